"""Tuned rows: a small grid per row, chosen on validation, so that no method is compared untuned,
and a choice that is not a coin toss: what cannot be told apart on validation is said, and decided
by a stated rule.

A row (or the whole table) may give `tune: {optim.lr: [0.03, 0.1, 0.3]}`; several keys make
their Cartesian product. Every setting runs on `table.tune_seeds` in
`<label>/tune/<setting>/seed_<s>/`; the row's reported runs (`<label>/seed_<s>/`, on `table.seeds`)
use the setting chosen:

1. Each setting's MEAN of `table.select_metric` (the FINAL validation accuracy, `val_acc`, by
   default: a row reports its final model, so the setting is chosen for the final model) over the
   tuning seeds; the best mean in the metric's direction (tables/measure.py). A setting
   with a missing or failed run has no mean and cannot win (the table notes it). Test metrics are
   refused as selection metrics.
2. The CONTENDERS: the settings whose difference from the best is within noise, i.e. not
   resolved by the interval of a paired difference (tables/stats.py) over the tuning seeds,
   with the floor of the validation set for an accuracy (N examples from the runs'
   `data_split.val_samples`): on 144 validation images and one seed, settings fewer than 6 images
   apart are contenders. A metric without a floor (a loss) may be given a stated resolution
   (`table.tune_resolution`, e.g. from a pilot's spread over seeds): settings whose mean is within
   it of the best are contenders too. Without either and with one seed, only an exact tie is.
3. A grid tuned on ONE seed whose contenders are more than one runs again, whole, on
   `table.tune_tie_seeds` (default: one seed used nowhere else), and steps 1-2 are taken again on
   the means over both seeds. EVERY tuning seed the runs hold for a point of the grid counts, not
   only those the rule asked for (`held_seeds`): a tie seed run at one stage of a grid's
   extension stays in its choice after the extension has separated the grid on the first seed
   alone, and a point of the grid without that seed's run has no mean (the table makes it; a
   gather cannot choose it). Why: head_to_head_lm_cpu's diloco@roles ran its grid on tie seed 100
   while 0.001 and 0.003 were within noise on seed 0; the extension's 0.009 then won on seed 0
   alone and the rule read seed 0 only, though with seed 100 the two it ignored beat 0.009
   (issue 88). A choice rests on all the evidence a table made for it.
4. The STABILITY MARGIN: a contender that DIVERGED on any tuning seed is set aside (with two
   seeds a diverged run can leave its mean within noise of the best); then, along a grid key where
   a larger value is less stable (`table.tune_stability_keys`, default the learning rate), so is
   a contender whose next larger grid point diverged on any tuning seed; each unless it would set
   aside every contender left. A run has diverged when its final validation loss is not finite or
   no lower than its first logged training loss (about the untrained model's: it ended no better
   than it began). Why: the largest stable rate moves from seed to seed, and a handful of tuning
   seeds cannot see a rate that diverges on one seed in eight; when validation cannot tell the
   contenders apart, the one a grid step further from a rate seen to fail is the safer choice.
   (Found by docs/results/head_to_head_mnist1d_iid_pair, where allreduce's 0.3, tied with 0.1 and
   a step below 0.9, which diverged on both tuning seeds, was chosen by a validation loss 0.0002
   lower and then diverged on one reported seed of eight.)
   The margin's COST is bounded: where it sets the best mean aside, it gives the best up only for
   the settings it keeps (none diverged, none a step below a divergence) whose mean is within
   `table.tune_margin_cost` of the best, and step 5 decides among those; where it keeps none so
   close, the best is not set aside, and step 5 decides between it and the contenders the margin
   keeps (where every setting diverged, the best mean wins). Without a stated cost, only a
   difference the validation set itself cannot resolve is affordable (its floor from N examples,
   on the two means; for a loss, `table.tune_resolution`). Why: with two seeds step 2's interval
   has one degree of freedom, so a setting 16 points below the best on both seeds alike can be a
   contender, and the margin, a tie-break, handicapped methods by far more than the table claims
   to resolve (head_to_head_mnist1d_cpu at 339 tuning runs: local_sgd@dir0.1 chose 0.03 at 0.774
   on validation over 0.1 at 0.938, because 0.3 diverged on one seed of two; ef_signsgd@iid 0.1
   at 0.832 over 0.9 at 0.973, and then, with the contenders taken against the best kept, 0.3 at
   0.953; lsgd@dir0.1, where every rate diverged, the largest, 2.7, at 0.100, over 0.1 at 0.205).
5. Among the contenders that remain, the best mean of `table.tie_metric` (validation loss by
   default: a finer measure of the same models than the count of images they get right) wins;
   where that ties too or is missing, the best mean of the selection metric, then grid order.
   table.md flags every row whose choice was made among several contenders ("within noise") and
   names the contenders the margin set aside.

A grid is only as good as its range: a method whose best learning rate lies below the grid is
compared at the wrong one. With `table.tune_extend=N`, a one-key numeric grid whose winner, or any
setting tied with the best mean, is at an edge gets one more point beyond that edge, the grid's own
ratio further (0.03 after 0.1 and 0.3 gives 0.009), up to N times per side; each new point runs on
the row's tuning seeds like the others, and the choice is made again (`extend_grid`). A choice
still at an edge is flagged. The reported runs of a row are checked against the setting finally
chosen (`stale_setting`).
"""
from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from core.rundir import RunDir
from tables.measure import Better, is_proportion
from tables.run_records import OVERRIDES, FolderRecords, RunRecords, RunsAt, number, parse_overrides, records_of
from tables.runs import recorded_units
from tables.stats import LEVEL, Difference, difference_se_floor

