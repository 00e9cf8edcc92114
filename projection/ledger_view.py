"""What a run's time ledger says, in the terms the projection needs.

The ledger (`report.ledger=true`, engine/report/ledger.py) holds, per rank and step, the compute
segments (`data_wait`, `forward_backward`, `imbalance`, `plugin`, with `optimizer` nested in
`plugin`) and every communication with its issue, completion and, for an overlapped bucket, ready
time; each rank's times count from its own origin, whose wall-clock second the ledger keeps, so
the ranks are put on one clock first (`Clock`). From it:

- the ops each rank made at each step (`recorded_ops`), the workload the blind proof replays;
- each rank's own time per step, split at its first wait (`local_times`). The training thread
  waits inside a blocking op of its own thread from issue to completion, and for overlapped
  buckets from when `plugin` starts (backward is over, and any injected delay) to the last
  bucket's completion. For the replay (`spans=True`) everything else in the step's span (from
  its first segment to the next step's) is the rank's own work, `before` the first wait and
  `after` it, evaluation and logging included, as the run spent them. For a profile
  (`spans=False`) only the segments count: `before` = data wait + forward and backward, `after` =
  the plugin's time outside its waits (the optimizer step and the plugin's own arithmetic); the
  injected imbalance is left out, since a projection regenerates it;
- each bucket's ready time as a fraction of `before` (`bucket_ready`);
- the measured wall time of the training steps (`measured_wall`);
- a parameter server's service time per push (`service_times`): from each push's receipt to its
  reply on the server's serving threads, their union over the threads per push.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dist_algos.comm.pattern import CommOp
from projection.compute import ComputeProfile, profile_from_steps

BEFORE = ("data_wait", "forward_backward")


class Clock:
    """Every rank's times on one clock: seconds since the earliest rank's origin."""

    def __init__(self, ledger: Any) -> None:
        origins = {rank: facts.origins_unix for rank, facts in ledger.ranks.items()}
        self.base = min((o[0] for o in origins.values() if o), default=0.0)
        self.origins = origins

    def __call__(self, rank: int, attempt: int, t: float) -> float:
        origins = self.origins.get(rank) or (self.base,)
        return t + origins[min(attempt, len(origins) - 1)] - self.base


@dataclass(frozen=True)
class LocalTimes:
    """(ranks, steps) seconds before each step's first wait and after its last, for `ranks` in
    order; `mids` (ranks, steps, M): the rank's own time between consecutive waits (zero where a
    step has fewer); each rank's step starts on the common clock (the last column: its end)."""

    ranks: tuple[int, ...]
    before: np.ndarray
    after: np.ndarray
    starts: np.ndarray
    mids: np.ndarray


def recorded_ops(ledger: Any) -> dict[tuple[int, int], list[CommOp]]:
    out: dict[tuple[int, int], list[tuple[tuple[int, int], CommOp]]] = defaultdict(list)
    for rec in ledger.comm:
        out[(rec.rank, rec.step)].append(((rec.attempt, rec.seq), rec.op))
    return {key: [op for _, op in sorted(items, key=lambda x: x[0])] for key, items in out.items()}


def train_steps(ledger: Any) -> tuple[list[int], int]:
    """(ranks that took steps, the steps every one of them took)."""
    per_rank: dict[int, set[int]] = defaultdict(set)
    for seg in ledger.compute:
        if seg.segment == "forward_backward":
            per_rank[seg.rank].add(seg.step)
    if not per_rank:
        return [], 0
    return sorted(per_rank), min(len(steps) for steps in per_rank.values())


def waits(records: Sequence[Any], plugin_start: float, clock: Clock) -> list[tuple[float, float]]:
    """The intervals one rank's training thread waited in communication during one step: its
    blocking ops (a background thread's blocking op, WAGMA's global average, is waited for by the
    training thread too), and its buckets from the plugin's start; overlapping ones merged (a
    stage of messages is one wait)."""
    at = lambda r, t: clock(r.rank, r.attempt, t)  # noqa: E731
    out = [(at(r, r.issue_s), at(r, r.complete_s)) for r in records if r.op.blocking and r.op.bucket is None]
    buckets = [r for r in records if r.op.bucket is not None]
    if buckets:
        last = max(at(r, r.complete_s) for r in buckets)
        if last > plugin_start:
            out.append((plugin_start, last))
    return merged(out)


def merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def local_times(ledger: Any, spans: bool = True) -> LocalTimes:
    """Each training rank's own time per step (see the module docstring)."""
    clock = Clock(ledger)
    ranks, steps = train_steps(ledger)
    segs: dict[tuple[int, int], list[tuple[str, float, float]]] = defaultdict(list)
    for s in ledger.compute:
        segs[(s.rank, s.step)].append((s.segment, clock(s.rank, s.attempt, s.start_s),
                                       clock(s.rank, s.attempt, s.end_s)))
    recs: dict[tuple[int, int], list[Any]] = defaultdict(list)
    for rec in ledger.comm:
        recs[(rec.rank, rec.step)].append(rec)
    before, after = np.zeros((len(ranks), steps)), np.zeros((len(ranks), steps))
    starts = np.zeros((len(ranks), steps + 1))
    between: dict[tuple[int, int], list[float]] = {}
    for i, rank in enumerate(ranks):
        end = 0.0
        for step in range(steps):
            mine = segs[(rank, step)]
            start = min(a for _, a, _ in mine)
            plugin = min((a for name, a, _ in mine if name == "plugin"), default=max(b for _, _, b in mine))
            records = recs.get((rank, step), [])
            intervals = waits(records, plugin, clock)
            if step + 1 < steps and segs.get((rank, step + 1)):
                end = min(a for _, a, _ in segs[(rank, step + 1)])
            else:
                end = max([b for _, _, b in mine] + [b for _, b in intervals])
            waited = sum(b - a for a, b in intervals)
            if spans:
                first = intervals[0][0] if intervals else end
                gaps = [max(b[0] - a[1], 0.0) for a, b in zip(intervals, intervals[1:])]
                between[(i, step)] = gaps
                before[i, step] = max(first - start, 0.0)
                after[i, step] = max(end - start - waited - before[i, step] - sum(gaps), 0.0)
            else:
                before[i, step] = sum(b - a for name, a, b in mine if name in BEFORE)
                in_plugin = sum(b - a for name, a, b in mine if name == "plugin")
                after[i, step] = max(in_plugin - waited, 0.0)
            starts[i, step] = start
        starts[i, steps] = end
    width = max((len(g) for g in between.values()), default=0)
    mids = np.zeros((len(ranks), steps, width))
    for (i, step), gaps in between.items():
        mids[i, step, :len(gaps)] = gaps
    return LocalTimes(tuple(ranks), before, after, starts, mids)


def bucket_ready(ledger: Any, times: LocalTimes) -> tuple[float, ...]:
    """Median ready time of each bucket as a fraction of its step's `before`."""
    clock = Clock(ledger)
    index = {r: i for i, r in enumerate(times.ranks)}
    fractions: dict[int, list[float]] = defaultdict(list)
    steps = times.before.shape[1]
    for rec in ledger.comm:
        if rec.op.bucket is None or rec.rank not in index or rec.step >= steps or rec.ready_s is None:
            continue
        i = index[rec.rank]
        span = times.before[i, rec.step]
        if span > 0:
            ready = clock(rec.rank, rec.attempt, rec.ready_s) - times.starts[i, rec.step]
            fractions[rec.op.bucket].append(min(max(ready / span, 0.0), 1.0))
    return tuple(float(np.median(fractions[b])) for b in sorted(fractions))


def measured_wall(times: LocalTimes) -> float:
    """From the first rank's first step start to the last rank's last step end, one clock."""
    return float(times.starts[:, -1].max() - times.starts[:, 0].min())


def start_offsets(times: LocalTimes) -> np.ndarray:
    """How much later than the first each rank started its first step (the replay starts them so)."""
    return times.starts[:, 0] - times.starts[:, 0].min()


def profile(ledger: Any, source: str, warmup: int = 2) -> ComputeProfile:
    """The ledger's compute pooled over ranks and steps (segments only), the first `warmup`
    steps left out."""
    times = local_times(ledger, spans=False)
    keep = slice(min(warmup, max(times.before.shape[1] - 1, 0)), None)
    return profile_from_steps(times.before[:, keep].ravel(), times.after[:, keep].ravel(), source,
                              bucket_ready(ledger, local_times(ledger)))


def service_times(ledger: Any, server_ranks: Sequence[int]) -> dict[int, float]:
    """Seconds a server spends per push: on each serving thread, from a push's receipt to the
    reply it sends; the union of those intervals over the server's threads (one applies at a
    time, the others wait for it) divided by the pushes (0 where the ledger has none)."""
    clock = Clock(ledger)
    by_thread: dict[tuple[int, str], list[Any]] = defaultdict(list)
    for rec in ledger.comm:
        if rec.rank in server_ranks and rec.op.kind.value in ("push", "pull"):
            by_thread[(rec.rank, rec.op.thread)].append(rec)
    intervals: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for (rank, _), recs in by_thread.items():
        recs.sort(key=lambda r: (r.attempt, r.seq))
        for push, pull in zip(recs, recs[1:]):
            if push.op.kind.value == "push" and pull.op.kind.value == "pull":
                intervals[rank].append((clock(rank, push.attempt, push.complete_s),
                                        clock(rank, pull.attempt, pull.issue_s)))
    return {rank: sum(b - a for a, b in merged(intervals[rank])) / len(intervals[rank]) if intervals[rank] else 0.0
            for rank in server_ranks}
