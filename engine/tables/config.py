"""A paper table's config (`table=NAME`, recipes/tables/NAME.yaml) and its directory's layout.

A table lists rows, each a recipe plus overrides and a label, the baseline row that ratios refer
to, the seeds, and the paper's published numbers for each row with their source. Each row x seed
is its own run directory, `<table dir>/<label>/seed_<s>/`.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig

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
    plots: list[str] = field(default_factory=lambda: ["accuracy"])  # accuracy | pareto | series:<key> | throughput
    rows: list[RowConfig] = field(default_factory=list)
    # summary.json keys shown per row, plus time_to_target_s (needs target_acc); ratios: those
    # divided by the baseline row's
    columns: list[str] = field(default_factory=lambda: ["test_acc", "best_test_acc", "steps", "syncs", "comm_bytes",
                                                        "wall_s", "samples_per_s"])
    ratios: list[str] = field(default_factory=lambda: ["syncs", "comm_bytes", "wall_s", "samples_per_s"])
    target_acc: Optional[float] = option(None, gt=0, le=1)  # time_to_target_s: wall-clock to this test_acc
    x_label: str = ""  # what a row's `x` is, for `speedup:` plots
    dry_run: bool = False
    launcher: TableLauncher = TableLauncher.local
    row_timeout_s: Optional[float] = option(None, gt=0)


def load_table(node: DictConfig) -> TableConfig:
    table = typed_section(TableConfig, node, "table")
    labels = [r.label for r in table.rows]
    if not labels:
        raise UserError(f"table {table.name}: no rows")
    if len(set(labels)) != len(labels):
        raise UserError(f"table {table.name}: row labels must be unique ({labels})")
    for where, base in [("table.baseline", table.baseline)] + [(f"row {r.label}: baseline", r.baseline) for r in table.rows]:
        if base is not None and base not in labels:
            raise UserError(f"{where}={base} is not a row label; rows: {', '.join(labels)}")
    if "time_to_target_s" in table.columns and table.target_acc is None:
        raise UserError(f"table {table.name}: the time_to_target_s column needs table.target_acc")
    return table


def row_args(table: TableConfig, row: RowConfig, seed: int, run_dir: RunDir) -> list[str]:
    args = [f"recipe={row.recipe}"] if row.recipe else []
    return [*args, *table.overrides, *row.overrides, f"seed={seed}", f"hydra.run.dir={run_dir.root}"]


def row_dir(out: Path, row: RowConfig, seed: int) -> RunDir:
    return RunDir(out / row.label / f"seed_{seed}")


