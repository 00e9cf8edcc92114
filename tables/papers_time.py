"""`python cli.py table=papers_time hydra.run.dir=DIR`: the papers' wall-clock claims, projected.

No run of the papers' setups exists here (ImageNet on GPU clusters), so each method's workload is
its plugin's declared communication pattern (`projection.workload.declared`) over the paper's
model, built on the meta device just to read its parameter shapes, at the paper's worker count,
with the method's own plugin config and learning-rate schedule composed from its recipe (QSR's
period and DGS's density follow the schedule); the compute is a device profile of the paper's
GPU and the system a cluster preset (tables/papers_claims.py reads the claim file). Each
projection goes through `projection.engine.project`, its band from the compute tail where the
profile has one. The rows set the projected figure beside the paper's with their ratio and what
the model lacks; DIR/table.md and DIR/table.csv are the result, deterministic (fixed seeds), so
the committed docs/results/papers_time/ is exactly what the command writes there.
"""
from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from core.errors import UserError
from dist_algos import get_algorithm
from dist_algos.comm.pattern import PatternConfig
from engine.config import RunConfig, load_run_config, register_schemas
from engine.train.optim import Schedule, peak_lr
from projection.cluster import REPO, Cluster, load_preset
from projection.compute import ComputeProfile, device_profile, imbalance_delays
from projection.engine import Projection, project
from projection.network import Network
from projection.run_inputs import model_layout
from projection.workload import declared
from tables.papers_claims import UNITS, Claim, Claims, Measure, Method, Setup, load_claims

TABLE_MD, TABLE_CSV = "table.md", "table.csv"
#: bootstrap replicates for the band (a profile with a measured tail; device files have none)
REPLICATES = 8


def compose_method(method: Method, where: str) -> RunConfig:
    """The method's validated run config, composed from cli.py's tree as a run of it would be."""
    args = method.args()
    try:
        if GlobalHydra.instance().is_initialized():  # inside cli.py: its own Hydra
            return load_run_config(compose(config_name="config", overrides=args))
        register_schemas()
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            return load_run_config(compose(config_name="config", overrides=args))
    except (HydraException, OmegaConfBaseException) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(f"{where}: {' '.join(args)} does not compose ({first}); fix the recipe or overrides") from None


def world_for(algorithm: Any, algo_cfg: Any, workers: int) -> int:
    """The ranks a launch needs for `workers` training ranks (a parameter server's ranks added)."""
    for extra in range(0, 9):
        if len(algorithm.layout(algo_cfg, workers + extra).train) == workers:
            return workers + extra
    raise UserError(f"algo={algorithm.name}: no world of {workers} to {workers + 8} ranks trains {workers} workers")


def pattern_inputs(setup: Setup, cfg: RunConfig, algorithm: Any, cluster: Cluster) -> PatternConfig:
    """The declaration's inputs: the setup's steps and the recipe's schedule at the paper's batch."""
    update_batch = setup.batch_per_worker if algorithm.updates_per_worker else setup.batch_per_worker * setup.workers
    peak = peak_lr(cfg.optim, update_batch)
    schedule = Schedule(cfg.sched, peak, setup.steps, setup.steps_per_epoch)
    return PatternConfig(cfg.algo, setup.steps, setup.steps_per_epoch, cluster.ranks_per_node, schedule.lr_at, peak,
                         schedule.warmup_steps)


@dataclass(frozen=True)
class MethodTime:
    """One method's projection in one setup, and what it rests on."""

    setup: str
    method: str
    algo: str
    projection: Projection
    notes: tuple[str, ...]


def project_method(claims: Claims, setup: Setup, name: str, cluster: Cluster, profile: ComputeProfile) -> MethodTime:
    method = setup.methods[name]
    cfg = compose_method(method, f"table.setups.{setup.name}.methods.{name}")
    algorithm = get_algorithm(cfg.algo.name)
    world = world_for(algorithm, cfg.algo, setup.workers)
    work = declared(algorithm, cfg.algo, world, pattern_inputs(setup, cfg, algorithm, cluster), model_layout(cfg),
                    setup.steps)
    delays = imbalance_delays(setup.imbalance, work.train_ranks, setup.steps, profile.median_s) \
        if setup.imbalance is not None else None
    servers = {r: 0.0 for r in range(world) if r not in work.train_ranks}
    result = project(work, Network(cluster, world), profile, seed=claims.seed, replicates=REPLICATES, delays=delays,
                     service_s=servers, event_window=claims.event_window)
    notes = [f"{name} (algo={cfg.algo.name}, {world} ranks): {result.engine}, {result.step_s:.4g} s per step, "
             f"{setup.steps} steps"]
    if servers:
        notes.append(f"{name}: the server's own work per push is taken as zero (no ledger measured it)")
    return MethodTime(setup.name, name, cfg.algo.name, result, tuple(notes) + result.notes)


