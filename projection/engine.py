"""One projection: a workload on a network with a compute profile, by the engine that fits it.

A bulk-synchronous workload goes through the recurrence (projection/recurrence.py), anything
else through the discrete-event engine (projection/events.py); they agree where both apply
(tests/test_projection_engines.py). The band comes from the compute tail: the measured profile is
resampled with replacement (a bootstrap) and the run projected again with fresh draws, so a
profile of few steps, whose max-of-1,024 is uncertain, gets a wide band and a long one a narrow
one; the band is the 5th to 95th percentile over the replicates. A profile without a measured
spread gives one replicate and no band.

The discrete-event engine simulates every message of every rank, so it runs a window of steps
(`event_window`, and at most EVENT_BUDGET rank-steps: 19 steps at 1,024 ranks) with at most
EVENT_REPLICATES replicates, and carries the window's steady rate (its second half) to the run's
length; the projection says so.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from projection.compute import ComputeProfile
from projection.events import simulate_events
from projection.network import Network
from projection.recurrence import Recurrence, Timeline
from projection.workload import Workload

RECURRENCE, EVENTS = "recurrence", "events"


@dataclass(frozen=True)
class Projection:
    world: int
    steps: int
    engine: str
    wall_s: float
    step_s: float
    wall_band: tuple[float, float]
    step_band: tuple[float, float]
    simulated_steps: int
    notes: tuple[str, ...] = ()
    step_end: Optional[np.ndarray] = field(default=None, repr=False, compare=False)  # the first replicate's

    def time_to(self, step: int) -> tuple[float, float, float]:
        """Seconds to the end of `step` (0-based), with the wall's band scaled to it."""
        if step < 0:  # before the first step (an evaluation of the initial model)
            return 0.0, 0.0, 0.0
        ends = self.step_end
        if ends is not None and step < len(ends) and step < self.simulated_steps:
            at = float(ends[step])
        else:  # past a window: at the steady rate
            last = self.simulated_steps - 1
            at = float(ends[last]) + (step - last) * self.step_s if ends is not None and last >= 0 else \
                self.wall_s * (step + 1) / max(self.steps, 1)
        share = at / self.wall_s if self.wall_s else 0.0
        return at, self.wall_band[0] * share, self.wall_band[1] * share


class Draws:
    """Compute draws for the recurrence, step by step, made a block of steps at a time (one call
    to the generator per block rather than per step)."""

    BLOCK = 256

    def __init__(self, profile: ComputeProfile, rng: np.random.Generator, ranks: int,
                 delays: Optional[np.ndarray]) -> None:
        self.profile, self.rng, self.ranks, self.delays = profile, rng, ranks, delays
        self.first = -self.BLOCK
        self.block: tuple[np.ndarray, np.ndarray] = (np.empty(0), np.empty(0))

    def __call__(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        if not self.first <= step < self.first + self.BLOCK:
            self.first = step
            before, after = self.profile.draws(self.rng, (self.BLOCK, self.ranks))
            self.block = (before, after)
        before, after = self.block[0][step - self.first], self.block[1][step - self.first]
        if self.delays is not None:
            before = before + self.delays[:, step]
        return before, after


def engine_for(workload: Workload, forced: Optional[str] = None) -> str:
    if forced:
        return forced
    return RECURRENCE if workload.synchronous() else EVENTS


def window_of(workload: Workload, steps: int) -> Workload:
    """The first `steps` steps of a workload (no end-of-training ops)."""
    return dataclasses.replace(workload, steps=steps, _cache={})


def replay(workload: Workload, network: Network, before: np.ndarray, after: np.ndarray, engine: str,
           bucket_ready: tuple[float, ...] = (), service_s: Optional[dict[int, float]] = None,
           mids: Optional[np.ndarray] = None) -> Timeline:
    """The run with the compute given rank by rank and step by step ((ranks, steps) seconds, and
    `mids` (ranks, steps, M) between a step's waits): the blind proof's replay of a measured run."""
    if engine == RECURRENCE:
        return Recurrence(workload, network, bucket_ready).run(lambda step: (before[:, step], after[:, step]),
                                                               mids=mids)
    return simulate_events(workload, network, before, after, service_s, bucket_ready, mids=mids)


def extrapolate(timeline: Timeline, window: int, steps: int) -> tuple[float, float]:
    """(wall, seconds per step) of `steps` steps from a window's steady second half."""
    ends = timeline.step_end[:window]
    half = max(window // 2, 1)
    rate = (ends[-1] - ends[-half - 1]) / half if window > half else ends[-1] / window
    return float(ends[-1] + (steps - window) * rate), float(rate)


#: the discrete events simulate at most this many rank-steps per replicate (about a minute here),
#: at least MIN_WINDOW steps, and at most EVENT_REPLICATES replicates
EVENT_BUDGET, MIN_WINDOW, EVENT_REPLICATES = 20_000, 10, 3


def band(values: list[float]) -> tuple[float, float]:
    """The 5th to 95th percentile of the replicates, widened to hold the first (the profile as
    measured), which is the projection's own figure."""
    if len(values) < 2:
        return values[0], values[0]
    low, high = np.quantile(values, [0.05, 0.95])
    return float(min(low, values[0])), float(max(high, values[0]))


def project(workload: Workload, network: Network, profile: ComputeProfile, *, seed: int = 0, replicates: int = 8,
            delays: Optional[np.ndarray] = None, service_s: Optional[dict[int, float]] = None,
            engine: Optional[str] = None, event_window: int = 200) -> Projection:
    """Wall time and time per step of `workload` with compute drawn from `profile` (plus the
    regenerated imbalance `delays`, (ranks, steps)), with its band (see the module docstring)."""
    chosen = engine_for(workload, engine)
    ranks, steps = len(workload.train_ranks), workload.steps
    window = max(MIN_WINDOW, min(event_window, EVENT_BUDGET // max(ranks, 1)))
    simulated = steps if chosen == RECURRENCE else min(steps, window)
    if chosen == EVENTS:
        replicates = min(replicates, EVENT_REPLICATES)
    view = workload if simulated == steps else window_of(workload, simulated)
    rng = np.random.default_rng(seed)
    walls, rates = [], []
    first: Optional[np.ndarray] = None
    count = replicates if profile.measured_tail else 1
    for k in range(count):
        drawn = profile if k == 0 else profile.resampled(rng)
        if chosen == RECURRENCE:
            timeline = Recurrence(view, network, profile.bucket_ready).run(Draws(drawn, rng, ranks, delays))
        else:
            before, after = drawn.draws(rng, (ranks, simulated))
            if delays is not None:
                before = before + delays[:, :simulated]
            timeline = simulate_events(view, network, before, after, service_s, profile.bucket_ready)
        if first is None:
            first = timeline.step_end
        if simulated == steps:
            walls.append(timeline.wall_s)
            rates.append(timeline.wall_s / max(steps, 1))
        else:
            wall, rate = extrapolate(timeline, simulated, steps)
            walls.append(wall)
            rates.append(rate)
    notes = ()
    if simulated < steps:
        notes = (f"discrete events over the first {simulated} of {steps} steps at {workload.world} ranks, "
                 "the rest at the window's steady rate",)
    low, high = band(walls)
    step_low, step_high = band(rates)
    return Projection(workload.world, steps, chosen, walls[0], rates[0], (float(low), float(high)),
                      (float(step_low), float(step_high)), simulated, notes, first)
