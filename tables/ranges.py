"""What a metric's values can be, and when a row's seeds spread too far for a t interval to say
more than that.

Ranges: an accuracy lies in [0, 1], so a difference of two in [-1, 1] (a skew interaction, a
difference of two differences, in [-2, 2]); a loss, bits, bytes, steps and seconds at or above 0,
their differences anywhere. tables/stats.py cuts every interval at its range (`cut`), which keeps
its coverage and changes no verdict.

Unstable rows: a t interval over a few seeds is symmetric about their mean; when the seeds spread
so widely that the seeds' part alone (t(0.975, k-1) s / sqrt(k), before any floor) reaches past the
range, the interval's shape says nothing true any more: ten seeds at 0.97 and one collapsed to
0.10 (MNIST-1D's ef_signsgd@dir0.1, 0.8827 +/- 0.1977), or three seeds at 0.82, 0.58 and 0.46 under
label skew (workers_cpu's dgs.w8@dir0.1, 0.6211 +/- 0.4643, upper end 1.085). Such a row is marked
**unstable** in table.md and table.csv (`unstable`) and drawn hollow in the figures, and its seeds
are listed, so that a reader sees what happened rather than an interval cut in half; so is a row
one of whose seeds diverged (its metric, or its loss on the same set, not finite: MNIST-1D's
lowrank@dir0.1, whose seeds' accuracies from 0.10 to 0.98 still give a t interval inside [0, 1],
ended seed 10 with a NaN loss). The floor is left out of
the rule on purpose: a row whose seeds all score 0.99 on 360 test images has an interval reaching
past 1 only through the test set's floor, and is as stable as a row can be.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Optional

from tables.measure import is_proportion
from tables.stats import Range, half_width

UNSTABLE = "unstable"


def cell_bounds(metric: str) -> Range:
    """What a cell of `metric` can take: [0, 1] for an accuracy, [0, inf) for the rest (losses,
    bits per character, perplexity, bytes, steps, seconds)."""
    return (0.0, 1.0) if is_proportion(metric) else (0.0, math.inf)


def difference_bounds(metric: str, terms: int = 1) -> Range:
    """What a difference of two cells of `metric` can take (`terms` 2: a difference of two
    differences, the skew interaction): [-terms, terms] for an accuracy, unbounded for the rest."""
    return (-float(terms), float(terms)) if is_proportion(metric) else (-math.inf, math.inf)


def unstable_reason(by_seed: Mapping[int, float], metric: str, diverged: Sequence[int] = ()) -> Optional[str]:
    """Why a row's seeds make it unstable on `metric` (module doc), naming each seed's value;
    None for a stable row (or one of fewer than two seeds). `diverged`: the seeds whose loss on
    the metric's set is not finite."""
    if len(by_seed) < 2:
        return None
    shown = ", ".join(f"seed {s}: {v:.4g}" for s, v in sorted(by_seed.items()))
    bad = sorted({*diverged, *(s for s, v in by_seed.items() if not math.isfinite(v))})
    if bad:
        return f"seed {', '.join(map(str, bad))} diverged (a loss not finite); {metric} by {shown}"
    values = list(by_seed.values())
    h, mean = half_width(values), statistics.fmean(values)
    low, high = cell_bounds(metric)
    if h is not None and (mean - h < low or mean + h > high):
        where = f"[{low:g}, {high:g}]" if math.isfinite(high) else f"{low:g} and above"
        return (f"the seeds' t interval over {len(values)} seeds, {mean:.4f} ± {h:.4f}, reaches past {where}: "
                f"{metric} by {shown}")
    return None
