"""The contract of a task: what a run optimises and how it is judged.

A task says what a step differentiates (`loss`), what the evaluator sums over batches and ranks and
how the sums become metrics (`batch_sums`, `finish`), which direction of each metric is better
(`Metric.higher_is_better`) and which validation metric selects by default (`selection_metric`).
Each task is one module of this package behind `@register_task` (core/task/__init__.py); the
metrics two tasks share (`LOSS`, `ACC`) are declared here, once, so a name means one direction in
every task.
"""
from __future__ import annotations

import inspect
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Optional, Sequence

import torch

from core.errors import UserError
from core.spec import DataSpec

PREFIXES = ("best_val_", "val_", "test_", "best_test_")  # how summary.json and metrics.jsonl name a metric
SUFFIXES = ("_at_best",)


@dataclass(frozen=True)
class Metric:
    name: str  # as it appears after `val_` / `test_`: "acc", "loss", ...
    higher_is_better: bool
    meaning: str


LOSS = Metric("loss", False, "mean cross-entropy (nats)")
ACC = Metric("acc", True, "top-1 accuracy")


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
    """Subclasses set `metrics` (in reporting order; an instance may report fewer, as
    classification's top-5 needs more than 5 classes, but never one the class does not declare:
    the class's list is what tables know before a run), `selection_metric`, `sums_size`, and what
    a report shows of them (`shown`: the progress bar's line at an evaluation; `plotted`: the
    panels of a run's curves.png, each a metric against step). `name` is set by `register_task`.

    The constructor's parameters are filled from the data's spec by name (`for_spec`), as a model
    builder's are: `num_classes`, `vocab_size`, or none."""

    name: ClassVar[str]
    metrics: tuple[Metric, ...]
    selection_metric: ClassVar[str]  # the validation metric that selects by default
    sums_size: ClassVar[int]  # the length of `batch_sums`
    shown: ClassVar[tuple[str, ...]]
    plotted: ClassVar[tuple[str, ...]]
    # what a share metric (accuracy) of this task counts: its scored units (`scored`)
    unit: ClassVar[str] = "example"

    def __init__(self) -> None:
        """A task that needs nothing of its input's spec."""

    @classmethod
    def for_spec(cls, spec: DataSpec) -> "Task":
        """This task for inputs like `spec`: each constructor parameter from the spec's field of
        that name (a parameter with a default keeps it where the spec has no such field); one
        line when the spec lacks a field the task needs."""
        params = [p for p in inspect.signature(cls.__init__).parameters.values()
                  if p.name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        fields = spec.fields()
        missing = [p.name for p in params if p.name not in fields and p.default is p.empty]
        if missing:
            raise UserError(f"the {cls.name} task needs the {', '.join(missing)} of its input, which the data's "
                            f"{spec.describe()} do not have; give the data set's spec a task that fits its input")
        return cls(**{p.name: fields[p.name] for p in params if p.name in fields})

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

    def scored(self, sums: torch.Tensor, prefix: str) -> dict[str, float]:
        """What the summed batches' metrics were counted over, as summary.json records it beside
        them: `{prefix}_units`, the number of scored units a share metric (accuracy) is a share of
        (samples; a language model's characters: every position of every window), and
        `{prefix}_loss_se`, the standard error of the mean loss over the set's scoring groups (a
        sample; a window), the sampling error of that one set, which every seed evaluated on it
        shares. Why: a table's floor under an interval is the set's own sampling error, and it
        must count what the metric counts (issue 88: 512 windows are 32,768 characters). {} for a
        task that does not say (a table then reads the set's size in examples)."""
        return {}

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


def mean_se(total: float, squares: float, groups: float) -> float:
    """The standard error of the mean of `groups` values from their sum and sum of squares:
    sqrt(s^2 / n), s^2 the sample variance (NaN below two groups, or for a value not finite)."""
    if groups < 2 or not math.isfinite(total) or not math.isfinite(squares):
        return math.nan
    variance = max(squares - total * total / groups, 0.0) / (groups - 1)
    return math.sqrt(variance / groups)
