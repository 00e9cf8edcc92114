"""The sparsifying compressors against reference computations on fixed tensors (no processes)."""
from __future__ import annotations

import pytest
import torch

from dist_algos.compress.sparse_feedback import clip_by_norm_, dgc_, dgc_warmup_density, gradient_dropping_, samomentum_
from dist_algos.compress.topk import layer_k, topk_per_layer
from dist_algos.param_server import wire
from dist_algos.param_server.layout import partition
from core.errors import UserError

SIZES = [4, 6]


def scatter(idx: torch.Tensor, values: torch.Tensor, n: int) -> torch.Tensor:
    out = torch.zeros(n)
    out[idx] = values
    return out


def reference_topk(x: torch.Tensor, sizes: list[int], density: float) -> set[int]:
    """Sort each layer by magnitude in plain Python and take the first k."""
    chosen, offset = set(), 0
    for n in sizes:
        k = max(1, int(density * n))
        order = sorted(range(n), key=lambda j: -abs(float(x[offset + j])))
        chosen |= {offset + j for j in order[:k]}
        offset += n
    return chosen


def test_topk_per_layer_picks_each_layers_largest() -> None:
    x = torch.tensor([0.1, -3.0, 2.0, 0.5, 1.0, -1.5, 0.2, 4.0, -0.1, 0.3])
    assert topk_per_layer(x, SIZES, 0.5).tolist() == [1, 2, 4, 5, 7]
    # a tiny density still sends one entry per layer, the largest
    assert topk_per_layer(x, SIZES, 0.01).tolist() == [1, 7]
    assert layer_k([3, 1000, 50], 0.01) == [1, 10, 1]
    # zeros are never selected (sending one changes nothing), also on the sampled path
    assert topk_per_layer(torch.tensor([0.0, 0.0, -3.0, 0.0]), [4], 0.5).tolist() == [2]
    big = torch.zeros(100_000)
    big[[5, 70_000]] = torch.tensor([1.0, -2.0])
    assert topk_per_layer(big, [100_000], 0.01).tolist() == [5, 70_000]
    gen = torch.Generator().manual_seed(0)
    y = torch.randn(300, generator=gen)
    sizes = [17, 200, 83]
    assert set(topk_per_layer(y, sizes, 0.1).tolist()) == reference_topk(y, sizes, 0.1)
    # large layers take the sampled-threshold path; still exactly the top k
    z = torch.randn(300_000, generator=gen) * torch.linspace(0.1, 3, 300_000)
    assert torch.equal(topk_per_layer(z, [200_000, 100_000], 0.01),
                       torch.cat([torch.topk(z[:200_000].abs(), 2000).indices.sort().values,
                                  torch.topk(z[200_000:].abs(), 1000).indices.sort().values + 200_000]))
    with pytest.raises(ValueError):
        topk_per_layer(y, [10, 10], 0.1)


def test_gradient_dropping_conserves_what_was_accumulated() -> None:
    gen = torch.Generator().manual_seed(1)
    residual = torch.zeros(10)
    accumulated = torch.zeros(10)
    sent_total = torch.zeros(10)
    for _ in range(5):
        update = torch.randn(10, generator=gen)
        before = residual + update
        idx, values = gradient_dropping_(residual, update, SIZES, 0.3)
        accumulated += update
        sent_total += scatter(idx, values, 10)
        assert set(idx.tolist()) == reference_topk(before, SIZES, 0.3)
        assert torch.equal(values, before[idx])
        assert torch.all(residual[idx] == 0)
        assert torch.allclose(sent_total + residual, accumulated, atol=1e-6)


def test_dgc_momentum_correction_and_factor_masking() -> None:
    gen = torch.Generator().manual_seed(2)
    u, v = torch.randn(10, generator=gen), torch.randn(10, generator=gen)
    grad = torch.randn(10, generator=gen)
    m, lr = 0.9, 0.1
    u_ref = m * u + grad
    v_ref = v + u_ref
    idx, values = dgc_(u, v, grad, m, lr, SIZES, 0.3)
    assert set(idx.tolist()) == reference_topk(v_ref, SIZES, 0.3)
    assert torch.allclose(values, lr * v_ref[idx])
    unsent = torch.ones(10, dtype=torch.bool)
    unsent[idx] = False
    assert torch.all(u[idx] == 0) and torch.all(v[idx] == 0)  # the masking
    assert torch.allclose(u[unsent], u_ref[unsent]) and torch.allclose(v[unsent], v_ref[unsent])
    assert torch.allclose(scatter(idx, values / lr, 10) + v, v_ref, atol=1e-6)  # conservation


