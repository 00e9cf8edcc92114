"""The whole configuration of a run: Hydra's schema for it, and its typed, validated form.

Every section's dataclass lives next to the component it configures (`engine.train.config`,
`engine.train.optim`, `engine.train.checkpointer`, `engine.report.metrics`, `engine.launch.config`,
`core.distenv`, `data.config`) and is the one source of that section's defaults:
`register_schemas` puts them into Hydra's ConfigStore as the `_syncopt` node that
conf/config.yaml starts from, together with one option per model, data set and algorithm from
their registries, so the YAML files carry only what differs. `load_run_config` turns the
composed tree into a `RunConfig`: every section merged onto its dataclass, every declared range
checked, the model, data set and algorithm looked up, then frozen.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

import data
import dist_algos
import models
from core.distenv import DistConfig
from core.errors import UserError
from core.schema import Section, config_error_line, freeze, to_container, typed_section
from data import DataConfig, PathsConfig, data_spec, load_data_config
from dist_algos.base import AlgoConfig
from engine.ft.config import FTConfig
from engine.launch.config import LaunchConfig, load_launch_config
from engine.report.metrics import LoggerConfig
from engine.tables.config import TableConfig
from engine.train.checkpointer import CheckpointConfig, check_checkpoint
from engine.train.config import TrainConfig, check_train
from engine.train.faults import FaultsConfig
from engine.train.optim import OptimConfig, SchedConfig, check_optim, check_sched


@dataclass
class RunSchema:
    """The top of the composed config as Hydra sees it (conf/config.yaml's first default)."""

    seed: int = 0
    # auto: continue from the newest complete checkpoint in the run directory; null: start fresh;
    # a path: that checkpoint (a checkpoints/step_* directory or another run directory)
    resume: Optional[str] = "auto"
    init_from: Optional[str] = None  # a checkpoint whose model (rank 0's) starts a new run
    paths: PathsConfig = field(default_factory=PathsConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    sched: SchedConfig = field(default_factory=SchedConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)  # injected failures (engine/train/faults.py)
    ft: FTConfig = field(default_factory=FTConfig)
    model: Any = None  # the model group's node (models' registry)
    data: Any = None  # the data group's node (data sets' registry)
    algo: Any = None  # the algo group's node (the plugin's config dataclass)
    table: Any = None  # set only by `table=NAME` (engine.tables)


@dataclass
class RunConfig(Section):
    """The whole validated configuration of one run, as every rank sees it (frozen)."""

    seed: int
    resume: Optional[str]
    init_from: Optional[str]
    model: dict[str, Any]
    data: DataConfig
    algo: AlgoConfig
    optim: OptimConfig
    sched: SchedConfig
    train: TrainConfig
    checkpoint: CheckpointConfig
    launch: LaunchConfig
    logger: LoggerConfig
    dist: DistConfig
    faults: FaultsConfig
    ft: FTConfig
    raw: DictConfig = field(repr=False)  # the resolved composed config, for saving and logging


_registered = False


def register_schemas() -> None:
    """Hydra's ConfigStore: the run's schema, and one option per model, data set, algorithm."""
    global _registered
    if _registered:
        return
    _registered = True
    store = ConfigStore.instance()
    store.store(name="_syncopt", node=RunSchema)
    store.store(group="table", name="_schema", node=TableConfig)
    data.register_configs()
    models.register_configs()
    dist_algos.register_configs()


def load_run_config(cfg: DictConfig) -> RunConfig:
    """Validate the composed config and return its typed, frozen form; raises `UserError` with
    one line for anything a user could have mistyped or set out of range."""
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as err:
        raise UserError(config_error_line(err, "config")) from None
    seed = cfg.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise UserError(f"seed={seed!r}: expected an integer")
    resume = cfg.get("resume", "auto")
    if resume is not None and not isinstance(resume, str):
        raise UserError(f"resume={resume!r}: expected auto, null or a checkpoint path")
    data_cfg = load_data_config(cfg.get("data"))
    model = to_container(cfg.get("model")) or {}
    models.check_model_config(model, data_spec(data_cfg))
    optim = typed_section(OptimConfig, cfg.get("optim"), "optim")
    sched = typed_section(SchedConfig, cfg.get("sched"), "sched")
    train = typed_section(TrainConfig, cfg.get("train"), "train")
    check_optim(optim)
    check_sched(sched)
    check_train(train)
    checkpoint = typed_section(CheckpointConfig, cfg.get("checkpoint"), "checkpoint")
    check_checkpoint(checkpoint)
    dist = typed_section(DistConfig, cfg.get("dist"), "dist")
    run = RunConfig(
        seed=seed, resume=resume, init_from=cfg.get("init_from"), model=model, data=data_cfg,
        algo=dist_algos.load_algo_config(cfg.get("algo")), optim=optim, sched=sched,
        train=train,
        checkpoint=checkpoint,
        launch=load_launch_config(cfg.get("launch"), dist.device),
        logger=typed_section(LoggerConfig, cfg.get("logger"), "logger"),
        dist=dist,
        faults=typed_section(FaultsConfig, cfg.get("faults"), "faults"),
        ft=typed_section(FTConfig, cfg.get("ft"), "ft"), raw=cfg,
    )
    return freeze(run)
