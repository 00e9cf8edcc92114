"""Projected time to quality for any table, at its gather (issue 89): real numerics, projected time.

For each row and seed, the run's own validation curve (measured at the worker count that ran)
gives the first evaluation step that reaches a target; the projection (docs/projection.md: the
plugin's declared pattern at the run's world, the ledger's byte ratios and compute where the run
kept a ledger, else a device profile) gives the wall clock to the end of that step on a named
cluster, with its band. Two targets per row, from its baseline row (allreduce) on the same variant
and worker count: (a) the baseline's final value of the selection metric (validation), the mean
over its seeds; (b) a looser one (`table.project.loose_ratio` of it where higher is better, plus
`loose_margin` where lower is).

A cell is the mean over the seeds that reached the target, its band from the lowest seed's low
end to the highest seed's high end (the compute tail's 5th-95th percentile, docs/projection.md),
and how many seeds reached it where not all did; a row none of whose seeds reached it is "not
reached", and a worker count the row has no runs at is "not run": accuracy is never extrapolated.

The bandwidth sweep (`sweep`) projects the same steps again with each cluster's NIC bandwidth set
to each of `table.project.bandwidths_gbit`, at one worker count, one replicate (no band), so that
the figure shows where each method's best setting starts to beat allreduce end to end.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from core.errors import UserError
from projection.cluster import GBIT, Cluster
from projection.run_inputs import RunInputs
from tables.config import RowConfig, TableConfig, headline
from tables.measure import Better, reaches
from tables.projected_runs import Projector, run_inputs
from tables.run_records import RunRecords
from tables.runs import row_rel, variant_of

BASELINE, LOOSE = "baseline", "loose"


@dataclass(frozen=True)
class Target:
    """A validation value to reach: which (a or b), of which metric, which way is better."""

    kind: str
    metric: str
    value: float
    better: Better

    def name(self, baseline: str) -> str:
        """The target in a header's words ("allreduce's final val_acc", "0.99 x ...")."""
        return f"{baseline}'s final {self.metric}" if self.kind == BASELINE else f"looser {self.metric}"


@dataclass(frozen=True)
class SeedTime:
    """One seed's first step reaching a target and the projected seconds to it (with the band)."""

    seed: int
    step: int
    seconds: float
    low: float
    high: float


@dataclass
class Cell:
    """One row's time to one target (the module doc): the seeds that ran and those that reached."""

    label: str
    target: Optional[Target]
    seeds_run: int
    reached: list[SeedTime] = field(default_factory=list)

    @property
    def state(self) -> str:
        if self.seeds_run == 0:
            return "not run"
        if self.target is None:
            return "no target"
        return "reached" if self.reached else "not reached"

    @property
    def seconds(self) -> Optional[float]:
        return float(np.mean([s.seconds for s in self.reached])) if self.reached else None

    @property
    def band(self) -> Optional[tuple[float, float]]:
        return (min(s.low for s in self.reached), max(s.high for s in self.reached)) if self.reached else None

    @property
    def ranked(self) -> Optional[float]:
        """The time to rank the row by (headlines, the bandwidth sweep): its `seconds` where at least
        half the seeds that ran reached the target, else None. `seconds` is the mean of the seeds that
        reached, so a row with one lucky seed of ten would be ranked on that run alone."""
        return self.seconds if self.reached and 2 * len(self.reached) >= self.seeds_run else None


@dataclass
class RowRuns:
    """A row's finished runs, read once: per seed the run's inputs and its validation curve."""

    row: RowConfig
    runs: dict[int, RunInputs]
    curves: dict[int, list[tuple[int, float]]]

    @property
    def train_ranks(self) -> Optional[int]:
        first = next(iter(self.runs.values()), None)
        return None if first is None else int(first.summary.get("train_ranks") or first.world)

    @property
    def algo(self) -> str:
        first = next(iter(self.runs.values()), None)
        return first.config.algo.name if first is not None else self.row.label


def metric_curve(records: RunRecords, rel: str, metric: str) -> list[tuple[int, float]]:
    """(step, value) of `metric` at every evaluation of the run, in order."""
    out = []
    for rec in records.metrics(rel, "eval") or []:
        value = rec.get(metric)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out.append((int(rec["step"]), float(value)))
    return out


