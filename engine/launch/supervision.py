"""The one supervision loop of the launching side: the launcher's attempt (engine/launch/loop.py)
and the fault-tolerant supervisor (engine/ft/launch/supervisor.py) both run on it.

Both supervise processes they started in the same way, every POLL_S: a new `RUN/stop_request`
counts as a first stop signal (SLURM's time-limit warning writes it; a signal through srun would
reach the ranks twice); the job is looked at (its processes reaped, and whatever its policy does
then: restart a replica, end on a failure); a pending stop is delivered once the job can take it
(SIGUSR1 before a rank has installed its handler would kill the rank instead of stopping it);
ranks whose heartbeat went silent are dealt with; the job ends once it is done. What differs is
the policy, which the job supplies as a `Supervised`: the launcher delivers the stop once, to
every rank, and ends the job on one stalled rank (its peers would wait in a collective until
dist.timeout_s and blame nobody); the fault-tolerant supervisor tells each replica when that
replica is ready, kills a stalled one alone and restarts it.

`StopSignals` is the handler of the stop signals (core/stop_signals.py) for one job: the first
asks for a checkpoint-and-stop (one line says so, the job's own), every later one asks the job to
end at once (`Supervised.end_now`: the launcher escalates SIGTERM then SIGKILL on its process
group, the fault-tolerant supervisor kills every process it started). A job may begin a stop of
its own, without a signal (a quorum that can no longer form).
"""
from __future__ import annotations

import signal
import sys
import time
from collections.abc import Sequence
from types import FrameType
from typing import Optional, Protocol

from core import stop_signals
from engine.launch.rank_watch import Stall

#: seconds between two looks at the job: well under a heartbeat, and a stop is passed on at once
POLL_S = 0.2


class Supervised(Protocol):
    """A job as the supervision loop drives it: what it looks like and what its policy does.
    Every method but `end_now` runs in the loop; `end_now` runs in a signal handler."""

    def stop_line(self, signum: int) -> str:
        """The line that tells the user what the first stop signal `signum` will do."""

    def stop_requested(self) -> bool:
        """A stop asked through a file since the job began (RUN/stop_request)."""

    def poll(self) -> Optional[int]:
        """Look at the job once: reap its processes and act on what ended; the job's exit code
        once it is over (its launcher exited, a user error, the end asked by `end_now`), else None."""

    def ready(self) -> bool:
        """Whether a pending stop can be delivered now."""

    def deliver_stop(self) -> bool:
        """Tell the job to checkpoint and stop; True when it need not be told again (False: call
        again every tick, as for replicas that start or are restarted meanwhile)."""

    def stalls(self) -> Sequence[Stall]:
        """The ranks (replicas) whose heartbeat has been silent too long while they live."""

    def end_stalled(self, stalls: Sequence[Stall]) -> Optional[int]:
        """Act on silent ranks; the job's exit code if that ends it, else None."""

    def done(self) -> Optional[int]:
        """The job's exit code once every rank is done (then the loop ends), else None."""

    def end_now(self, signum: int, count: int) -> None:
        """The `count`-th stop signal (2 or more): end the job at once. Runs in the handler:
        system calls only, what it ends is reaped by the next `poll`."""


class StopSignals:
    """The stop signals one job heard, and the stop they ask for.

    `received`: every stop signal heard, in order (a caller's list: restart-all does not retry a
    job the user stopped); `first`: the stop in progress (the first signal, SIGUSR1 for a
    stop_request, or the job's own), None while there is none; `pending`: not yet delivered."""

    def __init__(self, job: Supervised, received: Optional[list[int]] = None) -> None:
        self.job = job
        self.received: list[int] = [] if received is None else received
        self.first: Optional[int] = None
        self.pending = False

    def __call__(self, signum: int, frame: Optional[FrameType] = None) -> None:
        self.received.append(signum)
        if len(self.received) == 1:
            self.begin(signum)
            print(self.job.stop_line(signum), file=sys.stderr, flush=True)
        else:
            self.job.end_now(signum, len(self.received))

    def begin(self, signum: int) -> None:
        """Start a stop to be delivered (a signal's, or the job's own: then no signal is counted)."""
        self.first = signum
        self.pending = True

    def install(self, also: Sequence[int] = ()) -> stop_signals.Previous:
        """Hear the stop signals (and `also`: a job manager's) from now on; the handlers found,
        for `core.stop_signals.restore`."""
        return stop_signals.install(self, also)


def tick(job: Supervised, stops: StopSignals) -> Optional[int]:
    """One look at the job, in the order every supervisor keeps; its exit code once it is over."""
    if stops.first is None and job.stop_requested():
        stops(signal.SIGUSR1)  # as a first stop signal, on every node that watches the run
    code = job.poll()
    if code is not None:
        return code
    if stops.pending and job.ready():
        stops.pending = not job.deliver_stop()
    stalled = job.stalls()
    if stalled:
        code = job.end_stalled(stalled)
        if code is not None:
            return code
    return job.done()


def supervise(job: Supervised, stops: StopSignals, poll_s: float = POLL_S) -> int:
    """Drive `job` until it is over; its exit code. The caller installs `stops` (it may hear
    signals before and after the loop: while a job starts, or waits for other nodes)."""
    while True:
        code = tick(job, stops)
        if code is not None:
            return code
        time.sleep(poll_s)
