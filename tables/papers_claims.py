"""The papers' wall-clock claims as a table config declares them (`table=papers_time`,
recipes/tables/papers_time.yaml), read and checked before anything is projected.

A claim file has two parts. `setups`: each paper's machine and workload as the paper states it
(workers, per-worker batch, epochs and samples, so a run's steps follow; the cluster preset and
the device profile that describe its machine; an injected load imbalance; the methods compared,
each a recipe plus overrides, whose plugin config and model the projection composes). `claims`:
each figure the paper states (value and unit, or only words where it gives no number), where it
states it, which setup and method(s) it is about, what it measures, and what the model lacks to
reproduce it. Every number carries its source, as the cluster presets' do: a projection compared
with a paper is only as honest as the provenance of what went into it. Anything wrong is one
line naming the key and the fix (exit code 2 through cli.py).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from core.errors import UserError
from engine.train.imbalance import ImbalanceConfig
from projection.cluster import REPO, plain, preset_names


class Measure(str, enum.Enum):
    """What a claim's figure measures, and so how a projection is turned into it."""

    throughput_ratio = "throughput_ratio"  # the baseline's time per step over the method's (same batch, workers)
    wall_minutes = "wall_minutes"  # the method's wall time to the setup's steps
    wall_hours = "wall_hours"
    speedup_vs_one = "speedup_vs_one"  # workers x one worker's compute step / the method's step (DGS's README)
    not_stated = "not_stated"  # the paper gives no wall-clock figure: the row says so, nothing is projected


UNITS = {Measure.throughput_ratio: "x", Measure.wall_minutes: "min", Measure.wall_hours: "h",
         Measure.speedup_vs_one: "x", Measure.not_stated: ""}


@dataclass(frozen=True)
class Method:
    name: str
    recipe: str
    overrides: tuple[str, ...] = ()

    def args(self) -> list[str]:
        """cli.py's overrides that compose this method's run config."""
        return [f"recipe={self.recipe}", *self.overrides]


