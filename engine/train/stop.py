"""Stopping at a step boundary on a signal (SLURM preemption, Ctrl-C, the time-limit warning).

A signal only sets a flag; the ranks agree on it every `train.preempt_check_every` steps with a
one-element all_reduce (MAX), so all of them checkpoint the same step and exit 0. Agreement is
needed because a signal reaches the ranks at different moments; doing it every few steps rather
than every step keeps wait-avoiding methods from being forced into lock-step. A second signal
exits at once.
"""
from __future__ import annotations

import signal
import sys
from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


class StopSignal:
    def __init__(self) -> None:
        self.received: Optional[str] = None
        self._previous = {}
        for sig in HANDLED:
            self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        if self.received is not None:
            print(f"second {signal.Signals(signum).name}: exiting without a checkpoint", file=sys.stderr, flush=True)
            sys.exit(128 + signum)
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
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


@dataclass(frozen=True)
class Stop:
    kind: str  # stop_after | signal (the checkpoint's reason)
    message: str  # for stopped.json and the user


class StopAgreement:
    """Whether the run stops early at this step boundary, and why: `train.stop_after` (as a
    preemption would stop it) or a signal any rank received. Every rank asks at every step."""

    def __init__(self, stop_after: Optional[int], check_every: int, total_steps: int) -> None:
        self.stop_after, self.check_every, self.total_steps = stop_after, check_every, total_steps
        self.signal = StopSignal()

    def reason(self, step: int) -> Optional[Stop]:
        """Why to stop after `step` (None: go on); a collective every `check_every` steps."""
        if self.stop_after is not None and self.stop_after <= step < self.total_steps:
            return Stop("stop_after", f"train.stop_after={self.stop_after}")
        if self.signal.agreed(step, self.check_every):
            return Stop("signal", f"signal {self.signal.received or 'on another rank'}")
        return None

    def close(self) -> None:
        self.signal.restore()
