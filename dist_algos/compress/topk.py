"""Top-k sparsification: per layer (`topk:DENSITY`, the k = max(1, int(density x n)) largest |x|
of each layer, zeros left out) and over the whole model (`topk_global:DENSITY`, one k for the
whole vector, so large layers can take all of it). Biased; meant to run with error feedback.

`topk_per_layer` is also the selection of the parameter-server family (gradient dropping, DGC,
DGS in `sparse_feedback`, and the servers' replies): one top-k for all."""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from dist_algos.compress import register_compressor
from dist_algos.compress.contract import EncodeContext, Payload
from dist_algos.compress.sparse import IndexSparsifier, density_arg, sparse_payload


def layer_k(sizes: Sequence[int], density: float) -> list[int]:
    """Entries each layer sends: max(1, int(density x n)), at most n."""
    return [min(n, max(1, int(density * n))) for n in sizes]


#: Layers at least this large select through a sampled threshold first (see `_topk_indices`).
SAMPLED_MIN = 65536
SAMPLE_SIZE = 16384


def _topk_indices(magnitude: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest entries that are not zero, ascending. Exact; fast for large
    sparse selections.

    A full `torch.topk` of 1% of a 2.4M-entry layer takes ~50 ms on a CPU core. Instead, a
    strided sample gives a threshold that about 2k entries exceed; the k largest of those
    candidates are the k largest overall whenever there are at least k of them (every entry of
    the top k is at least the k-th largest value, which is at least the threshold). Otherwise,
    or for small layers, plain topk. Zeros are left out (sending one changes nothing): a server's
    reply to a worker that is nearly up to date is mostly zeros.
    """
    n = magnitude.numel()
    if n >= SAMPLED_MIN and 8 * k <= n:
        sample = magnitude[::max(1, n // SAMPLE_SIZE)]
        above = min(sample.numel(), max(1, math.ceil(2 * k * sample.numel() / n)))
        threshold = torch.topk(sample, above, sorted=False).values.min()
        candidates = torch.nonzero(magnitude >= threshold if threshold > 0 else magnitude > 0).flatten()
        if candidates.numel() >= k or threshold == 0:
            if candidates.numel() > k:
                candidates = candidates[torch.topk(magnitude[candidates], k, sorted=False).indices]
            return candidates.sort().values
    idx = torch.topk(magnitude, k, sorted=False).indices
    return idx[magnitude[idx] > 0].sort().values


def topk_per_layer(x: torch.Tensor, sizes: Sequence[int], density: float) -> torch.Tensor:
    """Flat indices of the k largest |x| of each layer (ascending within a layer)."""
    picked = []
    offset = 0
    for n, k in zip(sizes, layer_k(sizes, density)):
        if k >= n:
            idx = torch.arange(n, device=x.device)
        else:
            idx = _topk_indices(x[offset:offset + n].abs(), k)
        picked.append(idx + offset)
        offset += n
    if offset != x.numel():
        raise ValueError(f"layer sizes add up to {offset}, the vector has {x.numel()} entries")
    return torch.cat(picked) if picked else torch.zeros(0, dtype=torch.long, device=x.device)


@register_compressor("topk")
class TopK(IndexSparsifier):
    fixed_size = False  # zeros are left out
    def __init__(self, density: str = "0.01") -> None:
        self.density = density_arg(density)

    def encode(self, x: torch.Tensor, ctx: EncodeContext) -> Payload:
        return sparse_payload(x, topk_per_layer(x, ctx.sizes, self.density))

    def spec(self) -> str:
        return f"topk:{self.density:g}"


@register_compressor("topk_global")
class TopKGlobal(TopK):
    def encode(self, x: torch.Tensor, ctx: EncodeContext) -> Payload:
        k = min(x.numel(), max(1, int(self.density * x.numel())))
        return sparse_payload(x, _topk_indices(x.abs(), k))

    def spec(self) -> str:
        return f"topk_global:{self.density:g}"