Setting = tuple[tuple[str, Any], ...]  # ((key, value), ...) in the grid's key order


def grid_settings(grid: dict[str, list[Any]]) -> list[Setting]:
    """Every combination of the grid's values, the first key varying slowest."""
    keys = list(grid)
    return [tuple(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]


def setting_overrides(setting: Setting) -> list[str]:
    return [f"{key}={value}" for key, value in setting]


def setting_name(setting: Setting) -> str:
    """The setting as a directory name and a table cell (`optim.lr_0.1`, `,`-joined)."""
    return ",".join(f"{key}_{value}" for key, value in setting)


def tune_rel(label: str, setting: Setting, seed: int) -> str:
    """A tuning run's path in the table's folder (and store): `<label>/tune/<setting>/seed_<s>`."""
    return f"{label}/tune/{setting_name(setting)}/seed_{seed}"


def tune_dir(out: Path, label: str, setting: Setting, seed: int) -> RunDir:
    return RunDir(out / tune_rel(label, setting, seed))


@dataclass(frozen=True)
class TunePolicy:
    """How a grid's choice is made: the selection metric and its direction, the tie metric and its
    direction, the validation set's size where runs do not record it, the extra tuning seeds
    a one-seed grid gets when its best settings are within noise, and the grid keys along which a
    larger value is less stable (step 4's margin)."""
    metric: str = "val_acc"
    better: Better = Better.higher
    tie_metric: Optional[str] = "val_loss"
    tie_better: Better = Better.lower
    val_examples: Optional[int] = None
    tie_seeds: tuple[int, ...] = ()
    level: float = LEVEL
    stability_keys: tuple[str, ...] = ("optim.lr",)
    resolution: Optional[float] = None  # a loss's difference validation cannot resolve (step 2)
    # the most of the selection metric's mean step 4 may give up by setting the best aside (None:
    # only a difference the validation set itself cannot resolve: its floor, or `resolution`)
    margin_cost: Optional[float] = None


@dataclass
class Tuned:
    """A row's grid, each setting's mean selection metric over the seeds the choice was made on
    (None: a run is missing or failed), and the winner among the settings with a mean (None if
    none has one); the contenders (settings within noise of the best, the winner among them) and
    the rule that decided between them."""
    metric: str
    results: list[tuple[Setting, Optional[float], int]]  # setting, mean, runs found
    winner: Optional[Setting]
    seeds: list[int] = field(default_factory=list)
    contenders: list[Setting] = field(default_factory=list)
    rule: str = "best mean"  # best mean | stability margin | <tie_metric> | grid order
    tie_means: dict[Setting, Optional[float]] = field(default_factory=dict)
    val_examples: Optional[int] = None  # the validation set's size the noise was judged on
    at_edge: bool = False  # a one-key numeric grid whose winner, or a setting tied with the best, is at an edge
    # contenders step 4 set aside: diverged, or a grid step below a setting that did
    set_aside: list[Setting] = field(default_factory=list)
    diverged: dict[Setting, list[int]] = field(default_factory=dict)  # the tuning seeds each diverged on
    extended: int = 0  # the points `extend_grid` added beyond a winning edge (set by the table runner)

    @property
    def complete(self) -> bool:
        """Every setting of the grid as run has its runs on every seed: the choice is final (an
        extension still to run shows here as a setting without its runs)."""
        return self.winner is not None and all(runs == len(self.seeds) for _, _, runs in self.results)

    @property
    def within_noise(self) -> bool:
        """The winner was chosen among several settings validation could not tell apart."""
        return len(self.contenders) > 1


def _value(summary: Optional[dict[str, Any]], metric: str, where: object = "summary.json") -> Optional[float]:
    """A tuning run's metric (None: no run, or not recorded); one line for a value not a number."""
    value = number(summary, metric, where) if summary else None
    return None if value is None else float(value)


def _val_examples(summary: Optional[dict[str, Any]]) -> Optional[int]:
    """The units a validation accuracy counts (tables/runs.py: a text set's characters)."""
    return recorded_units(summary, "val") if summary else None


def within_noise(a: dict[int, float], b: dict[int, float], n_examples: Optional[int], level: float = LEVEL,
                 resolution: Optional[float] = None) -> bool:
    """Whether two settings' values by seed (the same seeds) are not told apart: their mean
    difference is at most `resolution` (a stated one, for a metric without a floor), or the
    interval of their paired difference, its floor from n validation examples (accuracies only:
    None otherwise), includes 0. One seed without a floor or a resolution: only an exact tie."""
    diffs = [a[s] - b[s] for s in sorted(a)]
    mean = statistics.fmean(diffs)
    if mean == 0 or (resolution is not None and abs(mean) <= resolution):
        return True
    k = len(diffs)
    se_seed = statistics.stdev(diffs) / math.sqrt(k) if k > 1 else 0.0
    h = Difference(mean, None, None, "paired", se_seed, max(k - 1, 1), difference_se_floor(mean, n_examples)).half_width(level)
    return h is not None and abs(mean) <= h


def _best(values: list[float], better: Better) -> float:
    return max(values) if better == Better.higher else min(values)


def _numeric_values(settings: list[Setting]) -> Optional[list[float]]:
    """The values of a one-key numeric grid of two or more settings (None for any other grid)."""
    if len(settings) < 2 or len(settings[0]) != 1:
        return None
    values = [s[0][1] for s in settings]
    return values if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values) else None