def project_setups(claims: Claims) -> tuple[dict[tuple[str, str], MethodTime], dict[str, list[str]]]:
    """Every (setup, method) a claim reads, projected once; and each setup's assumption lines."""
    wanted = sorted({(c.setup, m) for c in claims.claims for m in (c.method, c.baseline) if c.setup and m})
    times: dict[tuple[str, str], MethodTime] = {}
    lines: dict[str, list[str]] = {}
    for setup_name in [s for s in claims.setups if any(k[0] == s for k in wanted)]:  # the file's order
        setup = claims.setups[setup_name]
        cluster, profile = load_preset(setup.cluster), device_profile(setup.device)
        for key in [k for k in wanted if k[0] == setup_name]:
            times[key] = project_method(claims, setup, key[1], cluster, profile)
        lines[setup_name] = setup_lines(setup, cluster, profile, [times[k] for k in wanted if k[0] == setup_name])
    return times, lines


def setup_lines(setup: Setup, cluster: Cluster, profile: ComputeProfile, times: list[MethodTime]) -> list[str]:
    """The assumptions a setup's projections rest on, as `project` prints them."""
    lines = [f"{setup.paper}: {setup.what}",
             f"{setup.workers} workers x {setup.batch_per_worker} per step, {setup.steps_per_epoch} steps per epoch, "
             f"{setup.steps} steps; cluster={cluster.name} ({cluster.description}); ranks fill nodes in order, "
             f"{cluster.ranks_per_node} per node; collectives as {cluster.library.value} chooses at each size",
             f"compute: {profile.source} ({profile.median_s:.4g} s per step, drawn for every rank and step)",
             *profile.notes,
             "gradient buckets, where a pattern overlaps them, ready at the end of backward: no ready times measured"]
    if setup.imbalance is not None:
        lines.append(f"imbalance regenerated with train.imbalance's injector: {setup.imbalance.delay_ms:g} ms with "
                     f"probability {setup.imbalance.prob:g} per rank and step, seeded per rank")
    for item in times:
        lines += list(item.notes)
    lines += [f"{key}: {source}" for key, source in setup.sources.items()]
    lines += [f"{key}: {source}" for key, source in cluster.sources.items()]  # keys start with cluster.
    return lines


def figure(claim: Claim, setup: Setup, times: dict[tuple[str, str], MethodTime]) -> tuple[float, float, float]:
    """The claim's projected figure and its band (low, high)."""
    mine = times[(claim.setup, claim.method)].projection
    if claim.measure == Measure.throughput_ratio:
        base = times[(claim.setup, claim.baseline)].projection
        return (base.step_s / mine.step_s, base.step_band[0] / mine.step_band[1],
                base.step_band[1] / mine.step_band[0])
    if claim.measure in (Measure.wall_minutes, Measure.wall_hours):
        scale = 60.0 if claim.measure == Measure.wall_minutes else 3600.0
        return mine.wall_s / scale, mine.wall_band[0] / scale, mine.wall_band[1] / scale
    one = setup.workers * device_profile(setup.device).median_s  # workers x one worker's step alone
    return one / mine.step_s, one / mine.step_band[1], one / mine.step_band[0]


@dataclass(frozen=True)
class Row:
    claim: Claim
    setup: Optional[Setup]
    projected: Optional[tuple[float, float, float]]
    engine: str

    @property
    def ratio(self) -> Optional[float]:
        if self.projected is None or self.claim.paper.value is None:
            return None
        return self.projected[0] / self.claim.paper.value


