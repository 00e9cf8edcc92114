"""Intervals over seeds with a floor from the evaluation set: what a table may claim from a few
runs per row. docs/tables.md states every formula; the notation here is the same.

A cell over k seeds is its mean and a 95% interval of half-width

    h = sqrt(h_seed^2 + h_set^2),  h_seed = t(0.975, k-1) s / sqrt(k),  h_set = z(0.975) SE_set

s the sample standard deviation over seeds. For an accuracy, a share of N scored units (the units
its task scores: samples, a language model's characters; tables/runs.py `scored_units`), SE_set
is the Agresti-Coull standard error of a proportion, sqrt(p~(1-p~) / (N+4)) with p~ = (N p + 2) /
(N+4): the seeds share one test set, so its sampling error does not average out over seeds, and a
row whose seeds all score the same (s = 0) still gets the interval its N units allow, never width
0. A loss's SE_set is the set's standard error of the mean loss its runs record (`se_set`); other
metrics (bytes, seconds), and a loss whose runs record none, get h_seed alone. One seed: no
interval.

A difference of two rows (a - b) is PAIRED by seed when both have the same seeds and share what
a seed fixes (tables/compare.py decides: the same training-rank count and partition), the
t interval of the per-seed differences (df = k-1); otherwise Welch's unequal-variance interval
(Welch-Satterthwaite df). Its floor: at least N|d| test examples must be classified differently
by the two for their accuracies to differ by d, and a difference resting on b examples has
standard error at least sqrt(b)/N; SE_set = sqrt(q~(1-q~) / (N+4)) with q~ = (N|d| + 2) / (N+4)
(Agresti-Coull on the discordant share). With z = 1.96 a difference of fewer than 6 test examples
is never resolved, as the exact sign test on 5 of 5 discordant examples (p = 0.0625) would not.

The p-value of a difference is the level at which its interval just reaches 0 (so "resolved at
95%" is "p < 0.05"); `holm` corrects a table's family of p-values (Holm 1979), and `holm_levels`
gives each comparison the level of the Holm step that decided it, at which its drawn interval
excludes 0 exactly when Holm resolves it. What a comparison can resolve with 80% power is
tables/power.py's.

Intervals stay in the metric's range (`cut`): an accuracy's cell in [0, 1], a difference of two in
[-1, 1], a loss's cell at or above 0. A t interval over a few seeds that spread widely (a seed
that collapsed to chance beside nine that did not) reaches past what the metric can take; the
interval is cut there, which keeps its coverage (the true value lies in the range, so it lies in
the interval exactly when it lies in the cut one), and the row is marked unstable
(tables/ranges.py): its seeds, not the interval's shape, say what happened. Cutting never moves an
end across 0, so no verdict and no p-value changes.

Quantiles are scipy's (scipy comes with scikit-learn and is pinned in requirements.txt).
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

LEVEL = 0.95
POWER = 0.8


def t_quantile(df: float, level: float = LEVEL) -> float:
    """The two-sided `level` quantile of Student's t with `df` degrees of freedom."""
    from scipy.stats import t

    return float(t.ppf(0.5 + level / 2, df))


def _t_isf(tail: float, df: float) -> float:
    from scipy.stats import t

    return float(t.isf(tail, df))


def _z_isf(tail: float) -> float:
    from scipy.stats import norm

    return float(norm.isf(tail))


def half_width(values: Sequence[float], level: float = LEVEL) -> Optional[float]:
    """Half the width of the t interval of the mean of `values` (None below two values): the seed
    part alone, h_seed."""
    n = len(values)
    if n < 2:
        return None
    return t_quantile(n - 1, level) * statistics.stdev(values) / math.sqrt(n)


def share_se(share: float, n: int) -> float:
    """The Agresti-Coull standard error of a share of n examples: sqrt(p~(1-p~)/(n+4)),
    p~ = (n share + 2)/(n + 4); never 0, also at a share of 0 or 1."""
    p = (n * min(max(share, 0.0), 1.0) + 2) / (n + 4)
    return math.sqrt(p * (1 - p) / (n + 4))


def cell_half_width(values: Sequence[float], n_examples: Optional[int] = None,
                    level: float = LEVEL, se_set: Optional[float] = None) -> Optional[float]:
    """h = sqrt(h_seed^2 + h_set^2) of a cell (None below two values); `n_examples` given only for
    a proportion (an accuracy of that many scored units), or `se_set`, the set's standard error of
    a mean (a loss's, as its runs record it), else h = h_seed."""
    seed = half_width(values, level)
    if seed is None or not (n_examples or se_set):
        return seed
    z = _z_isf((1 - level) / 2)
    return math.hypot(seed, z * (share_se(statistics.fmean(values), n_examples) if n_examples else se_set))


def difference_se_floor(mean_difference: float, n_examples: Optional[int]) -> float:
    """SE_set of a difference of two accuracies on the same n examples (see the module doc);
    0 without n (no floor)."""
    return share_se(abs(mean_difference), n_examples) if n_examples else 0.0


Range = tuple[float, float]  # what a value can take: (low, high)
UNBOUNDED: Range = (-math.inf, math.inf)


def cut(low: float, high: float, bounds: Range = UNBOUNDED) -> tuple[float, float]:
    """An interval cut at the range a value can take (module doc)."""
    return max(low, bounds[0]), min(high, bounds[1])


