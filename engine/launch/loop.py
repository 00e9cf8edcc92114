"""The launching process's loop: start the job's ranks through DeepSpeed's launcher (or torchrun),
and supervise them until the job is over.

cli.py, when it is not itself a launched rank, re-executes itself through the launcher with the
run directory it resolved passed down (`hydra.run.dir=...`), so every rank writes into one run
directory. `launch` runs the one launch plan `plans.plan_for` picks (engine/launch/plans.py: one
machine, the same ranks forked from this process (`launch.launcher=fork`), pdsh, no-ssh per
node, an emulated cluster; their commands and environment come from engine/launch/commands.py)
and `run_launcher` supervises it, forked ranks as launched ones, on the supervision loop that the
fault-tolerant supervisor runs on too (engine/launch/supervision.py; `LaunchedRanks` is this
side's policy):

- signals (Ctrl-C, SIGTERM, SLURM's warning signal) are passed to the ranks as SIGUSR1, which
  makes them checkpoint at an agreed step and exit 0; a second signal ends the job. A file
  `<run_dir>/stop_request` does the same on every node that watches the run (the SLURM script
  uses it: a signal through srun would reach the ranks twice);
- when the job fails, it names the rank that stopped first (ranks leave `logs/rank_<r>.pid`, and
  `logs/rank_<r>.error` when they die of an exception) and where its log is;
- a rank whose heartbeat goes silent ends the job, named with its step.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from contextlib import nullcontext
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Optional

from core import stop_signals
from core.errors import USER_ERROR_EXIT, report_user_errors
from core.rundir import RunDir
from engine.launch.fork import RankBody
from engine.launch.plans import plan_for
from engine.launch.rank_watch import RankWatch, Stall
from engine.launch.commands import script_args
from engine.launch.config import LaunchConfig
from engine.launch.network import EmulatedCluster
from engine.launch.supervision import StopSignals, supervise


def _job_manager_signal() -> Optional[tuple[int, Callable[[int, Optional[FrameType]], Any]]]:
    """submitit's preemption signal and its handler, when this process runs under submitit.

    submitit (Hydra's SLURM launcher) requeues the job from its handler of SIGUSR2 (or
    SUBMITIT_PREEMPT_SIGNAL); SLURM sends that signal to every process of the job step. We let the
    ranks ignore it, turn it into a checkpoint-and-stop, and call submitit's handler once the
    ranks have stopped, so the requeued job resumes from that checkpoint.
    """
    name = os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")
    sig = getattr(signal, f"SIG{name}", None)
    if sig is None or sig in stop_signals.STOP_SIGNALS:
        return None
    handler = signal.getsignal(sig)
    return (sig, handler) if callable(handler) else None


class LaunchedRanks:
    """One attempt's launch as the supervision loop sees it (engine/launch/supervision.py): the
    launcher's process (or fork's group leader), whose session holds every rank of this node, and
    the watch over the ranks' files. Its policy: the stop is delivered once, to every rank, when
    all of them catch it; a stalled rank ends the job; the job is over when the launcher exits or
    every rank has recorded a clean exit."""

    def __init__(self, watch: RankWatch, stall_s: Optional[float]) -> None:
        self.watch, self.stall_s = watch, stall_s
        self.proc: Any = None  # a Popen, or fork's leader (the handler is installed before either starts)
        self.stall: Optional[Stall] = None  # the stall that ended the job

    def stop_line(self, signum: int) -> str:
        return (f"syncopt: {signal.Signals(signum).name}: ranks will checkpoint and stop at the next agreed step "
                "(signal again to stop at once)")

    def stop_requested(self) -> bool:
        return self.watch.stop_requested()

    def poll(self) -> Optional[int]:
        code = self.proc.poll()
        if code is None:
            self.watch.poll()
        return code

    def ready(self) -> bool:
        return self.watch.ready()

    def deliver_stop(self) -> bool:
        self.watch.signal_ranks(signal.SIGUSR1)
        return True

    def stalls(self) -> list[Stall]:
        return self.watch.stalls(self.stall_s) if self.stall_s else []

    def end_stalled(self, stalls: Sequence[Stall]) -> int:
        self.stall = stalls[0]
        _end_group(self.proc)
        self.watch.signal_ranks(signal.SIGKILL)
        return 1

    def done(self) -> Optional[int]:
        codes = self.watch.exit_codes()
        if codes is None or any(codes.values()):
            return None
        time.sleep(0.3)  # the launcher's own clean exit, if it is quick
        if self.proc.poll() is None:
            _end_group(self.proc)
        return 0

    def end_now(self, signum: int, count: int) -> None:
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGTERM if count < 3 else signal.SIGKILL)


def run_launcher(cmd: list[str], env: dict[str, str], run_dir: RunDir | Path, watch: Optional[RankWatch] = None,
                 stall_s: Optional[float] = None, received: Optional[list[int]] = None,
                 start: Optional[Callable[[Optional[int]], Any]] = None) -> int:
    """Run the launcher, forward stop signals to the ranks, and explain a failure in one line.

    The first stop signal (or a new stop_request file) is delivered as SIGUSR1 as soon as every
    rank is ready for it; a second one terminates the launcher's process group, a third kills it.
    A rank whose heartbeat is silent for `stall_s` seconds ends the job at once, named with its
    step (its peers would otherwise wait in a collective until dist.timeout_s and then blame
    nobody). Once every rank has recorded a clean exit the job is over, whatever the launcher's
    own polling still takes. `received`: the stop signals that arrived are appended to it (a job
    the user stopped is not restarted). `start`: starts the ranks instead of `cmd` (a launch
    plan's, launch.launcher=fork), given the signal they must ignore. The loop is the shared one
    (engine/launch/supervision.py), driving `LaunchedRanks`.
    """
    run_dir = RunDir.of(run_dir)
    watch = watch or RankWatch(run_dir)
    watch.clear()
    manager = _job_manager_signal()

    def child_setup() -> None:
        if manager is not None:  # the ranks must not die of the job manager's signal
            signal.signal(manager[0], signal.SIG_IGN)

    job = LaunchedRanks(watch, stall_s)
    stops = StopSignals(job, received)
    previous = stops.install(also=[manager[0]] if manager else [])
    try:
        if start is not None:
            job.proc = start(manager[0] if manager is not None else None)
        else:
            job.proc = subprocess.Popen(cmd, env=env, start_new_session=True,
                                        preexec_fn=child_setup if manager is not None else None)
        if len(stops.received) > 1:  # stopped twice while it was being started
            os.killpg(job.proc.pid, signal.SIGTERM)
        code = supervise(job, stops)
        watch.poll()
    finally:
        stop_signals.restore(previous)
        if job.proc is not None:
            _end_group(job.proc)  # whatever of the launch is left (a rank's children) ends with it
    if job.stall is not None:
        print(f"syncopt: error: {job.stall.describe()}; the job was stopped; log: "
              f"{watch.run_dir.rank_log(job.stall.rank)}", file=sys.stderr, flush=True)
    elif code == USER_ERROR_EXIT:
        print(f"syncopt: error: {watch.user_error()}", file=sys.stderr, flush=True)
    elif code != 0:
        print(f"syncopt: error: {watch.failure_report(code)}", file=sys.stderr, flush=True)
    if manager is not None and manager[0] in stops.received and code == 0:
        manager[1](manager[0], None)  # submitit: save the submission and requeue (exits)
    return code


def _end_group(proc: Any) -> None:
    """Kill the launcher and everything it started (its own session), and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def launch(cfg: LaunchConfig, run_dir: RunDir | Path, overrides: list[str], stall_s: Optional[float] = None,
           received: Optional[list[int]] = None, body: Optional[RankBody] = None) -> int:
    """Start the job's ranks (or this node's share of them) and supervise them; the exit code.
    `stall_s`: how long a rank's heartbeat may be silent before the job is ended (None: never);
    `received`: collects the stop signals that arrived (see `run_launcher`); `body`: what a rank
    forked from this process runs (launch.launcher=fork: cli.py's rank entry)."""
    run_dir = RunDir.of(run_dir)
    args = script_args(run_dir, overrides)
    # launch.network: built here, removed when the launch ends however it ends (engine.launch.network)
    network = EmulatedCluster(cfg.network, cfg.nproc) if cfg.network.emulated else nullcontext()
    with report_user_errors(), network as cluster:
        plan = plan_for(cfg, run_dir, args, cluster, body)
        watch = RankWatch(run_dir, local_ranks=plan.local_ranks, remote=plan.remote, ssh_port=plan.ssh_port)
        return run_launcher(plan.cmd, plan.env, run_dir, watch, stall_s, received, plan.start)


def stall_after_s(timeout_s: float) -> float:
    """How long a rank's heartbeat may be silent before the job is ended: half the collective
    timeout (its peers fail at the full timeout anyway), and never under 10 s, so that a rank
    busy in one long call that holds the interpreter (pickling a big checkpoint) is not taken
    for a stopped one."""
    return max(10.0, timeout_s / 2)
