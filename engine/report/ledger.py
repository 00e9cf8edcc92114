"""Reading a run's time ledger (`report.ledger=true`): what each rank computed and communicated,
step by step, with times; and the run's declared communication pattern beside it.

`read_ledger(run_dir)` gathers every rank's part files (engine/report/ledger_format.py) into one
`Ledger`: `compute`, a sequence of `ComputeSegment(rank, step, segment, start_s, end_s)`, and
`comm`, a sequence of `CommRecord(rank, step, seq, op, issue_s, complete_s, ready_s)` (`op` a
`dist_algos.comm.pattern.CommOp`; `ready_s` only for a bucket overlapped with backward). Times
are seconds since the rank's clock origin: `time.perf_counter` (CLOCK_MONOTONIC), taken when
the rank's trainer started this attempt; `attempt` numbers the attempts of a resumed run (0
first) and `Ledger.ranks[r].origins_unix` gives each attempt's origin in wall-clock seconds,
which aligns ranks and attempts. Where a run was resumed, the later attempt's records replace
the earlier one's from the step it resumed at (the earlier attempt's later steps were lost with
it). A part that is truncated or not a ledger's is one line naming the file (`UserError`);
nothing read runs code.

`pattern_config(plan, ledger)` is the run as a declared pattern sees it, and `differences`
compares each rank's recorded operations with a plugin's declaration (`comm_pattern`): per step
on the training thread, over the run on each background thread.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from core.errors import UserError
from core.rundir import RunDir
from dist_algos.comm.pattern import MAIN, CommOp, ParamLayout, PatternConfig, first_difference
from engine.report.ledger_format import KINDS, SEGMENTS, Part, read_part
from engine.train.optim import Schedule


@dataclass(frozen=True)
class ComputeSegment:
    rank: int
    step: int
    segment: str  # one of ledger_format.SEGMENTS
    start_s: float
    end_s: float
    attempt: int = 0


@dataclass(frozen=True)
class CommRecord:
    rank: int
    step: int
    seq: int  # the order this rank recorded its operations in (per attempt)
    op: CommOp
    issue_s: float
    complete_s: float
    ready_s: Optional[float]
    attempt: int = 0


@dataclass(frozen=True)
class RankFacts:
    """What a rank's parts say of the run: its world, ranks per node, step counts, the model's
    layout, and each attempt's first step and clock origin (wall-clock seconds)."""

    rank: int
    world: int
    local_size: int
    total_steps: int
    steps_per_epoch: int
    layout: ParamLayout
    starts: tuple[int, ...]
    origins_unix: tuple[float, ...]


@dataclass
class Ledger:
    compute: list[ComputeSegment] = field(default_factory=list)
    comm: list[CommRecord] = field(default_factory=list)
    ranks: dict[int, RankFacts] = field(default_factory=dict)

    def facts(self) -> RankFacts:
        """The run's facts (every rank's parts agree on them; the lowest rank's)."""
        return self.ranks[min(self.ranks)]

    def ops(self, rank: int, thread: Optional[str] = None) -> list[CommRecord]:
        """Rank `rank`'s records (of one thread), in the order they were made."""
        return sorted((r for r in self.comm if r.rank == rank and (thread is None or r.op.thread == thread)),
                      key=lambda r: (r.attempt, r.seq))


def _records(part: Part, attempt: int) -> tuple[list[ComputeSegment], list[CommRecord]]:
    rank = part.meta["rank"]
    compute = [ComputeSegment(rank, step, SEGMENTS[kind], start, end, attempt)
               for step, kind, start, end in part.segments.tolist()]
    comm = []
    for step, seq, kind, group, thread, size, payload, wire, recv, blocking, bucket, issue, complete, ready \
            in part.ops.tolist():
        op = CommOp(KINDS[kind], part.groups[group], size, payload, wire, blocking, part.threads[thread],
                    None if bucket < 0 else bucket, recv_bytes=recv)
        comm.append(CommRecord(rank, step, seq, op, issue, complete, None if ready != ready else ready, attempt))
    return compute, comm


