"""Error feedback and the communicator against one-process simulations with K workers (issue 22).

- the memories' definitions (EF's conservation, EF21's estimate, decayed EF with beta 1 is EF);
- the communicator on K gloo ranks gives what `simulate` computes from the definitions, for each
  combine kind (summed, gathered, voted) and each memory, bytes included;
- `algo=compressed` trains exactly as K model copies whose gradients are combined by `simulate`.
"""
from __future__ import annotations

from typing import Any

import pytest
import torch

from dist_algos.comm.accounting import allgather_bytes, allreduce_bytes
from dist_algos.compress import build_chain
from dist_algos.compress.communicator import Communicator, simulate
from dist_algos.compress.contract import EncodeContext
from dist_algos.compress.memory import Memory
from tests.support.harness import run_ranks
from tests.support.plugin_harness import grad_step, make_workers, plugin_trajectory, worker_batch

SIZES = [60, 12, 128]
SHAPES = [(6, 10), (12,), (8, 4, 2, 2)]
STEPS = 6
CASES = [  # (chain, feedback)
    (["topk:0.1"], "ef"),
    (["topk:0.1"], "ef21"),
    (["qsgd:4:64"], "none"),
    (["signmv"], "momentum:0.9"),
    (["sign"], "ef"),
    (["randomk:0.2", "fp16"], "ef"),
    (["threshold:1.5"], "ef"),
    (["chunk_topk:8:2", "binquant:2:6"], "decayed:0.9"),
    (["dct_topk:8:4"], "decayed:0.999"),
]


def x_of(worker: int, step: int) -> torch.Tensor:
    return torch.randn(sum(SIZES), generator=torch.Generator().manual_seed(100 * step + worker))


def test_ef_conserves_what_was_not_sent() -> None:
    """EF: sum of what a worker sent + its residual = sum of its inputs, at every step."""
    chain = build_chain(["topk:0.05"])
    mem = Memory("ef")
    total, sent = torch.zeros(sum(SIZES)), torch.zeros(sum(SIZES))
    for step in range(STEPS):
        x = x_of(0, step)
        p = mem.prepare(x)
        own = chain.decode(chain.encode(p, EncodeContext(SIZES, step)))
        mem.sent(p, own)
        total += x
        sent += own
        assert torch.allclose(sent + mem.local, total, atol=1e-5)


def test_ef21_estimate_is_the_mean_of_the_workers_estimates() -> None:
    """EF21: g = mean_i g_i after every round, and g_i moves towards the worker's gradient."""
    chain, k = build_chain(["topk:0.2"]), 3
    mems = [Memory("ef21") for _ in range(k)]
    for step in range(STEPS):
        xs = [x_of(w, 0) for w in range(k)]  # a fixed gradient: the estimates converge to it
        out = simulate(chain, mems, xs, SIZES, step)
        assert torch.allclose(out[0], torch.stack([m.local for m in mems]).mean(0), atol=1e-5)
    assert float((mems[0].local - x_of(0, 0)).norm()) < 0.5 * float(x_of(0, 0).norm())


def test_decayed_with_beta_one_is_ef() -> None:
    chain = build_chain(["topk:0.1"])
    a, b = [Memory("ef")], [Memory("decayed:1.0")]
    for step in range(STEPS):
        xs = [x_of(0, step)]
        assert torch.allclose(simulate(chain, a, xs, SIZES, step)[0], simulate(chain, b, xs, SIZES, step)[0])


def exchange_in_rank(rank: int, world: int, cases: list[tuple[list[str], str]]) -> list[Any]:
    out = []
    for chain, feedback in cases:
        comm = Communicator(build_chain(chain), feedback, world, rank, SIZES, seed=5, shapes=SHAPES)
        out.append([comm.exchange(x_of(rank, step), step) for step in range(STEPS)])
    return out


@pytest.fixture(scope="module")
def exchanged() -> list[Any]:
    return run_ranks(exchange_in_rank, 2, CASES, timeout=300)


@pytest.mark.parametrize("case", range(len(CASES)), ids=["+".join(c) + "/" + f for c, f in CASES])
def test_communicator_equals_the_simulation(exchanged: list[Any], case: int) -> None:
    chain_spec, feedback = CASES[case]
    chain = build_chain(chain_spec)
    mems = [Memory(feedback) for _ in range(2)]
    for step in range(STEPS):
        expected = simulate(chain, mems, [x_of(0, step), x_of(1, step)], SIZES, step, seed=5, shapes=SHAPES)
        for rank in range(2):
            got, nbytes = exchanged[rank][case][step]
            assert torch.allclose(got, expected[rank], atol=1e-5, rtol=1e-4), (chain_spec, step, rank)
            assert nbytes > 0
        assert torch.equal(exchanged[0][case][step][0], exchanged[1][case][step][0])  # ranks agree bitwise


