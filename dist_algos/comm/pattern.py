"""A plugin's communication, op by op: what the time ledger records and what a plugin declares.

The seam between the workload and the system (as SimAI and ASTRA-sim keep it): a plugin says
what each rank communicates at each step, with whom and how many bytes, and whether the step
waits for it; a model of the machine (projection/) says how long that takes on a cluster. The
same record serves twice:

- recorded: with `report.ledger=true` every communication a plugin counts is appended to the
  rank's ledger as a `CommOp` with its issue and completion times (engine/report/ledger.py);
  counting and recording are one call (`CommStats.record`), so the ledger's bytes are the run's
  byte counters by construction;
- declared: every plugin states its pattern as a pure function of (rank, step, world, config,
  the model's parameter layout) (`DistAlgorithm.comm_pattern`), and a test checks the
  declaration against the recorded ledger op for op at P = 2, 4 and 8 (`first_difference`).

Groups are symbolic, so a pattern declared at P = 8 says what happens at P = 1,024: `world`,
`wagma:<phase>` (this rank's group in the k-th phase of WAGMA's recursive-doubling schedule),
`ring:+d` / `ring:-d` (the rank d ahead of / behind this one on the ring of all ranks: D-PSGD's
neighbours, SGP's exponential graph), `pair:<peer>` (a point-to-point partner chosen by a
schedule: AD-PSGD's), `server:<s>` (the parameter server rank s, from a worker), `worker:<w>`
(worker rank w, from its server), `block:<g>` (the g consecutive ranks this rank's block holds:
LSGD's groups, a node when g is the ranks per node). A point-to-point op's group size is 2.

Step and thread: an op belongs to the training step during which it was issued on its rank; ops
of a background thread (`thread` names it) are ordered within that thread, and which step they
fall in depends on timing, so declarations and records are compared per thread over the run.

What the run decides. Where an op's bytes, or whether it happens at all, depend on the data or on
timing (a top-k that leaves zeros out, the leader LSGD picks by loss, which WAGMA member arrives
first, which AD-PSGD request a passive rank answers next), the declaration marks it
`data_dependent` and gives the most it can carry: a recorded op then matches it with bytes at
most those, or is absent. The simulator takes such an op's bytes from the run's ledger.
"""
from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

WORLD = "world"
MAIN = "main"


class OpKind(str, enum.Enum):
    """The collective or exchange actually used (its algorithm decides its time, not its name)."""

    ALLREDUCE = "allreduce"
    ALLGATHER = "allgather"
    BROADCAST = "broadcast"
    REDUCE_SCATTER = "reduce_scatter"
    SEND = "send"  # point-to-point, this rank to one peer
    RECV = "recv"
    PUSH = "push"  # a worker's message to a parameter server (recorded by both ends)
    PULL = "pull"  # a server's reply to a worker (recorded by both ends)
    BARRIER = "barrier"


@dataclass(frozen=True)
class CommOp:
    """One communication of one rank at one step.

    `payload_bytes`: the tensor bytes of the operation as nccl-tests sizes it (B for an
    all-reduce of B bytes; a message's bytes at both of its ends); `wire_bytes`: what this rank
    sends under the accounting of dist_algos/comm/accounting.py, `recv_bytes`: what it receives
    (their sums over a rank are its `comm_bytes` and `comm_recv_bytes`). `blocking`: the step
    waits for it before it goes on (a bucket overlapped with backward is blocking: the optimizer
    step waits for it; `bucket` says it started during backward); an op the training thread
    never waits for (a background thread's group average, a server's reply) is False. `thread`:
    `main`, or the background thread that made it. `bucket`: the DDP-style bucket's index, for
    gradient averaging overlapped with backward. `data_dependent` (declarations only): the bytes
    given are the most this op carries; the run decides the rest (see the module docstring)."""

    kind: OpKind
    group: str
    group_size: int
    payload_bytes: int
    wire_bytes: int
    blocking: bool = True
    thread: str = MAIN
    bucket: Optional[int] = None
    recv_bytes: int = 0
    data_dependent: bool = False

    def key(self) -> tuple[str, str, int, int, int, bool, str, Optional[int], int]:
        """What a declared op must equal in its recorded twin (times aside)."""
        return (OpKind(self.kind).value, self.group, self.group_size, self.payload_bytes, self.wire_bytes,
                self.blocking, self.thread, self.bucket, self.recv_bytes)

    def shape(self) -> tuple[str, str, int, bool, str, Optional[int]]:
        """The op without its bytes: what a data-dependent declaration fixes exactly."""
        return OpKind(self.kind).value, self.group, self.group_size, self.blocking, self.thread, self.bucket


