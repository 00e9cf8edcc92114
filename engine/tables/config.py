"""A paper table's config (`table=NAME`, recipes/tables/NAME.yaml) and its directory's layout.

A table lists rows, each a recipe plus overrides and a label, the baseline row that ratios refer
to, the seeds, and the paper's published numbers for each row with their source. Each row x seed
is its own run directory, `<table dir>/<label>/seed_<s>/`.

The rows a table runs are its listed rows expanded (`expand_rows`): `every_algorithm: true` adds
one row per registered algorithm from its CPU recipe, `recipes/cpu/<algo>.yaml`, and one per
other recipe in that folder (methods composed from an algorithm, e.g. a compressor); `variants`
repeats every row under each named set of overrides (IID and skewed data side by side);
`budget` puts every row on the same `train.budget_*`; `quick: true` keeps `quick_rows` (and the
baseline row), the first seed and no tuning, for a test or CI.
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


class TableLauncher(enum.StrEnum):
    local = "local"  # rows one after another on this machine
    slurm = "slurm"  # rows submitted as Hydra multiruns through the submitit launcher


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
    plots: list[str] = field(default_factory=lambda: ["accuracy"])  # accuracy | intervals | pareto | series:<key> | throughput | wall | speedup:<m>
    rows: list[RowConfig] = field(default_factory=list)
    # summary.json keys shown per row, plus time_to_target_s (needs target_acc); ratios: those
    # divided by the baseline row's
    # (selection on validation: the best evaluation by val_acc and the test accuracy there, never
    # the best test accuracy)
    columns: list[str] = field(default_factory=lambda: ["test_acc", "val_acc", "best_val_acc", "test_acc_at_best",
                                                        "steps", "syncs", "comm_bytes", "wall_s", "samples_per_s"])
    ratios: list[str] = field(default_factory=lambda: ["syncs", "comm_bytes", "wall_s", "samples_per_s"])
    target_acc: Optional[float] = option(None, gt=0, le=1)  # time_/bytes_to_target: first eval reaching this
    target_metric: str = "val_acc"  # the eval records' metric that target_acc applies to (validation)
    # tuning (engine/tables/tuning.py): a grid per row, run on tune_seeds, chosen on select_metric
    tune: dict[str, list[Any]] = field(default_factory=dict)
    tune_seeds: list[int] = field(default_factory=lambda: [0])
    # a one-key numeric grid whose best setting is strictly at an edge is extended by one more point
    # beyond it (the grid's own ratio), up to this many times per side: a baseline whose best
    # learning rate lies outside the grid is not tuned (engine/tables/tuning.py, extend_grid)
    tune_extend: int = option(0, ge=0)
    select_metric: str = "val_acc"  # summary.json key, higher is better; never a test_* metric
    compare_metric: str = "test_acc"  # the column whose difference from the baseline row is tested
    budget: dict[str, Any] = field(default_factory=dict)  # e.g. {train.budget_samples: 42240}: every row
    every_algorithm: bool = False  # one row per registered algorithm from recipes/cpu/<algo>.yaml
    # what the every-algorithm rows' recipes must share (checked by tests/test_tables.py): the
    # composed config's model, data, epochs, global batch and ranks, msgd on one process
    row_constraints: dict[str, Any] = field(default_factory=dict)
    variants: dict[str, list[str]] = field(default_factory=dict)  # name -> overrides; rows x variants
    quick: bool = False  # quick_rows, the first seed, no tuning, quick_overrides: a test/CI form
    quick_rows: list[str] = field(default_factory=list)
    quick_overrides: list[str] = field(default_factory=list)
    x_label: str = ""  # what a row's `x` is, for `speedup:` plots
    dry_run: bool = False
    launcher: TableLauncher = TableLauncher.local
    row_timeout_s: Optional[float] = option(None, gt=0)


RECIPES = Path(__file__).resolve().parents[2] / "recipes"
CPU_RECIPES = RECIPES / "cpu"  # every algorithm's own CPU recipe on the default digits task


PLOTS = ("accuracy", "intervals", "pareto", "throughput", "wall")  # engine/tables/plots.py draws


def algorithm_rows(folder: Path = CPU_RECIPES) -> list[RowConfig]:
    """One row per registered algorithm (registry order), its recipe `folder/<algo>.yaml`, then
    one per other recipe there (a method composed from an algorithm). A missing recipe is one line
    naming the file to create."""
    algos = dist_algos.list_algorithms()
    missing = [a for a in algos if not (folder / f"{a}.yaml").is_file()]
    if missing:
        raise UserError(f"algorithm {missing[0]} has no CPU recipe for every-algorithm tables: create "
                        f"{folder / (missing[0] + '.yaml')} (`# @package _global_`, "
                        f"`defaults: [override /algo: {missing[0]}]`) on the default digits task "
                        f"(small_cnn, digits, 30 epochs, 4 ranks x batch 32)")
    methods = sorted(p.stem for p in folder.glob("*.yaml") if p.stem not in algos and not p.stem.startswith("_"))
    return [RowConfig(label=name, recipe=f"{folder.name}/{name}") for name in [*algos, *methods]]


def expand_rows(table: TableConfig) -> TableConfig:
    """The rows the table runs: listed rows, every-algorithm rows (a listed row with the same label
    replaces its algorithm's), each under every variant (label `<row>@<variant>`, baseline the variant's baseline),
    the table-wide budget, and the quick form."""
    rows = list(table.rows)
    if table.every_algorithm:  # registry order; a listed row takes its algorithm's place
        listed = {r.label: r for r in rows}
        found = algorithm_rows()
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
    if table.variants:
        rows = [replace(r, label=f"{r.label}@{name}", overrides=[*extra, *r.overrides],
                        baseline=f"{r.baseline or baseline}@{name}" if (r.baseline or baseline) else None,
                        series=r.series or r.label)
                for name, extra in table.variants.items() for r in rows]
        baseline = None  # per row now
    overrides = [*table.overrides, *budget, *(table.quick_overrides if table.quick else [])]
    seeds = table.seeds[:1] if table.quick else table.seeds
    return replace(table, rows=rows, overrides=overrides, seeds=seeds, baseline=baseline,
                   tune={} if table.quick else table.tune)


def row_grid(table: TableConfig, row: RowConfig) -> dict[str, list[Any]]:
    """The row's tuning grid ({}: not tuned)."""
    return dict(row.tune if row.tune is not None else table.tune)


