"""The compressor zoo against its definitions (issue 22): unbiasedness and variance bounds of the
stochastic quantisers over many seeded draws, the majority vote, shared random-k positions, exact
wire bytes, chains, and every registered compressor's round trip. Error feedback against
one-process simulations with K workers is in tests/compress/test_error_feedback.py."""
from __future__ import annotations

import math

import pytest
import torch

from core.errors import UserError
from dist_algos.compress import build_chain, build_stage, list_compressors
from dist_algos.compress.bits import pack, unpack
from dist_algos.compress.communicator import combine_payloads, simulate
from dist_algos.compress.contract import Combine, EncodeContext, layer_bounds
from dist_algos.compress.memory import Memory

SIZES = [300, 40, 700]  # three "layers"
SHAPES = [(10, 30), (40,), (7, 10, 10)]
DRAWS = 4000


def vector(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(sum(SIZES), generator=g) * torch.linspace(0.1, 2.0, sum(SIZES))


def draws(spec: str, x: torch.Tensor, n: int = DRAWS) -> torch.Tensor:
    c = build_stage(spec)
    return torch.stack([c.decode(c.encode(x, EncodeContext(SIZES, step=s, rank=0))) for s in range(n)])


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_pack_round_trip_and_size(bits: int) -> None:
    codes = torch.randint(0, 2**bits, (1001,), generator=torch.Generator().manual_seed(bits)).to(torch.uint8)
    packed = pack(codes, bits)
    assert packed.numel() == math.ceil(1001 * bits / 8)
    assert torch.equal(unpack(packed, bits, 1001), codes)


def per_coordinate_variance_bound(name: str, x: torch.Tensor) -> torch.Tensor:
    """Each method's bound on Var[Q(x)_i]: stochastic rounding between neighbouring levels a gap
    D apart has variance at most D^2 / 4 (QSGD: D = bucket norm / s; TernGrad: D = layer max);
    natural compression at most x_i^2 / 8; unbiased random-k x_i^2 (n / k - 1)."""
    if name.startswith("qsgd"):
        _, s, b = name.split(":")
        norms = torch.cat([v.norm().expand(len(v)) for v in x.split(int(b))])
        return (norms / int(s)) ** 2 / 4
    if name == "terngrad":
        return torch.cat([v.abs().max().expand(len(v)) for v in x.split(SIZES)]) ** 2 / 4
    if name == "natural":
        return x**2 / 8
    density = float(name.split(":")[1])
    return x**2 * (1 / (int(density * x.numel()) / x.numel()) - 1)


@pytest.mark.parametrize("name", ["qsgd:4:128", "qsgd:1:512", "terngrad", "natural", "randomk:0.2:unbiased"])
def test_unbiased_within_five_standard_errors(name: str) -> None:
    """mean of DRAWS independent draws vs x: every coordinate within 5 standard errors of the mean,
    the standard error from the method's variance bound (a biased compressor fails: its bias does
    not shrink with more draws)."""
    x = vector()
    d = draws(name, x)
    se = (per_coordinate_variance_bound(name, x) / DRAWS).sqrt()
    assert build_stage(name).unbiased
    err = (d.mean(0) - x).abs()
    assert bool((err <= 5 * se + 1e-6).all()), float((err / se).max())


def test_a_biased_compressor_fails_the_same_check() -> None:
    """The check above can fail: top-k's bias (the dropped entries) stays whatever the number of
    draws, against the same standard error QSGD is held to."""
    x = vector()
    d = draws("topk:0.2", x, 20)  # deterministic: DRAWS draws would all be these
    se = (per_coordinate_variance_bound("qsgd:4:128", x) / DRAWS).sqrt()
    assert not bool(((d.mean(0) - x).abs() <= 5 * se + 1e-6).all())


@pytest.mark.parametrize("levels,bucket", [(1, 128), (4, 128), (16, 512)])
def test_qsgd_variance_bound(levels: int, bucket: int) -> None:
    """Alistarh et al., Lemma 3.1: E||Q(v) - v||^2 <= min(d / s^2, sqrt(d) / s) ||v||^2 per bucket."""
    x = vector(1)
    d = draws(f"qsgd:{levels}:{bucket}", x, 1000)
    measured = ((d - x) ** 2).sum(1).mean()
    bound = sum(min(len(v) / levels**2, math.sqrt(len(v)) / levels) * float(v.norm()) ** 2 for v in x.split(bucket))
    assert measured <= bound
    assert measured > 0.01 * bound  # it does quantise


def test_terngrad_variance_is_its_formula() -> None:
    """E||Q(g) - g||^2 = sum_i (s |g_i| - g_i^2), s = max |g| of the layer (within 5%)."""
    x = vector(2)
    d = draws("terngrad", x, 2000)
    measured = float(((d - x) ** 2).sum(1).mean())
    expected = sum(float((v.abs().max() * v.abs() - v**2).sum()) for v in x.split(SIZES))
    assert abs(measured - expected) <= 0.05 * expected
    values = set(torch.unique(d[0].split(SIZES)[0].abs()).tolist())
    assert values <= {0.0, float(x.split(SIZES)[0].abs().max())}  # ternary


def test_natural_variance_bound_and_powers_of_two() -> None:
    x = vector(3)
    d = draws("natural", x, 1000)
    assert float(((d - x) ** 2).sum(1).mean()) <= float(x.norm()) ** 2 / 8
    nonzero = d[0][d[0] != 0].abs()
    assert torch.equal(torch.log2(nonzero), torch.log2(nonzero).round())


@pytest.mark.parametrize("k", [4, 5])
def test_majority_vote_is_the_sign_of_the_sum_of_signs(k: int) -> None:
    xs = [vector(10 + r) for r in range(k)]
    out = simulate(build_stage("signmv"), [Memory() for _ in range(k)], xs, SIZES, step=0)
    signs = torch.stack([torch.where(x >= 0, 1.0, -1.0) for x in xs])
    assert torch.equal(out[0], signs.sum(0).sign())
    assert all(torch.equal(o, out[0]) for o in out)
    if k % 2 == 0:
        assert bool((out[0] == 0).any())  # ties give 0


def test_randomk_positions_are_shared_and_change_per_step() -> None:
    c = build_stage("randomk:0.05")
    x = vector()
    pos = [c.encode(x, EncodeContext(SIZES, step=7, rank=r)).info["indices"] for r in range(4)]
    assert all(torch.equal(p, pos[0]) for p in pos)
    assert not torch.equal(pos[0], c.encode(x, EncodeContext(SIZES, step=8, rank=0)).info["indices"])
    payload = c.encode(x, EncodeContext(SIZES, step=7, rank=0))
    assert set(payload.tensors) == {"values"}  # no index is sent
    assert payload.wire_bytes == 4 * int(0.05 * x.numel())


def test_wire_bytes_are_what_is_sent() -> None:
    x, n = vector(), sum(SIZES)
    ctx = EncodeContext(SIZES, shapes=SHAPES)
    expect = {
        "qsgd:4:128": 4 * math.ceil(n / 128) + math.ceil(math.ceil(n / 128) * 128 * 4 / 8),  # 4-bit codes
        "terngrad": 4 * len(SIZES) + math.ceil(n * 2 / 8),
        "sign": 4 * len(SIZES) + math.ceil(n / 8),
        "signmv": math.ceil(n / 8),
        "natural": n + math.ceil(n / 8),  # 9 bits per entry
        "fp16": 2 * n, "bf16": 2 * n,
        "int8:256": 4 * math.ceil(n / 256) + n,
        "topk:0.1": sum(max(1, int(0.1 * s)) for s in SIZES) * (2 + 4),  # int16 position + float32
        "quant:2": 4 + math.ceil(n * 2 / 8),
        "binquant:2:6": math.ceil(n * 2 / 8) + len(SIZES) * (4 * 4 + 4),  # per layer: table + shift
    }
    for spec, nbytes in expect.items():
        assert build_stage(spec).encode(x, ctx).wire_bytes == nbytes, spec


def test_chain_topk_then_two_bits() -> None:
    """top-k then 2 bits per kept value: the positions are top-k's, the values 4 levels."""
    x = vector()
    chain = build_chain(["topk:0.1", "quant:2"])
    p = chain.encode(x, EncodeContext(SIZES))
    y = chain.decode(p)
    kept = torch.nonzero(y).flatten()
    topk = build_stage("topk:0.1").encode(x, EncodeContext(SIZES)).tensors["indices"].long()
    assert set(kept.tolist()) <= set(topk.tolist())
    assert len(torch.unique(y[topk])) <= 4
    assert p.wire_bytes == topk.numel() * 2 + 4 + math.ceil(topk.numel() * 2 / 8)
    assert chain.combine == Combine.GATHER


def test_chain_randomk_then_fp16_is_summable_and_exact() -> None:
    xs = [vector(r) for r in range(3)]
    chain = build_chain(["randomk:0.1", "fp16"])
    assert chain.combine == Combine.SUM
    out = simulate(chain, [Memory() for _ in xs], xs, SIZES, step=3)[0]
    idx = build_stage("randomk:0.1").indices(sum(SIZES), EncodeContext(SIZES, step=3))
    mean = torch.stack([x[idx].half().float() for x in xs]).sum(0) / 3
    assert torch.allclose(out[idx], mean, atol=1e-3)
    assert int((out != 0).sum()) <= idx.numel()


def test_dct_topk_with_every_coefficient_is_lossless() -> None:
    x = vector()
    c = build_stage("dct_topk:16:100000")
    assert torch.allclose(c.decode(c.encode(x, EncodeContext(SIZES, shapes=SHAPES))), x, atol=1e-5)


@pytest.mark.parametrize("name", list_compressors())
def test_every_compressor_round_trips(name: str) -> None:
    """Any registered compressor: same length back, no NaN, sane error, combines across workers."""
    c = build_stage(name)
    x = vector()
    ctx = EncodeContext(SIZES, step=1, rank=0, shapes=SHAPES)
    p = c.encode(x, ctx)
    y = c.decode(p)
    assert y.shape == x.shape and bool(torch.isfinite(y).all())
    assert p.wire_bytes == sum(t.numel() * t.element_size() for t in p.tensors.values()) > 0
    assert float((y - x).norm()) <= 4 * float(x.norm())
    both = combine_payloads(c, [p, c.encode(x, EncodeContext(SIZES, step=1, rank=1, shapes=SHAPES))])
    assert both.shape == x.shape


@pytest.mark.parametrize("spec,message", [(["nosuch"], "nosuch"), (["topk:2"], "density"),
                                          (["qsgd", "fp16"], "sparsifier"), (["topk:0.1", "signmv"], "vote")])
def test_bad_chains_are_user_errors(spec: list[str], message: str) -> None:
    from dist_algos.compress import check_chain as check_compression

    with pytest.raises(UserError, match=message):
        check_compression(spec, "ef")


def test_bad_feedback_is_a_user_error() -> None:
    from dist_algos.compress import check_chain as check_compression

    with pytest.raises(UserError, match="algo.feedback"):
        check_compression(["topk:0.1"], "ef3")


def test_lowrank_sketch_is_unbiased_within_five_standard_errors() -> None:
    """lowrank:R:unbiased with Q ~ N(0, 1/R) drawn from the step: E[M Q Q^T] = M; entry (i, j) has
    variance (|M_i|^2 + M_ij^2) / R; the vector layer is sent as it is (exact)."""
    x = vector()
    c = build_stage("lowrank:3:unbiased")
    d = torch.stack([c.decode(c.encode(x, EncodeContext(SIZES, step=s, rank=0, shapes=SHAPES))) for s in range(DRAWS)])
    var = []
    for (a, b), shape in zip(layer_bounds(SIZES), SHAPES):
        if len(shape) < 2:
            var.append(torch.zeros(b - a))
            continue
        m = x[a:b].view(shape[0], -1)
        var.append(((m.pow(2).sum(1, keepdim=True) + m.pow(2)) / 3).flatten())
    se = (torch.cat(var) / DRAWS).sqrt()
    err = (d.mean(0) - x).abs()
    assert c.unbiased and bool((err <= 5 * se + 1e-6).all()), float((err / (se + 1e-12)).max())
    assert torch.equal(d[0][300:340], x[300:340])  # the vector layer


def test_lowrank_payloads_sum_to_the_sketch_of_the_sum_and_send_rows_times_r() -> None:
    """Linear in M with Q shared: the all_reduced sketches decode to the mean's sketch; on the wire
    rows x R floats per sketched layer, the others whole (10 x 30 -> 10 x 4, (7, 10, 10) -> 7 x 4)."""
    c = build_stage("lowrank:4")
    xs = [vector(seed) for seed in range(3)]
    ctx = [EncodeContext(SIZES, step=5, rank=r, shapes=SHAPES) for r in range(3)]
    mean = combine_payloads(c, [c.encode(x, k) for x, k in zip(xs, ctx)])
    direct = c.decode(c.encode(sum(xs) / 3, ctx[0]))
    assert torch.allclose(mean, direct, atol=1e-5)
    assert c.encode(xs[0], ctx[0]).wire_bytes == 4 * (10 * 4 + 40 + 7 * 4)
    assert build_stage("lowrank:100").encode(xs[0], ctx[0]).wire_bytes == 4 * 1040  # R >= columns: sent whole


def test_lowrank_default_is_a_contraction_with_the_optimal_scale() -> None:
    """Error feedback needs E|C(x) - x|^2 < |x|^2: the unbiased sketch's error exceeds |x| at R = 4
    (the check can fail), the scaled default's mean square error is (cols + 1) / (R + cols + 1) of
    each sketched layer's |M|^2 (within 5%, 2,000 draws)."""
    x = vector()
    sq = {}
    for spec in ("lowrank:4", "lowrank:4:unbiased"):
        c = build_stage(spec)
        errs = torch.stack([c.decode(c.encode(x, EncodeContext(SIZES, step=s, shapes=SHAPES))) - x for s in range(2000)])
        sq[spec] = errs.pow(2).mean(0)
    layer = slice(340, 1040)  # (7, 10, 10): 100 columns
    norm2 = float(x[layer].pow(2).sum())
    assert float(sq["lowrank:4:unbiased"][layer].sum()) > norm2
    assert float(sq["lowrank:4"][layer].sum()) == pytest.approx(norm2 * 101 / 105, rel=0.05)
