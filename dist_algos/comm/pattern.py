"""A plugin's communication, op by op: what the time ledger records and what a plugin declares.

The seam between the workload and the system (as SimAI and ASTRA-sim keep it): a plugin says
what each rank communicates at each step, with whom and how many bytes, and whether the step
waits for it; a model of the machine (projection/) says how long that takes on a cluster. The
same record serves twice:

- recorded: with `report.ledger=true` every communication a plugin makes is appended to the
  rank's ledger as a `CommOp` with its issue and completion times (engine/report/ledger.py);
- declared: every plugin states its pattern as a pure function of (rank, step, world, config,
  the model's parameter layout) (`DistAlgorithm.comm_pattern`), and a test checks the
  declaration against the recorded ledger op for op at P = 2, 4 and 8.

Groups are symbolic, so a pattern declared at P = 8 says what happens at P = 1,024: `world`,
`wagma:<phase>` (the group of the k-th butterfly phase), `ring:+1` / `ring:-1` (a neighbour in a
ring or on a graph's edge), `pair:<peer>` (a point-to-point partner), `server:<s>` (the parameter
server owning shard s), `leader` (LSGD's), `node` (the ranks of one node), `nodes` (one rank per
node).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Optional


class OpKind(str, enum.Enum):
    """The collective or exchange actually used (its algorithm decides its time, not its name)."""

    ALLREDUCE = "allreduce"
    ALLGATHER = "allgather"
    BROADCAST = "broadcast"
    REDUCE_SCATTER = "reduce_scatter"
    SEND = "send"  # point-to-point, this rank to one peer
    RECV = "recv"
    PUSH = "push"  # a worker's message to a parameter server
    PULL = "pull"  # a server's reply to a worker
    BARRIER = "barrier"


@dataclass(frozen=True)
class CommOp:
    """One communication of one rank at one step.

    `payload_bytes`: the tensor bytes this rank contributes (what a collective's size means in
    nccl-tests: B for an all-reduce of B bytes); `wire_bytes`: what this rank puts on the wire
    under the accounting of dist_algos/comm/accounting.py (equal to the byte counters' increment).
    `blocking`: the step waits for it to complete before going on; an asynchronous op (a
    background thread, a server's pull answered later) is False. `thread`: `main`, or the name
    of the background thread that made it. `bucket`: for gradient averaging overlapped with
    backward, the bucket's index (its ready time within backward is recorded in the ledger)."""

    kind: OpKind
    group: str
    group_size: int
    payload_bytes: int
    wire_bytes: int
    blocking: bool = True
    thread: str = "main"
    bucket: Optional[int] = None

    def key(self) -> tuple[str, str, int, int, int, bool, str, Optional[int]]:
        """What a declared op must equal in its recorded twin (times aside)."""
        return (OpKind(self.kind).value, self.group, self.group_size, self.payload_bytes, self.wire_bytes,
                self.blocking, self.thread, self.bucket)


@dataclass(frozen=True)
class ParamLayout:
    """What a pattern needs to know of the model: each parameter tensor's element count and
    element size, in the order the plugin flattens them (`named_parameters()` order), so byte
    counts are exact without a model in hand."""

    numels: tuple[int, ...]
    element_size: int = 4

    @property
    def total_bytes(self) -> int:
        return sum(self.numels) * self.element_size


@dataclass
class StepPattern:
    """Every op one rank makes at one step, in issue order."""

    rank: int
    step: int
    ops: list[CommOp] = field(default_factory=list)
