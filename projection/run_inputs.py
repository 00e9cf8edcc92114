"""What a projection reads of a finished run, each file checked, each fault one line naming it.

- `config.yaml`: the plugin and its config, the schedule (a declared pattern may follow the
  learning rate: QSR's period, DGS's density), the injected imbalance;
- `summary.json`: the steps, the worker count, the selected point (`best_step`, `best_<metric>`),
  the peak learning rate;
- `metrics.jsonl`: the validation curve, for the time to a target value;
- `ledger/` (`report.ledger=true`): the compute profile, the run's own ops (the byte ratios of
  data-dependent ops), the servers' service time; without it a device profile must stand in.
Nothing read runs code: YAML, JSON and numpy columns without pickles.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from core.errors import UserError
from core.rundir import RunDir
from data import data_spec
from dist_algos import get_algorithm
from dist_algos.comm.pattern import ParamLayout, PatternConfig
from engine.config import RunConfig, load_run_config
from engine.report.ledger import Ledger, read_ledger
from engine.train.imbalance import ImbalanceConfig
from engine.train.optim import Schedule
from models import build_model


@dataclass
class RunInputs:
    """A finished run as the projection sees it."""

    root: Path
    config: RunConfig
    summary: dict[str, Any]
    ledger: Optional[Ledger]
    algorithm: Any  # the plugin class

    @property
    def world(self) -> int:
        return int(self.summary["world_size"])

    @property
    def steps(self) -> int:
        return int(self.summary["steps"])

    @property
    def steps_per_epoch(self) -> int:
        epochs = float(self.summary.get("epochs") or 0)
        return max(1, round(self.steps / epochs)) if epochs else self.steps

    @property
    def worker_batch(self) -> int:
        """Samples a training rank computes per step: what a per-batch device profile is read at."""
        total, ranks = self.summary.get("global_batch"), self.summary.get("train_ranks")
        if isinstance(total, int) and isinstance(ranks, int) and ranks > 0:
            return total // ranks
        return int(self.config.train.batch_size)

    def layout(self) -> ParamLayout:
        """The model's parameter layout (from the ledger, which recorded it; else the model)."""
        if self.ledger is not None and self.ledger.ranks:
            return self.ledger.facts().layout
        return model_layout(self.config)

    def lr_at(self) -> Callable[[int], float]:
        schedule = Schedule(self.config.sched, float(self.summary["peak_lr"]), self.steps, self.steps_per_epoch)
        return schedule.lr_at

    def pattern_config(self, local_size: int) -> PatternConfig:
        """The run's pattern inputs, for any world (the step counts and the schedule are the run's)."""
        schedule = Schedule(self.config.sched, float(self.summary["peak_lr"]), self.steps, self.steps_per_epoch)
        return PatternConfig(self.config.algo, self.steps, self.steps_per_epoch, local_size, schedule.lr_at,
                             float(self.summary["peak_lr"]), schedule.warmup_steps)

    def imbalance(self) -> ImbalanceConfig:
        return self.config.train.imbalance


def model_layout(config: RunConfig) -> ParamLayout:
    """The layout of the run's model, built on the meta device (no weights, no data)."""
    with torch.device("meta"):
        model = build_model(dict(config.model), data_spec(config.data))
    return ParamLayout.of(model)


def read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise UserError(f"{path} is not readable JSON ({type(err).__name__}); it is the run's {what}: "
                        "rerun the run or give another project.run") from None
    if not isinstance(value, dict):
        raise UserError(f"{path} is not the run's {what} (a JSON object); give another project.run")
    return value


def read_run(path: Optional[str], need_ledger: bool) -> RunInputs:
    """The run at `path`, checked (see the module docstring)."""
    if not path:
        raise UserError("project.run is unset: give a finished run directory (project.run=DIR)")
    run_dir = RunDir(Path(path).expanduser())
    if not run_dir.root.is_dir():
        raise UserError(f"project.run={path}: no such directory")
    if not run_dir.config.is_file():
        raise UserError(f"project.run={path} has no config.yaml: give the directory of a syncopt run")
    if not run_dir.summary.is_file():
        raise UserError(f"project.run={path} has no summary.json: the run has not finished; project a finished run")
    try:
        config = load_run_config(OmegaConf.load(run_dir.config))
    except (OSError, OmegaConfBaseException, ValueError, yaml.YAMLError) as err:
        raise UserError(f"{run_dir.config} is not a readable run config ({type(err).__name__}); give another "
                        "project.run") from None
    summary = read_json(run_dir.summary, "summary")
    for key in ("steps", "world_size", "peak_lr"):
        if not isinstance(summary.get(key), (int, float)):
            raise UserError(f"{run_dir.summary} lacks {key!r}: not a finished run's summary; give another project.run")
    ledger = None
    if run_dir.ledger.is_dir():
        try:
            ledger = read_ledger(run_dir)
        except UserError:
            raise
        except Exception as err:  # a damaged part the reader did not anticipate: still one line
            raise UserError(f"{run_dir.ledger} is not a readable time ledger ({type(err).__name__}: {err}); "
                            "remove it, or rerun with report.ledger=true") from None
    elif need_ledger:
        raise UserError(f"project.run={path} has no time ledger and project.device is unset: nothing says how long "
                        "its compute takes; rerun it with report.ledger=true or give project.device=FILE "
                        "(conf/cluster/device/)")
    return RunInputs(run_dir.root, config, summary, ledger, get_algorithm(config.algo.name))


def validation_curve(root: Path) -> list[tuple[int, dict[str, float]]]:
    """(step, the evaluation's values) for every evaluation in metrics.jsonl, in order."""
    path = RunDir(root).metrics
    out = []
    if not path.is_file():
        return out
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise UserError(f"{path} line {n} is not JSON: the run's metrics are damaged; "
                            "give another project.run") from None
        if isinstance(row, dict) and any(str(k).startswith("val_") for k in row) and "step" in row:
            out.append((int(row["step"]), {k: v for k, v in row.items() if isinstance(v, (int, float))}))
    return out
