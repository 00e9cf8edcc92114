"""A paper table's config (`table=NAME`, recipes/tables/NAME.yaml) and its directory's layout.

A table lists rows, each a recipe plus overrides and a label, the baseline row that ratios refer
to, the seeds, and the paper's published numbers for each row with their source. Each row x seed
is its own run directory, `<table dir>/<label>/seed_<s>/`.

The rows a table runs are its listed rows expanded (`expand_rows`): `every_algorithm: true` adds
one row per registered algorithm from its CPU recipe, `recipes/cpu/<algo>.yaml` (or the same
methods on another task: `recipe_set: cpu_<task>`, a folder with a `_task.yaml`), and one per
other recipe in that folder (methods composed from an algorithm, e.g. a compressor); `variants`
repeats every row under each named set of overrides (IID and skewed data side by side);
`budget` puts every row on the same `train.budget_*`; `quick: true` keeps `quick_rows` (and the
baseline row), the first seed and no tuning, for a test or CI.

The protocol's settings (docs/tables.md): the headline metric and its direction (`compare_metric`
on test, `select_metric` on validation, `better`), the tuning's tie rule (`tie_metric`,
`tune_tie_seeds`), the comparisons beyond each row's baseline (`interaction_from`: the skew
interaction; `comparisons`: declared pairs), and `allow_dirty` (tables/provenance.py).
"""
from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig

import dist_algos

from core.errors import UserError
from core.rundir import RunDir
from core.schema import Section, option, typed_section
from tables.measure import Better, Headline, evaluation_set, implied_direction
from tables.projected_config import ProjectedColumns

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
TABLE_CONFIGS = Path(__file__).resolve().parents[1] / "conf" / "table"
CPU_RECIPES = RECIPES / "cpu"  # every algorithm's own CPU recipe on the default digits task
TASK_FILE = "_task.yaml"  # in recipes/cpu_<task>/: the task those files put cpu/'s methods on


def recipe_sets(recipes: Path = RECIPES) -> tuple[str, ...]:
    """The every-algorithm rows' recipe sets present: `cpu` (the default digits task), then each
    `cpu_<task>/` holding a `_task.yaml`: a task's new set is files only, accepted here unedited."""
    return ("cpu", *sorted(p.parent.name for p in recipes.glob(f"cpu_*/{TASK_FILE}")))


class TableLauncher(enum.StrEnum):
    local = "local"  # rows one after another on this machine
    slurm = "slurm"  # rows submitted as Hydra multiruns through the submitit launcher


class SplitSeeds(enum.StrEnum):
    # one validation and one test set for every run (data.split_seed as the row sets it): the
    # differences hold for that test set; intervals carry its finite size as a floor
    per_table = "per_table"
    # every run's data options named by its data set (`DataSet.split_redraw_options`) set to its seed:
    # each seed has validation and test sets of its own, so a difference's interval over seeds
    # includes the test sets' sampling (a claim beyond one test set); refused for a fixed test set
    per_seed = "per_seed"


class WorkerBatch(enum.StrEnum):
    # each worker keeps its recipe's train.batch_size: the global batch grows with the workers,
    # and the learning rate follows each recipe's rule (its optim.lr, or lr x update batch / B
    # where the recipe sets optim.scale_lr_with_batch=B; engine/train/optim.py peak_lr)
    per_worker = "per_worker"
    # train.global_batch_size=workers.global_batch for every count: each worker takes its share
    global_constant = "global_constant"


@dataclass
class WorkersAxis(Section):
    """The number of training workers as an axis of the table (docs/workers.md): every row runs at
    each count, `launch.nproc` = the count plus the row's `extra_ranks` (a parameter server's)."""

    counts: list[int] = field(default_factory=list)  # training workers; [] : no axis
    batch: WorkerBatch = WorkerBatch.per_worker
    global_batch: Optional[int] = option(None, ge=1)  # batch=global_constant: the global batch at every count
    quick_counts: list[int] = field(default_factory=list)  # the quick form's counts ([]: the first count)


