"""Stopping at a step boundary: on a signal (SLURM preemption, Ctrl-C, the time-limit warning),
at `train.stop_after`, or when a budget is spent (`Budget`).

A signal only sets a flag; the ranks agree on it every `train.preempt_check_every` steps with a
one-element all_reduce (MAX), so all of them checkpoint the same step and exit 0. Agreement is
needed because a signal reaches the ranks at different moments; doing it every few steps rather
than every step keeps wait-avoiding methods from being forced into lock-step. A second signal
exits at once.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from core import stop_signals
from engine.train.train_state import TrainState

log = logging.getLogger("syncopt")


class StopSignal:
    def __init__(self) -> None:
        self.received: Optional[str] = None
        self._previous = stop_signals.install(self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        if self.received is not None:
            print(f"second {signal.Signals(signum).name}: exiting without a checkpoint", file=sys.stderr, flush=True)
            # at once: not through the interpreter's exit, which joins every thread first, and one may be
            # blocked in a native call for an hour (a torchft quorum); what was written stays written
            os._exit(128 + signum)
        self.received = signal.Signals(signum).name

    def agreed(self, step: int, every: int, group: Optional[dist.ProcessGroup] = None) -> bool:
        """Whether any rank has been signalled; a collective on every rank at the same steps."""
        if step % every:
            return False
        if dist.get_world_size(group) == 1:
            return self.received is not None
        flag = torch.tensor([1 if self.received is not None else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        return bool(flag.item())

    def restore(self) -> None:
        stop_signals.restore(self._previous)


@dataclass(frozen=True)
class Stop:
    kind: str  # stop_after | signal (the checkpoint's reason)
    message: str  # for stopped.json and the user


@dataclass(frozen=True)
class Budget:
    """What a run may spend before it ends (`train.budget_*`), so that rows of a table compare at
    equal cost rather than equal steps. Unlike a stop, a spent budget ENDS the run: the plugin's
    finalize, the final evaluation, the final checkpoint and summary.json (`stop_reason`,
    `budget`, `spent`).

    The ranks must end at the same step. Samples are known on every rank without talking (step x
    samples per step, the same everywhere, servers included), so that budget ends the run at
    exactly the first step that reaches it. Bytes differ per rank and wall-clock drifts, so those
    are agreed by one all_reduce (SUM of the bytes sent, and of the ranks past the wall budget)
    every `train.preempt_check_every` steps, like the stop signal: the run may overshoot them by
    up to that many steps less one (set it to 1 for an exact bytes budget).
    """
    samples: Optional[int] = None
    bytes: Optional[int] = None
    wall_s: Optional[float] = None

    @classmethod
    def of(cls, train_cfg: Any) -> "Budget":
        return cls(train_cfg.budget_samples, train_cfg.budget_bytes, train_cfg.budget_wall_s)

    def active(self) -> bool:
        return self.samples is not None or self.needs_agreement()

    def needs_agreement(self) -> bool:
        return self.bytes is not None or self.wall_s is not None

    def record(self) -> dict[str, Any]:
        return {"samples": self.samples, "bytes": self.bytes, "wall_s": self.wall_s}

    def spent(self, kind: str, amount: float) -> bool:
        """Whether `amount` of `kind` (samples | bytes | wall_s) spends this budget."""
        limit = getattr(self, kind)
        return limit is not None and amount >= limit


class StopAgreement:
    """Whether the run stops early at this step boundary, and why: `train.stop_after` (as a
    preemption would stop it) or a signal any rank received; and whether a budget is spent
    (`budget_spent`, asked first, so that the run's end is evaluated and checkpointed once).
    Every rank asks both at every step."""

    def __init__(self, stop_after: Optional[int], check_every: int, total_steps: int,
                 budget: Budget = Budget(), samples_per_step: int = 0) -> None:
        self.stop_after, self.check_every, self.total_steps = stop_after, check_every, total_steps
        self.budget, self.samples_per_step = budget, samples_per_step
        self.signal = StopSignal()
        # fault-tolerant mode: the replicas agree on a stop in their rounds instead (engine/ft/rank/rounds.py):
        # None while there is none, else a note on why ("": a signal, agreed in a round)
        self.agreement: Optional[Callable[[], Optional[str]]] = None

    def budget_spent(self, step: int, sent_bytes: int, elapsed_s: float,
                     group: Optional[dist.ProcessGroup] = None) -> Optional[dict[str, Any]]:
        """The record of the budget spent at `step` ({reason, step, spent}; None: go on). A
        collective at the agreement steps when a bytes or wall-clock budget is set."""
        samples = step * self.samples_per_step
        if self.budget.spent("samples", samples):
            return {"reason": "budget_samples", "step": step, "spent": samples}
        if not self.budget.needs_agreement() or step % self.check_every:
            return None
        mine = [float(sent_bytes), 1.0 if self.budget.spent("wall_s", elapsed_s) else 0.0]
        if dist.get_world_size(group) > 1:
            agreed = torch.tensor(mine, dtype=torch.float64)
            dist.all_reduce(agreed, group=group)
            mine = agreed.tolist()
        if self.budget.spent("bytes", mine[0]):
            return {"reason": "budget_bytes", "step": step, "spent": int(mine[0])}
        if mine[1] > 0:  # the longest rank's wall-clock, the same record on every rank (resume reads it)
            longest = torch.tensor([elapsed_s], dtype=torch.float64)
            if dist.get_world_size(group) > 1:
                dist.all_reduce(longest, op=dist.ReduceOp.MAX, group=group)
            return {"reason": "budget_wall_s", "step": step, "spent": round(longest.item(), 3)}
        return None

    def still_spent(self, record: Optional[dict[str, Any]]) -> bool:
        """On resume: whether the budget that ended the run is spent under this run's settings
        (a raised or removed budget lets training go on)."""
        if not record:
            return False
        return self.budget.spent(record["reason"].removeprefix("budget_"), record["spent"])

    def resumed_spent(self, st: TrainState, train_cfg: Any, reporting: bool) -> bool:
        """A resumed run that a budget ended continues to nothing while that budget is spent
        (it re-reports, as a finished run does); a raised or removed budget trains on."""
        if st.budget_stop is None:
            return False
        if self.still_spent(st.budget_stop):
            if reporting:
                kind = st.budget_stop["reason"]
                log.warning("nothing to continue: train.%s=%s was spent at step %d (%s); the run is complete. "
                            "Raise train.%s to train on", kind, getattr(train_cfg, kind),
                            st.budget_stop["step"], st.budget_stop["spent"], kind)
            return True
        st.budget_stop, st.finalized = None, False
        return False

    def summary(self, record: Optional[dict[str, Any]], spent: dict[str, Any]) -> dict[str, Any]:
        """summary.json's account: why the run ended (`steps`: it ran them all), the budget, and
        what was spent (`spent`: samples, all ranks' bytes and wall-clock at the end, the
        plugin's finalize and the final evaluation included)."""
        return {"stop_reason": record["reason"] if record else "steps", "budget": self.budget.record(),
                "spent": spent, **({"budget_step": record["step"]} if record else {})}

    def reason(self, step: int) -> Optional[Stop]:
        """Why to stop after `step` (None: go on); a collective every `check_every` steps."""
        if self.stop_after is not None and self.stop_after <= step < self.total_steps:
            return Stop("stop_after", f"train.stop_after={self.stop_after}")
        if self.agreement is not None:
            note = self.agreement()
            if note is None:
                return None
            if self.signal.received is None:
                return Stop("signal", note or "signal on another replica")
            said = f"signal {self.signal.received}"
            return Stop("signal", f"{said}: {note}" if note else said)
        if self.signal.agreed(step, self.check_every):
            return Stop("signal", f"signal {self.signal.received or 'on another rank'}")
        return None

    def close(self) -> None:
        self.signal.restore()
