"""Exact resume for every registered algorithm, in every mode it declares (composer's
algorithm-resumption test, here).

For each plugin's `test_scenarios`, on the scenario's gloo ranks with its ranks per node (a
real multi-node layout where the scenario sets `local_size`, so groups by node exist), on the
scenario's task (digits, or a tiny GPT on the Shakespeare corpus's windows): train N
steps uninterrupted; train again with `train.stop_after=k`, then resume to N; every rank's final
checkpoint (parameters, buffers, optimizer state, scheduler, plugin state, RNG, counters) must
be equal bit for bit. Plugins whose default mode depends on timing declare
`deterministic_overrides` (and the reason) and are tested in that mode; the list is printed.
A plugin that declares no scenario fails with one line naming what to add and where.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from dist_algos import get_algorithm, list_algorithms
from dist_algos.base import DistAlgorithm, Scenario
from tests.support.harness import run_ranks, train_in_rank
from tests.support.registry import env_of, lookup, optimizer_overrides, scenario_ids, scenario_values, task_overrides, \
    world_of

STEPS, STOP = 60, 25  # the numbers; 11 steps per epoch on 4 ranks: the stop is mid-epoch, between evals
IGNORED = ("elapsed", "train_seconds", "seconds", "injected_s", "median", "warmup")  # wall-clock readings (and the warm-up window, per segment)


def diff(a: Any, b: Any, path: str = "") -> list[str]:
    """Paths where two checkpoint states differ (tensors bitwise, including dtype and shape)."""
    if any(key in path.rsplit("/", 1)[-1] for key in IGNORED):
        return []
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        same = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype \
            and a.shape == b.shape and torch.equal(a, b)
        return [] if same else [path]
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{path} keys {sorted(map(str, set(a) ^ set(b)))}"]
        return [d for k in a for d in diff(a[k], b[k], f"{path}/{k}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{path} length"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def resume_scenario(rank: int, world: int, overrides: list[str], tmp: str) -> list[str]:
    full, split = f"{tmp}/full", f"{tmp}/split"
    train_in_rank(rank, world, overrides + ["resume=null"], full)
    train_in_rank(rank, world, overrides + ["resume=null", f"train.stop_after={STOP}"], split)
    train_in_rank(rank, world, overrides + ["resume=auto"], split)
    final = f"checkpoints/step_{STEPS:08d}/rank_{rank}.pt"
    a = torch.load(Path(full) / final, weights_only=True)
    b = torch.load(Path(split) / final, weights_only=True)
    assert b["trainer"]["step"] == STEPS
    return diff(a, b)


def override_value(value: Any) -> str:
    """A Python value as a Hydra override's value (lists without quotes)."""
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(map(override_value, value)) + "]"
    return "null" if value is None else str(value)


def base_overrides(name: str) -> list[str]:
    return [f"algo={name}", f"train.max_steps={STEPS}", "train.eval_every_steps=20",
            "train.log_every_steps=5", "model.width=8", "checkpoint.every_epochs=1"]


def algo_overrides(name: str) -> list[str]:
    """The plugin's defaults in its deterministic mode (for other tests' own resume variants)."""
    cls = get_algorithm(name)
    return base_overrides(name) + [f"algo.{k}={override_value(v)}" for k, v in cls.deterministic_overrides.items()]


def run_overrides(cls: type[DistAlgorithm], scenario: Scenario) -> list[str]:
    values = [f"algo.{k}={override_value(v)}" for k, v in scenario_values(cls, scenario).items()]
    return base_overrides(cls.name) + task_overrides(scenario) + optimizer_overrides(scenario) + values


@pytest.mark.parametrize("scenario_id", scenario_ids())
def test_resume_is_bit_exact(scenario_id: str, tmp_path: Path) -> None:
    cls, scenario = lookup(scenario_id)
    if cls.deterministic_overrides:
        print(f"{cls.name}: tested with {cls.deterministic_overrides} because {cls.deterministic_reason}")
    diffs = run_ranks(resume_scenario, world_of(cls, scenario), run_overrides(cls, scenario), str(tmp_path),
                      timeout=300, env=env_of(cls, scenario))
    for rank, d in enumerate(diffs):
        assert not d, f"{scenario_id} rank {rank}: resumed state differs at {d[:10]}"


def test_registry_declares_reasons() -> None:
    """A plugin tested in a non-default mode must say why (the exceptions are listed, not hidden)."""
    for name in list_algorithms():
        cls = get_algorithm(name)
        if cls.deterministic_overrides:
            assert cls.deterministic_reason, f"{name} sets deterministic_overrides without a reason"