@dataclass
class RowConfig(Section):
    label: str
    recipe: Optional[str] = None
    overrides: list[str] = field(default_factory=list)
    paper: dict[str, Any] = field(default_factory=dict)  # metric -> published value, plus "source"
    note: str = ""
    baseline: Optional[str] = None  # the row this row's ratios refer to (null: the table's baseline)
    x: Optional[float] = None  # the row's place on the x axis of `speedup:` plots (e.g. link Mbit/s)
    series: Optional[str] = None  # its line in those plots (null: its label)
    tune: Optional[dict[str, list[Any]]] = None  # a grid chosen on validation (null: the table's `tune`)
    # the table's variants this row runs under (null: all). A one-process row has no partition to
    # skew: head_to_head_cpu runs msgd under `iid` only
    variants: Optional[list[str]] = None
    # ranks beyond the training workers on the workers axis: a parameter-server row's servers
    # (launch.nproc = workers + extra_ranks, so that every row trains on the same number of workers)
    extra_ranks: int = option(0, ge=0)
    # options set to each run's seed (`<option>=<seed>`, after the row's own): filled from the data
    # set by table.split_seeds=per_seed (tables/runner.py, per_seed_options)
    seed_options: list[str] = field(default_factory=list)


@dataclass
class TableConfig(Section):
    name: str = ""
    title: str = ""
    description: str = ""
    paper: str = ""  # the paper the published numbers come from
    baseline: Optional[str] = None  # label of the row that ratios refer to
    seeds: list[int] = field(default_factory=lambda: [0])
    overrides: list[str] = field(default_factory=list)  # added to every row
    paper_metrics: list[str] = field(default_factory=lambda: ["test_acc"])  # published columns shown
    plots: list[str] = field(default_factory=lambda: ["accuracy"])  # accuracy | intervals | levels | pareto | frontier | series:<key> | throughput | wall | speedup:<m>
    rows: list[RowConfig] = field(default_factory=list)
    # summary.json keys shown per row, plus time_to_target_s (needs target_acc); ratios: those
    # divided by the baseline row's
    # (selection on validation: the best evaluation by val_acc and the test accuracy there, never
    # the best test accuracy)
    columns: list[str] = field(default_factory=lambda: ["test_acc", "val_acc", "best_val_acc", "test_acc_at_best",
                                                        "steps", "syncs", "comm_bytes", "wall_s", "samples_per_s"])
    ratios: list[str] = field(default_factory=lambda: ["syncs", "comm_bytes", "wall_s", "samples_per_s"])
    target_acc: Optional[float] = option(None, gt=0, le=1)  # time_/bytes_to_target: first eval reaching this
    target_value: Optional[float] = None  # the same for a metric that is not an accuracy (e.g. val_loss 1.2)
    target_metric: str = "val_acc"  # the eval records' metric that the target applies to (validation only)
    # tuning (tables/tuning.py): a grid per row, run on tune_seeds, chosen on select_metric
    tune: dict[str, list[Any]] = field(default_factory=dict)
    tune_seeds: list[int] = field(default_factory=lambda: [0])
    # a one-key numeric grid whose best setting is strictly at an edge is extended by one more point
    # beyond it (the grid's own ratio), up to this many times per side: a baseline whose best
    # learning rate lies outside the grid is not tuned (tables/tuning.py, extend_grid)
    tune_extend: int = option(0, ge=0)
    select_metric: str = "val_acc"  # summary.json key the tuning chooses by; never a test_* metric
    compare_metric: str = "test_acc"  # the headline: the column whose differences are tested
    # which way is better for compare_metric and select_metric (null: what their names imply:
    # accuracies higher, losses, bits_per_char and perplexity lower; tables/measure.py)
    better: Optional[Better] = None
    # tuning: settings within the validation set's resolution of the best are decided by this
    # metric's mean (its direction from its name), after a second tuning seed where there was one
    tie_metric: str = "val_loss"
    # the extra tuning seed(s) run when a one-seed grid's best settings are within noise of each
    # other (null: one seed, the smallest not in seeds or tune_seeds)
    tune_tie_seeds: Optional[list[int]] = None
    # grid keys along which a larger value is less stable (a step size): among settings validation
    # cannot tell apart, one whose next larger grid point diverged on a tuning seed is set aside, as
    # is one that diverged itself (tables/tuning.py, step 4; [] keeps only the latter)
    tune_stability_keys: list[str] = field(default_factory=lambda: ["optim.lr"])
    # for a selection metric without a floor (a loss, not an accuracy): the difference of means
    # validation cannot resolve, so that settings within it of the best are contenders (get the tie
    # seed, the margin, the tie rule); null: on one seed only an exact tie is (tables/tuning.py)
    tune_resolution: Optional[float] = option(None, gt=0)
    # the most of the selection metric the stability margin may give up: it sets the best mean
    # aside only for a setting it keeps within this of it (null: only for one the validation set
    # cannot tell apart: its floor, or tune_resolution; tables/tuning.py, step 4)
    tune_margin_cost: Optional[float] = option(None, gt=0)
    # the number of examples of the test and validation sets, for runs that do not record it
    # (summary.json `test_samples`, `data_split.val_samples`): the floor under accuracy intervals
    test_examples: Optional[int] = option(None, gt=0)
    val_examples: Optional[int] = option(None, gt=0)
    # the variant every other variant's drop is measured from (e.g. iid): the skew interaction,
    # each row's drop against its baseline's drop, with its interval (null: not computed)
    interaction_from: Optional[str] = None
    # declared comparisons [a, b] (a - b, paired where they pair); a label without @variant is
    # compared under every variant. Corrected with the rest of the table's comparisons (Holm)
    comparisons: list[list[str]] = field(default_factory=list)
    # other tasks' tables to set this one's verdicts beside (tables/cross_task.py): a table name ->
    # {this table's variant: that table's variant}, read from docs/results/<name>/table.csv when
    # this table is gathered (a table not produced yet is named as such)
    compare_with: dict[str, dict[str, str]] = field(default_factory=dict)
    # whether every seed draws its own validation and test sets (per_seed) or all share one
    split_seeds: SplitSeeds = SplitSeeds.per_table
    # a difference to resolve: table.md prints the seeds each variant would need for it
    resolve_target: Optional[float] = option(None, gt=0)
    # run on a tree with uncommitted changes (refused otherwise); table.md says so
    allow_dirty: bool = False
    # a paired comparison with a seed whose two runs ran on different machine types (core/machine.py):
    # flag (table.md says so) or refuse (the gather ends in one line; tables/machines.py)
    mixed_machines: str = option("flag", choices=("flag", "refuse"))
    # a folder each finished run's record is carried to, and restored from when the table starts
    # (tables/store.py): commit it, and a fresh checkout resumes the table; a relative path
    # is the repository's
    store: Optional[str] = None
    budget: dict[str, Any] = field(default_factory=dict)  # e.g. {train.budget_samples: 42240}: every row
    every_algorithm: bool = False  # one row per registered algorithm from recipes/<recipe_set>/<algo>.yaml
    # the every-algorithm rows' recipes: cpu (the default digits task) or a set of `recipe_sets()`
    # (cpu_mnist1d, cpu_lm): the same methods, each set's files cpu/'s recipes over its _task.yaml
    recipe_set: str = option("cpu", choices=recipe_sets())
    # what the every-algorithm rows' recipes must share (checked by tests/test_tables.py): the
    # composed config's model, data, epochs, global batch and ranks, msgd on one process
    row_constraints: dict[str, Any] = field(default_factory=dict)
    variants: dict[str, list[str]] = field(default_factory=dict)  # name -> overrides; rows x variants
    workers: WorkersAxis = field(default_factory=WorkersAxis)  # rows x numbers of workers (docs/workers.md)
    # "projected time to ..." files at the gather, on named clusters (tables/projected_config.py)
    project: ProjectedColumns = field(default_factory=ProjectedColumns)
    # how every row's ranks start: null, the runner's default (launch.launcher=auto: forked from
    # cli.py on one machine); true, launch.launcher=fork (refused where fork cannot serve); false,
    # DeepSpeed's launcher (the same run bit for bit; docs/workers.md); a row's own launch.launcher wins
    fork: Optional[bool] = None
    quick: bool = False  # quick_rows, the first seed, no tuning, quick_overrides: a test/CI form
    quick_rows: list[str] = field(default_factory=list)
    quick_overrides: list[str] = field(default_factory=list)
    x_label: str = ""  # what a row's `x` is, for `speedup:` plots
    dry_run: bool = False
    # run nothing: gather the rows whose every seed is made (a table made over days: what it says so
    # far); table.md is titled partial and lists the rows still to make
    gather_only: bool = False
    # gather from a published runs.csv instead of runs (a table made before stores; implies
    # gather_only; a relative path is the repository's; tables/runs_csv.py)
    runs_csv: Optional[str] = None
    launcher: TableLauncher = TableLauncher.local
    row_timeout_s: Optional[float] = option(None, gt=0)


