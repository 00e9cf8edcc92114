"""Choosing a leader from the workers' recent training losses (LSGD), and pulling towards it.

Each worker keeps the running mean of its last `window` minibatch losses (`RunningLoss`); at a
refresh the group gathers (rank, mean) pairs (`gather_losses`) and the lowest mean leads
(`choose_leader`). The losses stay on the model's device between refreshes, so recording a loss
costs no host synchronisation; only the refresh reads them back.

The reference implementation divides the ring buffer's sum by its full length even before it is
filled (zeros count); here the mean is over the losses seen so far. In a synchronous run every
worker has seen the same number of losses, so both give the same leader.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, Optional

import torch
import torch.distributed as dist


class RunningLoss:
    """Mean of the last `window` losses, kept in a ring buffer on `device` (float64)."""

    def __init__(self, window: int, device: torch.device) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1, not {window}")
        self.window = window
        self.values = torch.zeros(window, dtype=torch.float64, device=device)
        self.count = 0

    def add(self, loss: torch.Tensor | float) -> None:
        value = loss.detach().to(self.values.device, torch.float64) if isinstance(loss, torch.Tensor) else loss
        self.values[self.count % self.window] = value
        self.count += 1

    def mean(self) -> torch.Tensor:
        """The running mean as a 0-d tensor on the device (+inf before the first loss)."""
        seen = min(self.count, self.window)
        if seen == 0:
            return torch.full((), math.inf, dtype=torch.float64, device=self.values.device)
        return self.values[:seen].sum() / seen

    def state_dict(self) -> dict[str, Any]:
        return {"values": self.values.clone(), "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["values"].numel() != self.window:
            raise ValueError(f"loss window of {state['values'].numel()} in the checkpoint, {self.window} configured")
        self.values.copy_(state["values"])
        self.count = int(state["count"])


def choose_leader(candidates: Iterable[tuple[int, float]]) -> int:
    """The rank with the lowest loss; ties go to the lowest rank (as Python's `min` over rank
    order in the reference), and a non-finite (diverged) loss never leads over a finite one."""
    def key(pair: tuple[int, float]) -> tuple[float, int]:
        rank, loss = pair
        return (loss if math.isfinite(loss) else math.inf, rank)

    pairs = list(candidates)
    if not pairs:
        raise ValueError("choose_leader: no candidates")
    return min(pairs, key=key)[0]


def gather_losses(rank: int, mean: torch.Tensor, group: Optional[Any], group_size: int) -> list[tuple[int, float]]:
    """All-gather (rank, running mean) over `group` (None: the world); one small collective."""
    message = torch.stack([torch.tensor(float(rank), dtype=torch.float64, device=mean.device),
                           mean.to(torch.float64)])
    if group_size == 1:
        gathered = [message]
    else:
        gathered = [torch.empty_like(message) for _ in range(group_size)]
        dist.all_gather(gathered, message, group=group)
    rows = torch.stack(gathered).cpu().tolist()
    return [(int(r), float(loss)) for r, loss in rows]


def pull_towards_(params: Sequence[torch.Tensor], target: Sequence[torch.Tensor], strength: float) -> None:
    """x = (1 - strength) x + strength target, in place, buffer by buffer (the reference's 'mix')."""
    if strength == 0.0:
        return
    for x, t in zip(params, target):
        x.mul_(1.0 - strength).add_(t, alpha=strength)