def _edge_flags(settings: list[Setting], candidates: list[Setting]) -> tuple[bool, bool]:
    """(low, high): whether any of `candidates` is the smallest or largest value of a one-key
    numeric grid (False, False for any other grid)."""
    values = _numeric_values(settings)
    if values is None:
        return False, False
    chosen = {c[0][1] for c in candidates}
    return min(values) in chosen, max(values) in chosen


def choose(out: RunsAt, label: str, grid: dict[str, list[Any]], seeds: list[int], metric: str,
           policy: Optional[TunePolicy] = None) -> Tuned:
    """The setting chosen from the tuning runs' summaries over `seeds` (see the module doc,
    steps 1, 2, 4 and 5; `row_seeds` gives step 3's seeds). `out`: the table's folder, or the runs
    a gather reads (tables/run_records.py)."""
    records = records_of(out)
    policy = replace(policy or TunePolicy(), metric=metric)
    settings = grid_settings(grid)
    by_setting: dict[Setting, dict[int, float]] = {}
    ties: dict[Setting, dict[int, float]] = {}
    sizes: list[int] = []
    results: list[tuple[Setting, Optional[float], int]] = []
    failed: dict[Setting, list[int]] = {}  # the tuning seeds each setting diverged on (step 4)
    for setting in settings:
        runs = {s: tune_rel(label, setting, s) for s in seeds}
        summaries = {s: records.summary(r) for s, r in runs.items()}  # each read once
        where = {s: records.where(r, "summary.json") for s, r in runs.items()}
        values = {s: v for s, v in ((s, _value(d, metric, where[s])) for s, d in summaries.items()) if v is not None}
        if policy.tie_metric:
            ties[setting] = {s: v for s, v in ((s, _value(d, policy.tie_metric, where[s]))
                                               for s, d in summaries.items()) if v is not None}
        sizes += [n for n in map(_val_examples, summaries.values()) if n]
        if bad := [s for s, r in runs.items() if run_diverged(records, r, summaries[s])]:
            failed[setting] = bad
        complete = len(values) == len(seeds)
        if complete:
            by_setting[setting] = values
        results.append((setting, statistics.fmean(values.values()) if complete else None, len(values)))
    n_val = min(sizes) if sizes else policy.val_examples
    n_floor = n_val if is_proportion(metric) else None
    if not by_setting:
        return Tuned(metric, results, None, list(seeds), val_examples=n_val)
    means = {s: statistics.fmean(v.values()) for s, v in by_setting.items()}
    best_mean = _best(list(means.values()), policy.better)
    tied_best = [s for s in settings if means.get(s) == best_mean]
    first_best = tied_best[0]
    resolution = None if is_proportion(metric) else policy.resolution

    def affordable(s: Setting) -> bool:  # step 4: giving the best up for s costs no more than allowed
        if policy.margin_cost is not None:
            return abs(means[first_best] - means[s]) <= policy.margin_cost
        return within_noise({0: means[first_best]}, {0: means[s]}, n_floor, policy.level, resolution)

    contenders = [s for s in settings if s in means
                  and within_noise(by_setting[first_best], by_setting[s], n_floor, policy.level, resolution)]
    tie_means = {s: statistics.fmean(ties[s].values()) if len(ties.get(s, {})) == len(seeds) else None
                 for s in settings}
    winner, rule, set_aside = first_best, "best mean", []
    if len(contenders) > 1:
        below = below_a_divergence(settings, failed, policy.stability_keys)
        pool = [s for s in contenders if s not in failed] or contenders
        pool = [s for s in pool if s not in below] or pool
        set_aside = [s for s in contenders if s not in pool]
        if first_best in set_aside:
            # step 4's second half: the best is given up only for a kept setting within the margin's cost
            kept = [s for s in settings if s in means and s not in failed and s not in below]
            alternates = [s for s in kept if affordable(s)]
            if alternates:
                pool = alternates
                contenders = [s for s in settings if s in contenders or s in pool]
            else:  # nothing kept is close enough: the best stays, with the contenders the margin keeps
                pool = [s for s in contenders if s == first_best or s in kept]
                set_aside = [s for s in contenders if s not in pool]
        winner, rule = ((pool[0], "stability margin") if len(pool) == 1
                        else _break_tie(pool, means, tie_means, policy))
    low, high = _edge_flags(settings, [winner, *tied_best])
    return Tuned(metric, results, winner, list(seeds), contenders if len(contenders) > 1 else [winner], rule,
                 tie_means, n_val, low or high, set_aside, failed)


