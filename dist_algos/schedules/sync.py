"""When local workers average: the synchronisation period H of each round.

Local SGD/AdamW lets every worker take H optimizer steps on its own, then averages the models.
The schedules compared in QSR (Gu et al., ICLR 2024):

- `constant`: H = sync_period throughout (plain local SGD);
- `qsr`: the Quadratic Synchronisation Rule, H = max(H_base, floor((alpha / lr)^2)); H grows as
  the learning rate decays, where the paper finds extra local steps help generalisation;
- `linear`: the same with power 1, the rule QSR argues against;
- `post_local` (Lin et al., ICLR 2020): synchronous data parallelism (gradients averaged every
  step) before `switch_step`, constant H after it.

As in the QSR code, H is decided only at the start and right after an averaging step, for the
whole next round; `lr` is the learning rate of the round's first step, and during LR warmup (or
with alpha = 0) H is the warmup period. Unlike the QSR code, every schedule is capped by the
steps left, so the last round ends exactly at the last step and the final model is an average.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

SCHEDULES = ("constant", "qsr", "linear", "post_local")


@dataclass(frozen=True)
class SyncRule:
    """The schedule's parameters plus the run's step counts: a pure function of progress."""

    schedule: str
    sync_period: int  # H for constant; H_base (QSR's min_h) for qsr/linear; H after the switch
    warmup_period: int  # H while steps_done < warmup_steps, for qsr/linear (QSR's init_h)
    alpha: float  # qsr/linear: growth coefficient; 0 keeps warmup_period for the whole run
    power: float  # qsr: the exponent (2); linear uses 1 whatever this says
    switch_step: int  # post_local: steps before this are synchronous data parallelism
    warmup_steps: int
    total_steps: int

    def parallel_at(self, step: int) -> bool:
        """Whether step `step` (0-based) averages gradients instead of taking a local step."""
        return self.schedule == "post_local" and step < self.switch_step

    def period_after(self, steps_done: int, lr: float) -> int:
        """H of the round that starts after `steps_done` steps, whose first step has LR `lr`."""
        left = self.total_steps - steps_done
        if self.schedule == "constant":
            period = self.sync_period
        elif self.schedule == "post_local":
            period = 1 if steps_done < self.switch_step else self.sync_period
        elif steps_done < self.warmup_steps or self.alpha == 0:
            period = self.warmup_period
        else:
            power = 1.0 if self.schedule == "linear" else self.power
            period = max(growth_period(self.alpha, lr, power), self.sync_period)
        return max(min(period, left), 1)


def growth_period(alpha: float, lr: float, power: float) -> int:
    """floor((alpha / lr)^power); unbounded (a huge int) when the LR has reached zero."""
    if lr <= 0:
        return 2**62
    ratio = (alpha / lr) ** power
    return int(min(math.floor(ratio), 2**62))


@dataclass(frozen=True)
class RoundSteps:
    """Where a run's synchronisations fall, derived once from its rule and learning rates (what a
    declared communication pattern reads): the steps that average gradients (post-local SGD's
    first phase), the steps whose local update ends a round (in order), and whether local steps
    are left after the last of them (then `finalize` averages once more)."""

    parallel: frozenset[int]
    rounds: tuple[int, ...]
    local_after_last: bool


def round_steps(rule: SyncRule, lr_at: Callable[[int], float]) -> RoundSteps:
    """The plugin's own bookkeeping, replayed: H is picked at the start and after every
    synchronisation (`period_after`), a round ends once H local steps are done."""
    period, local = rule.period_after(0, lr_at(0)), 0
    parallel, rounds = [], []
    for step in range(rule.total_steps):
        if rule.parallel_at(step):
            parallel.append(step)
        else:
            local += 1
            if local < period:
                continue
            rounds.append(step)
        local = 0
        if step + 1 < rule.total_steps:
            period = rule.period_after(step + 1, lr_at(step + 1))
    return RoundSteps(frozenset(parallel), tuple(rounds), local > 0)
