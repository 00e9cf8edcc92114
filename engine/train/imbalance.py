"""Load-imbalance injection, usable with every algorithm (`train.imbalance.*`).

Uneven sample lengths, stragglers and noisy neighbours make some ranks slower in some steps;
this reproduces that on demand so that synchronous and wait-avoiding methods can be compared.
Each rank draws, every step and independently of the others, whether it is delayed (a seeded
generator per rank, so a run is repeatable); the delay is either fixed or a multiple of this
rank's median undelayed step time, measured over the first `calibration_steps` steps.
"""
from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass
from typing import Optional

from core.schema import Section, option


@dataclass
class ImbalanceConfig(Section):
    """`train.imbalance`: slow ranks down to study wait-avoiding methods.

    A delay is added after a rank's compute in a step, either a fixed `delay_ms` or `factor`
    times that rank's median undelayed step time (measured over the first steps), with
    probability `prob` per step, independently per rank, from a seeded generator.
    """

    ranks: Optional[list[int]] = option(None, ge=0)  # None: every training rank
    delay_ms: float = option(0.0, ge=0)
    factor: float = option(0.0, ge=0)
    prob: float = option(1.0, ge=0, le=1)
    seed: int = 1234

    @property
    def enabled(self) -> bool:
        return self.delay_ms > 0 or self.factor > 0


class ImbalanceInjector:
    calibration_steps = 10

    def __init__(self, cfg: ImbalanceConfig, rank: int) -> None:
        self.cfg = cfg
        self.active = cfg.enabled and (cfg.ranks is None or rank in cfg.ranks)
        self._rng = random.Random(cfg.seed * 100_003 + rank)
        self._samples: list[float] = []
        self.median_step_s: Optional[float] = None
        self.injected_s = 0.0
        self.delayed_steps = 0

    def delay_for(self, step: int) -> float:
        """Seconds to sleep after this step's compute (drawn even while calibrating, so the
        schedule of delays is a function of the seed and step alone)."""
        hit = self._rng.random() < self.cfg.prob
        if not self.active or not hit:
            return 0.0
        if self.cfg.delay_ms > 0:
            return self.cfg.delay_ms / 1000.0
        if self.median_step_s is None:
            return 0.0
        return self.cfg.factor * self.median_step_s

    def observe(self, undelayed_s: float) -> None:
        if self.median_step_s is None and self.active:
            self._samples.append(undelayed_s)
            if len(self._samples) >= self.calibration_steps:
                self.median_step_s = statistics.median(self._samples)

    def inject(self, step: int, undelayed_s: float) -> float:
        self.observe(undelayed_s)
        delay = self.delay_for(step)
        if delay > 0:
            time.sleep(delay)
            self.injected_s += delay
            self.delayed_steps += 1
        return delay

    def state_dict(self) -> dict:
        return {"rng": list(self._rng.getstate()[1]), "rng_version": self._rng.getstate()[0],
                "samples": list(self._samples), "median": self.median_step_s,
                "injected_s": self.injected_s, "delayed_steps": self.delayed_steps}

    def load_state_dict(self, state: dict) -> None:
        self._rng.setstate((state["rng_version"], tuple(state["rng"]), None))
        self._samples = list(state["samples"])
        self.median_step_s = state["median"]
        self.injected_s = state["injected_s"]
        self.delayed_steps = state["delayed_steps"]
