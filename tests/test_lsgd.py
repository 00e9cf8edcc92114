"""LSGD on 4 gloo ranks equals a single-process simulation of 4 workers (2 groups of 2), and its
evaluation models are what they claim to be.

Reported losses come from a fixed table of exact binary fractions (`table_loss`), so the
running means, and hence the leaders, are exactly the same in the ranks and in the simulation
whatever the summation order; the weights then follow the true gradients.
"""
from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn as nn

from tests.support.harness import run_ranks
from tests.support.plugin_harness import flat_params, grad_step, make_workers, plugin_trajectory, worker_batch

STEPS = 50
WORLD = 4

# name -> (plugin overrides, optimizer kind)
VARIANTS: dict[str, tuple[dict[str, Any], str]] = {
    # group_size from LOCAL_SIZE=2: two groups, both leaders, every pull at its own strength
    "two_groups": ({"loss_window": 3, "local_period": 2, "global_period": 6, "local_pull": 0.2,
                    "global_pull": 0.3, "local_refresh_pull": 0.25, "global_refresh_pull": 0.4}, "nesterov"),
    # one group of 4: the global leader only
    "one_group": ({"group_size": 4, "loss_window": 4, "global_period": 5, "global_refresh_pull": 0.5}, "sgd"),
    # local and global refreshes at the same steps, a window of one loss
    "same_period": ({"group_size": 2, "loss_window": 1, "local_period": 4, "global_period": 4}, "sgd"),
}
PROBE = {"group_size": 2, "loss_window": 2, "local_period": 2, "global_period": 4}
PROBE_STEPS = 9
BN_BATCHES = 2


def table_loss(worker: int, step: int) -> float:
    """A reported loss: a pseudo-random multiple of 1/1024 (exact in float32 and float64)."""
    return ((worker * 7919 + step * 104729 + (worker * step) % 13) % 1024) / 1024


def reported(worker: int, step: int) -> float:
    return float(torch.tensor(table_loss(worker, step)))  # what the rank receives (float32)


