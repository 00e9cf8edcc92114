"""Bulk-synchronous patterns as a recurrence over ranks, vectorised with numpy.

Every training rank makes the same ops at a step (projection/workload.py checks it), so the run
is a recurrence on one vector, each rank's clock T:

    T += before[r, s] + delay[r, s]                          compute, then the injected imbalance
    for each gradient bucket b (overlapped with backward):   ready at start + f_b before[r, s]
        start_b = max(max over the group of ready_b, end_(b-1));  end_b = start_b + time_b
    T = max(T, end of the last bucket)
    for each blocking collective, in issue order:            a group starts when its last member
        T = max over the group of T + time(op, group)        arrives and ends together
    for each stage of point-to-point messages:               a rank goes on once it and its peers
        T = max(T, T[peers]) + time                          have arrived and its messages are through
    T += after[r, s]                                         the optimizer step after the average

The time of an op over a partition of the ranks comes from projection/network.py (cached, so a
pattern that repeats costs one evaluation). A step's end is when its slowest rank finishes;
the wall time is the last rank's end. Over P ranks the max is the tail of the compute: a
world all-reduce at 1,024 ranks waits for the slowest of 1,024 draws every step.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Optional

import numpy as np

from dist_algos.comm.pattern import CommOp, OpKind
from projection.network import POINT_TO_POINT, Network, partition, peer_of
from projection.workload import Workload

#: (step) -> (before, after) seconds for every training rank, in `train_ranks` order
ComputeAt = Callable[[int], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class Timeline:
    """When each step ended (its slowest rank) and when each rank finished, in seconds."""

    step_end: np.ndarray
    rank_end: np.ndarray

    @property
    def wall_s(self) -> float:
        return float(self.rank_end.max()) if len(self.rank_end) else 0.0

    @property
    def step_s(self) -> np.ndarray:
        return np.diff(self.step_end, prepend=0.0)


class Groups:
    """A partition of the training ranks as index arrays, for per-group max in one call."""

    def __init__(self, groups: Sequence[Sequence[int]], index: dict[int, int]) -> None:
        self.groups = [tuple(g) for g in groups]
        flat = [index[r] for g in self.groups for r in g]
        self.order = np.asarray(flat, dtype=np.int64)
        sizes = [len(g) for g in self.groups]
        self.starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        self.group_of = np.full(len(index), -1, dtype=np.int64)
        for k, g in enumerate(self.groups):
            self.group_of[[index[r] for r in g]] = k
        self.complete = len(flat) == len(index)
        self.whole = self.complete and len(self.groups) == 1  # one group of every rank: no indexing

    def spread(self, per_group: np.ndarray, clock: np.ndarray) -> np.ndarray:
        """Each member's clock set to its group's value; ranks in no group keep theirs."""
        if self.whole:
            return np.full(len(clock), per_group[0])
        if self.complete:
            return per_group[self.group_of]
        out = clock.copy()
        inside = self.group_of >= 0
        out[inside] = per_group[self.group_of[inside]]
        return out

    def maximum(self, values: np.ndarray) -> np.ndarray:
        """Each group's max of `values` (indexed by rank position), one entry per group."""
        if self.whole:
            return np.array([values.max()])
        return np.maximum.reduceat(values[self.order], self.starts)


