"""powersgd on 2 gloo ranks equals PyTorch's own PowerSGD: `powerSGD_hook` on a DDP model.

An external reference, not our own: each rank trains the test model twice, once driven by the
plugin (tests/support/plugin_harness.py) and once as `DistributedDataParallel` with
`torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook`, on the same batches from the same
initial weights with the same SGD optimizer (momentum, weight decay); after every one of 50 steps
the parameters must agree to 1e-5 (and the plugin's ranks with each other, bit for bit).

What must match for the comparison to be exact up to rounding:
- the hook's options: matrix_approximation_rank = algo.rank, start_powerSGD_iter =
  algo.start_iter (DDP needs at least 2 before the hook may keep state), min_compression_rate,
  use_error_feedback, warm_start; orthogonalization_epsilon = 0 (the plugin divides by the exact
  norm; no column vanishes here) and the per-tensor mode (batch_tensors_with_same_shape=False);
- one bucket, whose matrices come last layer first, the order in which the plugin draws their
  random Q's: the test model's gradient (~10 KB) is below DDP's first-bucket cap, and from the
  second step DDP orders its bucket as gradients become ready in backward (the hook first
  compresses at step start_iter >= 2); the hook groups matrices by shape, which keeps that order
  here because the shapes are distinct. The test asserts both;
- the random Q's: at each initialisation of a bucket's Q's the hook seeds the CPU generator with
  `state.rng.randint(1_000_000_000)` and draws the Q's in bucket order; the plugin seeds a
  generator with seed + k at its k-th initialisation. The test gives the hook an rng whose k-th
  randint is seed + k;
- the same kernels: batched products (`torch.bmm`), Gram-Schmidt up to rank 2 and QR above, and
  error feedback over the whole gradient (the hook keeps, per bucket, this rank's value minus the
  mean for the tensors it does not compress too; that sums to zero over the ranks, but leaving it
  out changes the rounding, which 50 steps amplify past 1e-5).
With all that the two agree to the last bit on the CPU; the test allows the issue's 1e-5.
Except at rank 1: there the products are matrix-vector products whose rounding depends on where
the gradient lies in memory (its alignment in DDP's bucket differs from the plugin's buffer),
and the rank-1 power iteration amplifies a 1e-9 difference past 1e-5 within ~40 steps (to 1e-3 by
step 50): rank 1 is compared over its first 20 steps, which any error in the method would fail.
"""
from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.support.harness import run_ranks
from tests.support.plugin_harness import flat_params, loss_of, make_model, make_optimizer, plugin_trajectory, worker_batch

STEPS = 50
RANK1_STEPS = 20
VARIANTS: dict[str, dict[str, Any]] = {
    "rank2": {"rank": 2, "start_iter": 5},
    "rank1": {"rank": 1, "start_iter": 2},  # compared over RANK1_STEPS only: see the docstring
    "rank4_qr": {"rank": 4, "start_iter": 5, "min_compression_rate": 1.0},
    "no_warm_start": {"rank": 2, "start_iter": 5, "warm_start": False},
    "no_error_feedback": {"rank": 2, "start_iter": 5, "error_feedback": False, "seed": 7},
}


class SeedPerInit:
    """Stands in for the hook's numpy RandomState: the k-th draw is seed + k, the plugin's rule."""

    def __init__(self, seed: int) -> None:
        self.next = seed

    def randint(self, high: int) -> int:
        self.next += 1
        return self.next - 1


