"""A table's comparisons as one family: each row against its baseline, the skew interaction, the
declared pairs; which of them may be paired by seed; Holm's correction across all of them; and
the smallest difference each variant could resolve.

Pairing. A seed fixes a run's initial model, its data order and its partition of the training
data over the training ranks (data/split.py: a pure function of the seed, the number of training
ranks and the partition settings). Two rows share those only when their runs at a seed have the
same number of training ranks and the same partition settings (summary.json `train_ranks`,
`data_split`); such rows are compared PAIRED by seed. A parameter-server row on 8 ranks trains on
7 (rank 0 serves), so at the same seed it draws another partition than an 8-rank allreduce; a
one-process row (msgd) has no partition at all. Those are compared UNPAIRED (Welch), and the
table says why in one line. A parameter-server row is made paired by giving it one more rank
(`launch.nproc=9`: 8 training ranks, the baseline's partition and global batch). Runs that do not
record these facts (before they were recorded) are taken as paired, as before.

A one-process row under a skewed variant trains on all the data whatever the partition says: it is
marked in one line ("no partition to skew") and kept out of the skew interaction.

The skew interaction (`table.interaction_from: iid`): for a row R with baseline B and each other
variant V, I = (R@V - R@iid) - (B@V - B@iid), the row's change from IID to V against its
baseline's: positive when R holds up better than B on a higher-is-better metric. Paired by seed
when all four runs of a seed pair (R with B under both variants); otherwise Welch's interval
between R's per-seed drops and B's. Its floor combines the floors of the two differences it is
made of, sqrt(SE(R@V - B@V)^2 + SE(R@iid - B@iid)^2).

Every comparison with an interval has a p-value (tables/stats.py) and the family is
corrected by Holm's step-down method: a comparison is **resolved** when its Holm-adjusted p is
below 0.05, and its corrected interval is drawn at the level of the Holm step that decided it.
Its intervals stay in the range a difference can take (tables/ranges.py). A paired comparison
with a seed whose two runs ran on different machine types is flagged, or refused
(`table.mixed_machines`, tables/machines.py). What each comparison could resolve is
tables/resolution.py's.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Optional

from tables.config import TableConfig
from tables.machines import mixed_note
from tables.measure import Headline, is_proportion
from tables.power import Resolution, RowPower
from tables.ranges import difference_bounds
from tables.runs import EVALUATED_ON, Summary, row_of, scored_units, split_fact, variant_of
from tables.stats import LEVEL, Difference, difference, difference_se_floor, holm, holm_levels, one_sample, two_samples

ALPHA = 1 - LEVEL


@dataclass
class Comparison:
    kind: str  # baseline | interaction | declared
    name: str  # what is compared, as table.md shows it
    a: str  # the label measured (interaction: the row under the skewed variant)
    b: str  # the label it is measured against (interaction: the baseline under that variant)
    variant: str
    diff: Difference
    unpaired: str = ""  # why the interval is Welch's ("" when paired, or without an interval)
    parts: Optional[tuple[float, float]] = None  # interaction: the row's and the baseline's mean drop
    p_holm: Optional[float] = None
    level: Optional[float] = None  # the Holm step's level (its interval: 1 - level)
    low_holm: Optional[float] = None
    high_holm: Optional[float] = None
    machines: str = ""  # a paired comparison across machine types: which seeds (tables/machines.py)

    @property
    def p(self) -> Optional[float]:
        return self.diff.p_value

    @property
    def resolved(self) -> Optional[bool]:
        """Holm-resolved (None: no interval, not in the family)."""
        return None if self.p_holm is None else self.p_holm < ALPHA


@dataclass
class Family:
    comparisons: list[Comparison] = field(default_factory=list)
    notes: dict[str, str] = field(default_factory=dict)  # label -> one line (one-process skew)
    resolution: list[Resolution] = field(default_factory=list)  # per variant (tables/resolution.py)
    powers: dict[str, RowPower] = field(default_factory=dict)  # label -> its own power (tables/resolution.py)

    @property
    def size(self) -> int:
        return sum(1 for c in self.comparisons if c.p is not None)

    def of_row(self, label: str) -> Optional[Comparison]:
        return next((c for c in self.comparisons if c.kind == "baseline" and c.a == label), None)


def _recorded(runs: dict[str, dict[int, Summary]], label: str, metric: str) -> dict[int, float]:
    return {s: float(v[metric]) for s, v in runs.get(label, {}).items()
            if isinstance(v.get(metric), (int, float)) and not isinstance(v.get(metric), bool)}


def values(runs: dict[str, dict[int, Summary]], label: str, metric: str) -> dict[int, float]:
    """A row's values of `metric` by seed; none at all where a seed's is not finite (a loss that
    diverged): a difference with it has no mean or interval, and comparing the seeds left would
    report the survivors only, so every comparison with that row (baseline, interaction, declared)
    finds nothing to compare, and `build_family` notes why."""
    found = _recorded(runs, label, metric)
    return found if all(math.isfinite(v) for v in found.values()) else {}


def diverged_seeds(runs: dict[str, dict[int, Summary]], label: str, metric: str) -> list[int]:
    """The seeds on which a row's `metric` is not finite (a loss that became NaN or infinite)."""
    return sorted(s for s, v in _recorded(runs, label, metric).items() if not math.isfinite(v))