class Recurrence:
    """The engine for synchronous workloads (see the module docstring)."""

    def __init__(self, workload: Workload, network: Network, bucket_ready: Sequence[float] = ()) -> None:
        self.w = workload
        self.net = network
        self.ranks = list(workload.train_ranks)
        self.index = {r: i for i, r in enumerate(self.ranks)}
        self.bucket_ready = tuple(bucket_ready)
        self._groups: dict[tuple, Groups] = {}
        self._times: dict[tuple, np.ndarray] = {}
        self._stages: dict[tuple, tuple[list[np.ndarray], np.ndarray]] = {}

    # ---- cached pieces ---------------------------------------------------------------------
    def groups(self, op: CommOp) -> Groups:
        key = (op.group, op.group_size)
        found = self._groups.get(key)
        if found is None:
            parts = partition(op.group, self.w.world, op.group_size, self.ranks)
            found = self._groups[key] = Groups(parts, self.index)
        return found

    def op_times(self, op: CommOp, groups: Groups) -> np.ndarray:
        """Seconds of `op` in each group (all groups at once)."""
        key = (OpKind(op.kind), op.payload_bytes, op.wire_bytes, op.group, op.group_size)
        found = self._times.get(key)
        if found is None:
            found = self._times[key] = np.array([t.seconds for t in self.net.times(op, groups.groups)])
        return found

    def stage(self, ops: Sequence[CommOp]) -> tuple[list[np.ndarray], np.ndarray]:
        """A run of point-to-point ops issued together: each rank's peers (as rank positions),
        and each rank's time (its slowest message, every rank's messages sharing the links)."""
        key = tuple(op.key() for op in ops)
        found = self._stages.get(key)
        if found is not None:
            return found
        world = self.w.world
        peers = [np.array([self.index[peer_of(op.group, r, world)] for r in self.ranks]) for op in ops]
        sends = [(r, peer_of(op.group, r, world)) for op in ops if OpKind(op.kind) != OpKind.RECV for r in self.ranks]
        shares = self.net.shares(sends)
        receiving = self.net.receiving(sends)
        seconds = np.zeros(len(self.ranks))
        for op in ops:
            for i, r in enumerate(self.ranks):
                peer = peer_of(op.group, r, world)
                edge = (peer, r) if OpKind(op.kind) == OpKind.RECV else (r, peer)
                if edge not in shares:
                    shares.update(self.net.shares(sends + [edge]))
                timing = self.net.group_time(op, sorted(edge), [edge], shares, receiving)
                seconds[i] = max(seconds[i], timing.seconds)
        found = self._stages[key] = (peers, seconds)
        return found

    # ---- one step --------------------------------------------------------------------------
    def run(self, compute: ComputeAt, delays: Optional[np.ndarray] = None,
            mids: Optional[np.ndarray] = None) -> Timeline:
        """`mids` (ranks, steps, M): a replay's own time between a step's consecutive waits."""
        steps = self.w.steps
        clock = np.zeros(len(self.ranks))
        step_end = np.zeros(steps + 1)
        rep = self.ranks[0]
        none = np.zeros((len(self.ranks), 0))
        for step in range(steps + 1):
            ops = self.w.ops(rep, step)
            between = mids[:, step, :] if mids is not None and step < steps else none
            if step < steps:
                before, after = compute(step)
                if delays is not None:
                    before = before + delays[:, step]
            else:  # the end of training: only what finalize communicates
                before = after = np.zeros(len(self.ranks))
            clock = self.step(clock, ops, before, after, between)
            step_end[step] = clock.max()
        return Timeline(step_end[:steps] if not self.w.ops(rep, steps) else step_end, clock)

    def step(self, clock: np.ndarray, ops: Sequence[CommOp], before: np.ndarray, after: np.ndarray,
             between: Optional[np.ndarray] = None) -> np.ndarray:
        start = clock
        clock = clock + before
        waits = 0  # wait points passed; the time between them comes from `between`
        gaps = between if between is not None else np.zeros((len(clock), 0))
        buckets = [op for op in ops if op.bucket is not None]
        if buckets:
            clock = self.buckets(start, clock, before, buckets)
            waits = 1
        rest = [op for op in ops if op.bucket is None]
        i = 0
        while i < len(rest):
            op = rest[i]
            if op.blocking and 0 < waits <= gaps.shape[1]:
                clock = clock + gaps[:, waits - 1]
            waits += 1 if op.blocking else 0
            if OpKind(op.kind) in POINT_TO_POINT:
                j = i
                while j < len(rest) and OpKind(rest[j].kind) in POINT_TO_POINT:
                    j += 1
                peers, seconds = self.stage(rest[i:j])
                waited = clock
                for p in peers:
                    waited = np.maximum(waited, clock[p])
                clock = waited + seconds
                i = j
                continue
            groups = self.groups(op)
            times = self.op_times(op, groups)
            ends = groups.maximum(clock) + times
            clock = groups.spread(ends, clock)
            i += 1
        unused = gaps[:, max(waits - 1, 0):].sum(axis=1) if gaps.shape[1] else 0.0  # more gaps than waits
        return clock + after + unused

    def buckets(self, start: np.ndarray, done: np.ndarray, before: np.ndarray, ops: Sequence[CommOp]) -> np.ndarray:
        """Gradient buckets launched during backward, in bucket order, each when its gradients
        are ready on every member and the previous bucket is through."""
        last_end = None
        groups = self.groups(ops[0])
        for b, op in enumerate(ops):
            frac = self.bucket_ready[b] if b < len(self.bucket_ready) else 1.0
            ready = groups.maximum(start + frac * before)
            begin = ready if last_end is None else np.maximum(ready, last_end)
            last_end = begin + self.op_times(op, groups)
        assert last_end is not None
        return np.maximum(done, groups.spread(last_end, done))
