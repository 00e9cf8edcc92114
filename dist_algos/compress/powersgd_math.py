"""Low-rank gradient compression, the pure part of PowerSGD (Vogels et al., NeurIPS 2019).

A gradient tensor with more than one dimension is a matrix M of n rows (its first dimension)
and m columns (the rest flattened: a convolution's in_channels x kh x kw). PowerSGD approximates
it by P Q^T of rank r with one step of power iteration per training step, from the previous
step's Q: P = M Q, orthogonalise P, Q = M^T P, M ~ P Q^T. Each rank sends P and Q, (n + m) r
numbers instead of n m, and because P and Q are linear in M, all-reducing them gives the
approximation of the mean gradient. The compressing plugin is `dist_algos.powersgd`; the one-round
random sketch of a chain stage (`lowrank:R`) is another method, in `lowrank_sketch`.
"""
from __future__ import annotations

from typing import Optional

import torch


def compressed_shape(shape: torch.Size, rank: int, min_compression_rate: float) -> Optional[tuple[int, int, int]]:
    """(n, m, r) when a gradient of this shape is worth compressing, else None.

    Vectors (biases, norm weights) are sent as they are. A matrix is compressed at rank
    r = min(n, m, rank) only if that sends `min_compression_rate` times fewer numbers:
    (n + m) r x min_compression_rate < n m (the rule of PyTorch's PowerSGD hook)."""
    if len(shape) < 2:
        return None
    n = shape[0]
    m = 1
    for d in shape[1:]:
        m *= d
    r = min(n, m, rank)
    return (n, m, r) if (n + m) * r * min_compression_rate < n * m else None


def orthogonalize_(matrix: torch.Tensor) -> None:
    """Orthonormal columns in place, spanning what the columns spanned.

    Rank 1 and 2 (and half precision, which QR does not take) by Gram-Schmidt, the paper's
    method; higher ranks by a QR factorisation, which is faster there. PyTorch's hook makes the
    same choice, so the two agree to rounding."""
    if matrix.shape[1] <= 2 or matrix.dtype in (torch.float16, torch.bfloat16):
        gram_schmidt_(matrix)
    else:
        q, _ = torch.linalg.qr(matrix)
        matrix.copy_(q)


def gram_schmidt_(matrix: torch.Tensor) -> None:
    """Modified Gram-Schmidt on the columns of an (n, r) matrix, in place. A column that is all
    zeros (a layer whose gradient vanished) stays zero instead of becoming NaN."""
    for i in range(matrix.shape[1]):
        col = matrix[:, i:i + 1]
        norm = torch.linalg.vector_norm(col, dim=0, keepdim=True)
        col.div_(torch.where(norm > 0, norm, torch.ones_like(norm)))
        rest = matrix[:, i + 1:]
        if rest.numel():
            rest.sub_((col * rest).sum(dim=0, keepdim=True) * col)
