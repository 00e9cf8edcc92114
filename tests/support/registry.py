"""What the registry-wide tests read from a plugin's declarations (`dist_algos.base.DistAlgorithm`).

`scenarios()` lists every (plugin, scenario) pair; a plugin that declares none, or neither a
reference nor a reasoned exemption, is a `MissingDeclaration` whose message names what to add
and where, so the registry-wide tests fail with that one line instead of a bare set difference.
"""
from __future__ import annotations

import importlib
import inspect
from typing import Any, Optional

from dist_algos import get_algorithm, list_algorithms
from dist_algos.base import DistAlgorithm, Scenario


class MissingDeclaration(AssertionError):
    pass


def where(cls: type[DistAlgorithm]) -> str:
    """The plugin's class, as file:line, for a message that says where to add a declaration."""
    try:
        return f"{inspect.getsourcefile(cls)}:{inspect.getsourcelines(cls)[1]} (class {cls.__name__})"
    except (OSError, TypeError):
        return f"class {cls.__module__}.{cls.__name__}"


def declared_scenarios(name: str) -> dict[str, Scenario]:
    cls = get_algorithm(name)
    if not cls.test_scenarios:
        raise MissingDeclaration(
            f"algo={name} declares no test scenarios: add `test_scenarios = {{\"default\": Scenario()}}` "
            f"(dist_algos.base.Scenario, one per mode: groups, schedules, fragments, roles) to {where(cls)}")
    return dict(cls.test_scenarios)


def scenario_ids() -> list[str]:
    """"name/scenario" for every declared scenario; "name/<missing>" for a plugin that declares none
    (its test then fails with the message of `declared_scenarios`)."""
    out = []
    for name in list_algorithms():
        scenarios = get_algorithm(name).test_scenarios
        out += [f"{name}/{s}" for s in scenarios] if scenarios else [f"{name}/<missing>"]
    return out


def lookup(scenario_id: str) -> tuple[type[DistAlgorithm], Scenario]:
    name, label = scenario_id.split("/", 1)
    scenarios = declared_scenarios(name)
    return get_algorithm(name), scenarios[label]


def scenario_values(cls: type[DistAlgorithm], scenario: Scenario) -> dict[str, Any]:
    """The scenario's `algo.*` values over the plugin's deterministic mode."""
    return {**cls.deterministic_overrides, **scenario.overrides}


def optimizer_overrides(scenario: Scenario) -> list[str]:
    """The trainer's optimizer for the scenario's `optimizer` (momentum SGD is the default)."""
    return {"sgd": [], "nesterov": ["optim.nesterov=true"], "adamw": ["optim=adamw"]}[scenario.optimizer]


#: what a scenario's `task` trains in the trainer runs of the registry-wide tests (exact resume):
#: the default digits job, or a one-layer GPT (2 heads; the tests' model.width) on 16-character
#: windows of the Shakespeare corpus, 8 windows a rank, evaluated on 8 windows of each held-out part
TASK_OVERRIDES = {"classification": [],
                  "language_model": ["data=shakespeare_char", "model=gpt", "model.layers=1", "model.heads=2",
                                     "data.context_length=16", "data.eval_windows=8", "train.batch_size=8"]}


def task_overrides(scenario: Scenario) -> list[str]:
    if scenario.task not in TASK_OVERRIDES:
        raise MissingDeclaration(f"a scenario's task is {scenario.task!r}; the registry tests know "
                                 f"{', '.join(TASK_OVERRIDES)}")
    return TASK_OVERRIDES[scenario.task]


def world_of(cls: type[DistAlgorithm], scenario: Scenario) -> int:
    return scenario.world_size or cls.test_world_size


def env_of(cls: type[DistAlgorithm], scenario: Scenario) -> dict[str, str]:
    """The launcher's environment for the scenario's layout (ranks per node)."""
    return {"LOCAL_SIZE": str(scenario.local_size)} if scenario.local_size else {}


def reference_of(cls: type[DistAlgorithm]) -> Optional[Any]:
    """The declared reference (a `tests.support.references.Reference`), None for a reasoned exemption."""
    if cls.reference:
        module, _, attr = cls.reference.partition(":")
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as err:
            raise MissingDeclaration(f"algo={cls.name}: reference {cls.reference!r} does not load ({err}); "
                                     f"fix it at {where(cls)}") from None
    if cls.reference_exemption.strip():
        return None
    raise MissingDeclaration(
        f"algo={cls.name} declares no reference: add `reference = \"tests.support.references:NAME\"` (a "
        f"tests.support.references.Reference simulating its update in one process, see tests/support/references.py) or "
        f"`reference_exemption = \"why none can exist and what tests the update instead\"` to {where(cls)}")


def declared_pattern(cls: type[DistAlgorithm]) -> None:
    """A plugin must declare its communication pattern (what the time ledger checks and the
    projection reads); one that does not is a `MissingDeclaration` naming what to add and where."""
    if not cls.declares_pattern():
        raise MissingDeclaration(
            f"algo={cls.name} declares no communication pattern: add the classmethod `comm_pattern(cls, rank, step, "
            f"world, config, layout) -> list[CommOp]` (dist_algos.base.DistAlgorithm.comm_pattern; docs/"
            f"writing_a_plugin.md, \"Declaring the communication pattern\") to {where(cls)}")
