"""D-PSGD, SGP and AD-PSGD (WAGMA's gossip baselines) against single-process simulations of K
models; AD-PSGD's asynchronous mode under random delays (no deadlock, every exchange conserves
the sum of the models, the models contract towards their mean).

Every variant of a world size runs inside one `run_ranks` call; the references replay the same
update with K model copies and no communication, using the plugins' own topology functions.
"""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

import random
import time

import torch.nn as nn

from dist_algos.schedules.groups import bipartite_partner, exponential_peers, ring_neighbours
from core.errors import UserError
from tests.support.harness import run_ranks
from dist_algos.base import HyperParams
from tests.support.plugin_harness import flat_params, grad_step, make_workers, plugin_trajectory, worker_batch

STEPS = 10
# (algorithm, overrides, optimizer) per world size; 2 ranks: both ring neighbours are one rank
VARIANTS = {
    4: [("dpsgd", {}, "sgd"), ("sgp", {"num_peers": 1}, "sgd"), ("sgp", {"num_peers": 2}, "nesterov"),
        ("adpsgd", {"asynchronous": False}, "sgd")],
    2: [("dpsgd", {}, "adamw"), ("sgp", {"num_peers": 1}, "sgd"), ("adpsgd", {"asynchronous": False}, "nesterov")],
}
ASYNC_STEPS = 300


def rank_all(rank: int, world: int) -> dict[str, Any]:
    sync = [plugin_trajectory(rank, world, algo, overrides, STEPS, kind) for algo, overrides, kind in VARIANTS[world]]
    return {"sync": sync, "async": adpsgd_async_run(rank, world) if world == 4 else None}