@dataclass(frozen=True)
class Setup:
    """One paper's machine and workload (see the module docstring)."""

    name: str
    paper: str
    what: str
    workers: int
    batch_per_worker: int
    epochs: int
    samples_per_epoch: int
    cluster: str
    device: Path
    methods: dict[str, Method]
    imbalance: Optional[ImbalanceConfig] = None
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def steps_per_epoch(self) -> int:
        """Each worker's steps per epoch: the epoch's samples over the batch all workers take in a step."""
        return max(1, self.samples_per_epoch // (self.workers * self.batch_per_worker))

    @property
    def steps(self) -> int:
        return self.epochs * self.steps_per_epoch


@dataclass(frozen=True)
class PaperFigure:
    value: Optional[float]
    unit: str
    text: str
    source: str

    def shown(self) -> str:
        if self.value is None:
            return self.text
        return f"{self.value:g}{' ' if self.unit not in ('x', '') else ''}{self.unit}"


@dataclass(frozen=True)
class Claim:
    id: str
    claim: str
    measure: Measure
    paper: PaperFigure
    lacks: str
    setup: Optional[str] = None
    method: Optional[str] = None
    baseline: Optional[str] = None


@dataclass(frozen=True)
class Claims:
    name: str
    title: str
    setups: dict[str, Setup]
    claims: tuple[Claim, ...]
    event_window: int = 100
    seed: int = 0


def sourced_number(node: Any, key: str, where: str, sources: dict[str, str]) -> float:
    """`node[key]` as `{value: X, source: "..."}`, X a positive number, its source recorded."""
    item = node.get(key) if isinstance(node, dict) else None
    path = f"{where}.{key}"
    if not isinstance(item, dict) or set(item) != {"value", "source"}:
        raise UserError(f"{path}={item!r}: give it as {{value: X, source: '...'}} naming where the number comes from")
    value, source = item["value"], item["source"]
    if not isinstance(source, str) or not source.strip():
        raise UserError(f"{path}.source is empty: say where {value!r} comes from")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise UserError(f"{path}.value={value!r}: expected a positive number")
    sources[path] = source
    return float(value)


def text(node: Any, key: str, where: str, required: bool = True) -> str:
    value = node.get(key) if isinstance(node, dict) else None
    if value is None and not required:
        return ""
    if not isinstance(value, str) or not value.strip():
        raise UserError(f"{where}.{key}={value!r}: expected a non-empty text")
    return value.strip()


def read_methods(node: Any, where: str) -> dict[str, Method]:
    if not isinstance(node, dict) or not node:
        raise UserError(f"{where}.methods is missing: give each method as NAME: {{recipe: DIR/FILE, overrides: [...]}}")
    methods = {}
    for name, spec in node.items():
        here = f"{where}.methods.{name}"
        overrides = spec.get("overrides", []) if isinstance(spec, dict) else None
        if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
            raise UserError(f"{here}.overrides={overrides!r}: expected a list of cli.py overrides (KEY=VALUE)")
        methods[str(name)] = Method(str(name), text(spec, "recipe", here), tuple(overrides))
    return methods


def read_imbalance(node: Any, where: str, sources: dict[str, str]) -> Optional[ImbalanceConfig]:
    """The injected imbalance in the terms of `train.imbalance` (fixed delay, probability per rank and step)."""
    if node is None:
        return None
    here = f"{where}.imbalance"
    delay = sourced_number(node, "delay_ms", here, sources)
    prob = sourced_number(node, "prob", here, sources)
    if prob > 1:
        raise UserError(f"{here}.prob.value={prob}: a probability per rank and step is at most 1")
    return ImbalanceConfig(delay_ms=delay, prob=prob)


def read_setup(name: str, node: Any) -> Setup:
    where = f"table.setups.{name}"
    if not isinstance(node, dict):
        raise UserError(f"{where} is not a mapping: give paper, what, workers, batch_per_worker, epochs, "
                        "samples_per_epoch, cluster, device and methods")
    sources: dict[str, str] = {}
    numbers = {key: int(sourced_number(node, key, where, sources))
               for key in ("workers", "batch_per_worker", "epochs", "samples_per_epoch")}
    cluster = text(node, "cluster", where)
    if cluster not in preset_names():
        raise UserError(f"{where}.cluster={cluster}: no such preset (conf/cluster/); available: "
                        f"{', '.join(preset_names())}")
    device = REPO / text(node, "device", where)
    if not device.is_file():
        raise UserError(f"{where}.device={node['device']}: no such file; give a device profile "
                        "(conf/cluster/device/*.yaml)")
    return Setup(name, text(node, "paper", where), text(node, "what", where), cluster=cluster, device=device,
                 methods=read_methods(node.get("methods"), where),
                 imbalance=read_imbalance(node.get("imbalance"), where, sources), sources=sources, **numbers)


def read_paper(node: Any, where: str) -> PaperFigure:
    here = f"{where}.paper"
    if not isinstance(node, dict):
        raise UserError(f"{here} is missing: give {{value: X, unit: U, source: '...'}} or {{text: '...', source: '...'}}")
    source = node.get("source")
    if not isinstance(source, str) or not source.strip():
        raise UserError(f"{here}.source is empty: say where the paper states this figure (section, figure, README)")
    value = node.get("value")
    if value is None:
        return PaperFigure(None, "", text(node, "text", here), source.strip())
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise UserError(f"{here}.value={value!r}: expected a positive number (or give text: instead)")
    return PaperFigure(float(value), str(node.get("unit", "")), str(node.get("text", "")), source.strip())


def read_claim(node: Any, index: int, setups: dict[str, Setup]) -> Claim:
    where = f"table.claims[{index}]"
    if not isinstance(node, dict):
        raise UserError(f"{where} is not a mapping: give id, claim, measure, paper and lacks")
    measure_name = node.get("measure")
    if measure_name not in {m.value for m in Measure}:
        raise UserError(f"{where}.measure={measure_name!r}: expected one of {', '.join(m.value for m in Measure)}")
    measure = Measure(measure_name)
    claim = Claim(text(node, "id", where), text(node, "claim", where), measure, read_paper(node.get("paper"), where),
                  text(node, "lacks", where), node.get("setup"), node.get("method"), node.get("baseline"))
    if measure == Measure.not_stated:
        return claim
    if claim.setup not in setups:
        raise UserError(f"{where}.setup={claim.setup!r}: not a setup of this table ({', '.join(setups)})")
    methods = setups[claim.setup].methods
    needed = [("method", claim.method)] + ([("baseline", claim.baseline)] if measure == Measure.throughput_ratio else [])
    for key, name in needed:
        if name not in methods:
            raise UserError(f"{where}.{key}={name!r}: not a method of setup {claim.setup} ({', '.join(methods)})")
    return claim


def load_claims(node: Any) -> Claims:
    """The table config `node` (composed, or a plain mapping) as checked `Claims`."""
    node = plain(node)
    name = node.get("name", "papers_time") if isinstance(node, dict) else "papers_time"
    setups_node = node.get("setups") if isinstance(node, dict) else None
    if not isinstance(setups_node, dict) or not setups_node:
        raise UserError(f"table {name}: no setups; give each paper's machine and workload under setups:")
    setups = {str(k): read_setup(str(k), v) for k, v in setups_node.items()}
    claims_node = node.get("claims")
    if not isinstance(claims_node, list) or not claims_node:
        raise UserError(f"table {name}: no claims; list each paper figure under claims:")
    claims = tuple(read_claim(c, i, setups) for i, c in enumerate(claims_node))
    ids = [c.id for c in claims]
    if len(set(ids)) != len(ids):
        raise UserError(f"table {name}: claim ids must be unique ({', '.join(ids)})")
    window = node.get("event_window", 100)
    if isinstance(window, bool) or not isinstance(window, int) or window < 10:
        raise UserError(f"table.event_window={window!r}: expected a whole number of steps, at least 10")
    return Claims(str(name), str(node.get("title", name)), setups, claims, window, int(node.get("seed", 0)))
