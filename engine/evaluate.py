"""Evaluation on the test set, sharded over the evaluating ranks and summed over all ranks."""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


@torch.no_grad()
def evaluate(model: Optional[nn.Module], batches: Any, forward: Callable[[nn.Module, torch.Tensor], torch.Tensor],
             device: torch.device, num_classes: int, group: Optional[dist.ProcessGroup] = None) -> dict[str, float]:
    """Top-1 (and top-5 with more than 5 classes) accuracy and mean loss over the whole test set.

    Every rank calls this (a collective); ranks that do not evaluate pass `model=None` and add
    zeros. `batches` yields this rank's slice of the test set.
    """
    sums = torch.zeros(4, dtype=torch.float64)  # loss, top1, top5, count
    if model is not None:
        was_training = model.training
        model.eval()
        for x, y in batches:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            logits = forward(model, x).float()
            sums[0] += F.cross_entropy(logits, y, reduction="sum").item()
            k = min(5, num_classes)
            top = logits.topk(k, dim=1).indices
            hits = top.eq(y[:, None])
            sums[1] += hits[:, 0].sum().item()
            sums[2] += hits.any(dim=1).sum().item()
            sums[3] += len(y)
        model.train(was_training)
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(sums, group=group)
    count = max(sums[3].item(), 1.0)
    out = {"test_loss": sums[0].item() / count, "test_acc": sums[1].item() / count}
    if num_classes > 5:
        out["test_top5"] = sums[2].item() / count
    return out