# tables/plots.py draws; `frontier` (its figure, frontier.csv and a table.md section) tables/frontier.py
PLOTS = ("accuracy", "intervals", "pareto", "throughput", "wall", "levels", "workers", "frontier")


def algorithm_rows(folder: Path = CPU_RECIPES) -> list[RowConfig]:
    """One row per registered algorithm (registry order), its recipe `folder/<algo>.yaml`, then
    one per other recipe there (a method composed from an algorithm). A missing recipe is one line
    naming the file to create."""
    algos = dist_algos.list_algorithms()
    missing = [a for a in algos if not (folder / f"{a}.yaml").is_file()]
    if missing:
        if (folder / TASK_FILE).is_file():  # a set on another task: its files are cpu/'s over its task
            what = (f"`defaults: [/recipe/cpu/{missing[0]}, /recipe/{folder.name}/_task]`): the algorithm's "
                    f"digits recipe on this set's task")
        else:
            what = (f"`defaults: [override /algo: {missing[0]}]`) on the default digits task "
                    f"(small_cnn, digits, 30 epochs, 4 ranks x batch 32)")
        raise UserError(f"algorithm {missing[0]} has no CPU recipe for every-algorithm tables: create "
                        f"{folder / (missing[0] + '.yaml')} (`# @package _global_`, {what}")
    methods = sorted(p.stem for p in folder.glob("*.yaml") if p.stem not in algos and not p.stem.startswith("_"))
    return [RowConfig(label=name, recipe=f"{folder.name}/{name}") for name in [*algos, *methods]]


