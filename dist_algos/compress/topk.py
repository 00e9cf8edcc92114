"""Top-k sparsification: per layer (`topk:DENSITY`, the k = max(1, int(density x n)) largest |x|
of each layer, as the parameter-server family selects: `dist_algos.compressors.topk_per_layer`,
the same code) and over the whole model (`topk_global:DENSITY`, one k for the whole vector, so
large layers can take all of it). Biased; meant to run with error feedback."""
from __future__ import annotations

import torch

from dist_algos.compress import register_compressor
from dist_algos.compress.contract import Combine, Compressor, EncodeContext, Payload
from dist_algos.compress.sparse import dense_from, density_arg, sparse_payload
from dist_algos.compressors import _topk_indices, topk_per_layer


@register_compressor("topk")
class TopK(Compressor):
    combine = Combine.GATHER
    sparsifier = True

    def __init__(self, density: str = "0.01") -> None:
        self.density = density_arg(density)

    def encode(self, x: torch.Tensor, ctx: EncodeContext) -> Payload:
        return sparse_payload(x, topk_per_layer(x, ctx.sizes, self.density))

    def decode(self, payload: Payload) -> torch.Tensor:
        return dense_from(payload.tensors["indices"], payload.tensors["values"], payload.numel)

    def spec(self) -> str:
        return f"topk:{self.density:g}"


@register_compressor("topk_global")
class TopKGlobal(TopK):
    def encode(self, x: torch.Tensor, ctx: EncodeContext) -> Payload:
        k = min(x.numel(), max(1, int(self.density * x.numel())))
        return sparse_payload(x, _topk_indices(x.abs(), k))

    def spec(self) -> str:
        return f"topk_global:{self.density:g}"
