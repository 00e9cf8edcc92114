"""Intervals over seeds: what a table may claim from a few runs per row.

A cell over n seeds is its mean and a 95% Student-t interval, mean +- t(0.975, n-1) s / sqrt(n)
(s the sample standard deviation): with 3 seeds t = 4.303, so an interval is wide, which is the
point; one seed has no interval. A row's difference from its baseline row is "resolved" when
the 95% interval of the difference excludes 0.

The difference is PAIRED by seed when both rows have results for the same seeds (a seed fixes the
initial model, the data order and the partition, so two methods' runs at one seed share those
sources of noise and their difference is less noisy than either), the t interval of the
per-seed differences; otherwise (seeds missing on one side) Welch's unequal-variance interval.
The t quantile is scipy's (scipy comes with scikit-learn and is pinned in requirements.txt).
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

LEVEL = 0.95


def t_quantile(df: float, level: float = LEVEL) -> float:
    """The two-sided `level` quantile of Student's t with `df` degrees of freedom."""
    from scipy.stats import t

    return float(t.ppf(0.5 + level / 2, df))


def half_width(values: Sequence[float], level: float = LEVEL) -> Optional[float]:
    """Half the width of the t interval of the mean of `values` (None below two values)."""
    n = len(values)
    if n < 2:
        return None
    return t_quantile(n - 1, level) * statistics.stdev(values) / math.sqrt(n)


@dataclass(frozen=True)
class Difference:
    """A row's mean minus its baseline's, its interval, and how the interval was formed."""
    mean: float
    low: Optional[float]
    high: Optional[float]
    method: str  # paired | welch | none (too few seeds for an interval)

    @property
    def resolved(self) -> bool:
        return self.low is not None and self.high is not None and (self.low > 0 or self.high < 0)


def difference(row: dict[int, float], base: dict[int, float], level: float = LEVEL) -> Optional[Difference]:
    """`row` minus `base` (values by seed): paired by seed when both have the same seeds (two or
    more), else Welch's interval (two or more values on each side); None without values."""
    if not row or not base:
        return None
    if set(row) == set(base):
        diffs = [row[s] - base[s] for s in sorted(row)]
        mean = statistics.fmean(diffs)
        h = half_width(diffs, level)
        return Difference(mean, None if h is None else mean - h, None if h is None else mean + h,
                          "paired" if h is not None else "none")
    a, b = list(row.values()), list(base.values())
    mean = statistics.fmean(a) - statistics.fmean(b)
    if len(a) < 2 or len(b) < 2:
        return Difference(mean, None, None, "none")
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        return Difference(mean, mean, mean, "welch")
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))  # Welch-Satterthwaite
    h = t_quantile(df, level) * se
    return Difference(mean, mean - h, mean + h, "welch")
