"""A table's finished run as the projection reads it, and its projection on a cluster, made once.

Why here and not projection/run_inputs.py: a table's runs live in a run folder, a loose store or a
sealed one (tables/run_records.py), so their config and summary come through `RunRecords`, never
as files of a run directory. What a run measured comes, in order, from:

1. its time ledger (`ledger/`, numpy parts, never carried into a store), read where the table's run
   folder holds the run: a table produced with `report.ledger=true` and gathered where it ran;
2. its ledger digest (`ledger_digest.json`, projection/ledger_digest.py), which the store carried:
   the same table gathered on another machine, its run folders gone;
3. nothing: the compute from `table.project.device`, data-dependent ops at their declared most.

`table.project.compute` chooses the compute among them (auto: that order; ledger: 1 or 2, a run
with neither refused; device: 3 for every run, since ranks that shared too few cores measured
inflated steps); the byte ratios, the layout and the servers' service come from 1 or 2 whatever
it says. `Projector.used` names, per run, what was used, for the files.

A projection depends on the run's pattern (its plugin config, schedule, imbalance, model, world
and steps), the compute profile and the cluster, not on its seed or data: the seeds of a row share
one projection when their compute comes from one device profile and nothing was measured
(`Projector`'s cache). A run with its own ledger or digest has its own byte ratios, so its
projection is its own.
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
from projection.ledger_digest import CAP, LedgerDigest, RunMeasures, machine_words, parse
from projection.ledger_view import profile as ledger_profile
from projection.run_inputs import RunInputs
from tables.projected_config import ProjectedColumns
from tables.run_records import CONFIG, LEDGER_DIGEST, RunRecords

REPO = Path(__file__).resolve().parents[1]
LEDGER, DIGEST, DEVICE = "its ledger", "its ledger digest", "table.project.device"


@dataclass
class TableRun(RunInputs):
    """A table's run as the projection reads it: with the ledger digest its store carried."""

    digest: Optional[LedgerDigest] = None


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
    digest = None if ledger is not None else stored_digest(records, rel, summary)
    return TableRun(Path(rel), config, summary, ledger, get_algorithm(config.algo.name), digest)


def stored_digest(records: RunRecords, rel: str, summary: dict[str, Any]) -> Optional[LedgerDigest]:
    """The run's ledger digest where its record has one, checked to be this run's (its world and
    steps); one line naming the file otherwise."""
    text = records.text(rel, LEDGER_DIGEST)
    if text is None:
        return None
    where = records.where(rel, LEDGER_DIGEST)
    digest = parse(text, where)
    if (digest.world, digest.steps) != (int(summary["world_size"]), int(summary["steps"])):
        raise UserError(f"{where}: the digest of a run of {digest.world} ranks and {digest.steps} steps, not of this "
                        f"run ({summary['world_size']} ranks, {summary['steps']} steps); delete it, or remake it: "
                        "python -m tables.ledger_digests STORE RUN_FOLDER_ROOT")
    return digest


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
        """The run's compute as table.project.compute says (the module doc), or one line naming
        what to set."""
        digest = getattr(run, "digest", None)
        if self.cfg.compute != "device" and run.ledger is not None:
            key: tuple[Any, ...] = ("ledger", str(run.root))
            if key not in self._profiles:
                machine = machine_words(run.summary.get("machine"))
                self._profiles[key] = ledger_profile(run.ledger, "each run's own time ledger (ledger/ in its run "
                                                                 f"folder), measured on {machine}")
            return self._profiles[key], key
        if self.cfg.compute != "device" and digest is not None:
            key = ("digest", str(run.root))
            if key not in self._profiles:
                self._profiles[key] = digest.profile(
                    f"each run's ledger digest ({LEDGER_DIGEST} in the store: its measured steps, at most {CAP} of "
                    f"them), measured on {machine_words(digest.source.get('machine'))}")
            return self._profiles[key], key
        if self.cfg.compute == "ledger":
            raise UserError(f"table.project.compute=ledger: run {run.root} has no time ledger in its run folder and "
                            f"no {LEDGER_DIGEST} in the store; gather where its run folder is, write its digest "
                            "(python -m tables.ledger_digests STORE RUN_FOLDER_ROOT), or set "
                            "table.project.compute=auto with table.project.device=FILE")
        if not self.cfg.device:
            why = ("table.project.compute=device" if self.cfg.compute == "device"
                   else f"run {run.root} kept no time ledger (nor a {LEDGER_DIGEST})")
            raise UserError(f"table.project: {why} and table.project.device is unset, so nothing says how long its "
                            "compute takes; give table.project.device=FILE (a device profile, e.g. "
                            "conf/cluster/device/cpu_mnist1d_cnn.yaml) or make the runs with report.ledger=true")
        key = ("device", self.cfg.device, run.worker_batch)
        if key not in self._profiles:
            self._profiles[key] = device_profile(device_path(self.cfg.device), run.worker_batch)
        return self._profiles[key], key

    def used(self, run: RunInputs) -> tuple[str, str]:
        """(where the run's compute came from, where its byte ratios came from), for the files."""
        kind, digest = self.profile(run)[1][0], getattr(run, "digest", None)
        if kind == "device":
            compute = f"{DEVICE} ({Path(str(self.cfg.device)).name} at batch {run.worker_batch})"
        elif kind == "digest" and digest is not None:
            compute = f"{DIGEST} ({len(digest.pairs)} of {digest.count} steps)"
        else:
            compute = LEDGER
        ratios = LEDGER if run.ledger is not None else DIGEST if digest is not None else "none (declared most)"
        return compute, ratios

    def project(self, run: RunInputs, cluster: Cluster) -> Projection:
        """The run projected at its own worker count on `cluster`."""
        profile, profile_id = self.profile(run)
        cfg, digest = run.config, getattr(run, "digest", None)
        measured: Optional[RunMeasures] = digest.measures if run.ledger is None and digest is not None else None
        own = run.ledger is not None or measured is not None  # a ledger's or digest's byte ratios are its own
        pattern = repr((cfg.algo, cfg.sched, cfg.train.imbalance, cfg.model, run.world, run.steps,
                        run.summary.get("epochs"), run.summary["peak_lr"], run.worker_batch,
                        str(run.root) if own else ""))
        key = (cluster_key(cluster), repr(profile_id), pattern)
        if key not in self._made:
            settings = ProjectConfig(run=str(run.root), workers=[run.world], device=None, target=None,
                                     replicates=self.replicates or self.cfg.replicates,
                                     event_window=self.cfg.event_window, seed=0)
            self._made[key] = projections(settings, run, cluster, profile, [run.world], measured)[run.world]
        return self._made[key]

    def source(self, run: RunInputs) -> str:
        """Where the run's compute comes from, for the files' notes."""
        return self.profile(run)[0].source