def run_diverged(records: RunRecords, rel: str, summary: Optional[dict[str, Any]] = None) -> bool:
    """Whether a finished run ended no better than it began (step 4): its final validation loss is
    not finite, or not below its first logged training loss (the mean over its first steps, about
    the untrained model's loss: a network collapsed to a constant output sits there). False where
    either is not recorded: a missing run is step 1's business, not a divergence. `summary`: the
    run's summary.json where the caller has read it already."""
    summary = summary if summary is not None else records.summary(rel)
    final = _value(summary, "val_loss", records.where(rel, "summary.json"))
    if final is None:
        return False
    if not math.isfinite(final):
        return True
    first = records.first_train_loss(rel)
    return first is not None and final >= first


def diverged(run: RunDir, summary: Optional[dict[str, Any]] = None) -> bool:
    """`run_diverged` of one run folder."""
    return run_diverged(FolderRecords(run.root), ".", summary)


def below_a_divergence(settings: list[Setting], failed: dict[Setting, list[int]],
                       keys: tuple[str, ...]) -> list[Setting]:
    """The settings of a one-key numeric grid over one of `keys` whose next larger point diverged on
    some tuning seed (step 4); none for any other grid."""
    if _numeric_values(settings) is None or settings[0][0][0] not in keys:
        return []
    ordered = sorted(settings, key=lambda s: s[0][1])
    return [s for s, above in zip(ordered, ordered[1:]) if above in failed]


def _break_tie(contenders: list[Setting], means: dict[Setting, float], tie_means: dict[Setting, Optional[float]],
               policy: TunePolicy) -> tuple[Setting, str]:
    """Step 5: the best mean tie metric among the contenders; where it ties or is missing, the best
    mean selection metric; then grid order (the contenders are in grid order)."""
    pool = contenders
    if policy.tie_metric and all(tie_means.get(s) is not None for s in pool):
        best_tie = _best([tie_means[s] for s in pool], policy.tie_better)  # type: ignore[misc]
        pool = [s for s in pool if tie_means[s] == best_tie]
        if len(pool) == 1:
            return pool[0], policy.tie_metric
    best_mean = _best([means[s] for s in pool], policy.better)
    pool = [s for s in pool if means[s] == best_mean]
    return pool[0], ("best mean" if len(pool) == 1 else "grid order")


