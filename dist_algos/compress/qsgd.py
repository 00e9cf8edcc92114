"""QSGD (Alistarh et al., NeurIPS 2017), `qsgd:S:BUCKET` (S levels, default 4; buckets of 512).

Per bucket of d entries with norm ||v||_2, each entry becomes ||v|| sign(v_i) l_i / S with
l_i = floor(S |v_i| / ||v|| + u), u uniform in [0, 1): stochastic rounding between neighbouring
levels, so E[Q(v)] = v, and E||Q(v) - v||^2 <= min(d / S^2, sqrt(d) / S) ||v||^2 (the paper's
Lemma 3.1). On the wire: one float32 norm per bucket and, per entry, a sign bit and the level,
packed into the smallest of 2, 4 or 8 bits that holds 1 + ceil(log2(S + 1)) bits. The rounding
noise is drawn per worker from (seed, step, rank), so resumption replays it."""
from __future__ import annotations

import math

import torch

from dist_algos.compress import register_compressor
from dist_algos.compress.bits import pack, unpack
from dist_algos.compress.blocks import as_blocks
from dist_algos.compress.contract import Combine, Compressor, EncodeContext, Payload


def code_bits(levels: int) -> int:
    need = 1 + math.ceil(math.log2(levels + 1))
    return next(b for b in (2, 4, 8) if b >= need)


@register_compressor("qsgd")
class QSGD(Compressor):
    combine = Combine.GATHER
    unbiased = True

    def __init__(self, levels: str = "4", bucket: str = "512") -> None:
        self.levels, self.bucket = int(levels), int(bucket)
        if not 1 <= self.levels <= 127 or self.bucket < 1:
            raise ValueError(f"levels {self.levels} must be in 1..127 and bucket {self.bucket} at least 1")
        self.bits = code_bits(self.levels)

    def encode(self, x: torch.Tensor, ctx: EncodeContext) -> Payload:
        v = as_blocks(x.float(), self.bucket)
        norms = v.norm(dim=1, keepdim=True)
        scaled = v.abs() / torch.where(norms > 0, norms, torch.ones_like(norms)) * self.levels
        u = torch.rand(scaled.shape, generator=ctx.generator(shared=False))
        level = torch.floor(scaled + u).clamp_(max=self.levels)
        code = (level * 2 + (v < 0)).to(torch.uint8)  # level in the high bits, the sign in bit 0
        return Payload({"norms": norms.flatten(), "codes": pack(code.flatten(), self.bits)}, x.numel())

    def decode(self, payload: Payload) -> torch.Tensor:
        norms = payload.tensors["norms"]
        code = unpack(payload.tensors["codes"], self.bits, norms.numel() * self.bucket).view(-1, self.bucket).long()
        value = (code >> 1).float() / self.levels * norms.unsqueeze(1)
        value = torch.where(code & 1 == 1, -value, value)
        return value.flatten()[:payload.numel]

    def spec(self) -> str:
        return f"qsgd:{self.levels}:{self.bucket}"
