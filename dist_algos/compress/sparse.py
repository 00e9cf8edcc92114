"""Helpers shared by the sparsifiers: a payload of (indices, values) and its dense decode.

Index encoding: each kept entry's position in the flat vector, in the narrowest signed integer
type that holds the vector's length (`bits.index_dtype`: int16 up to 2^15 entries, int32 up to
2^31), ascending; values in float32 (a chain's next stage may compress them)."""
from __future__ import annotations

import torch

from dist_algos.compress.bits import index_dtype
from dist_algos.compress.contract import Combine, Compressor, Payload


def sparse_payload(x: torch.Tensor, idx: torch.Tensor) -> Payload:
    return Payload({"indices": idx.to(index_dtype(x.numel())), "values": x[idx].float()}, x.numel())


def dense_from(indices: torch.Tensor, values: torch.Tensor, numel: int) -> torch.Tensor:
    out = torch.zeros(numel, dtype=torch.float32)
    out.index_add_(0, indices.long(), values.float())
    return out


class IndexSparsifier(Compressor):
    """A sparsifier that sends each worker's own (indices, values) (`sparse_payload`): gathered,
    each decoded densely."""
    combine = Combine.GATHER
    sparsifier = True

    def decode(self, payload: Payload) -> torch.Tensor:
        return dense_from(payload.tensors["indices"], payload.tensors["values"], payload.numel)


def density_arg(value: str) -> float:
    d = float(value)
    if not 0 < d <= 1:
        raise ValueError(f"density {d} must be in (0, 1]")
    return d
