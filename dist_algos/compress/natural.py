"""Natural compression (Horvath et al., 2019), `natural`: each entry is rounded stochastically to
one of the two powers of two around it, 2^floor(log2|x|) or twice that, with the probabilities
that make it unbiased; the variance is at most 1/8 ||x||^2. On the wire the paper's 9 bits per
entry: an int8 exponent (-128 marks a zero) and a packed sign bit. Exponents are clamped to
float32's normal range [-126, 127]."""
from __future__ import annotations

import torch

from dist_algos.compress import register_compressor
from dist_algos.compress.bits import pack, unpack
from dist_algos.compress.contract import Combine, Compressor, EncodeContext, Payload

ZERO = -128


@register_compressor("natural")
class Natural(Compressor):
    combine = Combine.GATHER
    unbiased = True

    def encode(self, x: torch.Tensor, ctx: EncodeContext) -> Payload:
        x = x.float()
        mag = x.abs()
        _, exp = torch.frexp(mag)  # mag = m 2^exp, m in [0.5, 1): low = 2^(exp - 1)
        low = torch.ldexp(torch.ones_like(mag), exp - 1)
        up = torch.rand(x.shape, generator=ctx.generator(shared=False)) < (mag - low) / low
        e = (exp - 1 + up.to(exp.dtype)).clamp(-126, 127)
        e = torch.where(mag > 0, e, torch.full_like(e, ZERO)).to(torch.int8)
        return Payload({"exponents": e, "signs": pack((x < 0).to(torch.uint8), 1)}, x.numel())

    def decode(self, payload: Payload) -> torch.Tensor:
        e = payload.tensors["exponents"].to(torch.int32)
        sign = 1.0 - 2.0 * unpack(payload.tensors["signs"], 1, payload.numel).float()
        value = torch.ldexp(torch.ones(payload.numel), e)
        return torch.where(e == ZERO, torch.zeros_like(value), value * sign)
