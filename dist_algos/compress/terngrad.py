"""TernGrad (Wen et al., NeurIPS 2017), `terngrad`: per layer the scale s = max |g|, and each
entry becomes s sign(g_i) b_i with b_i ~ Bernoulli(|g_i| / s): values in {-s, 0, s}, unbiased,
with E||Q(g) - g||^2 = sum_i (s |g_i| - g_i^2) <= s ||g||_1. On the wire: one float32 scale per
layer and a 2-bit code per entry. (The paper's layer-wise gradient clipping is the trainer's
`train.grad_clip`, not part of the compressor.)"""
from __future__ import annotations

import torch

from dist_algos.compress import register_compressor
from dist_algos.compress.bits import pack, unpack
from dist_algos.compress.blocks import layer_ids, per_layer
from dist_algos.compress.contract import Combine, Compressor, EncodeContext, Payload


@register_compressor("terngrad")
class TernGrad(Compressor):
    combine = Combine.GATHER
    unbiased = True

    def encode(self, x: torch.Tensor, ctx: EncodeContext) -> Payload:
        x = x.float()
        scales = per_layer(x, ctx.sizes, "max")
        s = scales[layer_ids(ctx.sizes)]
        prob = x.abs() / torch.where(s > 0, s, torch.ones_like(s))
        keep = torch.rand(x.shape, generator=ctx.generator(shared=False)) < prob
        code = torch.where(keep, torch.where(x < 0, 2, 1), 0).to(torch.uint8)  # 0: zero, 1: +s, 2: -s
        return Payload({"scales": scales, "codes": pack(code, 2)}, x.numel(), info={"sizes": list(ctx.sizes)})

    def decode(self, payload: Payload) -> torch.Tensor:
        sizes = payload.info["sizes"]
        code = unpack(payload.tensors["codes"], 2, payload.numel)
        s = payload.tensors["scales"][layer_ids(sizes)]  # type: ignore[arg-type]
        return torch.where(code == 1, s, torch.where(code == 2, -s, torch.zeros_like(s)))
