"""Communication accounting shared by every plugin: bytes, synchronisation rounds, seconds, and
the time ledger's record of each operation.

Byte counts are what this rank puts on the wire for the collective actually used, so methods
can be compared on one axis:
- all_reduce of B bytes in a group of g: 2 (g - 1) / g * B (bandwidth-optimal ring / reduce-scatter
  + all-gather, what NCCL and gloo's ring algorithm send);
- broadcast from the root: B per receiver for the root, 0 for receivers (tree-free lower bound);
- all_gather of B bytes per rank: (g - 1) / g * g * B = (g - 1) * B;
- point-to-point: the payload itself.

Bytes are counted only by `CommStats.record`, which takes the operation (`CommOp`) and its
times: counting an operation and logging it to the ledger are one call, so the ledger's bytes
equal the counters by construction. An operation a background thread makes whose bytes must be
counted at a fixed point of the training thread (so that a byte budget or a checkpoint reads the
same counters on every run) is measured into `HeldOps` there and recorded at that point.
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, Optional, Protocol

from dist_algos.comm.pattern import MAIN, WORLD, CommOp, OpKind

#: the clock of every record: perf_counter (CLOCK_MONOTONIC on Linux, one clock for every
#: process of a host); the ledger turns readings into seconds from its rank's start
now = time.perf_counter


def allreduce_bytes(nbytes: int, group_size: int) -> int:
    return 0 if group_size <= 1 else int(2 * (group_size - 1) * nbytes // group_size)


def allgather_bytes(nbytes_per_rank: int, group_size: int) -> int:
    return (group_size - 1) * nbytes_per_rank


def allreduce_bytes_split(parts: Sequence[int], group_size: int) -> list[int]:
    """`allreduce_bytes` of the parts' sum, spread over the parts (DDP's buckets, one collective
    each): part i gets the growth of the cumulative count, so the parts add up to the whole's
    count exactly (counting each part on its own would floor each and change the total)."""
    out, done, counted = [], 0, 0
    for nbytes in parts:
        done += nbytes
        total = allreduce_bytes(done, group_size)
        out.append(total - counted)
        counted = total
    return out


def allreduce_op(nbytes: int, group_size: int, group: str = WORLD, thread: str = MAIN, blocking: bool = True,
                 bucket: Optional[int] = None) -> CommOp:
    """An all_reduce of `nbytes` as this accounting counts it (sent and received alike)."""
    wire = allreduce_bytes(nbytes, group_size)
    return CommOp(OpKind.ALLREDUCE, group, group_size, nbytes, wire, blocking, thread, bucket, recv_bytes=wire)


def allgather_op(nbytes_per_rank: int, group_size: int, group: str = WORLD, thread: str = MAIN,
                 blocking: bool = True, bucket: Optional[int] = None, data_dependent: bool = False) -> CommOp:
    """An all_gather of `nbytes_per_rank` from each member (sent and received alike)."""
    wire = allgather_bytes(nbytes_per_rank, group_size)
    return CommOp(OpKind.ALLGATHER, group, group_size, nbytes_per_rank, wire, blocking, thread, bucket,
                  recv_bytes=wire, data_dependent=data_dependent)


class OpSink(Protocol):
    """Where a helper records an operation it made: the plugin's `CommStats`, or `HeldOps`."""

    def record(self, op: CommOp, issued: float, completed: float, ready: Optional[float] = None) -> None: ...


class OpLog(Protocol):
    """Where recorded operations go (the rank's time ledger, engine/report/ledger_writer.py)."""

    def comm(self, op: CommOp, issued: float, completed: float, ready: Optional[float],
             step: Optional[int]) -> None: ...


class CommStats:
    """Thread-safe counters for one rank (plugins with a communication thread update them too);
    with a ledger attached (`log`), every recorded operation is also logged there."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bytes_sent = 0
        self.bytes_recv = 0
        self.syncs = 0
        self.seconds = 0.0
        self.log: Optional[OpLog] = None

    def record(self, op: CommOp, issued: float, completed: float, ready: Optional[float] = None,
               syncs: int = 0, step: Optional[int] = None) -> None:
        """Count `op`'s bytes (sent: `wire_bytes`, received: `recv_bytes`) and `syncs` rounds,
        and log it with its times (`now()` readings; `ready`: when an overlapped bucket's
        gradients were all there; `step`: the step it was issued at, when that is not the
        ledger's current one). A group of one moves nothing: its round is counted, not logged."""
        with self._lock:
            self.bytes_sent += int(op.wire_bytes)
            self.bytes_recv += int(op.recv_bytes)
            self.syncs += syncs
        if self.log is not None and (op.group_size > 1 or op.wire_bytes or op.recv_bytes):
            self.log.comm(op, issued, completed, ready, step)

    def add(self, syncs: int = 0, seconds: float = 0.0) -> None:
        """Rounds and seconds only: bytes are counted with their operation (`record`)."""
        with self._lock:
            self.syncs += syncs
            self.seconds += seconds

    @contextlib.contextmanager
    def timed(self) -> Iterator[None]:
        """Add the wall time of the enclosed communication to `seconds`."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(seconds=time.perf_counter() - start)

    def as_metrics(self) -> dict[str, float]:
        with self._lock:
            return {"comm_bytes": self.bytes_sent, "comm_recv_bytes": self.bytes_recv,
                    "syncs": self.syncs, "comm_s": round(self.seconds, 6)}

    def state_dict(self) -> dict[str, Any]:
        with self._lock:
            return {"bytes_sent": self.bytes_sent, "bytes_recv": self.bytes_recv,
                    "syncs": self.syncs, "seconds": self.seconds}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._lock:
            self.bytes_sent = int(state["bytes_sent"])
            self.bytes_recv = int(state["bytes_recv"])
            self.syncs = int(state["syncs"])
            self.seconds = float(state["seconds"])


class HeldOps:
    """Operations measured on a thread, counted and logged later by the training thread
    (`replay`), at the step they were issued (`step`)."""

    def __init__(self, step: Optional[int] = None) -> None:
        self.step = step
        self.ops: list[tuple[CommOp, float, float, Optional[float]]] = []

    def record(self, op: CommOp, issued: float, completed: float, ready: Optional[float] = None) -> None:
        self.ops.append((op, issued, completed, ready))

    @property
    def wire_bytes(self) -> int:
        return sum(op.wire_bytes for op, *_ in self.ops)

    def replay(self, stats: CommStats, syncs: int = 0) -> None:
        """Count and log every held op into `stats` (`syncs` rounds with them)."""
        for op, issued, completed, ready in self.ops:
            stats.record(op, issued, completed, ready, step=self.step)
        if syncs:
            stats.add(syncs=syncs)
        self.ops = []
