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

A grid is only as good as its range: a method whose best learning rate lies below the grid is
compared at the wrong one. With `table.tune_extend=N`, a one-key numeric grid whose best mean is
strictly at an edge (better than every other point) gets one more point beyond that edge, the
grid's own ratio further (0.03 after 0.1 and 0.3 gives 0.009), up to N times per side; each new
point runs on the tuning seeds like the others, and the choice is made again (`extend_grid`).
The reported runs of a row are checked against the setting finally chosen (`stale_setting`).
"""
from __future__ import annotations

import itertools
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf

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


def _next_point(edge: float, neighbour: float) -> float:
    """One grid step beyond `edge`, away from `neighbour` (geometric), to 3 significant digits."""
    return float(f"{edge * edge / neighbour:.3g}")


def extend_grid(out: Path, label: str, grid: dict[str, list[Any]], seeds: list[int], metric: str,
                limit: int) -> tuple[dict[str, list[Any]], int]:
    """The row's grid with the points `tune_extend` adds (see the module doc), and how many it
    added. Stops at a point whose runs are not all there yet: the caller runs them and asks again."""
    if limit <= 0 or len(grid) != 1:
        return grid, 0
    key, values = next(iter(grid.items()))
    if len(values) < 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in values):
        return grid, 0
    values, added = sorted(values), {"low": 0, "high": 0}
    while True:
        means = [mean for _, mean, _ in choose(out, label, {key: values}, seeds, metric).results]
        if any(m is None for m in means):
            break
        best = max(means)
        if means[0] == best and means.count(best) == 1 and added["low"] < limit:
            values, added["low"] = [_next_point(values[0], values[1]), *values], added["low"] + 1
        elif means[-1] == best and means.count(best) == 1 and added["high"] < limit:
            values, added["high"] = [*values, _next_point(values[-1], values[-2])], added["high"] + 1
        else:
            break
    return {key: values}, added["low"] + added["high"]


def stale_setting(run: RunDir, setting: Setting) -> Optional[str]:
    """Why a row's reported run directory does not belong to `setting` (None: it does, or it is
    empty): its recorded overrides (.hydra/overrides.yaml) give another value for a key of the
    setting, as after a grid extension changed a row's choice."""
    path = run.root / ".hydra" / "overrides.yaml"
    if not path.exists():
        return None
    recorded: dict[str, str] = {}
    for item in OmegaConf.to_container(OmegaConf.load(path)) or []:
        key, _, value = str(item).partition("=")
        recorded[key] = value
    for key, value in setting:
        if key in recorded and recorded[key] != str(value):
            return f"{key}={recorded[key]}, not the chosen {key}={value}"
    return None
