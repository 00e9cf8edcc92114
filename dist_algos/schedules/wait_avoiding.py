"""Wait-avoiding group averaging: a per-rank communication thread that runs a round schedule.

WAGMA's collectives are "externally triggerable": the first member of a group to reach step t
starts the group's average, and members that are still computing contribute the model they
published last instead of making the others wait. The authors' MPI library does this with
activation messages and a progress engine. Gloo (and NCCL) collectives, in contrast, complete
only when every member calls them. This module gets the same behaviour from ordinary
collectives by letting a background thread, not the training thread, be each rank's member:

- Round r of the schedule is the average of training step r: a group round (the rank's group
  for that step) or a global round. Every rank's communication thread takes part in every round,
  in order, on process groups of its own (the trainer's collectives on the default group, from
  the main thread, never interleave with them).
- At each step the training thread folds in the corrections of the rounds completed since its
  last step, *publishes* its model (a copy under a lock, stamped with the step: its "version")
  and goes on with its local step at once: at a group step it does not wait, neither for the
  others' computation nor for the communication; round t's average reaches the model at the
  next step (or later, when the network is slower than a step).
- A group round starts on this rank as soon as it is *activated*: by this rank's own arrival at
  that step, or by an activation message from any peer that has reached that round or a later
  one (a later round implies this one is due: the peer cannot be there unless earlier rounds
  ran). The first member to enter a round (the originator: no member has told it that it is
  already there) sends an activation message to the members that have not told it so; the
  others join the collective with whatever they published last. A listener thread per rank
  receives these small messages (one blocking any-source receive on a gloo group used only for
  signals) and wakes the communication thread. The activation therefore travels along the
  schedule: a fast rank pulls every round before its own through the ranks it depends on,
  contributing stale models where ranks are behind, and no round can be left without members.
- What a round averages is each member's *virtual* model v = published + corrections not yet
  folded in, and its result is kept as a correction, mean - v, that the training thread adds
  to its current model. So the local steps a rank took after publishing are kept rather than
  averaged away, and every round conserves the sum of the members' models exactly: the global
  average at a sync equals the start plus all ranks' updates over the number of ranks, as in
  synchronous training (the test checks this). A member that published at the round's own
  step and has nothing pending gets exactly the group mean, as in the synchronous mode.
- A global round starts only when this rank's own training thread arrives (a synchronous
  all_reduce over a world group of its own), after every earlier round has completed and been
  folded in: that is the only point where the training thread waits. Every rank publishes its
  model at every global step, so a contribution to any group round between two global rounds
  is at most tau - 1 steps old: the staleness bound tau holds by construction, and the thread
  records the staleness it actually saw.

Messages are two int64 values (kind, round). At the end every rank sends STOP to each of its
peers, so every posted receive completes and close() leaves no pending operation behind.
"""
from __future__ import annotations

import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from dist_algos.comm.accounting import CommStats, allreduce_op, now
from dist_algos.comm.pattern import CommOp, OpKind

ACTIVATE, STOP = 0, 1
MESSAGE_BYTES = 16
THREAD = "wagma-comm"  # the communication thread's name (the time ledger's `thread`)


@dataclass(frozen=True)
class Round:
    """What the schedule says for one round (= one training step)."""

    index: int
    is_global: bool
    members: list[int]  # global ranks in this rank's group (every rank for a global round)
    group: Any  # the process group this rank's communication thread reduces on
    label: str = "world"  # the group's symbolic name in the time ledger (`world`, `wagma:<phase>`)


@dataclass
class AveragerStats:
    """What the communication thread observed; staleness is (round - version contributed)."""

    group_rounds: int = 0
    global_rounds: int = 0
    stale_rounds: int = 0  # group rounds this rank joined with a model older than the round
    staleness_max: int = 0
    staleness_sum: int = 0
    late_steps: int = 0  # group steps at which no round had completed since the previous step
    comm_behind: int = 0  # group rounds run after this rank's training thread had gone past them
    wait_global_s: float = 0.0  # the training thread blocked at global averages
    staleness_hist: dict[int, int] = field(default_factory=dict)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


