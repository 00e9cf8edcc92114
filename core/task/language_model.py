"""The language model (text windows): cross-entropy of every position's next token over
N x T x vocab logits.

Metrics `loss` (mean token cross-entropy, nats), `ppl` (perplexity, e^loss), `bpc` (bits per
character, loss / ln 2) and `acc` (next-character accuracy); selects on `val_loss`. Its scored
unit is the character (every position of every window predicts the next one): an accuracy is a
share of the characters, not of the windows, so 512 windows of 64 are 32,768 units. The loss's
standard error is over windows (a window's mean loss), since the characters of one window are
not independent draws.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from core.spec import LANGUAGE_MODEL
from core.task import register_task
from core.task.base import LOSS, Metric, Task, mean_se

PPL = Metric("ppl", False, "perplexity, e^loss")
BPC = Metric("bpc", False, "bits per character, loss / ln 2")
NEXT_ACC = Metric("acc", True, "next-character accuracy")


@register_task(LANGUAGE_MODEL)
class LanguageModel(Task):
    metrics = (LOSS, PPL, BPC, NEXT_ACC)
    selection_metric = "val_loss"
    # summed token cross-entropy, right next tokens, tokens; summed window-mean losses, their
    # squares, windows (the loss's standard error over windows)
    sums_size = 6
    shown = ("loss", "bpc")
    plotted = ("loss", "bpc", "acc")  # (perplexity is e^loss: the loss panel says it)
    unit = "character"

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def _flat(self, output: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return output.float().reshape(-1, output.shape[-1]), target.reshape(-1)

    def loss(self, output: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
        logits, tokens = self._flat(output, target)
        return F.cross_entropy(logits, tokens, label_smoothing=label_smoothing)

    def hits(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return output.argmax(-1) == target

    def count(self, target: torch.Tensor) -> int:
        return target.numel()

    def batch_sums(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits, tokens = self._flat(output, target)
        windows = F.cross_entropy(logits, tokens, reduction="none").double().reshape(len(target), -1).mean(1)
        return torch.tensor([F.cross_entropy(logits, tokens, reduction="sum").item(),
                             (logits.argmax(-1) == tokens).sum().item(), tokens.numel(),
                             windows.sum().item(), windows.square().sum().item(), len(target)], dtype=torch.float64)

    def finish(self, sums: torch.Tensor, prefix: str) -> dict[str, float]:
        count = max(sums[2].item(), 1.0)
        loss = sums[0].item() / count
        return {f"{prefix}_loss": loss, f"{prefix}_ppl": math.exp(min(loss, 700.0)),
                f"{prefix}_bpc": loss / math.log(2), f"{prefix}_acc": sums[1].item() / count}

    def scored(self, sums: torch.Tensor, prefix: str) -> dict[str, float]:
        """The characters scored, and the standard error of the mean loss over the windows."""
        return {f"{prefix}_units": int(sums[2].item()),
                f"{prefix}_loss_se": mean_se(sums[3].item(), sums[4].item(), sums[5].item())}