def read_rows(table: TableConfig, records: RunRecords, out: Path, metric: str) -> dict[str, RowRuns]:
    """Every row's finished runs (a row with none has an empty `runs`)."""
    found = {}
    for row in table.rows:
        runs, curves = {}, {}
        for seed in table.seeds:
            rel = row_rel(row, seed)
            if records.has(rel):
                runs[seed] = run_inputs(records, rel, out)
                curves[seed] = metric_curve(records, rel, metric)
        found[row.label] = RowRuns(row, runs, curves)
    return found


def final_value(run: RunInputs, curve: list[tuple[int, float]], metric: str) -> Optional[float]:
    """The run's final value of `metric`: its summary's, else its last evaluation's."""
    value = run.summary.get(metric)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return curve[-1][1] if curve else None


def targets_of(base: RowRuns, metric: str, better: Better, cfg: Any) -> Optional[tuple[Target, Target]]:
    """(a, b) from the baseline row's runs (the module doc); None when it has no final value."""
    values = [v for s, run in base.runs.items() if (v := final_value(run, base.curves[s], metric)) is not None]
    if not values:
        return None
    a = float(np.mean(values))
    loose = a * cfg.loose_ratio if better == Better.higher else a + cfg.loose_margin
    return Target(BASELINE, metric, a, better), Target(LOOSE, metric, loose, better)


def first_step(curve: list[tuple[int, float]], target: Target) -> Optional[int]:
    """The first evaluation step whose value reaches the target (None: never)."""
    return next((step for step, value in curve if reaches(value, target.value, target.better)), None)


def cell(rows: RowRuns, target: Optional[Target], projector: Projector, cluster: Cluster) -> Cell:
    """One row's time to `target` on `cluster` (the module doc)."""
    found = Cell(rows.row.label, target, len(rows.runs))
    if target is None:
        return found
    for seed, run in rows.runs.items():
        step = first_step(rows.curves[seed], target)
        if step is None:
            continue
        # an evaluation at step s follows s steps: the time to the end of step s - 1 (0-based)
        seconds, low, high = projector.project(run, cluster).time_to(step - 1)
        found.reached.append(SeedTime(seed, step, seconds, low, high))
    return found


@dataclass
class Projected:
    """A table's projected times on one cluster: per row, its baseline, targets and two cells."""

    cluster: Cluster
    rows: dict[str, RowRuns]
    baselines: dict[str, str]
    targets: dict[str, Optional[tuple[Target, Target]]]
    cells: dict[str, tuple[Cell, Cell]]
    sources: list[str]
    used: dict[tuple[str, int], tuple[str, str]]  # (row, seed) -> (its compute's source, its byte ratios')
    # target (0: a, 1: b) -> Gbit/s -> row -> seconds (None: not reached)
    sweep: dict[int, dict[float, dict[str, Optional[float]]]] = field(default_factory=dict)
    sweep_workers: Optional[int] = None


def baseline_of(table: TableConfig, row: RowConfig) -> str:
    name = row.baseline or table.baseline
    if name is None:
        raise UserError(f"table {table.name}: table.project times rows to their baseline's quality, and the table "
                        "names no baseline row; set table.baseline")
    return name


def project_table(table: TableConfig, rows: dict[str, RowRuns], cluster: Cluster, projector: Projector) -> Projected:
    """Every row's two cells on `cluster`."""
    head = headline(table)
    metric, better = head.select, head.select_better
    baselines = {label: baseline_of(table, r.row) for label, r in rows.items()}
    targets = {label: targets_of(rows[base], metric, better, projector.cfg) for label, base in baselines.items()}
    cells = {}
    for label, found in rows.items():
        pair = targets[label]
        cells[label] = (cell(found, pair[0] if pair else None, projector, cluster),
                        cell(found, pair[1] if pair else None, projector, cluster))
    sources = sorted({projector.source(run) for r in rows.values() for run in r.runs.values()})
    used = {(label, seed): projector.used(run) for label, r in rows.items() for seed, run in r.runs.items()}
    return Projected(cluster, rows, baselines, targets, cells, sources, used)


def with_bandwidth(cluster: Cluster, gbit: float) -> Cluster:
    """The preset with its NICs at `gbit` (each direction, per NIC); everything else as it is."""
    return dataclasses.replace(cluster, nic=dataclasses.replace(cluster.nic, bandwidth_Bps=gbit * GBIT))