def test_bytes_are_the_collectives(exchanged: list[Any]) -> None:
    """Summable: an all_reduce of the payload; gathered: lengths (int64 each) + padded payload."""
    chain = build_chain(["randomk:0.2", "fp16"])
    wire = chain.encode(x_of(0, 0), EncodeContext(SIZES)).wire_bytes
    assert exchanged[0][CASES.index((["randomk:0.2", "fp16"], "ef"))][0][1] == allreduce_bytes(wire, 2)
    qsgd = build_chain(["qsgd:4:64"])
    wire = qsgd.encode(x_of(0, 0), EncodeContext(SIZES)).wire_bytes
    assert exchanged[0][CASES.index((["qsgd:4:64"], "none"))][0][1] == allgather_bytes(wire + 2 * 8, 2)


PLUGIN_STEPS = 5


def reference(chain_spec: list[str], feedback: str, sign_result: bool, k: int = 2, steps: int = PLUGIN_STEPS,
              kind: str = "sgd") -> list[torch.Tensor]:
    """K model copies; each step every copy's gradient goes through `simulate`, then each steps.
    Worker 0's flat parameters after every step and after the end (the copies stay identical)."""
    models, opts = make_workers(k, kind)
    chain = build_chain(chain_spec)
    mems = [Memory(feedback) for _ in range(k)]
    sizes = [p.numel() for p in models[0].parameters()]
    shapes = [tuple(p.shape) for p in models[0].parameters()]
    out = []
    for step in range(steps):
        grads = []
        for w, (m, o) in enumerate(zip(models, opts)):
            grad_step(m, o, *worker_batch(w, step, k))
            grads.append(torch.cat([p.grad.reshape(-1) for p in m.parameters()]))
        combined = simulate(chain, mems, grads, sizes, step, shapes=shapes)
        for m, o, c in zip(models, opts, combined):
            c = c.sign() if sign_result else c
            offset = 0
            for p in m.parameters():
                p.grad.copy_(c[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
            o.step()
        out.append(torch.cat([p.detach().reshape(-1) for p in models[0].parameters()]))
    return out + [out[-1]]


PLUGIN_CASES = [(["topk:0.1"], "ef", False), (["qsgd:4:128"], "none", False), (["signmv"], "momentum:0.9", False),
                (["dct_topk:8:4"], "decayed:0.9", True)]


#: per-layer rules give the same result bucket by bucket: overlapped runs against the same reference,
#: with buckets small enough (512 bytes, the first 102) that the test model is cut into several
OVERLAP_CASES = [(["topk:0.1"], "ef", False), (["sign"], "ef", False), (["signmv"], "momentum:0.9", False)]
SMALL_BUCKETS = {"overlap": True, "bucket_mb": 0.5 / 1024, "first_bucket_mb": 0.1 / 1024}


def plugin_in_rank(rank: int, world: int) -> list[list[torch.Tensor]]:
    plain = [plugin_trajectory(rank, world, "compressed", {"compress": c, "feedback": f, "sign_result": s},
                               PLUGIN_STEPS, "sgd") for c, f, s in PLUGIN_CASES]
    overlapped = [plugin_trajectory(rank, world, "compressed", {"compress": c, "feedback": f, "sign_result": s,
                                                                **SMALL_BUCKETS}, PLUGIN_STEPS, "sgd")
                  for c, f, s in OVERLAP_CASES]
    return plain + overlapped


def test_overlap_cuts_the_model_into_several_buckets() -> None:
    from dist_algos.comm.grad_buckets import MIB, assign_buckets
    from tests.support.plugin_harness import make_model

    sizes = [((torch.float32, "cpu"), p.numel() * 4) for p in make_model().parameters()]
    caps = (int(SMALL_BUCKETS["first_bucket_mb"] * MIB), int(SMALL_BUCKETS["bucket_mb"] * MIB))
    assert len(assign_buckets(sizes, caps)) >= 3


def test_plugin_equals_k_model_copies() -> None:
    runs = run_ranks(plugin_in_rank, 2, timeout=300)
    for case, (chain, feedback, sign) in enumerate(PLUGIN_CASES + OVERLAP_CASES):
        ref = reference(chain, feedback, sign)
        for rank in range(2):
            for step in range(PLUGIN_STEPS + 1):
                assert torch.allclose(runs[rank][case][step], ref[step], atol=1e-5), (chain, feedback, step)
        assert torch.equal(runs[0][case][-1], runs[1][case][-1])


def test_samomentum_memory_is_dgs_rule() -> None:
    """`feedback=samomentum:M` with `topk:D` is DGS's SAMomentum (`compressors.samomentum_`), bit for bit."""
    from dist_algos.compress.sparse_feedback import samomentum_

    chain, mem = build_chain(["topk:0.1"]), Memory("samomentum:0.9")
    velocity = torch.zeros(sum(SIZES))
    for step in range(STEPS):
        x = x_of(0, step)
        idx, values = samomentum_(velocity, x, 0.9, SIZES, 0.1)
        sent = torch.zeros(sum(SIZES)).index_put_((idx,), values)
        got = simulate(chain, [mem], [x], SIZES, step)[0]
        assert torch.equal(got, sent)
        assert torch.equal(mem.local, velocity)