def _partition(summary: Summary) -> tuple[Any, ...]:
    return tuple(split_fact(summary, k) for k in ("partition", "dirichlet_alpha", "classes_per_worker"))


def _evaluated_on(summary: Summary) -> tuple[Any, ...]:
    """What fixes a run's validation and test data beyond the set's name (None where not recorded)."""
    return tuple(split_fact(summary, k) for k in EVALUATED_ON)


def _describe(summary: Summary) -> str:
    kind, alpha, classes = _partition(summary)
    return f"{kind}" + (f"({alpha:g})" if isinstance(alpha, (int, float)) else "") + \
        (f"({classes} classes)" if classes is not None else "")


def pairing(runs: dict[str, dict[int, Summary]], a: str, b: str) -> str:
    """Why `a` and `b` cannot be paired by seed ("" when they can): a seed draws a different
    partition of the data for them (training-rank counts or partition settings differ)."""
    for seed in sorted(set(runs.get(a, {})) & set(runs.get(b, {}))):
        ra, rb = runs[a][seed], runs[b][seed]
        na, nb = ra.get("train_ranks"), rb.get("train_ranks")
        if na is not None and nb is not None and na != nb:
            return f"{na} training rank{'s' * (na != 1)} against {b}'s {nb}: a seed draws another partition"
        if ra.get("data_split") and rb.get("data_split") and _partition(ra) != _partition(rb):
            return f"partition {_describe(ra)} against {b}'s {_describe(rb)}"
        if _evaluated_on(ra) != _evaluated_on(rb):  # (table.split_seeds=per_seed gives both the seed's)
            return f"other data at seed {seed} (split and generator seeds {_evaluated_on(ra)} against {_evaluated_on(rb)})"
    return ""


def one_process_skew(runs: dict[str, dict[int, Summary]], label: str) -> bool:
    """A row whose runs train on one rank under a partition other than IID: nothing was skewed."""
    found = runs.get(label, {}).values()
    return bool(found) and all(s.get("train_ranks") == 1 and split_fact(s, "partition") not in (None, "iid")
                               for s in found)


def n_examples(table: TableConfig, runs: dict[str, dict[int, Summary]], labels: list[str],
               metric: str) -> Optional[int]:
    """The units an accuracy's floor counts (tables/runs.py `scored_units`: the smallest the runs
    record; None for a metric that is not a proportion, or where no size is known)."""
    if not is_proportion(metric):
        return None
    sizes = [scored_units(s, metric, table) for label in labels for s in runs.get(label, {}).values()]
    known = [n for n in sizes if n]
    return min(known) if known else (table.test_examples if metric.startswith("test") else table.val_examples)


def _pair(table: TableConfig, runs: dict[str, dict[int, Summary]], kind: str, a: str, b: str, metric: str,
          name: str) -> Optional[Comparison]:
    va, vb = values(runs, a, metric), values(runs, b, metric)
    if not va or not vb:
        return None
    why = pairing(runs, a, b)
    diff = difference(va, vb, n_examples=n_examples(table, runs, [a, b], metric), paired=not why,
                      bounds=difference_bounds(metric))
    if diff is not None and diff.method == "welch" and not why:
        why = "their seeds differ"
    paired = diff is not None and diff.method == "paired"
    mixed = mixed_note(runs, a, b, table.mixed_machines, table.name) if paired else ""
    return Comparison(kind, name, a, b, variant_of(a), diff, why, machines=mixed)


