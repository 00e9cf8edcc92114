"""A table's finished run as the projection reads it, and its projection on a cluster, made once.

Why here and not projection/run_inputs.py: a table's runs live in a run folder, a loose store or a
sealed one (tables/run_records.py), so their config and summary come through `RunRecords`, never
as files of a run directory. Only a run's time ledger is a folder (`ledger/`, numpy parts, never
carried into a store): it is read from the table's run folder where the run was made there, so a
table produced with `report.ledger=true` projects from its own measured compute at the gather, and
a store gathered elsewhere falls back on `table.project.device`, as runs made before ledgers do.

A projection depends on the run's pattern (its plugin config, schedule, imbalance, model, world
and steps), the compute profile and the cluster, not on its seed or data: the seeds of a row share
one projection when their compute comes from one device profile (`Projector`'s cache). A run with
its own ledger has its own compute and byte ratios, so its projection is its own.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from core.errors import UserError
from core.rundir import RunDir
from dist_algos import get_algorithm
from engine.config import load_run_config
from engine.report.ledger import read_ledger
from projection.cluster import Cluster
from projection.command import projections
from projection.compute import ComputeProfile, device_profile
from projection.config import ProjectConfig
from projection.engine import Projection
from projection.ledger_view import profile as ledger_profile
from projection.run_inputs import RunInputs
from tables.projected_config import ProjectedColumns
from tables.run_records import CONFIG, RunRecords

REPO = Path(__file__).resolve().parents[1]


def run_inputs(records: RunRecords, rel: str, out: Path) -> RunInputs:
    """The run `rel` of `records` with its ledger from the run folder `out/rel` where there is one;
    one line naming the record for anything unreadable."""
    text = records.text(rel, CONFIG)
    if text is None:
        raise UserError(f"{records.where(rel, CONFIG)}: the run recorded no config.yaml, so its communication "
                        "cannot be projected; gather without table.project, or make the run again")
    try:
        config = load_run_config(OmegaConf.create(yaml.safe_load(text)))
    except (OmegaConfBaseException, ValueError, TypeError, yaml.YAMLError) as err:
        raise UserError(f"{records.where(rel, CONFIG)} is not a readable run config ({type(err).__name__}); "
                        "gather without table.project, or make the run again") from None
    summary = records.summary(rel) or {}
    for key in ("steps", "world_size", "peak_lr"):
        if not isinstance(summary.get(key), (int, float)):
            raise UserError(f"{records.where(rel, 'summary.json')} lacks {key!r}: the projection needs the run's "
                            "steps, world and learning rate; gather without table.project")
    run_dir = RunDir(out / rel)
    ledger = read_ledger(run_dir) if run_dir.ledger.is_dir() else None
    return RunInputs(Path(rel), config, summary, ledger, get_algorithm(config.algo.name))


def device_path(device: str) -> Path:
    """table.project.device as a path (a relative one is the repository's, as table.store is)."""
    path = Path(device).expanduser()
    return path if path.is_absolute() else REPO / path


def cluster_key(cluster: Cluster) -> str:
    """What tells two clusters apart for the cache: every number, not the names of their sources."""
    return repr(dataclasses.replace(cluster, sources={}, calibration=None))


@dataclass
class Projector:
    """Projections of a table's runs at their own worker count, each made once (the module doc)."""

    cfg: ProjectedColumns
    replicates: Optional[int] = None  # None: cfg.replicates (the bandwidth sweep asks for 1)

    def __post_init__(self) -> None:
        self._profiles: dict[tuple[Any, ...], ComputeProfile] = {}
        self._made: dict[tuple[str, ...], Projection] = {}

    def profile(self, run: RunInputs) -> tuple[ComputeProfile, tuple[Any, ...]]:
        """The run's compute: its own ledger, else the device profile at its per-worker batch, else
        refused in one line naming table.project.device."""
        if run.ledger is not None:
            key: tuple[Any, ...] = ("ledger", str(run.root))
            if key not in self._profiles:
                self._profiles[key] = ledger_profile(run.ledger, f"the ledger of {run.root} ({run.world} ranks, "
                                                                 "the machine it ran on)")
            return self._profiles[key], key
        if not self.cfg.device:
            raise UserError(f"table.project: run {run.root} kept no time ledger and table.project.device is unset, "
                            "so nothing says how long its compute takes; give table.project.device=FILE (a device "
                            "profile, e.g. conf/cluster/device/cpu_mnist1d_cnn.yaml) or make the runs with "
                            "report.ledger=true")
        key = ("device", self.cfg.device, run.worker_batch)
        if key not in self._profiles:
            self._profiles[key] = device_profile(device_path(self.cfg.device), run.worker_batch)
        return self._profiles[key], key

    def project(self, run: RunInputs, cluster: Cluster) -> Projection:
        """The run projected at its own worker count on `cluster`."""
        profile, profile_id = self.profile(run)
        cfg = run.config
        pattern = repr((cfg.algo, cfg.sched, cfg.train.imbalance, cfg.model, run.world, run.steps,
                        run.summary.get("epochs"), run.summary["peak_lr"], run.worker_batch,
                        str(run.root) if run.ledger is not None else ""))  # a ledger's byte ratios are its own
        key = (cluster_key(cluster), repr(profile_id), pattern)
        if key not in self._made:
            settings = ProjectConfig(run=str(run.root), workers=[run.world], device=None, target=None,
                                     replicates=self.replicates or self.cfg.replicates,
                                     event_window=self.cfg.event_window, seed=0)
            self._made[key] = projections(settings, run, cluster, profile, [run.world])[run.world]
        return self._made[key]

    def source(self, run: RunInputs) -> str:
        """Where the run's compute comes from, for the files' notes."""
        return self.profile(run)[0].source
