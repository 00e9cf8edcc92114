"""D-PSGD and SGP (WAGMA's gossip baselines) against single-process simulations of K models.

Every variant of a world size runs inside one `run_ranks` call; the references replay the same
update with K model copies and no communication, using the plugins' own topology functions.
"""
from __future__ import annotations

from typing import Any

import pytest
import torch

from dist_algos.group_schedule import exponential_peers, ring_neighbours
from engine.errors import UserError
from tests.harness import run_ranks
from tests.plugin_harness import flat_params, grad_step, make_workers, plugin_trajectory, worker_batch

STEPS = 10
# (algorithm, overrides, optimizer) per world size; 2 ranks: both ring neighbours are one rank
VARIANTS = {
    4: [("dpsgd", {}, "sgd"), ("sgp", {"num_peers": 1}, "sgd"), ("sgp", {"num_peers": 2}, "nesterov")],
    2: [("dpsgd", {}, "adamw"), ("sgp", {"num_peers": 1}, "sgd")],
}


def rank_all(rank: int, world: int) -> list[list[torch.Tensor]]:
    return [plugin_trajectory(rank, world, algo, overrides, STEPS, kind) for algo, overrides, kind in VARIANTS[world]]


def set_flat(model: torch.nn.Module, flat: torch.Tensor) -> None:
    torch.nn.utils.vector_to_parameters(flat.clone(), model.parameters())


def reference_dpsgd(k: int, kind: str) -> list[list[torch.Tensor]]:
    """Mix with both ring neighbours, then each copy's step with its gradient taken before mixing."""
    models, opts = make_workers(k, kind)
    out: list[list[torch.Tensor]] = [[] for _ in range(k)]
    for step in range(STEPS):
        for w in range(k):
            grad_step(models[w], opts[w], *worker_batch(w, step, k))
        flat = [flat_params(m) for m in models]
        for w in range(k):
            left, right = ring_neighbours(w, k)
            set_flat(models[w], (flat[left] + flat[w] + flat[right]) / 3)
            opts[w].step()
            out[w].append(flat_params(models[w]))
    return finish(models, out)


def reference_sgp(k: int, num_peers: int, kind: str) -> list[list[torch.Tensor]]:
    """Push-sum: step on z, then x = z * w split over self and the out-peers, z = x / w."""
    models, opts = make_workers(k, kind)
    weights = [1.0] * k
    out: list[list[torch.Tensor]] = [[] for _ in range(k)]
    for step in range(STEPS):
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


def finish(models: list[torch.nn.Module], out: list[list[torch.Tensor]]) -> list[list[torch.Tensor]]:
    final = torch.stack([flat_params(m) for m in models]).mean(0)  # finalize: the global average
    return [traj + [final] for traj in out]


@pytest.mark.parametrize("world", [4, 2])
def test_gossip_equals_reference(world: int) -> None:
    per_rank: list[Any] = run_ranks(rank_all, world)
    for v, (algo, overrides, kind) in enumerate(VARIANTS[world]):
        if algo == "dpsgd":
            expected = reference_dpsgd(world, kind)
        else:
            expected = reference_sgp(world, overrides["num_peers"], kind)
        for rank in range(world):
            got = per_rank[rank][v]
            assert len(got) == len(expected[rank]) == STEPS + 1
            for step, (a, b) in enumerate(zip(got, expected[rank])):
                assert torch.allclose(a, b, atol=1e-6, rtol=0), \
                    f"{algo} {overrides} {kind} rank {rank} step {step}: max diff {(a - b).abs().max()}"
        # gossip leaves the ranks different until the final average, except push-sum between
        # two ranks with one peer, which is an exact average (each keeps half, sends half)
        exact = algo == "sgp" and world == 2
        assert torch.equal(per_rank[0][v][STEPS - 1], per_rank[1][v][STEPS - 1]) == exact


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


def test_sgp_validation_names_the_value() -> None:
    from dist_algos.sgp import Sgp, SgpConfig

    with pytest.raises(UserError, match="num_peers=3"):
        Sgp.validate(SgpConfig(num_peers=3), 4, 4)
    with pytest.raises(UserError, match="num_peers=0"):
        Sgp.validate(SgpConfig(num_peers=0), 4, 4)
    Sgp.validate(SgpConfig(num_peers=2), 4, 4)