@dataclass(frozen=True)
class Difference:
    """An estimate (a difference of rows, or a contrast of differences), its 95% interval, and the
    parts it was built from: the seeds' standard error and degrees of freedom, and the floor; its
    intervals are cut at `bounds`, the range the estimate can take."""
    mean: float
    low: Optional[float]
    high: Optional[float]
    method: str  # paired | welch | none (too few seeds for an interval)
    se_seed: Optional[float] = None
    df: Optional[float] = None
    se_set: float = 0.0
    seeds: int = 0  # per-seed values it rests on (paired: pairs; welch: the smaller side)
    bounds: Range = UNBOUNDED

    @property
    def resolved(self) -> bool:
        return self.low is not None and self.high is not None and (self.low > 0 or self.high < 0)

    def half_width(self, level: float = LEVEL) -> Optional[float]:
        """sqrt((t(level, df) se_seed)^2 + (z(level) se_set)^2) (None without an interval)."""
        return self._half_width_at(1 - level)

    def _half_width_at(self, alpha: float) -> Optional[float]:
        if self.se_seed is None or self.df is None:
            return None
        seed = _t_isf(alpha / 2, self.df) * self.se_seed if self.se_seed else 0.0
        return math.hypot(seed, _z_isf(alpha / 2) * self.se_set)

    def interval(self, level: float = LEVEL) -> tuple[Optional[float], Optional[float]]:
        """The interval at `level`, cut at the range the estimate can take."""
        h = self.half_width(level)
        return (None, None) if h is None else cut(self.mean - h, self.mean + h, self.bounds)

    def leaves_range(self, level: float = LEVEL) -> bool:
        """Whether the interval as computed reached past the range (and was cut)."""
        h = self.half_width(level)
        return h is not None and (self.mean - h < self.bounds[0] or self.mean + h > self.bounds[1])

    @property
    def p_value(self) -> Optional[float]:
        """The two-sided level at which the interval's edge reaches 0 (None without an interval)."""
        if self.se_seed is None or self.df is None:
            return None
        if self.mean == 0:
            return 1.0
        if self.se_seed == 0 and self.se_set == 0:
            return 0.0
        from scipy.optimize import brentq

        def gap(log_alpha: float) -> float:
            return self._half_width_at(math.exp(log_alpha)) - abs(self.mean)

        lo = math.log(1e-300)
        if gap(lo) <= 0:
            return 1e-300
        if gap(0.0) >= 0:
            return 1.0
        return math.exp(brentq(gap, lo, 0.0, xtol=1e-12))


def _built(mean: float, se_seed: Optional[float], df: Optional[float], se_set: float, method: str, seeds: int,
           level: float, bounds: Range) -> Difference:
    d = Difference(mean, None, None, method, se_seed, df, se_set, seeds, bounds)
    low, high = d.interval(level)
    return Difference(mean, low, high, method, se_seed, df, se_set, seeds, bounds)


def one_sample(values: Sequence[float], se_set: float = 0.0, level: float = LEVEL,
               bounds: Range = UNBOUNDED) -> Difference:
    """The interval of the mean of per-seed values (paired differences, or contrasts of them)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return Difference(mean, None, None, "none", seeds=len(values), bounds=bounds)
    se = statistics.stdev(values) / math.sqrt(len(values))
    return _built(mean, se, len(values) - 1, se_set, "paired", len(values), level, bounds)


def two_samples(a: Sequence[float], b: Sequence[float], se_set: float = 0.0, level: float = LEVEL,
                bounds: Range = UNBOUNDED) -> Difference:
    """Welch's interval of mean(a) - mean(b), unpaired (two values or more on each side)."""
    mean = statistics.fmean(a) - statistics.fmean(b)
    if len(a) < 2 or len(b) < 2:
        return Difference(mean, None, None, "none", seeds=min(len(a), len(b)), bounds=bounds)
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:
        df = float(len(a) + len(b) - 2)  # no spread on either side: df does not matter, h = the floor
    else:
        df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))  # Welch-Satterthwaite
    return _built(mean, se, df, se_set, "welch", min(len(a), len(b)), level, bounds)


def difference(row: dict[int, float], base: dict[int, float], level: float = LEVEL,
               n_examples: Optional[int] = None, paired: bool = True,
               bounds: Range = UNBOUNDED) -> Optional[Difference]:
    """`row` minus `base` (values by seed): paired by seed when `paired` and both have the same
    seeds (two or more), else Welch's interval (two or more values on each side); the floor of a
    difference of accuracies on `n_examples` when given; intervals cut at `bounds`. None without
    values."""
    if not row or not base:
        return None
    if paired and set(row) == set(base):
        diffs = [row[s] - base[s] for s in sorted(row)]
        return one_sample(diffs, difference_se_floor(statistics.fmean(diffs), n_examples), level, bounds)
    a, b = list(row.values()), list(base.values())
    mean = statistics.fmean(a) - statistics.fmean(b)
    return two_samples(a, b, difference_se_floor(mean, n_examples), level, bounds)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's adjusted p-values, in the given order: with p_(1) <= ... <= p_(m),
    adj_(j) = max over i <= j of min(1, (m - i + 1) p_(i)). A comparison is resolved when its
    adjusted p < alpha, which controls the chance of any false resolution in the family at alpha."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def holm_levels(pvalues: Sequence[float], alpha: float = 1 - LEVEL) -> list[float]:
    """Each comparison's level of significance at its Holm step: alpha / (m - j + 1) for the j-th
    smallest p while every smaller one was resolved, and, from the first comparison Holm does not
    resolve on, the level of that step. An interval drawn at 1 minus this level excludes 0 exactly
    when Holm resolves the comparison."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    levels, stopped = [alpha] * m, None
    for rank, i in enumerate(order):
        step = alpha / (m - rank)
        if stopped is None and not pvalues[i] < step:
            stopped = step
        levels[i] = step if stopped is None else stopped
    return levels
