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
    # summary.json keys shown as further columns after the standard ones; a row whose summary lacks
    # one shows "-", so a table can reserve a column for a measurement still to come
    extra_metrics: list[str] = field(default_factory=list)
    plots: list[str] = field(default_factory=lambda: ["accuracy"])  # accuracy | pareto | series:<key> | throughput
    rows: list[RowConfig] = field(default_factory=list)
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
    if table.baseline is not None and table.baseline not in labels:
        raise UserError(f"table.baseline={table.baseline} is not a row label; rows: {', '.join(labels)}")
    return table


def row_args(table: TableConfig, row: RowConfig, seed: int, run_dir: RunDir) -> list[str]:
    args = [f"recipe={row.recipe}"] if row.recipe else []
    return [*args, *table.overrides, *row.overrides, f"seed={seed}", f"hydra.run.dir={run_dir.root}"]


def row_dir(out: Path, row: RowConfig, seed: int) -> RunDir:
    return RunDir(out / row.label / f"seed_{seed}")


