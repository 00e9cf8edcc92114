"""The declarations the registry-wide tests read, checked without running ranks: every plugin has
scenarios and a reference or a reasoned exemption, and a missing one is one line naming what to
add and where; the reference comparison really tells a different update apart."""
from __future__ import annotations

import pytest

from dist_algos import get_algorithm, list_algorithms
from dist_algos.base import DistAlgorithm, Scenario, StepContext
from tests.support.harness import run_ranks
from tests.support.registry import MissingDeclaration, declared_scenarios, lookup, reference_of
from tests.test_reference_registry import TOLERANCE, scenario_trajectory


@pytest.mark.parametrize("name", list_algorithms())
def test_every_plugin_declares_scenarios_and_a_reference_or_an_exemption(name: str) -> None:
    cls = get_algorithm(name)
    assert declared_scenarios(name)
    ref = reference_of(cls)
    assert ref is not None or len(cls.reference_exemption.split()) >= 8, f"{name}: give the exemption's reason"
    for label, scenario in cls.test_scenarios.items():
        world = scenario.world_size or cls.test_world_size
        assert scenario.local_size is None or world % scenario.local_size == 0, f"{name}/{label}"
        assert scenario.optimizer in ("sgd", "nesterov", "adamw"), f"{name}/{label}"


class Undeclared(DistAlgorithm):
    name = "undeclared"

    def step(self, ctx: StepContext) -> None:
        ctx.optimizer_step()


def test_missing_declarations_are_one_line_naming_what_and_where(monkeypatch: pytest.MonkeyPatch) -> None:
    import dist_algos

    monkeypatch.setattr(dist_algos, "get_algorithm", lambda name: Undeclared)
    monkeypatch.setattr("tests.support.registry.get_algorithm", lambda name: Undeclared)
    with pytest.raises(MissingDeclaration) as err:
        declared_scenarios("undeclared")
    message = str(err.value)
    assert "\n" not in message and "test_scenarios" in message and "test_plugin_declarations.py:" in message
    monkeypatch.setattr(Undeclared, "test_scenarios", {"default": Scenario()})
    with pytest.raises(MissingDeclaration) as err:
        reference_of(Undeclared)
    message = str(err.value)
    assert "\n" not in message and "reference_exemption" in message and "(class Undeclared)" in message


def test_the_reference_comparison_tells_a_different_update_apart() -> None:
    """EASGD's run against its reference with another moving rate: the comparison must see it."""
    cls, scenario = lookup("easgd/tau3")
    ref = reference_of(cls)
    got = run_ranks(scenario_trajectory, 4, "easgd/tau3", timeout=240)
    right = ref.simulate(dict(scenario.overrides), 4, ref.steps, scenario.optimizer)
    wrong = ref.simulate({**scenario.overrides, "moving_rate": 0.42}, 4, ref.steps, scenario.optimizer)
    worst = lambda want: max((a - b).abs().max().item() for g, w in zip(got, want) for a, b in zip(g, w))  # noqa: E731
    assert worst(right) < TOLERANCE < worst(wrong)