def ddp_trajectory(rank: int, world: int, algo: dict[str, Any]) -> dict[str, Any]:
    """This rank's flat parameters after each step of DDP + powerSGD_hook, and the bucket order."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps
    from torch.nn.parallel import DistributedDataParallel

    model = make_model()
    backward_matrices = [n for n, p in model.named_parameters() if p.dim() > 1][::-1]
    ddp = DistributedDataParallel(model)
    opt = make_optimizer(model, "sgd")
    state = ps.PowerSGDState(process_group=None, matrix_approximation_rank=algo["rank"],
                             start_powerSGD_iter=algo["start_iter"],
                             min_compression_rate=algo.get("min_compression_rate", 2.0),
                             use_error_feedback=algo.get("error_feedback", True),
                             warm_start=algo.get("warm_start", True), orthogonalization_epsilon=0,
                             random_seed=0, batch_tensors_with_same_shape=False)
    state.rng = SeedPerInit(algo.get("seed", 0))
    orders: list[list[str]] = []
    by_id = {id(p): n for n, p in model.named_parameters()}

    def hook(st, bucket):  # type: ignore[no-untyped-def]  # DDP rejects annotations that are not GradBucket
        orders.append([by_id[id(p)] for p in bucket.parameters() if p.dim() > 1])
        return ps.powerSGD_hook(st, bucket)

    ddp.register_comm_hook(state, hook)
    out = []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=False)
        loss_of(ddp, *worker_batch(rank, step, world)).backward()
        opt.step()
        out.append(flat_params(model))
    return {"traj": out, "orders": orders[algo["start_iter"]:], "backward_matrices": backward_matrices,
            "shapes": [tuple(p.shape) for p in model.parameters() if p.dim() > 1]}


def both(rank: int, world: int) -> dict[str, Any]:
    return {name: {"plugin": plugin_trajectory(rank, world, "powersgd", algo, STEPS, "sgd"),
                   "ddp": ddp_trajectory(rank, world, algo)} for name, algo in VARIANTS.items()}


@pytest.fixture(scope="module")
def runs() -> list[dict[str, Any]]:
    # PyTorch's hook synchronises CUDA whenever it is available, even for CPU tensors (it raised
    # "Expected a cuda device, but got: cpu" on an H100): the reference ranks see no GPU
    return run_ranks(both, 2, timeout=300, env={"CUDA_VISIBLE_DEVICES": ""})


@pytest.mark.parametrize("name", list(VARIANTS))
def test_equals_pytorch_powersgd_hook(runs: list[dict[str, Any]], name: str) -> None:
    for rank, run in enumerate(runs):
        ddp, plugin = run[name]["ddp"], run[name]["plugin"]
        assert all(order == ddp["backward_matrices"] for order in ddp["orders"]), \
            "DDP's bucket does not hold the matrices last layer first"
        assert len(set(ddp["shapes"])) == len(ddp["shapes"]), "same-shaped matrices: the hook would regroup them"
        steps = RANK1_STEPS if VARIANTS[name]["rank"] == 1 else STEPS
        for step, (got, want) in enumerate(zip(plugin[:steps], ddp["traj"][:steps])):
            assert torch.allclose(got, want, atol=1e-5, rtol=0), \
                f"rank {rank} after step {step + 1}: max diff {(got - want).abs().max().item():.3g}"
    assert all(torch.equal(a, b) for a, b in zip(runs[0][name]["plugin"], runs[1][name]["plugin"]))


def test_compression_actually_happened(runs: list[dict[str, Any]]) -> None:
    """A vacuous comparison (nothing compressed) would pass too: rank 2 must differ from plain SGD."""
    from tests.test_allreduce import reference

    plain = reference(2, "sgd")  # 12 steps of exact averaging
    got = runs[0]["rank2"]["plugin"][11]
    assert (got - plain[11]).abs().max() > 1e-4


def test_compressed_shapes_follow_the_hooks_rule() -> None:
    from dist_algos.compress.powersgd_math import compressed_shape

    assert compressed_shape(torch.Size([64]), 2, 2.0) is None  # vectors travel uncompressed
    assert compressed_shape(torch.Size([4, 1, 3, 3]), 2, 2.0) is None  # (4 + 9) 2 x 2 = 52 >= 36
    assert compressed_shape(torch.Size([8, 4, 3, 3]), 2, 2.0) == (8, 36, 2)  # 176 < 288
    assert compressed_shape(torch.Size([10, 3]), 4, 1.0) is None  # r = 3: 39 >= 30
    assert compressed_shape(torch.Size([128, 1024]), 4, 2.0) == (128, 1024, 4)


def test_gram_schmidt_is_orthonormal_and_keeps_zero_columns() -> None:
    from dist_algos.compress.powersgd_math import gram_schmidt_, orthogonalize_

    m = torch.randn(50, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    gram_schmidt_(m)
    assert torch.allclose(m.T @ m, torch.eye(2, dtype=torch.float64), atol=1e-12)
    z = torch.zeros(5, 2)
    gram_schmidt_(z)
    assert torch.equal(z, torch.zeros(5, 2))
    q = torch.randn(40, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    orthogonalize_(q)
    assert torch.allclose(q.T @ q, torch.eye(4, dtype=torch.float64), atol=1e-12)


@pytest.mark.parametrize("override, message", [
    ({"rank": 0}, "algo.rank"),
    ({"start_iter": -1}, "algo.start_iter"),
    ({"min_compression_rate": 0.5}, "algo.min_compression_rate"),
])
def test_bad_settings_are_one_line_user_errors(override: dict[str, Any], message: str) -> None:
    from core.errors import UserError
    from core.schema import typed_section
    from dist_algos import get_algorithm

    cls = get_algorithm("powersgd")
    with pytest.raises(UserError, match=message) as err:
        typed_section(cls.Config, {"name": "powersgd", **override}, "algo")
    assert "\n" not in str(err.value)


@pytest.mark.slow
def test_resume_is_bit_exact_without_warm_start(tmp_path: Any) -> None:
    """Without warm start the Q's are drawn afresh every step (the k-th draw from seed + k), so
    the count of draws must survive a resume; with rank 1 every matrix is compressed."""
    from tests.test_resume_registry import algo_overrides, resume_configs, resume_scenario

    overrides = algo_overrides("powersgd") + ["algo.warm_start=false", "algo.rank=1", "algo.start_iter=3"]
    diffs = run_ranks(resume_scenario, 2, resume_configs(overrides), str(tmp_path), timeout=300)
    for rank, d in enumerate(diffs):
        assert not d, f"rank {rank}: resumed state differs at {d[:10]}"
