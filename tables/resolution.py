"""What a table can resolve: per variant from its rows' median spread, and per row from its own.

A table's headline power figure used to be one number per variant: the smallest difference the
median row's paired spread resolves with 80% power. That is the median row's, not every row's:
on the language model 10 of 23 IID rows had their own minimum detectable difference above the
0.02 the table claimed to meet (adpsgd 0.042, wagma 0.036), and every verdict is taken at a Holm
step's level, where the table resolves about 0.05 (issue 88). So beside the median figure each
row gets its own:

- `mdd`: the smallest true difference from its baseline that its own comparison (its standard
  error and degrees of freedom: paired, or Welch's; the floor of the evaluation set for an
  accuracy) resolves with 80% power at alpha 0.05, one comparison alone;
- `mdd_step`: the same at the level of the Holm step that decided it (tables/stats.py
  `holm_levels`), the level its verdict was actually taken at;

both by the exact power of tables/power.py. With `table.resolve_target`, table.md counts the rows
whose own figure meets it, at one comparison and at their Holm step, and says so in its headline
sentence, not only the median. A standard deviation from k seeds is itself uncertain: its 95%
range (chi-square, k - 1 degrees of freedom) is printed beside the median, so that a margin
within it (the language model's 0.0194 against 0.02 on 6 seeds) is read as the coin toss it is.
"""
from __future__ import annotations

import math
import statistics
from typing import Optional

from tables.compare import ALPHA, Comparison, Family, n_examples
from tables.config import TableConfig
from tables.measure import is_proportion
from tables.power import Resolution, RowPower, accuracy_floor, detectable, min_detectable, sd_range, seeds_for
from tables.runs import Summary, variant_of


def row_power(table: TableConfig, runs: dict[str, dict[int, Summary]], c: Comparison, metric: str) -> Optional[RowPower]:
    """A baseline comparison's own minimum detectable differences (None without an interval)."""
    d = c.diff
    if d.se_seed is None or d.df is None or d.method not in ("paired", "welch"):
        return None
    share = is_proportion(metric)
    floor = accuracy_floor(n_examples(table, runs, [c.a, c.b], metric) if share else None)
    most = 1.0 if share else None
    return RowPower(c.a, c.variant, d.method, d.se_seed * math.sqrt(max(d.seeds, 1)), d.df, c.level,
                    detectable(d.se_seed, d.df, floor, ALPHA, most=most),
                    detectable(d.se_seed, d.df, floor, c.level, most=most) if c.level is not None else None)


def _meets(value: Optional[float], target: Optional[float]) -> bool:
    return value is not None and target is not None and value <= target


def resolve(table: TableConfig, runs: dict[str, dict[int, Summary]], family: Family, metric: str) -> None:
    """Fill the family's per-variant resolution and per-row power (module doc)."""
    baseline = [c for c in family.comparisons if c.kind == "baseline"]
    family.powers = {p.label: p for p in (row_power(table, runs, c, metric) for c in baseline) if p is not None}
    m = max(family.size, 1)
    target = table.resolve_target
    out = []
    for v in dict.fromkeys(variant_of(r.label) for r in table.rows):
        mine = [p for p in family.powers.values() if p.variant == v]
        counts = dict(rows=len(mine), met=sum(_meets(p.mdd, target) for p in mine) if target else None,
                      met_step=sum(_meets(p.mdd_step, target) for p in mine) if target else None)
        paired = [c for c in baseline if c.variant == v and c.diff.method == "paired" and c.diff.se_seed is not None]
        if not paired:
            out.append(Resolution(v, 0, len(table.seeds), None, None, None, None, **counts))
            continue
        sd = statistics.median(c.diff.se_seed * math.sqrt(c.diff.seeds) for c in paired)  # type: ignore[operator]
        k = int(statistics.median(c.diff.seeds for c in paired))
        n = n_examples(table, runs, [c.a for c in paired] + [c.b for c in paired], metric)
        out.append(Resolution(v, len(paired), k, sd, n, min_detectable(sd, k, n), min_detectable(sd, k, n, ALPHA / m),
                              seeds_for(target, sd, n) if target else None, sd_range(k), **counts))
    family.resolution = out
