"""What a table's metrics are: which direction is better, and which are proportions of an
evaluation set (so that the set's size bounds how finely they can be told apart).

A table compares rows on one headline metric on test (`table.compare_metric`) and chooses
settings on its validation counterpart (`table.select_metric`); both share a direction,
`table.better` (`higher` or `lower`), or, left unset, the direction their names imply:

- higher is better: accuracies (`*_acc`, `*_top5`, `best_val_acc`, `test_acc_at_best`);
- lower is better: losses (`*_loss`), a language model's bits per character and perplexity
  (`*_bpc`, `*_ppl`, as core/task.py names them in summary.json; `bits_per_char`, `perplexity`).

The names of core/task.py's metrics carry one direction in every task (`core.task.METRIC_DIRECTIONS`).

A metric whose name implies neither needs `table.better`; the table refuses it in one line.

Proportions: an accuracy is a share of the N examples it was measured on, so its sampling error
on that set is binomial and known from N (tables/stats.py turns that into a floor under
every interval). A loss or a perplexity is a mean over examples whose spread the runs do not
record, so those metrics get no floor; table.md says so where it applies.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional

from core.task import METRIC_DIRECTIONS


class Better(enum.StrEnum):
    higher = "higher"
    lower = "lower"


_LOWER_SUFFIXES = ("bits_per_char", "perplexity", *(f"_{m}" for m, up in METRIC_DIRECTIONS.items() if not up))
_HIGHER_SUFFIXES = tuple(f"_{m}" for m, up in METRIC_DIRECTIONS.items() if up)


def implied_direction(metric: str) -> Optional[Better]:
    """The direction a metric's name implies (None: its name says nothing)."""
    base = metric.removesuffix("_at_best")
    if base.endswith(_LOWER_SUFFIXES) or base in ("bits_per_char", "perplexity") or METRIC_DIRECTIONS.get(base) is False:
        return Better.lower
    if base.endswith(_HIGHER_SUFFIXES) or METRIC_DIRECTIONS.get(base):
        return Better.higher
    return None


def evaluation_set(metric: str) -> Optional[str]:
    """`test` or `val`: the set a metric was measured on (None: a measurement of the run, such as
    bytes or seconds, not of a set)."""
    if metric.startswith(("test_", "best_test_")):
        return "test"
    if metric.startswith(("val_", "best_val_")):
        return "val"
    return None


def is_proportion(metric: str) -> bool:
    """An accuracy (top-1 or top-5) of an evaluation set: a share of its examples."""
    base = metric.removesuffix("_at_best").removeprefix("best_")
    return evaluation_set(metric) is not None and base.endswith(("_acc", "_top5"))


def sign(better: Better) -> int:
    """+1 when higher is better, -1 when lower is: `sign * (a - b) > 0` means a is better than b."""
    return 1 if better == Better.higher else -1


def reaches(value: float, target: float, better: Better) -> bool:
    """Whether `value` is at least as good as `target` (time- and bytes-to-target)."""
    return value >= target if better == Better.higher else value <= target


@dataclass(frozen=True)
class Headline:
    """The metric a table compares rows on (on test) and chooses settings by (on validation),
    and which way is better for each."""
    compare: str
    select: str
    better: Better  # of `compare`
    select_better: Better

    @property
    def sign(self) -> int:
        return sign(self.better)