def _read_rank(folder: Path, ledger: Ledger) -> None:
    """One rank's parts, attempt by attempt: each attempt's records replace the earlier ones'
    from the step it started at."""
    attempts: dict[str, list[Part]] = {}
    for path in sorted(folder.glob("part_*.npz")):
        attempts.setdefault(path.name.split("_")[1], []).append(read_part(path))
    compute: list[ComputeSegment] = []
    comm: list[CommRecord] = []
    starts, origins = [], []
    last: Optional[Part] = None
    for index, parts in enumerate(attempts[k] for k in sorted(attempts)):
        start = parts[0].meta["start_step"]
        compute = [c for c in compute if c.step < start]
        comm = [c for c in comm if c.step < start]
        for part in parts:
            more_compute, more_comm = _records(part, index)
            compute += more_compute
            comm += more_comm
            last = part
        starts.append(start)
        origins.append(parts[0].origin_unix)
    if last is None:
        return
    m = last.meta
    if m["rank"] != int(folder.name.removeprefix("rank_")):
        raise UserError(f"{folder}: holds the ledger of rank {m['rank']}; the run's ledger/ folder was mixed up, "
                        "remove it or rerun with report.ledger=true")
    ledger.compute += compute
    ledger.comm += comm
    ledger.ranks[m["rank"]] = RankFacts(m["rank"], m["world"], m["local_size"], m["total_steps"],
                                        m["steps_per_epoch"], last.layout, tuple(starts), tuple(origins))


def read_ledger(run_dir: RunDir | str | Path) -> Ledger:
    """Every rank's time ledger in the run directory (see the module docstring)."""
    root = RunDir.of(run_dir).ledger
    folders = sorted(p for p in root.glob("rank_*") if p.is_dir() and p.name[5:].isdigit()) if root.is_dir() else []
    if not folders:
        raise UserError(f"{root}: no time ledger in this run directory; run it with report.ledger=true")
    ledger = Ledger()
    for folder in folders:
        _read_rank(folder, ledger)
    if not ledger.ranks:
        raise UserError(f"{root}: its rank folders hold no ledger part; run it with report.ledger=true")
    return ledger


def pattern_config(plan: Any, ledger: Ledger) -> PatternConfig:
    """The run as its plugin's declared pattern sees it: `plan` (an `engine.plan.RunPlan` built for
    the ledger's world) for the plugin's config and the learning rates, the ledger for the step
    counts and the ranks per node."""
    facts, cfg = ledger.facts(), plan.config
    schedule = Schedule(cfg.sched, plan.hyper.peak_lr, facts.total_steps, facts.steps_per_epoch)
    return PatternConfig(cfg.algo, facts.total_steps, facts.steps_per_epoch, facts.local_size, schedule.lr_at,
                         plan.hyper.peak_lr, schedule.warmup_steps)


Declare = Callable[[int, int], Sequence[CommOp]]  # (rank, step) -> the declared ops


def differences(ledger: Ledger, declare: Declare, steps: Optional[Sequence[int]] = None) -> list[str]:
    """Where each rank's recorded operations depart from `declare(rank, step)`: op for op, step
    by step on the training thread, and over the run on each background thread (whose steps
    depend on timing); `steps`: those compared (default: the whole run and its end, `finalize`)."""
    facts = ledger.facts()
    steps = range(min(facts.starts), facts.total_steps + 1) if steps is None else steps
    found = []
    for rank in sorted(ledger.ranks):
        declared = {step: list(declare(rank, step)) for step in steps}
        recorded = ledger.ops(rank)
        on_main: dict[int, list[CommOp]] = {}
        for r in recorded:
            if r.op.thread == MAIN:
                on_main.setdefault(r.step, []).append(r.op)
        for step in steps:
            diff = first_difference([op for op in declared[step] if op.thread == MAIN], on_main.pop(step, []))
            if diff:
                found.append(f"rank {rank} step {step}: {diff}")
        found += [f"rank {rank} step {step}: recorded {len(ops)} op(s) outside the steps compared"
                  for step, ops in sorted(on_main.items()) if step >= min(steps, default=0)]
        threads = {op.thread for ops in declared.values() for op in ops} | {r.op.thread for r in recorded}
        for thread in sorted(threads - {MAIN}):
            want = [op for step in steps for op in declared[step] if op.thread == thread]
            diff = first_difference(want, [r.op for r in recorded if r.op.thread == thread and r.step in declared])
            if diff:
                found.append(f"rank {rank} thread {thread}: {diff}")
    return found


def bytes_by_rank(ledger: Ledger) -> dict[int, tuple[int, int]]:
    """(bytes sent, bytes received) per rank, summed over its records: its `comm_bytes` and
    `comm_recv_bytes` (the counters count exactly what is recorded)."""
    out = {rank: (0, 0) for rank in ledger.ranks}
    for r in ledger.comm:
        sent, recv = out[r.rank]
        out[r.rank] = (sent + r.op.wire_bytes, recv + r.op.recv_bytes)
    return out


__all__ = ["CommRecord", "ComputeSegment", "Ledger", "RankFacts", "bytes_by_rank", "differences", "pattern_config",
           "read_ledger"]
