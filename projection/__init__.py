"""Time at scale: a model of the machine applied to what a run did (docs/projection.md).

The workload (a plugin's declared communication pattern, or a run's ledger) meets the system (a
cluster preset: links, collectives' algorithms, and a compute profile with its tail) in one of
two engines: a vectorised recurrence for bulk-synchronous patterns, discrete events on SimGrid
for the rest. `python cli.py project.run=DIR cluster=NAME` is the command (`command`); the
blind proof and the calibration are bench/projection.py and bench/calibrate_network.py. Above the
engine, below the tables (which will add projected-time columns from it)."""
from __future__ import annotations

from hydra.core.config_store import ConfigStore

from projection.config import ProjectConfig


def register_project_schema() -> None:
    """The typed `project` node (conf/config.yaml's `optional project: _schema`), registered by the
    commands that compose it (cli.py), not by the engine."""
    ConfigStore.instance().store(group="project", name="_schema", node=ProjectConfig)
