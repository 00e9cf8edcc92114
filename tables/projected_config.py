"""`table.project.*`: a table's "projected time to quality" columns, written at its gather.

    python cli.py table=NAME table.gather_only=true table.store=... cluster=eth1
    python cli.py table=NAME table.gather_only=true table.store=... 'table.project.clusters=[ib400_8gpu,eth25,eth1]'

A run's compute (`compute`, `device`) and the byte ratios of its data-dependent ops come from its time
ledger where its run folder is at hand, else from the ledger digest its store carried
(projection/ledger_digest.py), else the device profile; the files say per run which were used.

Each named cluster (the command's `cluster=NAME`, composed with any overrides of it, and the presets of
`clusters`) gets its own files beside table.md (tables/projected.py): nothing is projected unless a
cluster is named, so a table gathered without one is the table it always was. Accuracy is never
projected: a row's quality comes from its own runs at the worker count they ran; only the time to it
is a projection (docs/projection.md).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from core.schema import Section, option

#: table.project.compute's choices (the field's comment)
COMPUTE_SOURCES = ("auto", "ledger", "device")
#: the NIC bandwidths the bandwidth figure sweeps (Gbit/s): 100 Mbit/s WAN to 400 Gbit/s NDR
SWEEP_GBIT = [0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 200.0, 400.0]


@dataclass
class ProjectedColumns(Section):
    """Which clusters, which compute, which targets and which sweep (the module doc)."""

    # presets (conf/cluster/NAME.yaml) to project onto, beside the command's own `cluster=NAME`
    clusters: list[str] = field(default_factory=list)
    # a device profile (conf/cluster/device/*.yaml) for the compute of runs that kept no time
    # ledger (report.ledger=true); a run without either is refused in one line
    device: Optional[str] = None
    # where each run's compute comes from. auto: its ledger (where its run folder is at hand), else
    # the ledger digest its store carried, else `device`; ledger: the first two only, a run with
    # neither refused; device: `device` for every run (runs made with more ranks than cores measure
    # inflated compute). A run's byte ratios come from its ledger or digest in every mode.
    compute: str = option("auto", choices=COMPUTE_SOURCES)
    # the looser target: for a metric where higher is better, this fraction of the baseline's final
    # value (0.99: 99% of allreduce's accuracy); where lower is better, the baseline's plus `loose_margin`
    loose_ratio: float = option(0.99, gt=0, le=1)
    loose_margin: float = option(0.05, gt=0)
    # the bandwidth figure: the NIC bandwidths swept (Gbit/s) at one worker count (null: the largest
    # the table ran), each cluster's preset otherwise unchanged
    bandwidths_gbit: list[float] = option(factory=lambda: list(SWEEP_GBIT), gt=0)
    sweep_workers: Optional[int] = option(None, ge=1)
    # the projection's band (bootstrap replicates of the compute tail) and the discrete-event window
    # (steps simulated at a worker count for asynchronous methods; the rest at its steady rate)
    replicates: int = option(8, ge=1)
    event_window: int = option(50, ge=10)
