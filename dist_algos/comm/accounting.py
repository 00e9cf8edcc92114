"""Communication accounting shared by every plugin: bytes, synchronisation rounds, seconds.

Byte counts are what this rank puts on the wire for the collective actually used, so methods
can be compared on one axis:
- all_reduce of B bytes in a group of g: 2 (g - 1) / g * B (bandwidth-optimal ring / reduce-scatter
  + all-gather, what NCCL and gloo's ring algorithm send);
- broadcast from the root: B per receiver for the root, 0 for receivers (tree-free lower bound);
- all_gather of B bytes per rank: (g - 1) / g * g * B = (g - 1) * B;
- point-to-point: the payload itself.
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any


def allreduce_bytes(nbytes: int, group_size: int) -> int:
    return 0 if group_size <= 1 else int(2 * (group_size - 1) * nbytes // group_size)


def allgather_bytes(nbytes_per_rank: int, group_size: int) -> int:
    return (group_size - 1) * nbytes_per_rank


class CommStats:
    """Thread-safe counters for one rank (plugins with a communication thread update them too)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bytes_sent = 0
        self.bytes_recv = 0
        self.syncs = 0
        self.seconds = 0.0

    def add(self, sent: int = 0, recv: int = 0, syncs: int = 0, seconds: float = 0.0) -> None:
        with self._lock:
            self.bytes_sent += int(sent)
            self.bytes_recv += int(recv)
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