def worker_overrides(axis: WorkersAxis, workers: int, row: RowConfig) -> list[str]:
    """A row's overrides at `workers` training workers under the table's batch rule."""
    found = [f"launch.nproc={workers + row.extra_ranks}"]
    if axis.batch == WorkerBatch.global_constant:
        found.append(f"train.global_batch_size={axis.global_batch}")
    return found


def _check_workers(table: TableConfig) -> None:
    axis = table.workers
    if not axis.counts:
        if axis.quick_counts or axis.global_batch is not None:
            raise UserError(f"table {table.name}: workers.quick_counts and workers.global_batch need workers.counts")
        return
    if any(n < 1 for n in axis.counts) or len(set(axis.counts)) != len(axis.counts):
        raise UserError(f"table {table.name}: workers.counts={list(axis.counts)} must be distinct counts of at least 1")
    if not set(axis.quick_counts) <= set(axis.counts):
        raise UserError(f"table {table.name}: workers.quick_counts={list(axis.quick_counts)} must be among "
                        f"workers.counts={list(axis.counts)}")
    if axis.batch == WorkerBatch.global_constant:
        if axis.global_batch is None:
            raise UserError(f"table {table.name}: workers.batch=global_constant needs workers.global_batch=N "
                            "(the global batch every count shares)")
        bad = [n for n in axis.counts if axis.global_batch % n]
        if bad:
            raise UserError(f"table {table.name}: workers.global_batch={axis.global_batch} is not divisible by "
                            f"{bad[0]} workers; pick a global batch every count divides")
    elif axis.global_batch is not None:
        raise UserError(f"table {table.name}: workers.global_batch={axis.global_batch} is read with "
                        "workers.batch=global_constant only (per_worker keeps each recipe's train.batch_size)")