def load_table(node: DictConfig) -> TableConfig:
    table = expand_rows(typed_section(TableConfig, node, "table"))
    if table.select_metric.startswith(("test_", "best_test")):
        raise UserError(f"table {table.name}: select_metric={table.select_metric} would choose on the test "
                        f"set; use val_acc (or best_val_acc)")
    labels = [r.label for r in table.rows]
    if not labels:
        raise UserError(f"table {table.name}: no rows")
    if len(set(labels)) != len(labels):
        raise UserError(f"table {table.name}: row labels must be unique ({labels})")
    for where, base in [("table.baseline", table.baseline)] + [(f"row {r.label}: baseline", r.baseline) for r in table.rows]:
        if base is not None and base not in labels:
            raise UserError(f"{where}={base} is not a row label; rows: {', '.join(labels)}")
    for column in ("time_to_target_s", "bytes_to_target"):
        if column in table.columns and table.target_acc is None:
            raise UserError(f"table {table.name}: the {column} column needs table.target_acc")
    for plot in table.plots:  # (an unknown one was skipped in silence, after hours of runs)
        if plot not in PLOTS and not plot.startswith(("series:", "speedup:")):
            raise UserError(f"table {table.name}: table.plots has {plot!r}; known: {', '.join(PLOTS)}, "
                            "series:<key>, speedup:<metric>")
    return table


def row_args(table: TableConfig, row: RowConfig, seed: int, run_dir: RunDir, setting: list[str] = ()) -> list[str]:
    """cli.py's arguments for one run of a row (`setting`: a tuning grid's overrides, last)."""
    args = [f"recipe={row.recipe}"] if row.recipe else []
    return [*args, *table.overrides, *row.overrides, *setting, f"seed={seed}", f"hydra.run.dir={run_dir.root}"]


def row_dir(out: Path, row: RowConfig, seed: int) -> RunDir:
    return RunDir(out / row.label / f"seed_{seed}")