def rows_of(claims: Claims, times: dict[tuple[str, str], MethodTime]) -> list[Row]:
    rows = []
    for claim in claims.claims:
        if claim.measure == Measure.not_stated:
            rows.append(Row(claim, None, None, ""))
            continue
        setup = claims.setups[claim.setup]
        engines = sorted({times[(claim.setup, m)].projection.engine for m in (claim.method, claim.baseline) if m})
        rows.append(Row(claim, setup, figure(claim, setup, times), "+".join(engines)))
    return rows


def number(value: float) -> str:
    """Three significant figures, deterministic text."""
    return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"


def projected_text(row: Row) -> str:
    if row.projected is None:
        return "not projected"
    value, low, high = row.projected
    unit = UNITS[row.claim.measure]
    shown = f"{number(value)}{'' if unit == 'x' else ' '}{unit}"
    if math.isclose(low, high, rel_tol=1e-9):
        return f"{shown} (no band)"
    return f"{shown} ({number(low)}-{number(high)})"


def render_md(claims: Claims, rows: list[Row], lines: dict[str, list[str]]) -> str:
    out = [f"# {claims.title}", "",
           "Projected, not measured: each figure applies the projection model (docs/projection.md) to the method's "
           "declared communication at the paper's scale, on a cluster preset and a device profile of the paper's GPU, "
           "every number sourced in those files. Nothing was adjusted toward a paper's figure. Regenerate with "
           "`python cli.py table=papers_time hydra.run.dir=docs/results/papers_time` (recipes/tables/papers_time.yaml); "
           "README.md beside this file says what the table can and cannot show.", "",
           "| paper | claim | setup | the paper's figure | projected (band) | projected / paper | engine | "
           "what the model lacks |",
           "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        c = row.claim
        ratio = f"{row.ratio:.2f}" if row.ratio is not None else "-"
        paper = row.setup.paper.split(",")[0] if row.setup else c.paper.source.split(",")[0]
        out.append(f"| {paper} | {c.claim} | {c.setup or '-'} | {c.paper.shown()} ({c.paper.source}) | "
                   f"{projected_text(row)} | {ratio} | {row.engine or '-'} | {c.lacks} |")
    out += ["", "Bands are the 5th-95th percentile over bootstrap replicates of the compute tail; a device file gives "
            "one step time and no spread, so these projections have none (\"no band\").", ""]
    for name, setup_lines_ in lines.items():
        out += [f"## Assumptions: {name}", ""] + [f"- {line}" for line in setup_lines_] + [""]
    return "\n".join(out)


CSV_FIELDS = ["id", "paper", "claim", "setup", "measure", "method", "baseline", "paper_value", "paper_unit",
              "paper_text", "paper_source", "projected", "band_low", "band_high", "projected_over_paper", "engine",
              "lacks"]


def render_csv(rows: list[Row]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        c, p = row.claim, row.projected
        writer.writerow({
            "id": c.id, "paper": row.setup.paper if row.setup else "", "claim": c.claim, "setup": c.setup or "",
            "measure": c.measure.value, "method": c.method or "", "baseline": c.baseline or "",
            "paper_value": f"{c.paper.value:g}" if c.paper.value is not None else "", "paper_unit": c.paper.unit,
            "paper_text": c.paper.text, "paper_source": c.paper.source,
            "projected": f"{p[0]:.4g}" if p else "", "band_low": f"{p[1]:.4g}" if p else "",
            "band_high": f"{p[2]:.4g}" if p else "",
            "projected_over_paper": f"{row.ratio:.3f}" if row.ratio is not None else "", "engine": row.engine,
            "lacks": c.lacks})
    return buffer.getvalue()


def write_papers_time(claims: Claims, out: Path) -> tuple[str, str]:
    """Project every claim and write DIR/table.md and DIR/table.csv; returns their texts."""
    times, lines = project_setups(claims)
    rows = rows_of(claims, times)
    md, table_csv = render_md(claims, rows, lines), render_csv(rows)
    out.mkdir(parents=True, exist_ok=True)
    (out / TABLE_MD).write_text(md + "\n")
    (out / TABLE_CSV).write_text(table_csv)
    return md, table_csv


def run_papers_time(node: Any, out: Path) -> int:
    """The command (see the module docstring); returns the exit code."""
    md, _ = write_papers_time(load_claims(node), out)
    print(md)
    print(f"\nwritten: {out / TABLE_MD}, {out / TABLE_CSV}")
    return 0