def reference_samomentum(u: torch.Tensor, grad: torch.Tensor, w: torch.Tensor, lr: float, m: float, wd: float,
                         sizes: list[int], rate: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference code's rule (threshold at the k-th value, masks, u += u (1 - mask) (1/m - 1))."""
    u = u * m
    payload = torch.zeros_like(u)
    offset = 0
    for n in sizes:
        layer = u[offset:offset + n]
        layer += (grad[offset:offset + n] + wd * w[offset:offset + n]) * lr
        k = max(1, int(n * rate))
        threshold = torch.kthvalue(layer.abs(), n - k).values
        mask = (layer.abs() > threshold).float()
        payload[offset:offset + n] = layer * mask
        layer += layer * (1 - mask) * (1 / m - 1)
        offset += n
    return payload, u


def test_samomentum_matches_the_reference_rule() -> None:
    gen = torch.Generator().manual_seed(3)
    u = torch.randn(10, generator=gen)
    mine, ref_u = u.clone(), u.clone()
    lr, m, wd = 0.1, 0.9, 5e-4
    for _ in range(4):
        grad, w = torch.randn(10, generator=gen), torch.randn(10, generator=gen)
        payload, ref_u = reference_samomentum(ref_u, grad, w, lr, m, wd, SIZES, 0.3)
        idx, values = samomentum_(mine, (grad + wd * w) * lr, m, SIZES, 0.3)
        assert torch.allclose(scatter(idx, values, 10), payload, atol=1e-6)
        assert torch.allclose(mine, ref_u, atol=1e-6)


def test_samomentum_residual_is_undecayed_and_sent_entries_keep_momentum() -> None:
    m = 0.5
    u = torch.zeros(4)
    steps = [torch.tensor([8.0, 0.1, 0.2, 0.0]), torch.tensor([4.0, 0.3, 0.0, 0.0])]
    for s in steps:
        idx, values = samomentum_(u, s, m, [4], 0.25)
        assert idx.tolist() == [0]
    # entry 1 was never sent: m u holds the plain sum of its steps (no decay)
    assert m * u[1] == pytest.approx(0.1 + 0.3)
    # entry 0 was sent both times and keeps its momentum: m * 8 + 4
    assert u[0] == pytest.approx(m * 8 + 4) and values.item() == pytest.approx(m * 8 + 4)
    with pytest.raises(ValueError):
        samomentum_(u, steps[0], 0.0, [4], 0.25)


def test_dgc_warmup_and_clipping() -> None:
    assert [dgc_warmup_density(0.01, e, 4) for e in range(6)] == [0.25, 0.0625, 0.015625, 0.01, 0.01, 0.01]
    assert [dgc_warmup_density(0.001, e, 4) for e in range(5)] == [0.25, 0.0625, 0.015625, 0.00390625, 0.001]
    assert dgc_warmup_density(0.01, 0, 0) == 0.01
    gen = torch.Generator().manual_seed(5)
    g = torch.randn(50, generator=gen) * 3
    p = torch.nn.Parameter(torch.zeros(50))
    p.grad = g.clone()
    torch.nn.utils.clip_grad_norm_([p], 1.5)
    norm = clip_by_norm_(g, 1.5)
    assert norm > 1.5 and torch.allclose(g, p.grad)


def test_wire_bytes_and_layout() -> None:
    idx, values = torch.arange(5), torch.ones(5)
    assert wire.sparse(idx, values, torch.float32).nbytes == wire.HEADER_BYTES + 5 * (4 + 4)
    assert wire.sparse(idx, values, torch.float16).nbytes == wire.HEADER_BYTES + 5 * (4 + 2)
    assert wire.dense(torch.ones(7), torch.float32).nbytes == wire.HEADER_BYTES + 7 * 4
    sizes = [100, 1, 50, 50, 1, 200]
    shards = partition(sizes, [0, 1, 2])
    assert [s.server for s in shards] == [0, 1, 2]
    assert shards[0].start == 0 and shards[-1].end == sum(sizes)
    assert all(a.end == b.start for a, b in zip(shards, shards[1:]))
    assert all(sum(s.sizes) == s.numel and s.sizes for s in shards)
    assert [len(s.sizes) for s in partition([5, 5], [0, 1])] == [1, 1]
    with pytest.raises(UserError, match="algo.servers=3"):
        partition([5, 5], [0, 1, 2])
