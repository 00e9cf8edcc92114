"""The workload half of the seam: what every rank communicates at every step.

Two sources give the same thing, a function (rank, step) -> the ops in issue order:
- a plugin's declaration (`DistAlgorithm.comm_pattern`), which answers for any world, so a run
  made on 8 ranks can be asked what it would do on 1,024 (`declared`);
- a run's ledger, which says what each rank did (`recorded`): the blind proof replays it.

An op the declaration marks `data_dependent` (a top-k that leaves zeros out, a leader chosen by
loss) carries the most it could; the run's ledger says how much it carried, as a ratio per kind
of op (`byte_ratios`), which a declared workload applies.

Which engine may time it (`synchronous`): a workload is bulk-synchronous when every training
rank makes the same ops (kinds, groups, bytes; a `pair:` or `server:` label differs from rank to
rank and is not), each blocking and on the training thread; the recurrence times those, the
discrete-event engine everything (projection/engine.py).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from core.errors import UserError
from dist_algos.comm.pattern import MAIN, CommOp, OpKind, ParamLayout, PatternConfig

OpsAt = Callable[[int, int], tuple[CommOp, ...]]
#: how many steps, spread over the run, and how many ranks, spread over the world, are compared
#: to decide symmetry (every rank of a world of 1,024 at every step would cost more than the run)
PROBES = 24
PROBE_RANKS = 64


def spread(items: Sequence[int], count: int) -> list[int]:
    """`count` of `items` spread evenly (all of them when there are no more), first and last kept."""
    if len(items) <= count:
        return list(items)
    return sorted({items[round(i * (len(items) - 1) / (count - 1))] for i in range(count)})


def shape_key(op: CommOp) -> tuple[str, str, Optional[int], str]:
    """What a byte ratio is kept by: the kind, the group's kind, the bucket, the thread."""
    return OpKind(op.kind).value, op.group.partition(":")[0], op.bucket, op.thread


@dataclass
class Workload:
    """Ops per (rank, step) for `world` ranks over `steps` steps (and the end of training,
    step == steps, where a plugin's `finalize` communicates). `train_ranks` take steps; other
    ranks (servers) only answer."""

    world: int
    steps: int
    train_ranks: tuple[int, ...]
    ops_at: OpsAt
    source: str
    byte_ratios: dict[tuple, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    _cache: dict[tuple[int, int], tuple[CommOp, ...]] = field(default_factory=dict, repr=False)

    def ops(self, rank: int, step: int) -> tuple[CommOp, ...]:
        key = (rank, step)
        found = self._cache.get(key)
        if found is None:
            found = tuple(self.scaled(op) for op in self.ops_at(rank, step))
            if rank == self.train_ranks[0]:  # the representative rank: asked every step
                self._cache[key] = found
        return found

    def scaled(self, op: CommOp) -> CommOp:
        ratio = self.byte_ratios.get(shape_key(op)) if op.data_dependent else None
        if ratio is None:
            return op
        return dataclasses.replace(op, payload_bytes=int(op.payload_bytes * ratio),
                                   wire_bytes=int(op.wire_bytes * ratio), recv_bytes=int(op.recv_bytes * ratio))

    def probe_steps(self) -> list[int]:
        count = min(PROBES, self.steps + 1)
        return sorted({round(i * self.steps / max(count - 1, 1)) for i in range(count)})

    def synchronous(self) -> bool:
        """Every training rank the same blocking training-thread ops at the probed steps, and no
        rank outside them communicating (see the module docstring)."""
        others = [r for r in range(self.world) if r not in set(self.train_ranks)]
        first = self.train_ranks[0]
        checked = spread(self.train_ranks[1:], PROBE_RANKS)
        for step in self.probe_steps():
            ops = self.ops(first, step)
            if any(not op.blocking or op.thread != MAIN or OpKind(op.kind) in (OpKind.PUSH, OpKind.PULL)
                   or op.group.startswith(("pair:", "server:", "worker:")) for op in ops):
                return False
            shape = [op.key() for op in ops]
            if any([op.key() for op in self.ops(r, step)] != shape for r in checked):
                return False
            if any(self.ops(r, step) for r in spread(others, PROBE_RANKS)):
                return False
        return True

    def total_bytes(self, rank: int) -> int:
        return sum(op.wire_bytes for step in range(self.steps + 1) for op in self.ops(rank, step))


def declared(algorithm: Any, algo_cfg: Any, world: int, config: PatternConfig, layout: ParamLayout,
             steps: int) -> Workload:
    """A plugin's declared pattern at `world` ranks (refused in one line if it declares none)."""
    if not algorithm.declares_pattern():
        raise UserError(f"algo={algorithm.name} declares no communication pattern (comm_pattern), so its time "
                        "at another world cannot be projected; declare it (docs/writing_a_plugin.md)")
    train = tuple(algorithm.layout(algo_cfg, world).train)

    def ops_at(rank: int, step: int) -> tuple[CommOp, ...]:
        return tuple(algorithm.comm_pattern(rank, step, world, config, layout))

    return Workload(world, steps, train, ops_at, f"algo={algorithm.name}'s declared pattern at {world} ranks")


def recorded(ops: dict[tuple[int, int], list[CommOp]], world: int, steps: int, train_ranks: Sequence[int],
             source: str) -> Workload:
    """A run's own ops, rank by rank and step by step, from its ledger."""
    table = {key: tuple(value) for key, value in ops.items()}
    return Workload(world, steps, tuple(train_ranks), lambda rank, step: table.get((rank, step), ()), source)


def byte_ratios(declared_ops: OpsAt, recorded_ops: dict[tuple[int, int], list[CommOp]]) -> dict[tuple, float]:
    """For each kind of data-dependent declared op, the run's recorded bytes over the declared
    most (a mean over every op the ledger has a twin for). An op's twin is the recorded op of
    its shape at the same place among the step's ops of that shape, in issue order: a top-k's
    all-gather of sizes and its all-gather of values share a shape, and only the second is the
    data's."""
    sums: dict[tuple, list[float]] = {}
    for (rank, step), got in recorded_ops.items():
        seen: dict[tuple, int] = {}
        for op in declared_ops(rank, step):
            place = seen[op.shape()] = seen.get(op.shape(), -1) + 1
            twins = [g for g in got if g.shape() == op.shape()]
            if op.data_dependent and place < len(twins) and op.wire_bytes:
                pair = sums.setdefault(shape_key(op), [0.0, 0.0])
                pair[0] += twins[place].wire_bytes
                pair[1] += op.wire_bytes
    return {key: got / most for key, (got, most) in sums.items() if most}


def pattern_config(algo_cfg: Any, total_steps: int, steps_per_epoch: int, local_size: int,
                   lr_at: Callable[[int], float], peak_lr: float, warmup_steps: int) -> PatternConfig:
    return PatternConfig(algo=algo_cfg, total_steps=total_steps, steps_per_epoch=steps_per_epoch,
                         local_size=local_size, lr_at=lr_at, peak_lr=peak_lr, warmup_steps=warmup_steps)
