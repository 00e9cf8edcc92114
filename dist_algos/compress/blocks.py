"""Cutting a flat vector into fixed-size blocks (zero-padded at the end) and into its layers, for
compressors with one scale per block or per layer."""
from __future__ import annotations

from collections.abc import Sequence

import torch


def as_blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    """(ceil(n / block), block) view of x, the last block zero-padded."""
    n = x.numel()
    rows = max(1, -(-n // block))
    if rows * block == n:
        return x.reshape(rows, block)
    out = torch.zeros(rows * block, dtype=x.dtype)
    out[:n] = x.reshape(-1)
    return out.view(rows, block)


def layer_ids(sizes: Sequence[int]) -> torch.Tensor:
    """For each entry of the flat vector, the index of its layer (for per-layer scales)."""
    return torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(list(sizes), dtype=torch.long))


def per_layer(x: torch.Tensor, sizes: Sequence[int], reduce: str) -> torch.Tensor:
    """One number per layer: 'max' of |x|, 'l1' (sum of |x|) or 'l2' norm."""
    pieces = x.float().split(list(sizes))
    if reduce == "max":
        return torch.stack([p.abs().max() if p.numel() else p.new_zeros(()) for p in pieces])
    if reduce == "l1":
        return torch.stack([p.abs().sum() for p in pieces])
    return torch.stack([p.norm() for p in pieces])
