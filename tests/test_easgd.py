"""Synchronous EASGD on 4 gloo ranks equals a single-process simulation with a centre variable,
and its evaluation model is the centre (or the average) with BatchNorm statistics re-estimated."""
from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.support.harness import run_ranks
from tests.support.plugin_harness import flat_params, grad_step, make_workers, plugin_trajectory, worker_batch
from tests.test_lsgd import (BN_BATCHES, WORLD, assert_consensus, expected_average_bn, mix, param_keys, probe,
                             resume_probe, set_flat)

STEPS = 50
VARIANTS: dict[str, tuple[dict[str, Any], str]] = {
    "tau3": ({"sync_period": 3, "moving_rate": 0.43}, "nesterov"),
    "tau1": ({"sync_period": 1, "moving_rate": 0.9}, "sgd"),
}
PROBE = {"sync_period": 2, "moving_rate": 0.5, "bn_batches": BN_BATCHES}
PROBE_STEPS = 7


def reference(sync_period: int, moving_rate: float, kind: str, steps: int, batch_norm: bool = False
              ) -> dict[str, Any]:
    """K workers and a centre, no communication: every tau steps, workers move towards the old
    centre by beta/K and the centre towards the workers' (pre-move) mean by beta."""
    models, opts = make_workers(WORLD, kind, batch_norm=batch_norm)
    center = flat_params(models[0])
    traj: list[list[torch.Tensor]] = [[] for _ in range(WORLD)]
    for step in range(steps):
        for w, (model, opt) in enumerate(zip(models, opts)):
            xb, yb = worker_batch(w, step, WORLD)
            grad_step(model, opt, xb, yb)
            opt.step()
        if (step + 1) % sync_period == 0:
            xs = [flat_params(m) for m in models]
            mean = torch.stack(xs).mean(0)
            for model, x in zip(models, xs):
                set_flat(model, mix(x, center, moving_rate / WORLD))
            center = mix(center, mean, moving_rate)
        for w in range(WORLD):
            traj[w].append(flat_params(models[w]))
    return {"traj": traj, "center": center, "models": models}


def easgd_rank(rank: int, world: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, (overrides, kind) in VARIANTS.items():
        out[name] = plugin_trajectory(rank, world, "easgd", overrides, STEPS, kind)
    for mode in ("center", "average"):
        out[f"probe_{mode}"] = probe(rank, world, "easgd", {**PROBE, "eval_model": mode}, PROBE_STEPS)
    out["resume"] = resume_probe(rank, world, "easgd", PROBE, PROBE_STEPS + 4, stop=5)
    return out


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    return run_ranks(easgd_rank, WORLD)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_easgd_equals_reference_simulation(ranks: list[dict[str, Any]], name: str) -> None:
    overrides, kind = VARIANTS[name]
    expected = reference(overrides["sync_period"], overrides["moving_rate"], kind, STEPS)["traj"]
    for rank in range(WORLD):
        traj = ranks[rank][name]
        for step in range(STEPS):
            diff = (traj[step] - expected[rank][step]).abs().max().item()
            assert diff < 1e-6, f"{name} rank {rank} step {step}: max diff {diff}"
    assert (ranks[0][name][STEPS - 1] - ranks[3][name][STEPS - 1]).abs().max() > 1e-4


def test_eval_center_is_the_centre_with_reestimated_bn(ranks: list[dict[str, Any]]) -> None:
    ref = reference(PROBE["sync_period"], PROBE["moving_rate"], "sgd", PROBE_STEPS, batch_norm=True)
    template = ranks[0]["probe_center"]["own"]
    weights, offset = {}, 0
    for key in param_keys(template):  # the flat centre back into named tensors
        n = template[key].numel()
        weights[key] = ref["center"][offset:offset + n].view_as(template[key])
        offset += n
    assert offset == ref["center"].numel()
    # the centre is not any worker's model
    assert not torch.allclose(weights[key], template[key], atol=1e-4)
    assert_consensus([ranks[r]["probe_center"]["eval"] for r in range(WORLD)], expected_average_bn(weights))
    state = ranks[1]["probe_center"]["state"]
    assert state["elastic_steps"] == PROBE_STEPS // PROBE["sync_period"]


def test_eval_average_is_the_workers_mean(ranks: list[dict[str, Any]]) -> None:
    owns = [ranks[r]["probe_average"]["own"] for r in range(WORLD)]
    mean = {k: torch.stack([o[k] for o in owns]).mean(0) for k in param_keys(owns[0])}
    assert_consensus([ranks[r]["probe_average"]["eval"] for r in range(WORLD)], expected_average_bn(mean))


def test_resume_from_saved_state(ranks: list[dict[str, Any]]) -> None:
    for rank in range(WORLD):
        assert ranks[rank]["resume"] == [], f"rank {rank}: resumed run differs at {ranks[rank]['resume'][:5]}"
