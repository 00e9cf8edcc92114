"""Classification (images, signals): one label per input, cross-entropy over N x classes logits.

Metrics `loss` (mean cross-entropy, nats), `acc` (top-1) and `top5` (reported with more than 5
classes), exactly the numbers the evaluator computed before tasks existed (tests/test_task.py
keeps that record); selects on `val_acc`. Its scored unit is the sample: an accuracy is a share of
the samples, and the loss's standard error is over per-sample losses.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from core.spec import CLASSIFICATION
from core.task import register_task
from core.task.base import ACC, LOSS, Metric, Task, mean_se

TOP5 = Metric("top5", True, "top-5 accuracy")


@register_task(CLASSIFICATION)
class Classification(Task):
    metrics = (LOSS, ACC, TOP5)  # an instance drops top5 at 5 classes or fewer
    selection_metric = "val_acc"
    sums_size = 5  # loss, top-1 hits, top-5 hits, samples, summed squared per-sample loss
    shown = ("acc", "loss")
    plotted = ("loss", "acc")
    unit = "sample"

    def __init__(self, num_classes: int) -> None:
        self.num_classes = num_classes
        self.metrics = (LOSS, ACC, TOP5) if num_classes > 5 else (LOSS, ACC)

    def loss(self, output: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
        return F.cross_entropy(output.float(), target, label_smoothing=label_smoothing)

    def hits(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return output.argmax(1) == target

    def count(self, target: torch.Tensor) -> int:
        return len(target)

    def batch_sums(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The evaluator's arithmetic as it has always been: the float32 summed cross-entropy as a
        float64, top-1 and top-k (k = min(5, classes)) hits, the sample count; then the summed
        squares of the per-sample losses, for the loss's standard error (`scored`)."""
        logits = output.float()
        hits = logits.topk(min(5, self.num_classes), dim=1).indices.eq(target[:, None])
        squares = F.cross_entropy(logits, target, reduction="none").double().square().sum().item()
        return torch.tensor([F.cross_entropy(logits, target, reduction="sum").item(), hits[:, 0].sum().item(),
                             hits.any(dim=1).sum().item(), len(target), squares], dtype=torch.float64)

    def finish(self, sums: torch.Tensor, prefix: str) -> dict[str, float]:
        count = max(sums[3].item(), 1.0)
        out = {f"{prefix}_loss": sums[0].item() / count, f"{prefix}_acc": sums[1].item() / count}
        if self.num_classes > 5:
            out[f"{prefix}_top5"] = sums[2].item() / count
        return out

    def scored(self, sums: torch.Tensor, prefix: str) -> dict[str, float]:
        """The samples, and the standard error of the mean per-sample loss over them."""
        return {f"{prefix}_units": int(sums[3].item()),
                f"{prefix}_loss_se": mean_se(sums[0].item(), sums[4].item(), sums[3].item())}
