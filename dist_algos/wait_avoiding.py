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
- The training thread *publishes* its model at each step (a copy under a lock, stamped with the
  step: its "version") and reads back the result of the newest round >= its step. It never
  waits for another rank's computation, only for the communication of a round that it itself
  may have activated.
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
- A global round starts only when this rank's own training thread arrives (a synchronous
  all_reduce over a world group of its own): that is the only point where the training thread
  waits for the others. Every rank publishes its model at every global step, so a contribution
  to any group round between two global rounds is at most tau - 1 steps old: the staleness
  bound tau holds by construction, and the thread records the staleness it actually saw.
- A rank that falls behind finds rounds already done with its stale model; it applies the
  newest result once (its own contribution replaced by its current model, so it is not
  counted twice) and, when no new round has completed since, takes a purely local step.

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

from dist_algos.comm import CommStats, allreduce_bytes

ACTIVATE, STOP = 0, 1
MESSAGE_BYTES = 16


@dataclass(frozen=True)
class Round:
    """What the schedule says for one round (= one training step)."""

    index: int
    is_global: bool
    members: list[int]  # global ranks in this rank's group (every rank for a global round)
    group: Any  # the process group this rank's communication thread reduces on


@dataclass
class AveragerStats:
    """What the communication thread observed; staleness is (round - version contributed)."""

    group_rounds: int = 0
    global_rounds: int = 0
    stale_rounds: int = 0  # group rounds this rank joined with a model older than the round
    staleness_max: int = 0
    staleness_sum: int = 0
    skipped: int = 0  # training steps with no new group result (rank behind): local step only
    wait_s: float = 0.0  # training thread blocked on results (global syncs, communication)
    messages: int = 0  # activation messages sent
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
        self._work = [torch.empty_like(b) for b in buffers]
        self._contributed = [torch.empty_like(b) for b in buffers]
        self._others = [torch.zeros_like(b) for b in buffers]  # sum of the other members' models
        self._cv = threading.Condition()
        self._version = -1  # step of the published model
        self._arrived = -1  # newest step this rank's training thread has reached
        self._activated = -1  # newest round any peer has told us it reached
        self._peer_round = {p: -1 for p in self.peers}
        self._completed = -1
        self._result_round = -1
        self._result_size = 1
        self._consumed = -1
        self._stopping = False
        self._error: Optional[BaseException] = None
        self._threads: list[threading.Thread] = []

    # ---- the training thread's side ---------------------------------------------------------
    @property
    def started(self) -> bool:
        return bool(self._threads)

    def start(self, first_round: int) -> None:
        self._completed = first_round - 1
        self._threads = [threading.Thread(target=self._listen, name="wagma-listener", daemon=True),
                         threading.Thread(target=self._run, args=(first_round,), name="wagma-comm", daemon=True)]
        for t in self._threads:
            t.start()

    def exchange(self, step: int, buffers: list[torch.Tensor]) -> str:
        """Publish `buffers` as this rank's model at `step` and average them in place with the
        newest result: "global" (the global average), "group", or "skipped" (nothing new)."""
        if not self.started:
            self.start(step)
        with self._cv:
            for dst, src in zip(self._published, buffers):
                dst.copy_(src)
            _sync(self.device)
            self._version = self._arrived = step
            self._cv.notify_all()
            t0 = time.perf_counter()
            self._cv.wait_for(lambda: self._completed >= step or self._error is not None)
            self.stats.wait_s += time.perf_counter() - t0
            if self._error is not None:
                raise RuntimeError(f"wait-avoiding communication thread failed: {self._error!r}") from self._error
            if self.plan(step).is_global:  # the comm thread left the average in _published
                for dst, src in zip(buffers, self._published):
                    dst.copy_(src)
                return "global"
            if self._result_round > self._consumed:
                self._consumed = self._result_round
                for dst, others in zip(buffers, self._others):
                    dst.add_(others).div_(self._result_size)
                return "group"
            self.stats.skipped += 1
            return "skipped"

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
                        for w, c, p in zip(self._work, self._contributed, self._published):
                            w.copy_(p)
                            c.copy_(p)
                        told = [p for p in rnd.members if p != self.rank and self._peer_round.get(p, -1) >= r]
                    sends = [] if rnd.is_global or told else self._activate(rnd)
                    self._reduce(rnd)
                    if stream is not None:
                        stream.synchronize()
                    for work in sends:
                        work.wait()
                    self._finish_round(rnd, version)
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
        self.stats.messages += len(targets)
        self.comm.add(sent=MESSAGE_BYTES * len(targets))
        return [dist.isend(message, dst=p, group=self.signal_group) for p in targets]

    def _reduce(self, rnd: Round) -> None:
        size = len(rnd.members)
        if size == 1:  # a group of one (group_size=1): the sum is the own model
            return
        with self.comm.timed():
            for w in self._work:
                dist.all_reduce(w, op=dist.ReduceOp.SUM, group=rnd.group)
        nbytes = sum(w.numel() * w.element_size() for w in self._work)
        self.comm.add(sent=allreduce_bytes(nbytes, size), recv=allreduce_bytes(nbytes, size), syncs=1)

    def _finish_round(self, rnd: Round, version: int) -> None:
        size = len(rnd.members)
        with self._cv:
            if rnd.is_global:
                for p, w in zip(self._published, self._work):
                    p.copy_(w.div_(size))
                self.stats.global_rounds += 1
            else:
                for o, w, c in zip(self._others, self._work, self._contributed):
                    torch.sub(w, c, out=o)
                self._result_round, self._result_size = rnd.index, size
                staleness = rnd.index - version
                st = self.stats
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
