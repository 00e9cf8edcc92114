"""Reference equivalence for every registered algorithm, in every mode it declares.

For each plugin's `test_scenarios`, on the scenario's gloo ranks (and ranks per node), the
plugin is driven step by step (`tests.support.plugin_harness.plugin_trajectory`, on the scenario's
task's workload: a small CNN on digits or a tiny GPT on token windows) and every rank's
parameters after every step are compared, to 1e-6, with the one-process simulation its
`reference` names (tests/support/references.py). A plugin with a reasoned `reference_exemption` is
listed with its reason; a plugin with neither fails with one line naming what to add and where.
"""
from __future__ import annotations

import pytest
import torch

from tests.support.harness import run_ranks
from tests.support.plugin_harness import plugin_trajectory, task_workload
from tests.support.registry import scenario_values, env_of, lookup, reference_of, scenario_ids, world_of

TOLERANCE = 1e-6


def scenario_trajectory(rank: int, world: int, scenario_id: str) -> list[torch.Tensor]:
    """This rank's parameters after every step of the scenario (inside a gloo rank; the reference's
    LR schedule and loss hook are looked up here, closures do not cross processes)."""
    cls, scenario = lookup(scenario_id)
    ref = reference_of(cls)
    kind = scenario.optimizer
    with task_workload(scenario.task):
        return plugin_trajectory(rank, world, cls.name, scenario_values(cls, scenario), ref.steps, kind,
                                 lr_at=ref.lr_at(kind) if ref.lr_at else None, loss_hook=ref.loss_hook,
                                 warmup_steps=ref.warmup_steps)


@pytest.mark.parametrize("scenario_id", scenario_ids())
def test_scenario_equals_its_reference(scenario_id: str) -> None:
    cls, scenario = lookup(scenario_id)
    ref = reference_of(cls)
    if ref is None:
        pytest.skip(f"{cls.name}: exempt from a one-process reference because {cls.reference_exemption}")
    world, overrides = world_of(cls, scenario), scenario_values(cls, scenario)
    got = run_ranks(scenario_trajectory, world, scenario_id, env=env_of(cls, scenario), timeout=240)
    with task_workload(scenario.task):
        expected = ref.simulate(overrides, world, ref.steps, scenario.optimizer)
    assert len(expected) == world, f"{scenario_id}: the reference returned {len(expected)} ranks, not {world}"
    checked = 0
    for rank, want in enumerate(expected):
        if want is None:
            continue
        assert len(want) >= ref.steps, f"{scenario_id}: the reference gave {len(want)} steps of {ref.steps}"
        for step, (a, b) in enumerate(zip(got[rank], want)):
            diff = (a - b).abs().max().item()
            assert diff < TOLERANCE, f"{scenario_id} rank {rank} step {step}: max diff {diff}"
        checked += 1
    assert checked, f"{scenario_id}: the reference modelled no rank"
