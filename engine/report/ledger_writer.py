"""The `report` section and the time ledger a rank keeps when `report.ledger=true`.

Per rank and step the ledger holds the compute segments the trainer times (`SEGMENTS` in
`ledger_format`: data wait, forward and backward, an injected delay, the plugin's step, the
optimizer update inside it) and every communication the plugin counts, with its issue and
completion times (and, for a bucket overlapped with backward, when its gradients were ready):
the plugin's `CommStats` logs each operation here as it counts it (`OpLog`), so the ledger's
bytes are the byte counters' by construction. That is the raw material of a time model
(issue 86): what each rank computed and sent, step by step, on this machine.

The clock is `time.perf_counter` (CLOCK_MONOTONIC: one clock for every process of a host), read
as seconds since this attempt's origin, taken when the trainer starts; `origin_unix` is the
wall-clock time of that origin, which aligns ranks and attempts. Records are kept in memory as
plain tuples (a few per step: the ledger costs microseconds a step) and written, as one part
file per rank (`ledger_format`), at every checkpoint and at the end: a part is what was recorded
since the last write. A resumed run is a new attempt with its own parts; the reader stitches
them, a later attempt replacing an earlier one's records from the step it resumed at. Off (the
default), nothing is timed or kept and no file is written.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from core.rundir import RunDir
from core.schema import Section
from dist_algos.comm.pattern import CommOp, ParamLayout
from engine.report.ledger_format import SEGMENTS, write_part

DATA_WAIT, FORWARD_BACKWARD, IMBALANCE, PLUGIN, OPTIMIZER = range(len(SEGMENTS))


@dataclass
class ReportConfig(Section):
    """What a run records for analysis besides its metrics (`report.*`)."""

    ledger: bool = False  # the time ledger: compute segments and communications per rank and step


def part_path(run_dir: RunDir, rank: int, origin_ns: int, part: int) -> Path:
    """Where part `part` of the attempt begun at `origin_ns` (wall clock) lies; names sort in time."""
    return run_dir.ledger / f"rank_{rank}" / f"part_{origin_ns:020d}_{part:04d}.npz"


class RankLedger:
    """One rank's time ledger (see the module docstring); inert when `cfg.ledger` is false."""

    def __init__(self, cfg: ReportConfig, run_dir: RunDir, rank: int, world: int, local_size: int,
                 total_steps: int, steps_per_epoch: int, layout: ParamLayout) -> None:
        self.on = cfg.ledger
        self.run_dir, self.layout = run_dir, layout
        self.meta = {"rank": rank, "world": world, "local_size": local_size, "start_step": 0, "part": 0,
                     "total_steps": total_steps, "steps_per_epoch": steps_per_epoch,
                     "element_size": layout.element_size}
        self.origin = time.perf_counter()
        self.meta["origin_ns"] = self.origin_ns = time.time_ns()
        self.step = 0  # the training step now under way (ops issued meanwhile belong to it)
        self._segments: list[tuple[int, int, float, float]] = []
        self._ops: list[tuple[int, int, CommOp, float, float, Optional[float]]] = []
        self._seq = 0
        self._lock = threading.Lock()

    @classmethod
    def build(cls, cfg: ReportConfig, run_dir: RunDir, rank: int, world: int, local_size: int, total_steps: int,
              steps_per_epoch: int, model: Any) -> "RankLedger":
        """This rank's ledger for a model (its layout is read only when the ledger is on)."""
        layout = ParamLayout.of(model) if cfg.ledger else ParamLayout(())
        return cls(cfg, run_dir, rank, world, local_size, total_steps, steps_per_epoch, layout)

    def start(self, step: int) -> None:
        """This attempt trains from `step` on (0, or the checkpoint it resumed from)."""
        self.meta["start_step"] = self.step = step

    def begin_step(self, step: int) -> None:
        self.step = step

    def segment(self, kind: int, start: float, end: float) -> None:
        """A compute segment of the current step (`perf_counter` readings)."""
        if self.on:
            self._segments.append((self.step, kind, start - self.origin, end - self.origin))

    def timed(self, kind: int, fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn`, timed as a segment of `kind` on each call (`fn` itself when the ledger is off)."""
        if not self.on:
            return fn

        def call(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.segment(kind, start, time.perf_counter())

        return call

    def comm(self, op: CommOp, issued: float, completed: float, ready: Optional[float],
             step: Optional[int]) -> None:
        """`OpLog`: one communication, from any thread (`CommStats.record`)."""
        o = self.origin
        with self._lock:
            self._ops.append((self.step if step is None else step, self._seq, op, issued - o, completed - o,
                              None if ready is None else ready - o))
            self._seq += 1

    def log(self) -> Optional["RankLedger"]:
        """What the plugin's `CommStats.log` is set to: this ledger when it is on."""
        return self if self.on else None

    def flush(self) -> None:
        """Write what was recorded since the last write as this attempt's next part (every rank,
        at each checkpoint and at the end)."""
        if not self.on:
            return
        with self._lock:
            segments, ops, self._segments, self._ops = self._segments, self._ops, [], []
        self.meta["origin_ns"] = self.origin_ns
        write_part(part_path(self.run_dir, self.meta["rank"], self.origin_ns, self.meta["part"]), self.meta,
                   self.layout, segments, ops)
        self.meta["part"] += 1