def ring(offset: int) -> str:
    return f"ring:{offset:+d}"


def pair(peer: int) -> str:
    return f"pair:{peer}"


def server(rank: int) -> str:
    return f"server:{rank}"


def worker(rank: int) -> str:
    return f"worker:{rank}"


def wagma(phase: int) -> str:
    return f"wagma:{phase}"


def block(size: int) -> str:
    return f"block:{size}"


@dataclass(frozen=True)
class ParamLayout:
    """What a pattern needs to know of the model: each trainable parameter tensor's element count
    (and shape, for compressors and PowerSGD that see matrices) in the order the plugins flatten
    them (`model.parameters()`), their element size, and the element counts of the model's
    floating-point buffers (BatchNorm statistics, which some methods average or push), so byte
    counts are exact without a model in hand."""

    numels: tuple[int, ...]
    element_size: int = 4
    shapes: tuple[tuple[int, ...], ...] = ()  # () : every parameter a vector of its numel
    buffer_numels: tuple[int, ...] = ()

    @classmethod
    def of(cls, model: Any) -> "ParamLayout":
        """A torch model's layout (its trainable parameters; its float buffers)."""
        params = [p for p in model.parameters() if p.requires_grad]
        sizes = {p.element_size() for p in params}
        if len(sizes) > 1:
            raise ValueError("a ParamLayout needs every trainable parameter in one dtype")
        return cls(tuple(p.numel() for p in params), sizes.pop() if sizes else 4,
                   tuple(tuple(p.shape) for p in params),
                   tuple(b.numel() for b in model.buffers() if b.is_floating_point()))

    @property
    def total_bytes(self) -> int:
        return sum(self.numels) * self.element_size

    @property
    def buffer_bytes(self) -> int:
        """The float buffers' bytes (float32, as they are flattened and sent)."""
        return sum(self.buffer_numels) * 4

    def layer_shapes(self) -> list[tuple[int, ...]]:
        return [tuple(s) for s in self.shapes] if self.shapes else [(n,) for n in self.numels]


@dataclass(frozen=True)
class PatternConfig:
    """What a declaration reads of a run besides the world and the layout: the plugin's config
    (`algo.*`), the step counts, the ranks per node, the learning rate of every step (QSR's period,
    DGS's density follow it) and its peak. `memo` holds what a declaration derives once from these
    (a schedule's synchronisation steps), so that asking step by step stays cheap; it never
    changes an answer."""

    algo: Any
    total_steps: int
    steps_per_epoch: int
    local_size: int = 1
    lr_at: Callable[[int], float] = field(default=lambda step: 1.0)
    peak_lr: float = 1.0
    warmup_steps: int = 0
    memo: dict[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def epoch_of(self, step: int) -> int:
        return step // max(self.steps_per_epoch, 1)


@dataclass
class StepPattern:
    """Every op one rank makes at one step, in issue order."""

    rank: int
    step: int
    ops: list[CommOp] = field(default_factory=list)


def _fits(declared: CommOp, recorded: CommOp) -> bool:
    if not declared.data_dependent:
        return declared.key() == recorded.key()
    return declared.shape() == recorded.shape() and recorded.payload_bytes <= declared.payload_bytes \
        and recorded.wire_bytes <= declared.wire_bytes and recorded.recv_bytes <= declared.recv_bytes


def first_difference(declared: Sequence[CommOp], recorded: Sequence[CommOp]) -> Optional[str]:
    """Where the recorded ops depart from the declared ones, in one line; None where they follow
    them op for op (a `data_dependent` declaration may carry fewer bytes, or be absent)."""
    at = 0
    for i, want in enumerate(declared):
        got = recorded[at] if at < len(recorded) else None
        if got is not None and _fits(want, got):
            at += 1
        elif not want.data_dependent:
            return f"declared op {i} {want.key()} but recorded {got.key() if got else 'nothing'}"
    if at < len(recorded):
        return f"recorded op {at} {recorded[at].key()} beyond the {len(declared)} declared"
    return None