def _interaction(table: TableConfig, runs: dict[str, dict[int, Summary]], row: str, base: str, v: str,
                 metric: str) -> Optional[Comparison]:
    v0 = table.interaction_from
    labels = [f"{row}@{v}", f"{row}@{v0}", f"{base}@{v}", f"{base}@{v0}"]
    r, r0, b, b0 = (values(runs, label, metric) for label in labels)
    common = set(r) & set(r0)
    common_base = set(b) & set(b0)
    if not common or not common_base:
        return None
    drops_row = {s: r[s] - r0[s] for s in common}
    drops_base = {s: b[s] - b0[s] for s in common_base}
    n = n_examples(table, runs, labels, metric)
    skewed = statistics.fmean(r.values()) - statistics.fmean(b.values())
    reference = statistics.fmean(r0.values()) - statistics.fmean(b0.values())
    se_set = math.hypot(difference_se_floor(skewed, n), difference_se_floor(reference, n))
    why = pairing(runs, labels[0], labels[2]) or pairing(runs, labels[1], labels[3])
    bounds = difference_bounds(metric, terms=2)
    if not why and set(drops_row) == set(drops_base):
        diff = one_sample([drops_row[s] - drops_base[s] for s in sorted(drops_row)], se_set, bounds=bounds)
    else:
        diff = two_samples(list(drops_row.values()), list(drops_base.values()), se_set, bounds=bounds)
        why = why or "their seeds differ"
    name = f"{row}: ({v} - {v0}) - {base}'s"
    return Comparison("interaction", name, labels[0], labels[2], v, diff, why if diff.method == "welch" else "",
                      (statistics.fmean(drops_row.values()), statistics.fmean(drops_base.values())))


def _declared(table: TableConfig) -> list[tuple[str, str]]:
    labels = {r.label for r in table.rows}
    pairs = []
    for a, b in table.comparisons:
        if "@" in a or "@" in b or not table.variants:
            pairs.append((a, b))
        else:
            pairs += [(f"{a}@{v}", f"{b}@{v}") for v in table.variants
                      if f"{a}@{v}" in labels and f"{b}@{v}" in labels]
    return pairs


def build_family(table: TableConfig, runs: dict[str, dict[int, Summary]], head: Headline) -> Family:
    """Every comparison of the table on its headline metric, corrected together (module doc)."""
    family = Family()
    metric = head.compare
    for row in table.rows:
        if one_process_skew(runs, row.label):
            family.notes[row.label] = (f"one training rank: {variant_of(row.label) or 'its partition'} has nothing "
                                       f"to split, so this row is {row_of(row.label)} on all the data, not a skewed "
                                       f"result (kept out of the skew interaction)")
    for row in table.rows:  # `values` gives such a row nothing to compare
        if bad := diverged_seeds(runs, row.label, metric):
            family.notes[row.label] = "; ".join(filter(None, [
                family.notes.get(row.label), f"{metric} not finite on seed {', '.join(map(str, bad))} (diverged), "
                                             f"so it is compared with no row"]))
    for row in table.rows:
        base = row.baseline or table.baseline
        if base and base != row.label:
            found = _pair(table, runs, "baseline", row.label, base, metric, f"{row.label} - {base}")
            if found:
                family.comparisons.append(found)
    if table.interaction_from:
        v0 = table.interaction_from
        for row in table.rows:
            v = variant_of(row.label)
            base = row.baseline or table.baseline
            if v in ("", v0) or not base or base == row.label or row.label in family.notes:
                continue
            found = _interaction(table, runs, row_of(row.label), row_of(base), v, metric)
            if found:
                family.comparisons.append(found)
    for a, b in _declared(table):
        found = _pair(table, runs, "declared", a, b, metric, f"{a} - {b}")
        if found:
            family.comparisons.append(found)
    correct(family)
    return family


def correct(family: Family) -> None:
    """Holm across the family's comparisons that have an interval (module doc)."""
    tested = [c for c in family.comparisons if c.p is not None]
    pvalues = [c.p for c in tested]
    for c, adjusted, level in zip(tested, holm(pvalues), holm_levels(pvalues, ALPHA)):  # type: ignore[arg-type]
        c.p_holm, c.level = adjusted, level
        c.low_holm, c.high_holm = c.diff.interval(1 - level)
