"""Tuned rows: a small grid per row, chosen on validation, so that no method is compared untuned.

A row (or the whole table) may give `tune: {optim.lr: [0.03, 0.1, 0.3]}`; several keys make
their Cartesian product. Every setting runs on `table.tune_seeds` in
`<label>/tune/<setting>/seed_<s>/`; the setting with the best MEAN of `table.select_metric` over
those seeds wins, and the row's reported runs (`<label>/seed_<s>/`, on `table.seeds`) use it.

The selection metric is the FINAL validation accuracy (`val_acc`) by default: the number reported
for a row is the final model's test accuracy, so the setting is chosen for the final model too
(`best_val_acc` would choose for a model the table never reports). Test metrics are refused as
selection metrics. Ties keep the earlier setting in grid order; a setting with a missing or failed
run has no mean and cannot win (the table notes it).
"""
from __future__ import annotations

import itertools
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from core.rundir import RunDir

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


def tune_dir(out: Path, label: str, setting: Setting, seed: int) -> RunDir:
    return RunDir(out / label / "tune" / setting_name(setting) / f"seed_{seed}")


@dataclass
class Tuned:
    """A row's grid, each setting's mean selection metric over the tuning seeds (None: a run is
    missing or failed), and the winner among the settings with a mean (None if none has one)."""
    metric: str
    results: list[tuple[Setting, Optional[float], int]]  # setting, mean, runs found
    winner: Optional[Setting]


def _metric(run: RunDir, metric: str) -> Optional[float]:
    if not run.summary.exists():
        return None
    value = json.loads(run.summary.read_text()).get(metric)
    return float(value) if isinstance(value, (int, float)) else None


def choose(out: Path, label: str, grid: dict[str, list[Any]], seeds: list[int], metric: str) -> Tuned:
    """The setting with the best mean `metric` over `seeds`, from the tuning runs' summaries."""
    results: list[tuple[Setting, Optional[float], int]] = []
    for setting in grid_settings(grid):
        values = [v for v in (_metric(tune_dir(out, label, setting, s), metric) for s in seeds) if v is not None]
        results.append((setting, statistics.fmean(values) if len(values) == len(seeds) else None, len(values)))
    scored = [(mean, -i) for i, (_, mean, _) in enumerate(results) if mean is not None]
    winner = results[-max(scored)[1]][0] if scored else None
    return Tuned(metric, results, winner)