class WaitAvoidingAverager:
    """One rank's side of the wait-avoiding schedule; see the module docstring.

    `plan(r)` gives round r; `peers` are the ranks that share a group with this one in some
    phase (they exchange activation and STOP messages); `signal_group` is a gloo group over all
    ranks used only for those messages.
    """

    def __init__(self, buffers: list[torch.Tensor], plan: Callable[[int], Round], rank: int,
                 peers: list[int], signal_group: Any, comm: CommStats, join_timeout_s: float) -> None:
        self.plan = plan
        self.rank = rank
        self.peers = list(peers)
        self.signal_group = signal_group
        self.comm = comm
        self.join_timeout_s = join_timeout_s
        self.device = buffers[0].device
        self.stats = AveragerStats()
        self._published = [b.detach().clone() for b in buffers]
        self._pending = [torch.zeros_like(b) for b in buffers]  # corrections not yet folded in
        self._work = [torch.empty_like(b) for b in buffers]
        self._contributed = [torch.empty_like(b) for b in buffers]
        self._cv = threading.Condition()
        self._version = -1  # step of the published model
        self._arrived = -1  # newest step this rank's training thread has reached
        self._activated = -1  # newest round any peer has told us it reached
        self._peer_round = {p: -1 for p in self.peers}
        self._completed = -1
        self._folded = -1  # newest round whose correction the training thread has folded in
        self._stopping = False
        self._error: Optional[BaseException] = None
        self._threads: list[threading.Thread] = []

    # ---- the training thread's side ---------------------------------------------------------
    @property
    def started(self) -> bool:
        return bool(self._threads)

    def start(self, first_round: int) -> None:
        self._completed = self._folded = first_round - 1
        self._threads = [threading.Thread(target=self._listen, name="wagma-listener", daemon=True),
                         threading.Thread(target=self._run, args=(first_round,), name=THREAD, daemon=True)]
        for t in self._threads:
            t.start()

    def exchange(self, step: int, buffers: list[torch.Tensor]) -> str:
        """This rank's part of step `step`, on the training thread: fold the completed rounds'
        corrections into `buffers`, publish them, and at a global step wait for the global
        average and return it in `buffers`. Returns "global", "group" (corrections were folded
        in) or "late" (no round has completed since the previous step)."""
        if not self.started:
            self.start(step)
        is_global = self.plan(step).is_global
        with self._cv:
            t0 = time.perf_counter()
            if is_global:  # every group round before it is done and folded in first
                self._wait(lambda: self._completed >= step - 1)
            kind = "group" if self._fold(buffers) else "late"
            for dst, src in zip(self._published, buffers):
                dst.copy_(src)
            _sync(self.device)
            self._version = self._arrived = step
            self._cv.notify_all()
            if not is_global:
                self.stats.late_steps += kind == "late"
                return kind
            self._wait(lambda: self._completed >= step)
            for dst, src in zip(buffers, self._published):  # the comm thread left the average there
                dst.copy_(src)
            self._folded = step
            self.stats.wait_global_s += time.perf_counter() - t0
            return "global"

    def pending_copy(self) -> list[torch.Tensor]:
        """The corrections not yet folded in, as of now (for a checkpoint; rounds still in
        flight are not in it)."""
        with self._cv:
            return [p.detach().cpu().clone() for p in self._pending]

    def drain(self, buffers: list[torch.Tensor]) -> None:
        """Fold in what the last rounds left (after close(), before a final average)."""
        with self._cv:
            self._fold(buffers)

    def _wait(self, ready: Callable[[], bool]) -> None:
        self._cv.wait_for(lambda: ready() or self._error is not None)
        if self._error is not None:
            raise RuntimeError(f"wait-avoiding communication thread failed: {self._error!r}") from self._error

    def _fold(self, buffers: list[torch.Tensor]) -> bool:
        """buffers += pending corrections (under the lock); whether a new round had completed."""
        if self._completed <= self._folded:
            return False
        for b, pending in zip(buffers, self._pending):
            b.add_(pending)
            pending.zero_()
        self._folded = self._completed
        return True

    def close(self) -> None:
        """Stop both threads (after the rounds still due); waits for the peers' STOP messages."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        for t in self._threads:
            t.join(self.join_timeout_s)

    # ---- the communication thread -----------------------------------------------------------
    def _due(self, r: int) -> bool:
        if self.plan(r).is_global:
            return self._arrived >= r
        return max(self._arrived, self._activated) >= r

    def _run(self, first_round: int) -> None:
        stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        if stream is not None:
            torch.cuda.set_device(self.device)
        r = first_round
        try:
            with torch.cuda.stream(stream) if stream is not None else nullcontext():
                while True:
                    with self._cv:
                        self._cv.wait_for(lambda: self._stopping or self._due(r))
                        if not self._due(r):
                            return
                        rnd = self.plan(r)
                        version = self._version
                        for w, c, p, pending in zip(self._work, self._contributed, self._published, self._pending):
                            torch.add(p, pending, out=c)  # the virtual model: what this rank will hold
                            w.copy_(c)
                        if stream is not None:  # done reading before the training thread may write
                            stream.synchronize()
                        told = [p for p in rnd.members if p != self.rank and self._peer_round.get(p, -1) >= r]
                    sends = [] if rnd.is_global or told else self._activate(rnd)
                    self._reduce(rnd)
                    if stream is not None:
                        stream.synchronize()
                    self._finish_round(rnd, version)
                    for work in sends:  # delivered by now or soon: peers' listeners always receive
                        work.wait()
                    r += 1
        except BaseException as err:  # surfaced to the training thread by exchange()
            with self._cv:
                if not self._stopping:
                    self._error = err
                self._cv.notify_all()
        finally:
            self._send_stops()

    def _activate(self, rnd: Round) -> list[Any]:
        """Tell the members that have not said they are at this round (or later) to start it."""
        with self._cv:
            targets = [p for p in rnd.members if p != self.rank and self._peer_round.get(p, -1) < rnd.index]
        message = torch.tensor([ACTIVATE, rnd.index], dtype=torch.int64)
        issued = now()
        works = [dist.isend(message, dst=p, group=self.signal_group) for p in targets]
        if targets:  # (sent while the round runs: their completion is not waited for here)
            op = CommOp(OpKind.SEND, rnd.label, len(rnd.members), MESSAGE_BYTES, MESSAGE_BYTES * len(targets),
                        False, THREAD)
            self.comm.record(op, issued, now(), step=rnd.index)
        return works

    def _reduce(self, rnd: Round) -> None:
        size = len(rnd.members)
        if size == 1:  # a group of one (group_size=1): the sum is the own model
            return
        issued = now()
        with self.comm.timed():
            for w in self._work:
                dist.all_reduce(w, op=dist.ReduceOp.SUM, group=rnd.group)
        nbytes = sum(w.numel() * w.element_size() for w in self._work)
        self.comm.record(allreduce_op(nbytes, size, rnd.label, THREAD, blocking=rnd.is_global), issued, now(),
                         syncs=1, step=rnd.index)

    def _finish_round(self, rnd: Round, version: int) -> None:
        size = len(rnd.members)
        with self._cv:
            if rnd.is_global:  # nothing was pending: the training thread folded it in and waits
                for p, w in zip(self._published, self._work):
                    p.copy_(w.div_(size))
                self.stats.global_rounds += 1
            else:  # pending += mean - contributed
                for pending, w, c in zip(self._pending, self._work, self._contributed):
                    pending.add_(w.div_(size)).sub_(c)
                st = self.stats
                # a contribution newer than the round: the comm thread ran behind its training
                # thread, which published later steps meanwhile (fresher, not stale)
                st.comm_behind += version > rnd.index
                staleness = max(0, rnd.index - version)
                st.group_rounds += 1
                st.stale_rounds += staleness > 0
                st.staleness_max = max(st.staleness_max, staleness)
                st.staleness_sum += staleness
                st.staleness_hist[staleness] = st.staleness_hist.get(staleness, 0) + 1
            _sync(self.device)
            self._completed = rnd.index
            self._cv.notify_all()

    def _send_stops(self) -> None:
        message = torch.tensor([STOP, -1], dtype=torch.int64)
        try:
            for work in [dist.isend(message, dst=p, group=self.signal_group) for p in self.peers]:
                work.wait()
        except Exception:  # the process group is gone (an error elsewhere): nothing to tell
            pass

    # ---- the listener thread ----------------------------------------------------------------
    def _listen(self) -> None:
        buf = torch.zeros(2, dtype=torch.int64)
        stops = 0
        try:
            while stops < len(self.peers):
                src = dist.recv(buf, src=None, group=self.signal_group)
                kind, index = int(buf[0]), int(buf[1])
                with self._cv:
                    if kind == STOP:
                        stops += 1
                    else:
                        self._activated = max(self._activated, index)
                        self._peer_round[src] = max(self._peer_round.get(src, -1), index)
                    self._cv.notify_all()
        except BaseException as err:
            with self._cv:
                if not self._stopping:
                    self._error = err
                self._cv.notify_all()
