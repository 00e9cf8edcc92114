"""The parameter-server family's sparsifiers with error-feedback memory, as pure functions on flat
tensors (gradient dropping, DGC, DGS's SAMomentum).

A flat vector holds a model's layers back to back; `sizes` lists their lengths. Every rule here
selects, per layer, the k = max(1, int(density x n)) entries of largest magnitude of a layer of
n entries, leaving out entries that are zero (per layer, as the DGS reference and DGC do, so that
small layers such as biases are never starved by large ones), and keeps what it did not send in a
memory tensor, so that nothing is lost, only delayed. The memory tensors are updated in place; each function returns the
selected flat indices (int64, layer by layer, ascending inside a layer) and the values to send.

- gradient dropping (Aji and Heafield 2017): r += update; send top-k(r); r -= sent.
- DGC (Lin et al. 2018): momentum correction u = m u + g, accumulation v += u, send lr x top-k(v),
  momentum factor masking (u and v cleared where sent); local gradient clipping and the density
  warm-up are separate helpers.
- SAMomentum (DGS, Yan et al. 2020): u = m u + step; send top-k(u); entries not sent are divided
  by m so that the next multiplication by m restores them (an un-decayed residual), sent entries
  keep their momentum.

Ties are broken by `torch.topk` (k entries are sent whenever a layer has k that are not zero),
where the reference code's threshold `|x| > kth value` sends fewer than k when values tie.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

# The selection is the compressor zoo's top-k (dist_algos.compress.topk), the same code for the
# parameter-server family and for `algo.compress=[topk:D]`; SAMomentum's residual rule likewise.
from dist_algos.compress.memory import samomentum_keep_
from dist_algos.compress.topk import topk_per_layer

Selection = tuple[torch.Tensor, torch.Tensor]  # (int64 flat indices, values)


def gradient_dropping_(residual: torch.Tensor, update: torch.Tensor, sizes: Sequence[int],
                       density: float) -> Selection:
    """Aji and Heafield: accumulate the update into the residual, send the residual's top-k
    per layer, and keep the rest for later (conservation: sent + residual = accumulated)."""
    residual.add_(update)
    idx = topk_per_layer(residual, sizes, density)
    values = residual[idx]
    residual[idx] = 0
    return idx, values


def dgc_(momentum_buf: torch.Tensor, accum: torch.Tensor, grad: torch.Tensor, momentum: float,
         lr: float, sizes: Sequence[int], density: float) -> Selection:
    """DGC's momentum correction and factor masking: u = m u + g; v += u; send lr x top-k(v);
    clear u and v where sent (so stale momentum does not keep pushing sent coordinates)."""
    momentum_buf.mul_(momentum).add_(grad)
    accum.add_(momentum_buf)
    idx = topk_per_layer(accum, sizes, density)
    values = accum[idx] * lr
    accum[idx] = 0
    momentum_buf[idx] = 0
    return idx, values


def samomentum_(velocity: torch.Tensor, step: torch.Tensor, momentum: float, sizes: Sequence[int],
                density: float) -> Selection:
    """DGS's SAMomentum: u = m u + step (step = lr (g + wd w)); send top-k(u) per layer; the
    entries not sent become u / m, so the next u = m u + step adds the new step to them
    undecayed (a residual); the sent entries keep u, their momentum."""
    if momentum <= 0:
        raise ValueError("SAMomentum needs a momentum > 0 (the residual is divided by it)")
    velocity.mul_(momentum).add_(step)
    idx = topk_per_layer(velocity, sizes, density)
    values = velocity[idx]
    samomentum_keep_(velocity, idx, values, momentum)
    return idx, values


def clip_by_norm_(grad: torch.Tensor, max_norm: float) -> float:
    """Scale `grad` in place to L2 norm at most `max_norm` (torch's clip_grad_norm_ rule);
    returns the norm before clipping."""
    norm = float(grad.norm())
    coef = max_norm / (norm + 1e-6)
    if coef < 1:
        grad.mul_(coef)
    return norm


def dgc_warmup_density(density: float, epoch: int, warmup_epochs: int) -> float:
    """DGC's warm-up: density 0.25, 0.25^2, 0.25^3, ... per epoch (sparsity 75%, 93.75%,
    98.4%, ...) during the first `warmup_epochs` epochs, never below the target density."""
    if epoch < warmup_epochs:
        return max(density, 0.25 ** (epoch + 1))
    return density
