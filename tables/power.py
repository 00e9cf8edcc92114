"""What a comparison can resolve: the power of a table's interval test, and the smallest true
difference it resolves with 80% power, computed exactly rather than by the normal approximation.

A comparison is resolved at level alpha when its interval excludes 0 (tables/stats.py): |d^| >
h = sqrt((t(1-alpha/2, df) se^)^2 + (z(1-alpha/2) SE_set(d))^2), where d^ is the estimated
difference, se^ the seeds' standard error as estimated from the seeds, df its degrees of freedom
and SE_set(d) the floor of the evaluation set (0 for a metric without one). For a true difference
d, d^ = d + the seeds' noise (normal, standard error se) + the set's (normal, SE_set(d)), and
se^ = se sqrt(u/df) with u ~ chi^2(df). So the power is

    P(d) = E_u[ Phi((d - h(u)) / tau) + Phi((-d - h(u)) / tau) ],   tau = sqrt(se^2 + SE_set(d)^2),

an expectation over u taken by quadrature on u's quantiles. Without a floor it is exactly the
noncentral t's power, P(|T(df, d/se)| > t(1-alpha/2, df)) (tests/test_table_power.py checks it
against scipy's `nct`). Why not the approximation it replaces, d = (t(1-alpha/2, df) + t(power,
df)) se: it ignores the chance of the estimated spread coming out large, which at a strict level
and few degrees of freedom is most of the story: at Holm's first step over 94 comparisons with 6
seeds it claimed 0.049 where the exact power needs 0.054 (issue 88).

`min_detectable` is the d with P(d) = 80%; `seeds_for` the fewest seeds whose paired comparison
reaches a target. A comparison's own standard error and degrees of freedom give each row its
own minimum detectable difference (tables/compare.py), at one comparison's alpha and at the level
of its Holm step.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

import numpy as np

from tables.stats import LEVEL, POWER, difference_se_floor

ALPHA = 1 - LEVEL
NODES = 256  # Gauss-Legendre nodes on u's quantiles: the integrand is smooth and bounded in [0, 1]
SetError = Callable[[float], float]  # the set's standard error of a difference d (the floor)


@functools.lru_cache(maxsize=64)
def _chi_nodes(df: float) -> tuple[np.ndarray, np.ndarray]:
    """sqrt(u/df) at the quadrature's nodes of u ~ chi^2(df), and their weights (summing to 1)."""
    from scipy.stats import chi2

    x, w = np.polynomial.legendre.leggauss(NODES)
    q = (x + 1) / 2
    return np.sqrt(chi2.ppf(q, df) / df), w / 2


@functools.lru_cache(maxsize=1024)
def _quantiles(df: float, alpha: float) -> tuple[float, float]:
    from scipy.stats import norm, t

    return float(t.isf(alpha / 2, df)), float(norm.isf(alpha / 2))


def power(d: float, se: float, df: float, set_error: SetError = lambda _: 0.0, alpha: float = ALPHA) -> float:
    """The chance that a comparison of true difference `d`, seeds' standard error `se` on `df`
    degrees of freedom and the set's standard error `set_error(d)`, is resolved at `alpha` (module
    doc)."""
    from scipy.special import ndtr  # the normal distribution function, without scipy.stats' overhead

    tq, zq = _quantiles(float(df), alpha)
    floor = set_error(abs(d))
    tau = math.hypot(se, floor)
    if tau == 0:
        return 1.0 if abs(d) > 0 else 0.0
    if se == 0:  # the set's error alone: no spread to estimate
        return float(ndtr((d - zq * floor) / tau) + ndtr((-d - zq * floor) / tau))
    scale, weights = _chi_nodes(float(df))
    h = np.sqrt((tq * se * scale) ** 2 + (zq * floor) ** 2)
    return float(np.dot(weights, ndtr((d - h) / tau) + ndtr((-d - h) / tau)))


