"""Every registered plugin's declared communication pattern (`comm_pattern`) is what it does: at
P = 2, 4 and 8 ranks each of its scenarios runs with a time ledger attached to its accounting,
and every rank's recorded operations equal the declaration op for op (kind, group, group size,
bytes sent and received, blocking, thread, bucket), step by step on the training thread and in
order on each background thread (dist_algos/comm/pattern.py says what a declaration may leave to
the run). The ledger's bytes also equal each rank's byte counters.

Lean on purpose: one launch per world size runs every case one after another on the same ranks
(`tests.support.ledgers.record_cases`: the plugin driven directly, no data pipeline, evaluation
or checkpoint), 8 steps on the tests' small workloads, with the few overrides that reach every
branch of a declaration within them (`BRANCHES`); every scenario at P = 4, each plugin's first
scenario at P = 2 and 8 (what a declaration reads of the world, its groups, peers and workers,
is the same in a plugin's other scenarios). Timing-dependent modes are checked where their
declaration is exact enough to compare: WAGMA's wait-avoiding rounds and asynchronous serving;
AD-PSGD's asynchronous pairs are not (a passive rank answers whichever active rank asks first).
The trainer's own runs are compared too, at each scenario's world, in the exact-resume test
(tests/test_resume_registry.py), which keeps a ledger. A plugin with no declaration fails with
one line naming what to add and where.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from core.errors import UserError
from dist_algos import get_algorithm, list_algorithms
from dist_algos.base import DistAlgorithm
from engine.report.ledger import differences, read_ledger
from tests.support.harness import run_ranks
from tests.support.ledgers import Case, case_config, counter_differences, record_cases
from tests.support.plugin_harness import hyper_of, make_model, make_optimizer
from tests.support.registry import MissingDeclaration, declared_pattern, lookup, scenario_ids, scenario_values

WORLDS = (2, 4, 8)
FULL_WORLD = 4  # every scenario runs here; each plugin's first at the other sizes
LOCAL_SIZE = 2  # two ranks per node: LSGD's local groups, WAGMA's groups across nodes
#: overrides that reach every branch of a declaration within a case's 12 steps
BRANCHES: dict[str, dict[str, Any]] = {
    "powersgd": {"start_iter": 3},  # the plain all_reduce, then P and Q
    "gradient_dropping": {"resync_period": 5},  # dense replies after each resync
    "dgc": {"resync_period": 5, "warmup_epochs": 2},  # the density's warm-up ends within the run
    "dgs": {"resync_period": 5, "density_follows_lr": True},
}
#: timing-dependent modes whose declaration is compared (beside every scenario's deterministic one)
TIMED = {"wagma/wait_avoiding": Case("wagma", {"group_size": 2, "global_period": 3, "wait_avoiding": True}),
         "asgd/async": Case("asgd", {"serving": "async"}),
         "dgs/async": Case("dgs", {"serving": "async", "resync_period": 5})}
#: branches of a declaration no scenario reaches (compared on FULL_WORLD ranks only)
UNREACHED = {
    "allreduce/after_backward": Case("allreduce", {"overlap": False}),
    "local_sgd/post_local_bn": Case("local_sgd", {"sync_schedule": "post_local", "switch_step": 3, "period": 2,
                                                  "bn": "average"}),
    "local_sgd/compressed_delta": Case("local_sgd", {"period": 3, "compress": ["topk:0.1"], "feedback": "ef"}),
    "diloco/compressed_outer": Case("diloco", {"inner_steps": 4, "fragments": 2, "outer_compress": ["topk:0.1"],
                                               "outer_feedback": "ef", "bn": "average"}),
    "diloco/overlapped_outer": Case("diloco", {"inner_steps": 4, "fragments": 2, "overlap_steps": 1,
                                               "mixing": 0.5}),
}


def scenario_case(scenario_id: str) -> Case:
    cls, scenario = lookup(scenario_id)
    return Case(cls.name, {**scenario_values(cls, scenario), **BRANCHES.get(cls.name, {})}, scenario.task,
                scenario.optimizer)


@functools.lru_cache(maxsize=None)
def hyper(optimizer: str) -> Any:
    return hyper_of(make_optimizer(make_model(), optimizer))


def runs_at(case: Case, world: int) -> bool:
    """Whether the plugin accepts this world (msgd runs on one rank only)."""
    cls = get_algorithm(case.algo)
    cfg = case_config(case, world, LOCAL_SIZE).algo
    try:
        cls.validate(cfg, world, min(LOCAL_SIZE, world), hyper(case.optimizer))
    except UserError:
        return False
    return True


def all_cases() -> dict[str, Case]:
    cases = {}
    for scenario_id in scenario_ids():
        if scenario_id.endswith("/<missing>"):
            continue
        cases[scenario_id] = scenario_case(scenario_id)
    return {**cases, **TIMED, **UNREACHED}


def cases_at(world: int) -> dict[str, Case]:
    """What runs on `world` ranks: every case at FULL_WORLD, else each plugin's first scenario and
    the timing-dependent modes (the plugins that accept the world only)."""
    cases, first = all_cases(), {}
    for name in cases:
        first.setdefault(name.split("/")[0], name)
    chosen = cases if world == FULL_WORLD else {n: c for n, c in cases.items() if n in first.values() or n in TIMED}
    return {name: case for name, case in chosen.items() if runs_at(case, world)}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[dict[str, int], Path, list[Any]]]:
    """Per world size: each case's index, the folder of their ledgers, each rank's counters."""
    out = {}
    for world in WORLDS:
        here = cases_at(world)
        folder = tmp_path_factory.mktemp(f"ledgers_{world}")
        counters = run_ranks(record_cases, world, list(here.values()), str(folder), timeout=400,
                             env={"LOCAL_SIZE": str(min(LOCAL_SIZE, world))})
        out[world] = ({name: i for i, name in enumerate(here)}, folder, counters)
    return out


def test_every_plugin_declares_its_pattern() -> None:
    """A plugin without a declaration fails here in one line naming what to add and where."""
    for name in list_algorithms():
        declared_pattern(get_algorithm(name))

    class Silent(get_algorithm("msgd")):  # type: ignore[misc, valid-type]
        comm_pattern = DistAlgorithm.comm_pattern  # what a plugin that declares nothing inherits

    with pytest.raises(MissingDeclaration) as err:
        declared_pattern(Silent)
    line = str(err.value)
    assert "comm_pattern" in line and f"{Path(__file__).name}:" in line and "\n" not in line


def test_every_plugin_is_compared(recorded: dict[int, Any]) -> None:
    """Every registered plugin reaches the comparison at one world size at least (msgd's world of
    one is the exact-resume test's, which compares its ledger too)."""
    compared = {name.split("/")[0] for index, _, _ in recorded.values() for name in index}
    assert set(list_algorithms()) - compared <= {"msgd"}, f"never compared: {sorted(set(list_algorithms()) - compared)}"


@pytest.mark.parametrize("name,world", [(name, world) for world in WORLDS for name in cases_at(world)])
def test_declared_pattern_is_the_ledger(recorded: dict[int, Any], name: str, world: int) -> None:
    index, folder, counters = recorded[world]
    case = all_cases()[name]
    cls = get_algorithm(case.algo)
    try:
        declared_pattern(cls)
    except MissingDeclaration as err:
        pytest.fail(str(err))
    ledger = read_ledger(folder / str(index[name]))
    layout = ledger.facts().layout
    config = case_config(case, world, min(LOCAL_SIZE, world))
    found = differences(ledger, lambda rank, step: cls.comm_pattern(rank, step, world, config, layout))
    found += counter_differences(ledger, {r: (int(c[index[name]]["comm_bytes"]), int(c[index[name]]["comm_recv_bytes"]))
                                          for r, c in enumerate(counters)})
    assert not found, f"{name} on {world} ranks:\n" + "\n".join(found[:12])