def held_seeds(out: RunsAt, label: str, grid: dict[str, list[Any]]) -> list[int]:
    """The seeds of every finished tuning run the runs hold for a point of the row's grid."""
    names = {setting_name(s) for s in grid_settings(grid)}
    found = set()
    head = f"{label}/tune/"
    for rel in records_of(out).under(f"{label}/tune"):
        parts = rel[len(head):].split("/")
        if len(parts) == 2 and parts[0] in names and parts[1].startswith("seed_") and parts[1][5:].isdigit():
            found.add(int(parts[1][5:]))
    return sorted(found)


def row_seeds(out: RunsAt, label: str, grid: dict[str, list[Any]], seeds: list[int], metric: str,
              policy: Optional[TunePolicy] = None) -> list[int]:
    """The tuning seeds a row's choice is made on (step 3): `seeds` and every other seed the runs
    hold for a point of the grid, plus `policy.tie_seeds` when that is one seed and the settings
    that have results there are within noise of each other."""
    policy = policy or TunePolicy()
    seeds = [*seeds, *(s for s in held_seeds(out, label, grid) if s not in seeds)]
    if len(seeds) >= 2 or not policy.tie_seeds:
        return list(seeds)
    first = choose(out, label, grid, seeds, metric, policy)
    return [*seeds, *policy.tie_seeds] if first.within_noise else list(seeds)


def _next_point(edge: float, neighbour: float) -> float:
    """One grid step beyond `edge`, away from `neighbour` (geometric), to 3 significant digits."""
    return float(f"{edge * edge / neighbour:.3g}")


def extend_grid(out: RunsAt, label: str, grid: dict[str, list[Any]], seeds: list[int], metric: str,
                limit: int, policy: Optional[TunePolicy] = None) -> tuple[dict[str, list[Any]], int]:
    """The row's grid with the points `tune_extend` adds (see the module doc), and how many it
    added. Stops at a point whose runs are not all there yet: the caller runs them and asks again."""
    if limit <= 0 or len(grid) != 1:
        return grid, 0
    key, values = next(iter(grid.items()))
    if len(values) < 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values):
        return grid, 0
    values, added = sorted(values), {"low": 0, "high": 0}
    while True:
        current = {key: values}
        tuned = choose(out, label, current, row_seeds(out, label, current, seeds, metric, policy), metric, policy)
        if any(mean is None for _, mean, _ in tuned.results) or tuned.winner is None:
            break
        low, high = _edge_flags(grid_settings(current), [tuned.winner, *(
            s for s, mean, _ in tuned.results if mean == _best([m for _, m, _ in tuned.results if m is not None],
                                                                (policy or TunePolicy()).better))])
        grown = False
        if low and added["low"] < limit:
            values, added["low"], grown = [_next_point(values[0], values[1]), *values], added["low"] + 1, True
        if high and added["high"] < limit:
            values, added["high"], grown = [*values, _next_point(values[-1], values[-2])], added["high"] + 1, True
        if not grown:
            break
    return {key: values}, added["low"] + added["high"]


def stale_setting(run: RunDir, setting: Setting) -> Optional[str]:
    """Why a row's reported run directory does not belong to `setting` (None: it does, or it is
    empty): its recorded overrides (.hydra/overrides.yaml) give another value for a key of the
    setting, as after a grid extension changed a row's choice."""
    return stale_in(FolderRecords(run.root), ".", setting)


def stale_in(out: RunsAt, rel: str, setting: Setting) -> Optional[str]:
    """`stale_setting` of the run `rel` of `out` (a gather's runs: the choice may have changed
    since its reported runs were made, and a gather makes no run, so it says so)."""
    records = records_of(out)
    text = records.text(rel, OVERRIDES)  # (a run in progress has one too)
    if text is None:
        return None
    recorded: dict[str, str] = {}
    for item in parse_overrides(text, records.where(rel, OVERRIDES)):
        key, _, value = item.partition("=")
        recorded[key] = value
    for key, value in setting:
        if key in recorded and recorded[key] != str(value):
            return f"{key}={recorded[key]}, not the chosen {key}={value}"
    return None
