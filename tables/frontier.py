"""Each method's communication knob as one curve (issue 89): a frontier table's rows grouped by
method, each setting's final quality against the bytes each worker sent, and each method's best
setting chosen on validation.

A frontier table names its rows `<method>.<setting>` (`local_sgd.h8`: local SGD at H = 8;
`dgs.d0.01`: DGS at density 1%), a row without a `.` being a method with no knob (the baseline);
the part before the first `.` is the method, so the rows of one method are the points of its
curve. The head-to-head tables ask how much worse per sample one recipe is; a researcher choosing a
method asks which of its settings to use and what quality each byte buys, which is this.

Bytes per worker: a run's `comm_bytes` counts every rank's sent bytes (a parameter server's
replies included), divided here by its training ranks, so that curves of tables with different
worker counts share an axis.

The best setting of a method is the one with the best mean `select_metric` over the reported
seeds: validation chooses and the test set does not, as the tuning's rule is. Every setting
validation cannot tell apart from the best (paired by seed, with the validation set's floor for
an accuracy or `tune_resolution` for a loss: tables/tuning.py `within_noise`) is named beside it,
since a choice among settings the data cannot separate is no finding. The best setting's test
value and its difference from the baseline are its row's in table.md (Holm-corrected across the
table), not estimated again.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Optional

from tables.config import TableConfig, headline, row_name
from tables.measure import Better
from tables.render import set_size_of
from tables.runs import Summary, variant_of
from tables.tuning import within_noise


@dataclass(frozen=True)
class Point:
    """One setting of one method on one partition: where its curve passes."""
    label: str
    method: str
    setting: str  # "" for a method without a knob
    variant: str
    bytes_per_worker: Optional[float]
    value: Optional[float]  # the compared (test) metric's mean over seeds
    low: Optional[float]  # its 95% interval, cut at the metric's range
    high: Optional[float]
    selected: dict[int, float]  # the validation metric by seed
    unstable: bool
    baseline: bool = False  # the row is its own baseline (its record says so), drawn as a band

    @property
    def selected_mean(self) -> Optional[float]:
        """The validation metric's mean over seeds (None: no seed recorded it)."""
        return statistics.fmean(self.selected.values()) if self.selected else None


@dataclass(frozen=True)
class Best:
    """A method's best setting on one partition, with the settings validation cannot tell from it."""
    method: str
    variant: str
    point: Point
    alike: list[str]
    settings: int


def method_and_setting(label: str) -> tuple[str, str]:
    """(`local_sgd`, `h8`) from `local_sgd.h8@iid`; (`allreduce`, "") from `allreduce@iid`."""
    method, _, setting = row_name(label).partition(".")
    return method, setting


def _workers(runs: dict[int, Summary]) -> Optional[float]:
    counts = {s.get("train_ranks") or s.get("world_size") for s in runs.values()}
    counts.discard(None)
    return float(counts.pop()) if len(counts) == 1 else None


def points(table: TableConfig, records: list[dict[str, Any]], runs: dict[str, dict[int, Summary]]) -> list[Point]:
    """The rows with every seed made, as points of their methods' curves, in table order."""
    metric, select = table.compare_metric, table.select_metric
    found = []
    for rec in records:
        if rec.get("status") != "ok":
            continue
        by_seed = runs.get(rec["label"], {})
        workers, sent = _workers(by_seed), rec.get("comm_bytes")
        value = rec.get(metric)
        method, setting = method_and_setting(rec["label"])
        found.append(Point(
            label=rec["label"], method=method, setting=setting, variant=variant_of(rec["label"]),
            bytes_per_worker=sent / workers if isinstance(sent, (int, float)) and workers else None,
            value=value if isinstance(value, float) else None,
            low=rec.get(f"{metric}_low"), high=rec.get(f"{metric}_high"),
            selected={s: float(v) for s, run in by_seed.items() if isinstance(v := run.get(select), (int, float))},
            unstable=bool(rec.get("unstable")), baseline=rec.get("baseline") == rec["label"]))
    return found


def curves(found: list[Point]) -> dict[str, dict[str, list[Point]]]:
    """variant -> method -> its points by increasing bytes per worker (first-seen order of both)."""
    out: dict[str, dict[str, list[Point]]] = {}
    for p in found:
        out.setdefault(p.variant, {}).setdefault(p.method, []).append(p)
    for methods in out.values():
        for method, pts in methods.items():
            methods[method] = sorted(pts, key=lambda p: (p.bytes_per_worker is None, p.bytes_per_worker or 0.0))
    return out


def best_settings(table: TableConfig, found: list[Point], runs: dict[str, dict[int, Summary]]) -> list[Best]:
    """Each method's best setting per partition on validation, among its points whose seeds all
    recorded the validation metric (a method with one point is its own best)."""
    better = headline(table).select_better
    best = []
    for variant, methods in curves(found).items():
        for method, pts in methods.items():
            # (a seed whose validation value is NaN diverged: its setting is not a candidate, as in tuning)
            scored = [p for p in pts if p.selected and len(p.selected) == len(table.seeds)
                      and all(math.isfinite(v) for v in p.selected.values())]
            if not scored:
                continue
            pick = (max if better == Better.higher else min)(scored, key=lambda p: p.selected_mean)
            n_val = set_size_of(table, list(runs.get(pick.label, {}).values()), table.select_metric)
            alike = [p.setting or p.label for p in scored if p is not pick
                     and within_noise(p.selected, pick.selected, n_val, resolution=table.tune_resolution)]
            best.append(Best(method, variant, pick, alike, len(pts)))
    return best
