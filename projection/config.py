"""The `project` section: `python cli.py project.run=DIR cluster=NAME 'project.workers=[64,256,1024]'`.

A run's time on another machine and at other worker counts (docs/projection.md). Like `table`, the
section is read by a package above the engine (this one), never by a run; cli.py hands it over
when `project.run` is set.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from core.schema import Section, option


@dataclass
class ProjectConfig(Section):
    """`project.*`: which finished run, at which worker counts, with which compute."""

    run: Optional[str] = None  # the run directory to project (set: the command runs)
    workers: list[int] = option(factory=lambda: [64, 256, 1024], ge=1)
    # a device profile (conf/cluster/device/*.yaml) for the compute instead of the run's own ledger
    device: Optional[str] = None
    # a validation value to reach: the time to it, at the run's own worker count only
    target: Optional[float] = None
    replicates: int = option(8, ge=1, hint="bootstrap replicates of the compute tail for the band")
    event_window: int = option(200, ge=10, hint="steps the discrete-event engine simulates at a worker count")
    seed: int = 0
