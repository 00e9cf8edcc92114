"""A task: what a run optimises and how it is judged. Its training loss on a batch, its evaluation
metrics (summed over batches and ranks, then finished), which direction of each is better, and the
validation metric that selects by default.

Two tasks, named by the data's spec (`core.spec.DataSpec.task`, `task_for`):

- **classification** (images, signals): cross-entropy over N x classes logits; metrics `loss`
  (mean cross-entropy, nats), `acc` (top-1) and `top5` (reported with more than 5 classes),
  exactly the numbers the evaluator has always computed; selects on `val_acc`.
- **language_model** (text windows): cross-entropy of every position's next token over
  N x T x vocab logits; metrics `loss` (mean token cross-entropy, nats), `ppl` (perplexity,
  e^loss), `bpc` (bits per character, loss / ln 2) and `acc` (next-character accuracy); selects
  on `val_loss`.

It sits on the ground floor because everything that speaks of metrics asks it: the plan (the
default and the validity of `checkpoint.best_metric`), a rank's step and evaluator (the loss, the
sums), the summary and the table layer (names and directions), and none of them may import
another's floor. Plugins never see it: they see parameters, gradients and the optimizer.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import torch
import torch.nn.functional as F

from core.spec import CLASSIFICATION, LANGUAGE_MODEL, DataSpec

PREFIXES = ("best_val_", "val_", "test_", "best_test_")  # how summary.json and metrics.jsonl name a metric
SUFFIXES = ("_at_best",)


@dataclass(frozen=True)
class Metric:
    name: str  # as it appears after `val_` / `test_`: "acc", "loss", ...
    higher_is_better: bool
    meaning: str


LOSS = Metric("loss", False, "mean cross-entropy (nats)")
ACC = Metric("acc", True, "top-1 accuracy")
TOP5 = Metric("top5", True, "top-5 accuracy")
PPL = Metric("ppl", False, "perplexity, e^loss")
BPC = Metric("bpc", False, "bits per character, loss / ln 2")
NEXT_ACC = Metric("acc", True, "next-character accuracy")


def base_name(key: str) -> str:
    """`val_acc`, `test_acc_at_best`, `best_val_acc` -> `acc`."""
    for prefix in PREFIXES:
        if key.startswith(prefix):
            key = key[len(prefix):]
            break
    for suffix in SUFFIXES:
        key = key.removesuffix(suffix)
    return key


class Task(ABC):
    """Subclasses set `name`, `metrics` (in reporting order), `selection_metric`, and what a
    report shows of them (`shown`: the progress bar's line at an evaluation; `plotted`: the
    panels of a run's curves.png, each a metric against step)."""

    name: str
    metrics: tuple[Metric, ...]
    selection_metric: str  # the validation metric that selects by default
    sums_size: int  # the length of `batch_sums`
    shown: tuple[str, ...]
    plotted: tuple[str, ...]

    @abstractmethod
    def loss(self, output: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
        """The batch's mean loss (what a step differentiates), in float32."""

    @abstractmethod
    def hits(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Which predictions in the batch are right (top-1), a bool tensor with one entry per
        prediction (the training log's `acc`, summed only when a log step reads it)."""

    def correct(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """How many predictions in the batch are right (top-1), as a tensor."""
        return self.hits(output, target).sum()

    @abstractmethod
    def count(self, target: torch.Tensor) -> int:
        """How many predictions the batch holds: samples, or tokens."""

    @abstractmethod
    def batch_sums(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """This batch's contribution to the evaluation (float64, on the CPU), to be added over
        batches and all-reduced over ranks before `finish`; `zero_sums` is the empty one."""

    @abstractmethod
    def finish(self, sums: torch.Tensor, prefix: str) -> dict[str, float]:
        """The metrics of the summed batches, as `{prefix}_{name}`."""

    def zero_sums(self) -> torch.Tensor:
        return torch.zeros(self.sums_size, dtype=torch.float64)

    def metric(self, key: str) -> Metric:
        name = base_name(key)
        for m in self.metrics:
            if m.name == name:
                return m
        raise KeyError(f"{key} is not a metric of the {self.name} task ({', '.join(m.name for m in self.metrics)})")

    def higher_is_better(self, key: str) -> bool:
        return self.metric(key).higher_is_better

    def better(self, key: str, new: float, old: Optional[float]) -> bool:
        """Whether `new` improves on `old` (None: nothing yet) for metric `key`; a tie does not."""
        if old is None:
            return True
        return new > old if self.higher_is_better(key) else new < old

    def select(self, records: Sequence[Mapping[str, Any]], key: Optional[str] = None) -> Optional[int]:
        """Index of the first record with the best value of `key` (the task's selection metric by
        default) among those that have it; None when none has."""
        key = key or self.selection_metric
        best, best_value = None, None
        for i, record in enumerate(records):
            value = record.get(key)
            if value is not None and self.better(key, value, best_value):
                best, best_value = i, value
        return best


class Classification(Task):
    name = CLASSIFICATION
    selection_metric = "val_acc"
    sums_size = 4  # loss, top-1 hits, top-5 hits, samples
    shown = ("acc", "loss")
    plotted = ("loss", "acc")

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
        float64, top-1 and top-k (k = min(5, classes)) hits, the sample count."""
        logits = output.float()
        hits = logits.topk(min(5, self.num_classes), dim=1).indices.eq(target[:, None])
        return torch.tensor([F.cross_entropy(logits, target, reduction="sum").item(), hits[:, 0].sum().item(),
                             hits.any(dim=1).sum().item(), len(target)], dtype=torch.float64)

    def finish(self, sums: torch.Tensor, prefix: str) -> dict[str, float]:
        count = max(sums[3].item(), 1.0)
        out = {f"{prefix}_loss": sums[0].item() / count, f"{prefix}_acc": sums[1].item() / count}
        if self.num_classes > 5:
            out[f"{prefix}_top5"] = sums[2].item() / count
        return out


class LanguageModel(Task):
    name = LANGUAGE_MODEL
    metrics = (LOSS, PPL, BPC, NEXT_ACC)
    selection_metric = "val_loss"
    sums_size = 3  # summed token cross-entropy, right next tokens, tokens
    shown = ("loss", "bpc")
    plotted = ("loss", "bpc", "acc")  # (perplexity is e^loss: the loss panel says it)

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
        return torch.tensor([F.cross_entropy(logits, tokens, reduction="sum").item(),
                             (logits.argmax(-1) == tokens).sum().item(), tokens.numel()], dtype=torch.float64)

    def finish(self, sums: torch.Tensor, prefix: str) -> dict[str, float]:
        count = max(sums[2].item(), 1.0)
        loss = sums[0].item() / count
        return {f"{prefix}_loss": loss, f"{prefix}_ppl": math.exp(min(loss, 700.0)),
                f"{prefix}_bpc": loss / math.log(2), f"{prefix}_acc": sums[1].item() / count}


#: every metric name of every task, with its direction (the same name means the same direction in
#: every task: a table that has not run yet can tell `test_bpc` is better lower)
METRIC_DIRECTIONS: dict[str, bool] = {m.name: m.higher_is_better for m in (LOSS, ACC, TOP5, PPL, BPC, NEXT_ACC)}


def task_for(spec: DataSpec) -> Task:
    """The task of a data set's spec (its `task` field)."""
    if spec.task == CLASSIFICATION:
        return Classification(spec.fields()["num_classes"])
    if spec.task == LANGUAGE_MODEL:
        return LanguageModel(spec.fields()["vocab_size"])
    raise ValueError(f"no task {spec.task!r}")