def expand_rows(table: TableConfig) -> TableConfig:
    """The rows the table runs: listed rows, every-algorithm rows (a listed row with the same label
    replaces its algorithm's), each at every number of workers (label `<row>.w<N>`, baseline the
    baseline at N, `x` = N, `series` = the row), each under every variant (label
    `<row>@<variant>`, baseline the variant's baseline), the table-wide budget, and the quick form."""
    rows = list(table.rows)
    if table.every_algorithm:  # registry order; a listed row takes its algorithm's place
        listed = {r.label: r for r in rows}
        found = algorithm_rows(RECIPES / table.recipe_set)
        found_labels = {f.label for f in found}
        rows = [listed.get(r.label, r) for r in found] + [r for r in rows if r.label not in found_labels]
    if table.quick:
        unknown = sorted(set(table.quick_rows) - {r.label for r in rows})
        if unknown:
            raise UserError(f"table {table.name}: quick_rows {unknown} are not row labels")
        keep = {*table.quick_rows, *([table.baseline] if table.baseline else [])}  # ratios need the baseline
        rows = [replace(r, tune={}) for r in rows if r.label in keep]
    budget = [f"{k}={v}" for k, v in table.budget.items()]
    for key in table.budget:
        if not re.fullmatch(r"train\.budget_(samples|bytes|wall_s)", key):
            raise UserError(f"table {table.name}: budget key {key} is not train.budget_samples, "
                            f"train.budget_bytes or train.budget_wall_s")
    baseline = table.baseline
    comparisons = table.comparisons
    _check_workers(table)
    if table.workers.counts:
        counts = (table.workers.quick_counts or table.workers.counts[:1]) if table.quick else table.workers.counts
        rows = [replace(r, label=f"{r.label}.w{n}", overrides=[*r.overrides, *worker_overrides(table.workers, n, r)],
                        baseline=f"{r.baseline or baseline}.w{n}" if (r.baseline or baseline) else None,
                        x=float(n), series=r.series or r.label)
                for r in rows for n in counts]
        baseline = None  # per row now
        comparisons = [[f"{a}.w{n}", f"{b}.w{n}"] for a, b in comparisons for n in counts]
    if table.variants:
        for r in rows:
            unknown = sorted(set(r.variants or []) - set(table.variants))
            if unknown:
                raise UserError(f"table {table.name}: row {r.label} has variants {unknown}, which are not the "
                                f"table's ({', '.join(table.variants)})")
        rows = [replace(r, label=f"{r.label}@{name}", overrides=[*extra, *r.overrides],
                        baseline=f"{r.baseline or baseline}@{name}" if (r.baseline or baseline) else None,
                        series=r.series or r.label)
                for name, extra in table.variants.items() for r in rows if r.variants is None or name in r.variants]
        baseline = None  # per row now
    overrides = [*table.overrides, *({True: ["launch.launcher=fork"], False: ["launch.launcher=deepspeed"]}.get(table.fork, [])), *budget,
                 *(table.quick_overrides if table.quick else [])]
    seeds = table.seeds[:1] if table.quick else table.seeds
    if table.quick:  # the declared comparisons of the rows the quick form keeps
        kept = {row_name(r.label) for r in rows}
        comparisons = [pair for pair in comparisons if all(row_name(name) in kept for name in pair)]
    return replace(table, rows=rows, overrides=overrides, seeds=seeds, baseline=baseline,
                   tune={} if table.quick else table.tune, comparisons=comparisons,
                   x_label=table.x_label or ("training workers" if table.workers.counts else ""))


def row_name(label: str) -> str:
    """A label without its `@variant`."""
    return label.partition("@")[0]


def row_grid(table: TableConfig, row: RowConfig) -> dict[str, list[Any]]:
    """The row's tuning grid ({}: not tuned)."""
    return dict(row.tune if row.tune is not None else table.tune)


def _direction(table: TableConfig, metric: str, option_name: str) -> Better:
    found = table.better or implied_direction(metric)
    if found is None:
        raise UserError(f"table {table.name}: {option_name}={metric} says nothing of which way is better; "
                        f"set table.better=higher or table.better=lower")
    return found


def headline(table: TableConfig) -> Headline:
    """The metric rows are compared on (test), chosen by (validation), and which way is better."""
    return Headline(compare=table.compare_metric, select=table.select_metric,
                    better=_direction(table, table.compare_metric, "compare_metric"),
                    select_better=_direction(table, table.select_metric, "select_metric"))


def tie_direction(table: TableConfig) -> Better:
    """The tie metric's direction: from its name (val_loss: lower), never from `table.better`."""
    found = implied_direction(table.tie_metric)
    if found is None:
        raise UserError(f"table {table.name}: tie_metric={table.tie_metric} says nothing of which way is "
                        f"better; use a validation loss or accuracy (val_loss, val_acc)")
    return found