def adpsgd_async_run(rank: int, world: int) -> dict[str, Any]:
    """Asynchronous AD-PSGD with no gradient (lr 0): only the pairwise averages move the models.
    Returns each rank's weights before and after, with everything pending applied."""
    from dist_algos import get_algorithm
    from dist_algos.base import StepContext, TrainInfo
    from core.schema import typed_section
    from core.distenv import init_distributed

    ctx = init_distributed("gloo", device="cpu")
    cls = get_algorithm("adpsgd")
    plugin = cls(typed_section(cls.Config, {"name": "adpsgd", "asynchronous": True}, "algo"), ctx)
    torch.manual_seed(100 + rank)  # different models on different ranks
    model = nn.Linear(5, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    info = TrainInfo(total_steps=ASYNC_STEPS, steps_per_epoch=ASYNC_STEPS, lr_at=lambda s: 0.0, warmup_steps=0,
                     train_batches=lambda n: iter(()), forward=lambda m, x: m(x))
    plugin.setup(model, opt, info)
    before = flat_params(model)
    delays = random.Random(rank)
    for step in range(ASYNC_STEPS):
        if delays.random() < 0.25:
            time.sleep(delays.uniform(0.0005, 0.003))
        plugin.step(StepContext(step=step, epoch=0, loss=torch.zeros(()), lr=0.0, optimizer_step=opt.step))
    plugin.averager.close(ctx.timeout_s)
    plugin.averager.drain(list(plugin.weights))
    alive = plugin.averager._thread.is_alive()
    return {"before": before, "after": flat_params(model), "exchanges": plugin.averager.exchanges, "alive": alive}


def set_flat(model: torch.nn.Module, flat: torch.Tensor) -> None:
    torch.nn.utils.vector_to_parameters(flat.clone(), model.parameters())


def reference_mix_then_step(k: int, kind: str,
                             mix: Callable[[int, int, list[torch.Tensor]], torch.Tensor],
                             steps: int = STEPS) -> list[list[torch.Tensor]]:
    """Each copy takes its gradient, the copies' models are mixed (`mix(worker, step, models
    before mixing)`), then each copy steps with the gradient it took before mixing."""
    models, opts = make_workers(k, kind)
    out: list[list[torch.Tensor]] = [[] for _ in range(k)]
    for step in range(steps):
        for w in range(k):
            grad_step(models[w], opts[w], *worker_batch(w, step, k))
        flat = [flat_params(m) for m in models]
        for w in range(k):
            set_flat(models[w], mix(w, step, flat))
            opts[w].step()
            out[w].append(flat_params(models[w]))
    return finish(models, out)


def reference_dpsgd(k: int, kind: str, steps: int = STEPS) -> list[list[torch.Tensor]]:
    """Mix with both ring neighbours, then each copy's step with its gradient taken before mixing."""
    def ring_mix(w: int, step: int, flat: list[torch.Tensor]) -> torch.Tensor:
        left, right = ring_neighbours(w, k)
        return (flat[left] + flat[w] + flat[right]) / 3
    return reference_mix_then_step(k, kind, ring_mix, steps)


def reference_sgp(k: int, num_peers: int, kind: str, steps: int = STEPS) -> list[list[torch.Tensor]]:
    """Push-sum: step on z, then x = z * w split over self and the out-peers, z = x / w."""
    models, opts = make_workers(k, kind)
    weights = [1.0] * k
    out: list[list[torch.Tensor]] = [[] for _ in range(k)]
    for step in range(steps):
        for w in range(k):
            grad_step(models[w], opts[w], *worker_batch(w, step, k))
            opts[w].step()
        share_w = [weights[w] / (num_peers + 1) for w in range(k)]
        shares = [flat_params(models[w]) * share_w[w] for w in range(k)]
        for w in range(k):
            _, in_peers = exponential_peers(w, k, step, num_peers)
            x = shares[w].clone()
            for src in in_peers:
                x += shares[src]
            weights[w] = share_w[w] + sum(share_w[src] for src in in_peers)
            set_flat(models[w], x / weights[w])
        for w in range(k):
            out[w].append(flat_params(models[w]))
    return finish(models, out)


def reference_adpsgd(k: int, kind: str, steps: int = STEPS) -> list[list[torch.Tensor]]:
    """Each step every (active, passive) pair of the matching averages, then each copy steps."""
    return reference_mix_then_step(
        k, kind, lambda w, step, flat: (flat[w] + flat[bipartite_partner(w, k, step)]) / 2, steps)


def finish(models: list[torch.nn.Module], out: list[list[torch.Tensor]]) -> list[list[torch.Tensor]]:
    final = torch.stack([flat_params(m) for m in models]).mean(0)  # finalize: the global average
    return [traj + [final] for traj in out]


@pytest.mark.parametrize("world", [4, 2])
def test_gossip_equals_reference(world: int) -> None:
    results: list[Any] = run_ranks(rank_all, world)
    per_rank = [r["sync"] for r in results]
    for v, (algo, overrides, kind) in enumerate(VARIANTS[world]):
        if algo == "dpsgd":
            expected = reference_dpsgd(world, kind)
        elif algo == "sgp":
            expected = reference_sgp(world, overrides["num_peers"], kind)
        else:
            expected = reference_adpsgd(world, kind)
        for rank in range(world):
            got = per_rank[rank][v]
            assert len(got) == len(expected[rank]) == STEPS + 1
            for step, (a, b) in enumerate(zip(got, expected[rank])):
                assert torch.allclose(a, b, atol=1e-6, rtol=0), \
                    f"{algo} {overrides} {kind} rank {rank} step {step}: max diff {(a - b).abs().max()}"
        # gossip leaves the ranks different until the final average, except push-sum between
        # two ranks with one peer, which ends each step with an exact average (half kept, half sent)
        exact = world == 2 and algo == "sgp"
        assert torch.equal(per_rank[0][v][STEPS - 1], per_rank[1][v][STEPS - 1]) == exact
    if world == 4:
        check_async_adpsgd([r["async"] for r in results])


def check_async_adpsgd(runs: list[dict[str, Any]]) -> None:
    before = torch.stack([r["before"] for r in runs])
    after = torch.stack([r["after"] for r in runs])
    assert not any(r["alive"] for r in runs), "a communication thread did not end"
    assert all(r["exchanges"] > 0 for r in runs)
    # every exchange moves both partners by opposite halves of the same difference
    assert torch.allclose(after.sum(0), before.sum(0), atol=1e-5, rtol=0)
    spread = lambda x: (x - x.mean(0)).abs().max()  # noqa: E731
    assert spread(after) < 0.1 * spread(before), (spread(before), spread(after))


def test_a_passive_rank_asked_several_times_between_its_steps_averages_one_after_another() -> None:
    """Three active ranks reach one passive rank before its next step (64 ranks on two cores do):
    each request must meet the model the previous one left, so the passive rank ends at the
    successive pairwise averages and every active rank at the average with what it was sent. The
    exchange arithmetic of PairwiseAverager, without its thread or transport; answering each request
    with the published model alone would put the passive rank at p + (a1 + a2 + a3 - 3p) / 2,
    outside the models' hull."""
    import threading

    from dist_algos.adpsgd import PairwiseAverager

    def endpoint(model: torch.Tensor) -> PairwiseAverager:
        end = PairwiseAverager.__new__(PairwiseAverager)  # the arithmetic only: no thread, no group
        end._published, end._pending = [model.clone()], [torch.zeros_like(model)]
        end._sent, end._received = [torch.empty_like(model)], [torch.empty_like(model)]
        end._cv, end.exchanges = threading.Condition(), 0
        return end

    torch.manual_seed(0)
    passive_model, actives = torch.randn(6), [torch.randn(6) for _ in range(3)]
    passive = endpoint(passive_model)
    expected, total = passive_model.clone(), passive_model + sum(actives)
    finals = []
    for model in actives:
        active = endpoint(model)
        active._snapshot()
        passive._snapshot()
        active._received[0].copy_(passive._sent[0])
        passive._received[0].copy_(active._sent[0])
        active._correct()
        passive._correct()
        finals.append(active._published[0] + active._pending[0])
        assert torch.allclose(finals[-1], (model + expected) / 2, atol=1e-6)
        expected = (expected + model) / 2
    passive_final = passive._published[0] + passive._pending[0]
    assert torch.allclose(passive_final, expected, atol=1e-6)
    assert torch.allclose(passive_final + sum(finals), total, atol=1e-5)  # every exchange conserves the sum
    assert passive.exchanges == 3


def test_exponential_graph_is_balanced() -> None:
    for world in (2, 3, 4, 6, 8, 64):
        for step in range(8):
            for k in (1, 2):
                if k > max(1, (world - 1).bit_length()):
                    continue
                sent = [d for r in range(world) for d in exponential_peers(r, world, step, k)[0]]
                # every rank receives exactly as many messages as it sends: w stays 1
                assert sorted(sent) == sorted(list(range(world)) * k)
                for r in range(world):
                    outs, ins = exponential_peers(r, world, step, k)
                    assert all(exponential_peers(d, world, step, k)[1][j] == r for j, d in enumerate(outs))


def test_validation_names_the_value() -> None:
    from dist_algos.adpsgd import Adpsgd, AdpsgdConfig
    from dist_algos.sgp import Sgp, SgpConfig

    with pytest.raises(UserError, match="got 3"):
        Adpsgd.validate(AdpsgdConfig(), 3, 3, HyperParams())
    Adpsgd.validate(AdpsgdConfig(), 1, 1, HyperParams())

    with pytest.raises(UserError, match="num_peers=3"):
        Sgp.validate(SgpConfig(num_peers=3), 4, 4, HyperParams())
    with pytest.raises(UserError, match="num_peers=0"):
        Sgp.validate(SgpConfig(num_peers=0), 4, 4, HyperParams())
    Sgp.validate(SgpConfig(num_peers=2), 4, 4, HyperParams())
