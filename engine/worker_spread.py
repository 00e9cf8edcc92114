"""`python -m engine.worker_spread run=RUN_DIR [step=N]`: each worker's own score, their
mean's and their consensus distance, read from a finished (or stopped) run's checkpoint
(engine/report/spread.py says what is measured and why).

The run's own config.yaml decides the model, the data set, its validation carve-out and which
ranks train (the plugin's rank layout); the data set is read as the run read it (a missing one
is the run's one-line error). Everything is scored in this one process, on the CPU, in float32,
over the whole validation split and test set. Writes `RUN_DIR/spread/step_<8 digits>.json`
beside printing the table; nothing of the run is changed. Rank files are loaded with
`torch.load(weights_only=True)`, as a resume loads them.
"""
from __future__ import annotations

import io
import json
import sys
from pathlib import Path
from typing import Any, Optional

import hydra
import torch
import torch.nn as nn
from omegaconf import DictConfig, OmegaConf

from core.errors import UserError, report_user_errors
from core.rundir import RunDir
from core.task import task_for
from data import DataRequest, build_streams, check_data_on_disk, data_spec
from dist_algos import get_algorithm
from engine.checkpoint.files import Manifest, complete_checkpoints, load_rank_file
from engine.config import load_run_config, register_schemas
from engine.report.spread import Spread, measure_spread
from engine.train.compute import plain_state_dict
from engine.train.evaluation import evaluate
from models import build_model

PREFIX = "worker_spread"


def pick_checkpoint(run_dir: RunDir, found: list[Manifest], step: Optional[int]) -> Manifest:
    """Among the run's complete checkpoints `found` (newest first), the newest, or the one at
    `step`; one line when there is none."""
    if not found:
        raise UserError(f"run={run_dir.root} has no complete checkpoint (checkpoints/step_*/manifest.json); "
                        "give a run directory that trained with checkpointing on")
    if step is None:
        return found[0]
    for manifest in found:
        if manifest.step == step:
            return manifest
    steps = ", ".join(str(m.step) for m in sorted(found, key=lambda m: m.step))
    raise UserError(f"step={step}: run={run_dir.root} has checkpoints at steps {steps}; give one of them "
                    "or leave step unset for the newest")


def spread_of_run(path: Path, step: Optional[int] = None) -> tuple[Spread, str]:
    """Measure the workers of the run at `path` at its checkpoint `step` (the newest by default);
    also returns the task's headline metric (`acc` for classification, `loss` for a language
    model: the one its runs select on)."""
    run_dir = RunDir(path)
    if not run_dir.config.is_file():
        raise UserError(f"run={path} has no config.yaml: give the directory of a syncopt run")
    config = load_run_config(OmegaConf.load(run_dir.config))
    found = complete_checkpoints(run_dir)
    manifest = pick_checkpoint(run_dir, found, step)
    layout = get_algorithm(config.algo.name).layout(config.algo, manifest.world_size)
    check_data_on_disk(config.data)
    spec = data_spec(config.data)
    task = task_for(spec)
    request = DataRequest(batch_size=1, eval_batch_size=config.data.eval_batch_size or 256, seed=config.seed,
                          shard=None, num_shards=len(layout.train), eval_shard=0, eval_num_shards=1)
    streams = build_streams(config.data, request, with_val=True)
    device = torch.device("cpu")

    def score(model: nn.Module) -> dict[str, float]:
        out: dict[str, float] = {}
        for prefix, stream in (("val", streams.val), ("test", streams.test)):
            if stream is not None:
                out.update(evaluate(model, stream.batches(), lambda m, x: m(x), device, task, prefix=prefix))
        return out

    states = {}
    for name in manifest.files:
        rank = int(name.removeprefix("rank_").removesuffix(".pt"))
        saved = load_rank_file(Path(manifest.path) / name)
        if "model" in saved:
            states[rank] = plain_state_dict(saved["model"])
    spread = measure_spread(manifest.step, states, list(layout.train), lambda: build_model(config.model, spec).float(),
                            score)
    if spread.consensus_distance == 0 and len(spread.train_ranks) > 1:
        earlier = [m.step for m in found if m.step < spread.step]
        spread.notes.append(f"checkpoints before it: {', '.join(map(str, sorted(earlier)))} (step=N)" if earlier
                            else "the run kept no earlier checkpoint (checkpoint.every_* and keep_last decide which)")
    if spread.bn_averaged:
        spread.notes.append("the model has BatchNorm: the mean's running statistics are the workers' averaged, "
                            "not re-estimated as the plugins' average evaluation does")
    return spread, task.selection_metric.removeprefix("val_")


def render(spread: Spread, headline: str) -> str:
    """The table a person reads: each rank's headline metric on validation and test and its
    distance from the mean, then the mean, then Xi."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"workers at step {spread.step}: {len(spread.train_ranks)} training ranks", box=None)
    for column in ("rank", f"val_{headline}", f"test_{headline}", "||x_i - mean|| / ||mean||"):
        table.add_column(column, justify="right")

    def cell(metrics: dict[str, Any], key: str) -> str:
        return f"{metrics[key]:.4f}" if key in metrics else "-"

    for rank, metrics in spread.per_rank.items():
        role = "" if rank in spread.train_ranks else " (serving)"
        rel = f"{spread.relative(rank):.4f}" if rank in spread.train_ranks else "-"
        table.add_row(f"{rank}{role}", cell(metrics, f"val_{headline}"), cell(metrics, f"test_{headline}"), rel)
    table.add_row("mean", cell(spread.mean, f"val_{headline}"), cell(spread.mean, f"test_{headline}"), "0")
    console = Console(file=io.StringIO(), width=100, record=True)
    console.print(table)
    console.print(f"consensus distance {spread.consensus_distance:.4g} (||mean|| {spread.mean_norm:.4g}: "
                  f"{spread.consensus_distance / spread.mean_norm if spread.mean_norm else float('inf'):.4f} of it)")
    for note in spread.notes:
        console.print(f"note: {note}")
    return console.export_text()


@hydra.main(version_base="1.3", config_path="../conf", config_name="spread")
def main(cfg: DictConfig) -> None:
    with report_user_errors(PREFIX):
        if cfg.run is None:
            raise UserError("run=RUN_DIR is required: the directory of a syncopt run with checkpoints")
        spread, headline = spread_of_run(Path(cfg.run), None if cfg.step is None else int(cfg.step))
        out = RunDir(Path(cfg.run)).spread_record(spread.step)
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps(spread.as_dict(), indent=1) + "\n")
        sys.stdout.write(render(spread, headline))
        print(f"written to {out}")


if __name__ == "__main__":
    register_schemas()
    main()
