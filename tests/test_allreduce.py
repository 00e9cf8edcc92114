"""allreduce on K ranks equals one process taking the same steps on the K-times batch."""
from __future__ import annotations

import pytest
import torch

from tests.harness import run_ranks
from tests.plugin_harness import flat_params, make_workers, plugin_trajectory, worker_batch

STEPS = 12


def reference(k: int, kind: str) -> list[torch.Tensor]:
    """One model, one optimizer, each step on the concatenation of the K workers' batches."""
    (model,), (opt,) = make_workers(1, kind)
    out = []
    for step in range(STEPS):
        batches = [worker_batch(w, step, k) for w in range(k)]
        x = torch.cat([b[0] for b in batches])
        y = torch.cat([b[1] for b in batches])
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        out.append(flat_params(model))
    out.append(flat_params(model))
    return out


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_allreduce_equals_large_batch_single_process(kind: str) -> None:
    k = 4
    per_rank = run_ranks(plugin_trajectory, k, "allreduce", {}, STEPS, kind)
    expected = reference(k, kind)
    for rank, traj in enumerate(per_rank):
        for step, (got, want) in enumerate(zip(traj, expected)):
            assert torch.allclose(got, want, atol=1e-6, rtol=0), f"rank {rank} step {step}: max diff {(got - want).abs().max()}"
    # and the ranks are identical to each other, bit for bit
    for traj in per_rank[1:]:
        assert all(torch.equal(a, b) for a, b in zip(traj, per_rank[0]))
