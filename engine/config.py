"""The whole configuration of a run: Hydra's schema for it, and its typed, validated form.

Every section's dataclass lives next to the component it configures (`engine.train.config`,
`engine.train.optim`, `engine.train.checkpointer`, `engine.report.metrics`, `engine.launch.config`,
`core.distenv`, `data.config`) and is the one source of that section's defaults. `SECTIONS` is
the one list of the run's sections: what Hydra sees of each (its type and default) and how it
is loaded (merged onto its dataclass, its declared ranges and its own checks applied). From it
come `RunSchema`, which `register_schemas` puts into Hydra's ConfigStore as the `_syncopt` node
that conf/config.yaml starts from (together with one option per model, data set and algorithm
from their registries, so the YAML files carry only what differs), and `RunConfig`, the typed,
frozen form `load_run_config` returns. A new section is one entry here.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

import data
import dist_algos
import models
from core.distenv import DistConfig
from core.errors import UserError
from core.schema import Section, config_error_line, freeze, to_container, typed_section
from data import PathsConfig, data_spec, load_data_config
from engine.ft.config import FTConfig
from engine.launch.config import LaunchConfig, load_launch_config
from engine.report.ledger_writer import ReportConfig
from engine.report.metrics import LoggerConfig
from engine.train.checkpointer import CheckpointConfig, check_checkpoint
from engine.train.config import TrainConfig, check_train
from engine.train.faults import FaultsConfig
from engine.train.optim import OptimConfig, SchedConfig, check_optim, check_sched

#: a section's loader: (its name, its composed node, the loaded sections by name) -> its typed value
Loader = Callable[[str, Any, Callable[[str], Any]], Any]


@dataclass(frozen=True)
class SectionEntry:
    """One section of the run: the type and default Hydra sees, and how it is loaded (None: the
    schema only, not part of `RunConfig`: `paths` feeds interpolations, `table` the table runner)."""

    schema: Any
    default: Any  # a dataclass (its instance is the default) or a plain value
    load: Optional[Loader] = None


def typed(schema: type, check: Optional[Callable[[Any], None]] = None) -> SectionEntry:
    """A section that is its dataclass: merged onto it, ranges checked, then its own check."""

    def load(name: str, node: Any, _: Callable[[str], Any]) -> Any:
        value = typed_section(schema, node, name)
        if check is not None:
            check(value)
        return value

    return SectionEntry(schema, schema, load)


def _seed(_: str, node: Any, __: Callable[[str], Any]) -> int:
    if not isinstance(node, int) or isinstance(node, bool):
        raise UserError(f"seed={node!r}: expected an integer")
    return node


def _resume(_: str, node: Any, __: Callable[[str], Any]) -> Optional[str]:
    if node is not None and not isinstance(node, str):
        raise UserError(f"resume={node!r}: expected auto, null or a checkpoint path")
    return node


def _model(_: str, node: Any, section: Callable[[str], Any]) -> dict[str, Any]:
    model = to_container(node) or {}
    models.check_model_config(model, data_spec(section("data")))
    return model


def _launch(_: str, node: Any, section: Callable[[str], Any]) -> LaunchConfig:
    return load_launch_config(node, section("dist").device)  # the default rank count follows dist.device


#: the run's sections, in the order Hydra composes (and `--cfg job` prints) them
SECTIONS: dict[str, SectionEntry] = {
    "seed": SectionEntry(int, 0, _seed),
    # auto: continue from the newest complete checkpoint in the run directory; null: start fresh;
    # a path: that checkpoint (a checkpoints/step_* directory or another run directory)
    "resume": SectionEntry(Optional[str], "auto", _resume),
    "init_from": SectionEntry(Optional[str], None, lambda _, node, __: node),  # a checkpoint's model starts a new run
    "paths": SectionEntry(PathsConfig, PathsConfig),
    "train": typed(TrainConfig, check_train),
    "optim": typed(OptimConfig, check_optim),
    "sched": typed(SchedConfig, check_sched),
    "checkpoint": typed(CheckpointConfig, check_checkpoint),
    "launch": SectionEntry(LaunchConfig, LaunchConfig, _launch),
    "logger": typed(LoggerConfig),
    "report": typed(ReportConfig),  # what a run records for analysis: the time ledger (engine/report/ledger.py)
    "dist": typed(DistConfig),
    "faults": typed(FaultsConfig),  # injected failures (engine/train/faults.py)
    "ft": typed(FTConfig),
    "model": SectionEntry(Any, None, _model),  # the model group's node (models' registry)
    "data": SectionEntry(Any, None, lambda _, node, __: load_data_config(node)),  # the data group's node (data sets)
    "algo": SectionEntry(Any, None, lambda _, node, __: dist_algos.load_algo_config(node)),  # the plugin's Config
    "table": SectionEntry(Any, None),  # set only by `table=NAME`: read by tables/, above the engine
    # `cluster=NAME` (conf/cluster/) and `project.*`: read by projection/, above the engine
    "cluster": SectionEntry(Any, None),
    "project": SectionEntry(Any, None),
}


def _schema_field(entry: SectionEntry) -> Any:
    if dataclasses.is_dataclass(entry.default):
        return field(default_factory=entry.default)
    return field(default=entry.default)


RunSchema = dataclasses.make_dataclass("RunSchema", [(name, entry.schema, _schema_field(entry))
                                                     for name, entry in SECTIONS.items()])
RunSchema.__module__ = __name__
RunSchema.__doc__ = "The top of the composed config as Hydra sees it (conf/config.yaml's first default)."

RunConfig = dataclasses.make_dataclass(
    "RunConfig", [(name, entry.schema) for name, entry in SECTIONS.items() if entry.load is not None]
    + [("raw", DictConfig, field(repr=False))], bases=(Section,))
RunConfig.__module__ = __name__
RunConfig.__doc__ = """The whole validated configuration of one run, as every rank sees it (frozen); `raw` is
the resolved composed config, for saving and logging."""

_registered = False


def register_schemas() -> None:
    """Hydra's ConfigStore: the run's schema, and one option per model, data set, algorithm."""
    global _registered
    if _registered:
        return
    _registered = True
    store = ConfigStore.instance()
    store.store(name="_syncopt", node=RunSchema)
    data.register_configs()
    models.register_configs()
    dist_algos.register_configs()


def load_run_config(cfg: DictConfig) -> RunConfig:
    """Validate the composed config and return its typed, frozen `RunConfig`; raises `UserError`
    with one line for anything a user could have mistyped or set out of range. Sections load in
    `SECTIONS`' order; one that reads another (the model reads the data set, the launch reads
    dist.device) loads that one first."""
    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as err:
        raise UserError(config_error_line(err, "config")) from None
    loaded: dict[str, Any] = {}

    def section(name: str) -> Any:
        if name not in loaded:
            entry = SECTIONS[name]
            default = None if dataclasses.is_dataclass(entry.default) else entry.default
            loaded[name] = entry.load(name, cfg.get(name, default), section)
        return loaded[name]

    for name, entry in SECTIONS.items():
        if entry.load is not None:
            section(name)
    return freeze(RunConfig(**loaded, raw=cfg))
