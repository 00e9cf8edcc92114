"""The compute half of a machine: how long a rank works between its communications, with its tail.

A profile is a set of measured step times, each split where the step's first blocking
communication falls: `before` (data wait, forward, backward: what a gradient average waits for)
and `after` (the optimizer step after it). Drawn whole, a pair keeps the two parts of one real
step together. Sources: a run's own ledger (this CPU), a device file with the figures of
docs/gpu.md, or a user's own bench (`device_profile`).

The tail matters at scale: a synchronous step at P workers waits for the slowest of P draws, so
its expectation is E[max of P] = sum_i x_(i) [(i/N)^P - ((i-1)/N)^P] over the N sorted samples
(`expected_max`), and its q-quantile is the sample quantile at q^(1/P) (`quantile_of_max`). A
profile with one figure and no measured spread (a device file that gives only a mean) has no
tail: every draw is that figure, and `project` says so among its assumptions.

Load imbalance injected by `train.imbalance` is not drawn from the profile but regenerated: the
injector's own generator, seeded per rank, is run step by step (`imbalance_delays`), so a
projection at 1,024 workers sees exactly the delays those ranks would have drawn.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

import numpy as np
import yaml

from core.errors import UserError
from engine.train.imbalance import ImbalanceConfig, ImbalanceInjector


def expected_max(samples: np.ndarray, n: int) -> float:
    """E[max of n independent draws] from the empirical distribution of `samples`, exactly."""
    x = np.sort(np.asarray(samples, dtype=float))
    count = len(x)
    i = np.arange(1, count + 1, dtype=float)
    weights = (i / count) ** n - ((i - 1) / count) ** n
    return float(np.dot(weights, x))


def quantile_of_max(samples: np.ndarray, n: int, q: float) -> float:
    """The q-quantile of the max of n draws: P(max <= x) = F(x)^n, so F^-1(q^(1/n))."""
    return float(np.quantile(np.asarray(samples, dtype=float), q ** (1.0 / n), method="inverted_cdf"))


@dataclass(frozen=True)
class ComputeProfile:
    """Measured step times: `steps[k] = (before, after)` seconds of one rank's step k (pooled
    over ranks and steps, the warm-up left out); `bucket_ready[b]`: when gradient bucket b is
    ready, as a fraction of `before` (overlapped all-reduce), from the ledger."""

    steps: np.ndarray
    source: str
    measured_tail: bool = True
    bucket_ready: tuple[float, ...] = ()
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        steps = np.asarray(self.steps, dtype=float).reshape(-1, 2)
        if len(steps) == 0 or (steps < 0).any():
            raise ValueError("a compute profile needs at least one non-negative step time")
        object.__setattr__(self, "steps", steps)

    @property
    def totals(self) -> np.ndarray:
        return self.steps.sum(axis=1)

    @property
    def median_s(self) -> float:
        return float(np.median(self.totals))

    def draws(self, rng: np.random.Generator, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """(before, after) of `shape` independent steps, each a measured pair."""
        if len(self.steps) == 1:
            return np.full(shape, self.steps[0, 0]), np.full(shape, self.steps[0, 1])
        picked = rng.integers(0, len(self.steps), size=shape)
        return self.steps[:, 0][picked], self.steps[:, 1][picked]

    def resampled(self, rng: np.random.Generator) -> "ComputeProfile":
        """A bootstrap replicate: the samples drawn again with replacement (for the band)."""
        return replace(self, steps=self.steps[rng.integers(0, len(self.steps), size=len(self.steps))])

    def scaled(self, factor: float) -> "ComputeProfile":
        return replace(self, steps=self.steps * factor)


def profile_from_steps(before: Sequence[float], after: Sequence[float], source: str,
                       bucket_ready: Sequence[float] = ()) -> ComputeProfile:
    return ComputeProfile(np.column_stack([np.asarray(before, float), np.asarray(after, float)]), source,
                          measured_tail=len(before) > 1, bucket_ready=tuple(bucket_ready))


def device_profile(path: Path, batch: Optional[int] = None) -> ComputeProfile:
    """A device file (YAML, no code): `step_s: {value, source}` and optionally `samples_s: [...]`
    with `samples_source` (a bench's measured steps, which give the tail) and `after_fraction`
    (the share of a step after its communication: the optimizer step). A file measured at several
    per-worker batches (bench/device_profile.py) holds those fields per batch under
    `batches: {B: {...}}`; `batch` picks one, since a table's runs at 4-64 workers of one global
    batch compute 512/N samples a step each."""
    if not path.is_file():
        raise UserError(f"project.device={path}: no such file; give a device profile (conf/cluster/device/*.yaml)")
    try:
        node = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise UserError(f"project.device={path} is not a device profile ({type(err).__name__}: {err})") from None
    if isinstance(node, dict) and isinstance(node.get("batches"), dict):
        measured = node["batches"]
        if batch not in measured:
            have = ", ".join(str(b) for b in measured)
            raise UserError(f"project.device={path} has no steps measured at a per-worker batch of {batch} "
                            f"(measured: {have}); measure it with the bench command its source names, adding "
                            f"--batches {batch}")
        return profile_entry(measured[batch], path, f"{path.name} at batch {batch}")
    return profile_entry(node, path, path.name)


def profile_entry(node: Any, path: Path, name: str) -> ComputeProfile:
    """One measured entry of a device file (see `device_profile`)."""
    try:
        if not isinstance(node, dict):
            raise TypeError(f"a YAML {type(node).__name__}, not a mapping")
        step, source = float(node["step_s"]["value"]), str(node["step_s"]["source"])
    except (KeyError, TypeError, ValueError) as err:
        raise UserError(f"project.device={path} is not a device profile ({type(err).__name__}: {err}); it needs "
                        "step_s: {value: SECONDS, source: '...'}") from None
    if step <= 0 or not source.strip():
        raise UserError(f"project.device={path}: step_s needs a positive value and a source")
    after = float(node.get("after_fraction", 0.0))
    samples = node.get("samples_s")
    if samples:
        if not str(node.get("samples_source", "")).strip():
            raise UserError(f"project.device={path}: samples_s needs samples_source (the bench that measured them)")
        totals = np.asarray(samples, dtype=float)
        return profile_from_steps(totals * (1 - after), totals * after, f"{name}: {node['samples_source']}")
    return ComputeProfile(np.array([[step * (1 - after), step * after]]), f"{name}: {source}", measured_tail=False,
                          notes=("the device file gives one step time and no measured spread: every step takes "
                                 "it, so the band is zero",))


def imbalance_delays(cfg: ImbalanceConfig, ranks: Sequence[int], steps: int, median_s: float,
                     first_step: int = 0) -> Optional[np.ndarray]:
    """Seconds each of `ranks` sleeps after its compute at each step, regenerated with the
    injector itself (its per-rank seeded generator; a factor-of-median delay waits for the
    injector's calibration steps, whose median is taken as the profile's `median_s`). None when
    no imbalance is configured."""
    if not cfg.enabled:
        return None
    out = np.zeros((len(ranks), steps))
    for i, rank in enumerate(ranks):
        injector = ImbalanceInjector(cfg, rank)
        if not injector.active:
            continue
        for step in range(first_step + steps):
            calibrated = step >= ImbalanceInjector.calibration_steps
            injector.median_step_s = median_s if calibrated else None
            delay = injector.delay_for(step)
            if step >= first_step:
                out[i, step - first_step] = delay
    return out