def detectable(se: float, df: float, set_error: SetError = lambda _: 0.0, alpha: float = ALPHA,
               target: float = POWER, most: Optional[float] = None) -> Optional[float]:
    """The smallest true difference resolved with power `target` (None: none up to `most`, the
    largest difference the metric allows, e.g. 1 for accuracies)."""
    from scipy.optimize import brentq

    if df <= 0 or (se <= 0 and set_error(0.0) <= 0):
        return 0.0 if se <= 0 else None

    def short(d: float) -> float:
        return power(d, se, df, set_error, alpha) - target

    high = most if most is not None else max(se, set_error(0.0), 1e-12)
    while most is None and short(high) < 0:
        high *= 2
    if short(high) < 0:
        return None
    return float(brentq(short, 1e-12, high, xtol=1e-10))


def accuracy_floor(n_examples: Optional[int]) -> SetError:
    """The floor of a difference of accuracies on the same n examples (tables/stats.py), or none."""
    return (lambda d: difference_se_floor(d, n_examples)) if n_examples else (lambda _: 0.0)


def min_detectable(sd: float, seeds: int, n_examples: Optional[int] = None, alpha: float = ALPHA,
                   target: float = POWER) -> Optional[float]:
    """The smallest true difference a paired comparison over `seeds` seeds resolves with power
    `target` at `alpha`, its per-seed differences of standard deviation `sd`, with the floor of a
    difference of accuracies on `n_examples` where given (then at most 1: None when no difference
    of accuracies could be resolved). None below two seeds."""
    if seeds < 2:
        return None
    return detectable(sd / math.sqrt(seeds), seeds - 1, accuracy_floor(n_examples), alpha, target,
                      most=1.0 if n_examples else None)


def seeds_for(target: float, sd: float, n_examples: Optional[int] = None, alpha: float = ALPHA,
              power_target: float = POWER, most: int = 1000) -> Optional[int]:
    """The fewest seeds whose `min_detectable` is at most `target` (None: the floor of n examples
    alone exceeds it, or more than `most` seeds would be needed)."""
    if n_examples and detectable(0.0, 1, accuracy_floor(n_examples), alpha, power_target, 1.0) is None:
        return None
    low, high = 2, 2
    while True:  # min_detectable falls with the seeds: double, then bisect
        d = min_detectable(sd, high, n_examples, alpha, power_target)
        if d is not None and d <= target:
            break
        if high >= most:
            return None
        low, high = high + 1, min(2 * high, most)
    while low < high:
        mid = (low + high) // 2
        d = min_detectable(sd, mid, n_examples, alpha, power_target)
        if d is not None and d <= target:
            high = mid
        else:
            low = mid + 1
    return high


def sd_range(seeds: int, level: float = LEVEL) -> Optional[tuple[float, float]]:
    """The factors by which a standard deviation estimated from `seeds` values may be off at
    `level`: (sqrt(df / chi2(1 - a/2, df)), sqrt(df / chi2(a/2, df))), df = seeds - 1."""
    if seeds < 2:
        return None
    from scipy.stats import chi2

    df, a = seeds - 1, 1 - level
    return math.sqrt(df / chi2.isf(a / 2, df)), math.sqrt(df / chi2.ppf(a / 2, df))


@dataclass
class RowPower:
    """A row's own power against its baseline (module doc)."""
    label: str
    variant: str
    method: str  # paired | welch
    sd: float  # paired: the SD of the per-seed differences; Welch: its standard error x sqrt(seeds)
    df: float
    level: Optional[float]  # the Holm step's level its verdict was taken at
    mdd: Optional[float]  # at alpha 0.05 (None: no difference the metric allows is resolved)
    mdd_step: Optional[float]  # at its Holm step's level


@dataclass
class Resolution:
    """What one variant's comparisons with the baseline could resolve: from the median spread of
    its paired ones, and how many of its rows meet the table's target by their own spread."""
    variant: str
    comparisons: int  # paired comparisons the spread is taken from
    seeds: int
    sd: Optional[float]  # median standard deviation of their per-seed differences
    n_examples: Optional[int]
    mdd: Optional[float]  # smallest difference resolved with 80% power at alpha 0.05
    mdd_holm: Optional[float]  # the same at Holm's strictest level, alpha / m
    seeds_for_target: Optional[int] = None
    sd_range: Optional[tuple[float, float]] = None  # the 95% range of an SD from `seeds` values, as factors
    rows: int = 0  # rows with their own power figure (paired or Welch)
    met: Optional[int] = None  # of them, how many have mdd <= target (None: no target)
    met_step: Optional[int] = None  # ... mdd_step <= target