def bn_batches_of(worker: int, n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [worker_batch(worker, 1000 + i, WORLD) for i in range(n)]


# ---- the single-process reference -------------------------------------------------------------
def set_flat(model: nn.Module, flat: torch.Tensor) -> None:
    torch.nn.utils.vector_to_parameters(flat, model.parameters())


def mix(x: torch.Tensor, target: torch.Tensor, strength: float) -> torch.Tensor:
    """(1 - s) x + s target, in the same floating-point operations as the plugin (a differently
    rounded formula drifts by ~1e-7 per step, which a ReLU or max-pool tie can amplify)."""
    return x.clone().mul_(1 - strength).add_(target, alpha=strength)


def argmin_rank(means: dict[int, float]) -> int:
    return min(means, key=lambda r: (means[r], r))


def reference(overrides: dict[str, Any], kind: str, steps: int, batch_norm: bool = False
              ) -> dict[str, Any]:
    """K model copies running LSGD's update with no communication."""
    cfg = {"group_size": 2, "loss_window": 10, "local_period": 4, "global_period": 16, "local_pull": 0.1,
           "global_pull": 0.1, "local_refresh_pull": 0.1, "global_refresh_pull": 0.1, **overrides}
    g, window = cfg["group_size"], cfg["loss_window"]
    L, G = cfg["local_period"], cfg["global_period"]
    groups = [list(range(s, s + g)) for s in range(0, WORLD, g)]
    local = 1 < g < WORLD
    models, opts = make_workers(WORLD, kind, batch_norm=batch_norm)
    start = flat_params(models[0])
    glob = start.clone()
    loc = {i: start.clone() for i in range(len(groups))}
    losses: list[list[float]] = [[] for _ in range(WORLD)]
    traj: list[list[torch.Tensor]] = [[] for _ in range(WORLD)]
    history: list[list[int]] = []
    led_local = [0] * WORLD
    for step in range(steps):
        for w, (model, opt) in enumerate(zip(models, opts)):
            xb, yb = worker_batch(w, step, WORLD)
            grad_step(model, opt, xb, yb)
            losses[w].append(reported(w, step))
            opt.step()
            x = mix(flat_params(model), glob, cfg["global_pull"] / G)
            if local:
                x = mix(x, loc[w // g], cfg["local_pull"] / L)
            set_flat(model, x)
        done = step + 1
        means = {w: sum(losses[w][-window:]) / len(losses[w][-window:]) for w in range(WORLD)}
        if local and done % L == 0:
            for i, members in enumerate(groups):
                leader = argmin_rank({w: means[w] for w in members})
                led_local[leader] += 1
                loc[i] = flat_params(models[leader])
                for w in members:
                    set_flat(models[w], mix(flat_params(models[w]), loc[i], cfg["local_refresh_pull"]))
        if done % G == 0:
            leader = argmin_rank(means)
            history.append([done, leader])
            glob = flat_params(models[leader])
            for w in range(WORLD):
                set_flat(models[w], mix(flat_params(models[w]), glob, cfg["global_refresh_pull"]))
        for w in range(WORLD):
            traj[w].append(flat_params(models[w]))
    return {"traj": traj, "history": history, "led_local": led_local, "models": models,
            "means": {w: sum(losses[w][-window:]) / len(losses[w][-window:]) for w in range(WORLD)}}


# ---- inside the ranks -------------------------------------------------------------------------
def build(rank: int, algo: str, overrides: dict[str, Any], steps: int,
          saved: dict[str, Any] | None = None) -> tuple[Any, nn.Module, torch.optim.Optimizer]:
    """A plugin on a BatchNorm model, set up as the trainer does (model and optimizer state,
    if `saved`, loaded before set-up; the plugin's own state after)."""
    from dist_algos import get_algorithm
    from dist_algos.base import TrainInfo
    from core.schema import typed_section
    from core.distenv import init_distributed
    from tests.support.plugin_harness import make_model, make_optimizer

    ctx = init_distributed("gloo", device="cpu")  # (the model is on the CPU, on a GPU machine too)
    cls = get_algorithm(algo)
    cfg = typed_section(cls.Config, {"name": algo, **overrides}, "algo")
    plugin = cls(cfg, ctx)
    model = make_model(batch_norm=True)
    opt = make_optimizer(model, "sgd")
    if saved is not None:
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
    info = TrainInfo(total_steps=steps, steps_per_epoch=steps, lr_at=lambda s: 0.05, warmup_steps=0,
                     train_batches=lambda n: iter(bn_batches_of(rank, n)), forward=lambda m, x: m(x),
                     resuming=saved is not None)
    plugin.setup(model, opt, info)
    if saved is not None:
        plugin.load_state_dict(saved["algo"])
    return plugin, model, opt


def advance(plugin: Any, model: nn.Module, opt: torch.optim.Optimizer, rank: int, world: int, steps: range) -> None:
    from dist_algos.base import StepContext
    from tests.support.plugin_harness import loss_of

    for step in steps:
        xb, yb = worker_batch(rank, step, world)
        loss_of(model, xb, yb).backward()
        plugin.step(StepContext(step=step, epoch=0, loss=torch.tensor(table_loss(rank, step)), lr=0.05,
                                optimizer_step=opt.step))
        opt.zero_grad(set_to_none=False)


def probe(rank: int, world: int, algo: str, overrides: dict[str, Any], steps: int) -> dict[str, Any]:
    """`steps` of a plugin with table losses, then its evaluation model (BN re-estimation
    batches from `bn_batches_of`) and its reports."""
    plugin, model, opt = build(rank, algo, overrides, steps)
    advance(plugin, model, opt, rank, world, range(steps))
    own = {k: v.clone() for k, v in model.state_dict().items()}
    evaluated = plugin.eval_model(model)
    assert evaluated is not None
    return {"own": own, "eval": {k: v.clone() for k, v in evaluated.state_dict().items()},
            "own_after": {k: v.clone() for k, v in model.state_dict().items()},
            "summary": plugin.summary(), "metrics": plugin.metrics(), "state": plugin.state_dict()}


def resume_probe(rank: int, world: int, algo: str, overrides: dict[str, Any], steps: int, stop: int) -> list[str]:
    """Where the plugin's run stopped at `stop` and resumed from its saved state (through a
    weights_only round trip, as a checkpoint) differs from the uninterrupted run."""
    import io

    from tests.test_resume_registry import diff

    full = build(rank, algo, overrides, steps)
    advance(*full, rank, world, range(steps))
    first = build(rank, algo, overrides, steps)
    advance(*first, rank, world, range(stop))
    buffer = io.BytesIO()
    torch.save({"model": first[1].state_dict(), "optimizer": first[2].state_dict(), "algo": first[0].state_dict()},
               buffer)
    buffer.seek(0)
    resumed = build(rank, algo, overrides, steps, saved=torch.load(buffer, weights_only=True))
    advance(*resumed, rank, world, range(stop, steps))
    return diff({"model": full[1].state_dict(), "algo": full[0].state_dict()},
                {"model": resumed[1].state_dict(), "algo": resumed[0].state_dict()})


def expected_average_bn(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A BatchNorm model with these parameters and the statistics the consensus evaluation
    should give: per rank the plain average over its BN_BATCHES batches, then the rank mean."""
    from tests.support.plugin_harness import make_model

    model = make_model(batch_norm=True)
    state = model.state_dict()
    state.update(weights)
    model.load_state_dict(state)
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    per_rank = []
    for r in range(WORLD):
        for bn in bns:
            bn.reset_running_stats()
            bn.momentum = None
        model.train()
        with torch.no_grad():
            for x, _ in bn_batches_of(r, BN_BATCHES):
                model(x)
        per_rank.append({k: v.clone() for k, v in model.state_dict().items()})
    out = dict(per_rank[0])
    for key in out:
        if key.endswith(("running_mean", "running_var")):
            out[key] = torch.stack([p[key] for p in per_rank]).mean(0)
    return out


def assert_consensus(evals: list[dict[str, torch.Tensor]], expected: dict[str, torch.Tensor]) -> None:
    """Every rank evaluates the same model, with the expected weights and BN statistics."""
    for r, got in enumerate(evals):
        for key, want in expected.items():
            if key.endswith("num_batches_tracked"):
                continue
            tol = 1e-5 if key.endswith(("running_mean", "running_var")) else 1e-6
            assert torch.allclose(got[key], want, atol=tol, rtol=tol), f"rank {r} {key}: {(got[key] - want).abs().max()}"
        assert all(torch.equal(got[k], evals[0][k]) for k in got), f"rank {r} evaluates another model"


def param_keys(state: dict[str, torch.Tensor]) -> list[str]:
    return [k for k in state if not k.endswith(("running_mean", "running_var", "num_batches_tracked"))]


def lsgd_rank(rank: int, world: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, (overrides, kind) in VARIANTS.items():
        out[name] = plugin_trajectory(rank, world, "lsgd", overrides, STEPS, kind, loss_hook=table_loss)
    for mode in ("leader", "average"):
        out[f"probe_{mode}"] = probe(rank, world, "lsgd", {**PROBE, "eval_model": mode, "bn_batches": BN_BATCHES},
                                     PROBE_STEPS)
    out["resume"] = resume_probe(rank, world, "lsgd", PROBE, PROBE_STEPS + 4, stop=5)
    return out


@pytest.fixture(scope="module")
def ranks() -> list[dict[str, Any]]:
    return run_ranks(lsgd_rank, WORLD, env={"LOCAL_SIZE": "2"})


@pytest.fixture(scope="module")
def probe_reference() -> dict[str, Any]:
    return reference(PROBE, "sgd", PROBE_STEPS, batch_norm=True)


# ---- the tests --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(VARIANTS))
def test_lsgd_equals_reference_simulation(ranks: list[dict[str, Any]], name: str) -> None:
    overrides, kind = VARIANTS[name]
    expected = reference(overrides, kind, STEPS)["traj"]
    for rank in range(WORLD):
        traj = ranks[rank][name]
        assert len(traj) == STEPS + 1
        for step in range(STEPS):
            diff = (traj[step] - expected[rank][step]).abs().max().item()
            assert diff < 1e-6, f"{name} rank {rank} step {step}: max diff {diff}"
    # the workers really differ (a pull that silently equalised them would pass the above only by luck)
    assert (ranks[0][name][STEPS - 1] - ranks[3][name][STEPS - 1]).abs().max() > 1e-3


def test_leader_reports_match_reference(ranks: list[dict[str, Any]], probe_reference: dict[str, Any]) -> None:
    ref = probe_reference
    summaries = [ranks[r]["probe_leader"]["summary"] for r in range(WORLD)]
    from dist_algos.lsgd import LSGD

    merged = LSGD.merge_summaries(summaries)
    assert merged["global_leader_history"] == ref["history"]
    counts = [0] * WORLD
    for _, leader in ref["history"]:
        counts[leader] += 1
    assert merged["global_leader_counts"] == counts
    assert merged["local_leader_counts"] == ref["led_local"]
    assert merged["groups"] == [[0, 1], [2, 3]]
    assert merged["local_refreshes"] == PROBE_STEPS // PROBE["local_period"]
    last = ref["history"][-1][1]
    assert all(ranks[r]["probe_leader"]["metrics"]["global_leader"] == last for r in range(WORLD))


def test_eval_leader_is_the_current_leaders_model_on_every_rank(ranks: list[dict[str, Any]],
                                                                probe_reference: dict[str, Any]) -> None:
    leader = argmin_rank(probe_reference["means"])
    want = ranks[leader]["probe_leader"]["own"]
    for r in range(WORLD):
        got = ranks[r]["probe_leader"]["eval"]
        assert set(got) == set(want)
        for key in want:  # parameters and BatchNorm statistics, bit for bit
            assert torch.equal(got[key], want[key]), f"rank {r} {key}"
        own, after = ranks[r]["probe_leader"]["own"], ranks[r]["probe_leader"]["own_after"]
        assert all(torch.equal(own[k], after[k]) for k in own), "evaluation changed the training model"
    # the leader is not trivially rank 0 in this probe, or the test would not see a wrong source
    assert leader != 0


def test_eval_average_has_mean_weights_and_reestimated_bn(ranks: list[dict[str, Any]]) -> None:
    owns = [ranks[r]["probe_average"]["own"] for r in range(WORLD)]
    mean = {k: torch.stack([o[k] for o in owns]).mean(0) for k in param_keys(owns[0])}
    assert_consensus([ranks[r]["probe_average"]["eval"] for r in range(WORLD)], expected_average_bn(mean))


def test_state_dict_round_trips_and_is_per_rank(ranks: list[dict[str, Any]]) -> None:
    s0, s2 = ranks[0]["probe_leader"]["state"], ranks[2]["probe_leader"]["state"]
    # both groups' local leaders differ, the global leader cache is shared
    assert not torch.equal(s0["local_leader"][0], s2["local_leader"][0])
    assert torch.equal(s0["global_leader"][0], s2["global_leader"][0])
    assert s0["losses"]["count"] == PROBE_STEPS
    assert math.isfinite(s0["leader_loss"])


def test_resume_from_saved_state_with_two_groups(ranks: list[dict[str, Any]]) -> None:
    """Both leader caches and the loss window are saved (the registry-wide resume test runs
    one group, so the local leader's state is checked here)."""
    for rank in range(WORLD):
        assert ranks[rank]["resume"] == [], f"rank {rank}: resumed run differs at {ranks[rank]['resume'][:5]}"