def target(table: TableConfig) -> Optional[float]:
    """The value time- and bytes-to-target wait for (target_acc, or target_value)."""
    return table.target_value if table.target_value is not None else table.target_acc


def tie_seeds(table: TableConfig) -> list[int]:
    """The tuning seeds added where a one-seed grid cannot tell its best settings apart: never a
    reported seed (its runs would then have chosen their own setting)."""
    if table.tune_tie_seeds is not None:
        return list(table.tune_tie_seeds)
    used = {*table.seeds, *table.tune_seeds}
    return [next(s for s in range(len(used) + 1) if s not in used)]


def _check_protocol(table: TableConfig) -> None:
    """The protocol's settings, each one line when wrong."""
    for option_name, metric, verb in (("select_metric", table.select_metric, "choose"),
                                      ("target_metric", table.target_metric, "time its target")):
        if evaluation_set(metric) == "test":
            raise UserError(f"table {table.name}: {option_name}={metric} would {verb} on the test set; use "
                            f"its validation counterpart ({metric.replace('test_', 'val_', 1)})")
    headline(table)
    tie_direction(table)
    if table.target_acc is not None and table.target_value is not None:
        raise UserError(f"table {table.name}: set target_acc or target_value, not both")
    overlap = sorted(set(tie_seeds(table)) & set(table.seeds))
    if overlap:
        raise UserError(f"table {table.name}: tune_tie_seeds {overlap} are reported seeds; choose others")
    if table.interaction_from is not None and table.interaction_from not in table.variants:
        raise UserError(f"table {table.name}: interaction_from={table.interaction_from} is not a variant "
                        f"({', '.join(table.variants) or 'the table has none'})")
    for other, variants in table.compare_with.items():
        if not (TABLE_CONFIGS / f"{other}.yaml").exists():
            raise UserError(f"table {table.name}: compare_with names {other}, which is not a table (conf/table/)")
        for mine in variants:
            if mine not in table.variants:
                raise UserError(f"table {table.name}: compare_with.{other} maps {mine}, which is not a variant "
                                f"({', '.join(table.variants) or 'the table has none'})")
    labels = {r.label for r in table.rows}
    for pair in table.comparisons:
        if len(pair) != 2:
            raise UserError(f"table {table.name}: comparisons entry {pair} is not a pair [row, row]")
        for name in pair:
            known = name in labels or any(f"{name}@{v}" in labels for v in table.variants)
            if not known:
                raise UserError(f"table {table.name}: comparisons names {name}, which is not a row label")


def load_table(node: DictConfig) -> TableConfig:
    table = expand_rows(typed_section(TableConfig, node, "table"))
    _check_protocol(table)
    labels = [r.label for r in table.rows]
    if not labels:
        raise UserError(f"table {table.name}: no rows")
    if len(set(labels)) != len(labels):
        raise UserError(f"table {table.name}: row labels must be unique ({labels})")
    for where, base in [("table.baseline", table.baseline)] + [(f"row {r.label}: baseline", r.baseline) for r in table.rows]:
        if base is not None and base not in labels:
            raise UserError(f"{where}={base} is not a row label; rows: {', '.join(labels)}")
    for column in ("time_to_target_s", "bytes_to_target"):
        if column in table.columns and target(table) is None:
            raise UserError(f"table {table.name}: the {column} column needs table.target_acc (or target_value)")
    for plot in table.plots:  # (an unknown one was skipped in silence, after hours of runs)
        if plot not in PLOTS and not plot.startswith(("series:", "speedup:")):
            raise UserError(f"table {table.name}: table.plots has {plot!r}; known: {', '.join(PLOTS)}, "
                            "series:<key>, speedup:<metric>")
    return table


def row_args(table: TableConfig, row: RowConfig, seed: int, run_dir: RunDir, setting: list[str] = ()) -> list[str]:
    """cli.py's arguments for one run of a row (`setting`: a tuning grid's overrides, last)."""
    args = [f"recipe={row.recipe}"] if row.recipe else []
    return [*args, *table.overrides, *row.overrides, *setting, *(f"{key}={seed}" for key in row.seed_options),
            f"seed={seed}", f"hydra.run.dir={run_dir.root}"]


def row_dir(out: Path, row: RowConfig, seed: int) -> RunDir:
    return RunDir(out / row.label / f"seed_{seed}")


