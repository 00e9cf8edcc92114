"""`python cli.py project.run=DIR cluster=NAME 'project.workers=[64,256,1024]'`.

For a finished run on a named cluster: the time per step and the wall time to the run's steps
at each worker count, and at the run's own worker count the time to its best validation value
(and to `project.target`), each with a band from the compute tail, then every assumption the
numbers rest on. Accuracy is never projected: a quality is known only at the worker count that
reached it, and asking for one elsewhere is refused. So is what the model cannot know: a plugin
that declares no pattern, a calibration whose residuals miss their targets, a run without a
ledger when no device profile is given; a damaged run file is one line naming it.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

from core.errors import UserError
from core.schema import typed_section
from projection.calibration import failing
from projection.cluster import Cluster, load_cluster
from projection.compute import ComputeProfile, device_profile, imbalance_delays
from projection.config import ProjectConfig
from projection.engine import EVENT_REPLICATES, Projection, project
from projection.ledger_digest import RunMeasures, measures_of
from projection.ledger_view import profile as ledger_profile
from projection.network import Network
from projection.run_inputs import RunInputs, read_run, validation_curve
from projection.workload import declared


def check_cluster(cluster: Cluster) -> None:
    if cluster.calibration is not None:
        why = failing(cluster.calibration)
        if why:
            raise UserError(f"cluster={cluster.name}: its calibration cannot be trusted: {why}; run "
                            "bench/calibrate_network.py again on a quiet machine")


def compute_profile(cfg: ProjectConfig, run: RunInputs) -> ComputeProfile:
    if cfg.device:
        return device_profile(Path(cfg.device).expanduser(), run.worker_batch)
    assert run.ledger is not None
    return ledger_profile(run.ledger, f"the ledger of {run.root} ({run.world} ranks, this machine)")


def target_step(run: RunInputs, target: float) -> tuple[int, str]:
    """The first evaluation step whose selecting validation metric reached `target`."""
    metric = run.summary.get("best_metric") or "val_acc"
    lower_better = "loss" in metric or "bpc" in metric or "ppl" in metric
    for step, values in validation_curve(run.root):
        value = values.get(metric)
        if value is not None and (value <= target if lower_better else value >= target):
            return step, metric
    raise UserError(f"project.target={target}: the run's {metric} never reached it (best "
                    f"{run.summary.get(f'best_{metric}')}); give a value it reached")


def projections(cfg: ProjectConfig, run: RunInputs, cluster: Cluster, profile: ComputeProfile,
                workers: list[int], measured: Optional[RunMeasures] = None) -> dict[int, Projection]:
    """The run at each of `workers` on `cluster`. `measured`: the run's layout, byte ratios and
    service times where they come from elsewhere than its ledger (a table store's ledger digest)."""
    out = {}
    measured = measured or measures_of(run)
    layout, per_server = measured.layout, measured.per_server_s
    for world in workers:
        work = declared(run.algorithm, run.config.algo, world, run.pattern_config(cluster.ranks_per_node), layout,
                        run.steps)
        work.byte_ratios = measured.byte_ratios
        delays = imbalance_delays(run.imbalance(), work.train_ranks, run.steps, profile.median_s)
        out[world] = project(work, Network(cluster, world), profile, seed=cfg.seed, replicates=cfg.replicates,
                             delays=delays,
                             service_s={s: per_server for s in range(world) if s not in work.train_ranks},
                             event_window=cfg.event_window)
    return out


def seconds(value: float) -> str:
    if value >= 3600:
        return f"{value / 3600:.2f} h"
    if value >= 60:
        return f"{value / 60:.1f} min"
    if value >= 1:
        return f"{value:.2f} s"
    return f"{value * 1e3:.1f} ms"


def band(low: float, high: float) -> str:
    return f"({seconds(low)} - {seconds(high)})" if not math.isclose(low, high, rel_tol=1e-9) else "(no band)"


def assumptions(cfg: ProjectConfig, run: RunInputs, cluster: Cluster, profile: ComputeProfile,
                results: dict[int, Projection]) -> list[str]:
    lines = [f"compute: {profile.source}; every step draws a measured (before, after) pair, independently per rank "
             f"and step (median {seconds(profile.median_s)} per step)",
             "the same per-worker batch and the run's own step count and schedule at every worker count; accuracy "
             "is not projected",
             f"ranks fill nodes in order, {cluster.ranks_per_node} per node; collectives run as "
             f"{cluster.library.value} "
             "chooses at each size (projection/collectives.py); concurrent flows share links (docs/projection.md)"]
    lines += list(profile.notes)
    if run.imbalance().enabled:
        lines.append("train.imbalance regenerated with the injector's own seeded generators for the projected ranks")
    if not profile.bucket_ready:
        lines.append("gradient buckets (if the pattern overlaps any) ready at the end of backward: no ready times "
                     "were measured")
    for note in sorted({n for p in results.values() for n in p.notes}):
        lines.append(note)
    engines = sorted({f"{p.engine} at {w}" for w, p in results.items()})
    lines.append("engines: " + ", ".join(engines) + "; bands: 5th-95th percentile over "
                 f"{cfg.replicates} bootstrap replicates of the compute profile "
                 f"({EVENT_REPLICATES} at most for events)")
    lines.append("time to a step: the projected end of that step (past a window of events, at its steady rate); "
                 "evaluation and checkpoints are not in projected steps")
    lines += [f"{key}: {source}" for key, source in cluster.sources.items()]
    return lines


def run_project(node: Any, cluster_node: Any) -> int:
    """The command (see the module docstring); returns the exit code."""
    cfg: ProjectConfig = typed_section(ProjectConfig, node, "project")
    cluster = load_cluster(cluster_node)
    check_cluster(cluster)
    run = read_run(cfg.run, need_ledger=not cfg.device)
    workers = sorted(set(cfg.workers) | {run.world})
    if cfg.target is not None and any(w != run.world for w in cfg.workers):
        others = ", ".join(str(w) for w in cfg.workers if w != run.world)
        raise UserError(f"project.target={cfg.target} at {others} workers: accuracy is never projected; only the run's "
                        f"own {run.world} workers reached a validation value (set project.workers=[{run.world}])")
    profile = compute_profile(cfg, run)
    results = projections(cfg, run, cluster, profile, workers)
    print(f"syncopt project: {run.root} (algo={run.config.algo.name}, {run.world} ranks, {run.steps} steps) "
          f"on cluster={cluster.name}")
    print(f"  {'workers':>8}  {'engine':10}  {'per step (band)':34}  wall to {run.steps} steps (band)")
    for world, p in results.items():
        print(f"  {world:>8}  {p.engine:10}  {seconds(p.step_s) + ' ' + band(*p.step_band):34}  "
              f"{seconds(p.wall_s)} {band(*p.wall_band)}")
    own = results[run.world]
    best_step, metric = run.summary.get("best_step"), run.summary.get("best_metric")
    if best_step is not None and metric:
        t, low, high = own.time_to(int(best_step) - 1)
        print(f"  at {run.world} workers, to its best {metric} {run.summary.get(f'best_{metric}')} (step {best_step}): "
              f"{seconds(t)} {band(low, high)}")
    if cfg.target is not None:
        step, name = target_step(run, cfg.target)
        t, low, high = own.time_to(step - 1)
        print(f"  at {run.world} workers, to {name} {cfg.target} (step {step}): {seconds(t)} {band(low, high)}")
    print("assumptions:")
    for line in assumptions(cfg, run, cluster, profile, results):
        print(f"  - {line}")
    return 0