def sweep_count(table: TableConfig, rows: dict[str, RowRuns]) -> Optional[int]:
    """The worker count the sweep runs at: table.project.sweep_workers, else the largest that ran."""
    counts = {r.train_ranks for r in rows.values() if r.train_ranks is not None}
    return table.project.sweep_workers or (max(counts) if counts else None)


def sweep(projected: Projected, table: TableConfig, projector: Projector) -> None:
    """Time to each target at each swept bandwidth, for the rows that ran at the sweep's count."""
    count = sweep_count(table, projected.rows)
    projected.sweep_workers = count
    if count is None:  # no finished runs yet: nothing to sweep
        return
    chosen = {label: r for label, r in projected.rows.items() if r.train_ranks == count}
    for gbit in sorted(table.project.bandwidths_gbit):
        cluster = with_bandwidth(projected.cluster, gbit)
        for which in (0, 1):
            at = projected.sweep.setdefault(which, {}).setdefault(gbit, {})
            for label, found in chosen.items():
                pair = projected.targets[label]
                at[label] = cell(found, pair[which] if pair else None, projector, cluster).ranked


#: the projection's median error on a speedup over allreduce: |predicted / measured - 1| over the 21
#: speedups of docs/projection.md's blind proof (tests/test_projected_columns.py recomputes it from
#: that table). A row "faster" by less than this is faster by less than the projection can tell.
SPEEDUP_ERROR = 0.113


def sign_changes(gbits: list[float], sides: list[float]) -> list[tuple[float, bool]]:
    """Each bandwidth at which `sides` changes sign, interpolated on log-log axes, with whether it is
    negative above it."""
    found = []
    for g0, g1, s0, s1 in zip(gbits, gbits[1:], sides, sides[1:]):
        if (s0 < 0) != (s1 < 0):
            found.append((math.exp(math.log(g0) + (math.log(g1) - math.log(g0)) * s0 / (s0 - s1)), s1 < 0))
    return found


def crossings(gbits: list[float], mine: list[Optional[float]], base: list[Optional[float]]) -> Optional[str]:
    """Where a row's time crosses its baseline's across the sweep, in words (None: not comparable):
    the bandwidth of each change of sign of log(mine / base), interpolated on log-log axes; where the
    row is faster, where it is faster by more than the projection's own speedup error
    (SPEEDUP_ERROR), since a crossing inside that band is one the model cannot place; and the range
    of mine / base over the sweep, so that "faster" by a fraction of a percent (where compute is all
    there is) reads differently from "faster" by a factor."""
    pairs = [(g, m, b) for g, m, b in zip(gbits, mine, base) if m is not None and b is not None]
    if len(pairs) < 2:
        return None
    swept = [g for g, _, _ in pairs]
    ratios = [m / b for _, m, b in pairs]
    sides = [math.log(r) for r in ratios]
    span = f"{min(ratios):.3f}-{max(ratios):.3f} x the baseline's time"
    every = f"every swept bandwidth ({swept[0]:g}-{swept[-1]:g} Gbit/s; {span})"
    if all(s >= 0 for s in sides):
        return f"slower or equal at {every}"
    if all(s < 0 for s in sides):
        words = f"faster at {every}"
    else:
        words = "; ".join(f"faster {'above' if above else 'below'} {at:.3g} Gbit/s"
                          for at, above in sign_changes(swept, sides)) + f" ({span})"
    clear = [s + math.log1p(SPEEDUP_ERROR) for s in sides]  # < 0: faster by more than the error
    error = f"the projection's speedup error ({SPEEDUP_ERROR:.0%})"
    if all(c >= 0 for c in clear):
        return f"{words}; nowhere by more than {error}"
    if all(c < 0 for c in clear):
        return f"{words}; by more than {error} throughout"
    return f"{words}; by more than {error} " + ", ".join(
        f"{'above' if above else 'below'} {at:.3g} Gbit/s" for at, above in sign_changes(swept, clear))


def variant_rows(projected: Projected) -> dict[str, list[str]]:
    """The swept rows by variant, in table order."""
    out: dict[str, list[str]] = {}
    for label, r in projected.rows.items():
        if projected.sweep and r.train_ranks == projected.sweep_workers:
            out.setdefault(variant_of(label), []).append(label)
    return out
