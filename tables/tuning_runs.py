"""A table's tuning as the runner makes and reads it: the policy from the table's settings, each
row's grid as run (extended beyond a winning edge) and the seeds its choice rests on, the tuning
jobs, the choices, and what a gather shows of grids still running (the rules are tables/tuning.py's)."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from core.rundir import RunDir
from tables.config import RowConfig, TableConfig, headline, row_args, row_grid, tie_direction, tie_seeds
from tables.run_records import RunsAt, records_of
from tables.runs import Summary
from tables.tuning import (TunePolicy, Tuned, choose, extend_grid, grid_settings, row_seeds, setting_name,
                           setting_overrides, tune_dir, tune_rel)


def tune_policy(table: TableConfig) -> TunePolicy:
    """How the table's grids choose (tables/tuning.py): its selection metric and direction,
    its tie metric, and the extra tuning seed a one-seed grid gets when it cannot choose."""
    return TunePolicy(metric=table.select_metric, better=headline(table).select_better, tie_metric=table.tie_metric,
                      tie_better=tie_direction(table), val_examples=table.val_examples,
                      tie_seeds=tuple(tie_seeds(table)) if len(table.tune_seeds) < 2 else (),
                      stability_keys=tuple(table.tune_stability_keys), resolution=table.tune_resolution,
                      margin_cost=table.tune_margin_cost)


def tuning_grid(table: TableConfig, row: RowConfig, out: RunsAt) -> tuple[dict[str, list[Any]], int]:
    """The row's grid as run: its own, extended beyond a winning edge (`table.tune_extend`), and
    how many points the extension added."""
    return extend_grid(out, row.label, row_grid(table, row), table.tune_seeds, table.select_metric,
                       table.tune_extend, tune_policy(table))


def tuning_seeds(table: TableConfig, row: RowConfig, out: RunsAt, grid: dict[str, list[Any]]) -> list[int]:
    """The seeds a row's grid runs on: the tuning seeds, and the tie seed where one seed could not choose."""
    return row_seeds(out, row.label, grid, table.tune_seeds, table.select_metric, tune_policy(table))


def tuning_jobs(table: TableConfig, out: Path) -> list[tuple[str, list[str], RunDir]]:
    """Every tuned row's grid on its tuning seeds."""
    jobs = []
    for row in table.rows:
        grid = tuning_grid(table, row, out)[0]
        for setting in grid_settings(grid) if grid else []:
            for seed in tuning_seeds(table, row, out, grid):
                run_dir = tune_dir(out, row.label, setting, seed)
                jobs.append((f"{row.label} {setting_name(setting)} seed {seed}",
                             row_args(table, row, seed, run_dir, setting_overrides(setting)), run_dir))
    return jobs


def chosen(table: TableConfig, out: RunsAt) -> dict[str, Tuned]:
    """Each tuned row's grid results and winner, from the tuning runs written so far."""
    found = {}
    for row in table.rows:
        if row_grid(table, row):
            grid, added = tuning_grid(table, row, out)
            found[row.label] = replace(choose(out, row.label, grid, tuning_seeds(table, row, out, grid),
                                              table.select_metric, tune_policy(table)), extended=added)
    return found


def tuned_so_far(table: TableConfig, shown: TableConfig, out: RunsAt) -> tuple[dict[str, Tuned], list[str]]:
    """table.gather_only's tuning: every row of `shown` (they need their choice), and beside them
    each row whose grid is complete though none of its reported runs is shown yet, so that a choice
    (within noise, at an edge, a divergence) can be read while the table is still being produced;
    and a line naming the rows whose grids are still running."""
    tuned = chosen(table, out)
    keep = {r.label for r in shown.rows}
    running = [f"{label} ({sum(runs for _, _, runs in t.results)} of {len(t.results) * len(t.seeds)} runs)"
               for label, t in tuned.items() if label not in keep and not t.complete]
    lines = [f"Tuning: the grids of {sum(t.complete for t in tuned.values())} of {len(tuned)} tuned rows are "
             f"complete and shown under Tuning (a complete grid's choice is final).", ""]
    if running:
        lines += [f"Grids still running (not shown): {', '.join(running)}.", ""]
    return {label: t for label, t in tuned.items() if label in keep or t.complete}, lines


def tuning_summaries(table: TableConfig, out: RunsAt, tuned: dict[str, Tuned]) -> dict[str, dict[int, Summary]]:
    """The tuning runs' summaries (label -> index -> summary), for the provenance section."""
    records = records_of(out)
    found: dict[str, dict[int, Summary]] = {}
    for label, result in tuned.items():
        runs = [tune_rel(label, setting, s) for setting, _, _ in result.results for s in result.seeds]
        found[label] = {i: summary for i, rel in enumerate(runs) if (summary := records.summary(rel)) is not None}
    return found
