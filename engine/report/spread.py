"""How far apart a run's workers ended, and what each worker's own model and their mean score.

The question behind every method that lets workers differ between synchronisations (local SGD,
DiLoCo, EASGD, LSGD, gossip): a run's headline evaluates one model (the plugin's `eval_model`:
a centre, a leader, the mean), and when that model is poor the run alone cannot say whether the
workers failed to learn or learned apart, so that their mean is no model at all. This reads the
answer from a checkpoint's rank files, after the fact, without touching training:

- each rank's own weights scored on the validation split and the test set;
- the mean of the training ranks' weights scored the same way;
- the consensus distance (Kong et al., ICML 2021) Xi = sqrt(1/n sum_i ||x_i - mean||^2) over the
  training ranks' parameters, with ||mean|| beside it so that it reads as a fraction, and each
  rank's own ||x_i - mean|| / ||mean||.

The mean is taken over parameters and floating-point buffers alike; BatchNorm's running
statistics are averaged as they are, not re-estimated, so on a model with BatchNorm the mean's
score here is not the plugins' `average` evaluation (which re-estimates them) and says so
(`Spread.bn_averaged`). Integer buffers (BN's batch counter) are the first training rank's.
`engine/worker_spread.py` is the command (`python -m engine.worker_spread`).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

State = Mapping[str, torch.Tensor]
Score = Callable[[nn.Module], dict[str, float]]


def mean_state(states: Sequence[State]) -> dict[str, torch.Tensor]:
    """The entrywise mean of model states (floating entries, summed in float64 and cast back to
    each entry's dtype); other entries from the first state."""
    if not states:
        raise ValueError("the mean of no states")
    out: dict[str, torch.Tensor] = {}
    for key, first in states[0].items():
        if first.is_floating_point():
            total = torch.zeros(first.shape, dtype=torch.float64)
            for state in states:
                total += state[key].detach().to("cpu", torch.float64)
            out[key] = (total / len(states)).to(first.dtype)
        else:
            out[key] = first.detach().clone()
    return out


def distances_from(states: Sequence[State], mean: State, keys: Sequence[str]) -> list[float]:
    """||x_i - mean|| over the entries `keys` (the model's parameters), one per state."""
    return [math.sqrt(sum(float((s[k].double() - mean[k].double()).pow(2).sum()) for k in keys)) for s in states]


def norm_of(state: State, keys: Sequence[str]) -> float:
    return math.sqrt(sum(float(state[k].double().pow(2).sum()) for k in keys))


@dataclass
class Spread:
    """One checkpoint's workers: their scores, their mean's and how far apart they are."""

    step: int
    train_ranks: list[int]
    per_rank: dict[int, dict[str, float]]  # every rank with a model, serving ranks included
    mean: dict[str, float]  # the training ranks' mean weights
    distance: dict[int, float]  # training rank -> ||x_i - mean||
    mean_norm: float
    bn_averaged: bool  # the model has running statistics, averaged rather than re-estimated
    notes: list[str] = field(default_factory=list)

    @property
    def consensus_distance(self) -> float:
        """Xi = sqrt(1/n sum_i ||x_i - mean||^2) over the training ranks."""
        d = [self.distance[r] for r in self.train_ranks]
        return math.sqrt(sum(x * x for x in d) / len(d))

    def relative(self, rank: int) -> float:
        return self.distance[rank] / self.mean_norm if self.mean_norm else math.inf

    def as_dict(self) -> dict[str, Any]:
        return {"step": self.step, "train_ranks": self.train_ranks,
                "per_rank": {str(r): m for r, m in self.per_rank.items()}, "mean": self.mean,
                "consensus_distance": self.consensus_distance, "mean_norm": self.mean_norm,
                "relative_distance": {str(r): self.relative(r) for r in self.train_ranks},
                "bn_averaged": self.bn_averaged, "notes": self.notes}


def measure_spread(step: int, states: Mapping[int, State], train_ranks: Sequence[int],
                   build: Callable[[], nn.Module], score: Score) -> Spread:
    """Score every rank's model and the training ranks' mean; `build` makes an empty model of
    the run's architecture, `score` evaluates one (validation and test metrics)."""
    missing = [r for r in train_ranks if r not in states]
    if missing:
        raise ValueError(f"training ranks {missing} have no model in the checkpoint")
    model = build()
    params = [name for name, _ in model.named_parameters()]
    has_stats = any(b.is_floating_point() for _, b in model.named_buffers())

    def scored(state: State) -> dict[str, float]:
        model.load_state_dict(state)
        return score(model)

    per_rank = {r: scored(states[r]) for r in sorted(states)}
    workers = [states[r] for r in train_ranks]
    mean = mean_state(workers)
    distance = dict(zip(train_ranks, distances_from(workers, mean, params)))
    spread = Spread(step=step, train_ranks=list(train_ranks), per_rank=per_rank, mean=scored(mean),
                    distance=distance, mean_norm=norm_of(mean, params), bn_averaged=has_stats)
    if len(train_ranks) > 1 and spread.consensus_distance == 0:
        spread.notes.append(f"the training ranks hold identical weights at step {step}: a synchronisation at this "
                            "step, or a plugin that ends on an average (D-PSGD, SGP, local SGD, DiLoCo); an earlier "
                            "checkpoint shows how far apart they were")
    return spread
