"""`quant:BITS` (default 2): uniform quantisation of a vector to 2^BITS levels spread evenly over
[-m, m], m = max |x| of the vector, rounded to the nearest level: one float32 scale and BITS bits
per entry. Meant as the second stage of a chain, quantising a sparsifier's kept values (SparseLoCo's
top-k then 2-bit quantisation); biased, its error left to error feedback."""
from __future__ import annotations

import torch

from dist_algos.compress import register_compressor
from dist_algos.compress.bits import pack, unpack
from dist_algos.compress.contract import Combine, Compressor, EncodeContext, Payload


@register_compressor("quant")
class Uniform(Compressor):
    combine = Combine.GATHER

    def __init__(self, bits: str = "2") -> None:
        self.bits = int(bits)
        if self.bits not in (1, 2, 4, 8):
            raise ValueError(f"bits {self.bits} must be 1, 2, 4 or 8")
        self.steps = 2**self.bits - 1

    def encode(self, x: torch.Tensor, ctx: EncodeContext) -> Payload:
        x = x.float()
        m = x.abs().max() if x.numel() else torch.zeros(())
        scale = m if m > 0 else torch.ones(())
        code = torch.round((x / scale + 1) / 2 * self.steps).clamp_(0, self.steps).to(torch.uint8)
        return Payload({"scale": scale.reshape(1), "codes": pack(code, self.bits)}, x.numel())

    def decode(self, payload: Payload) -> torch.Tensor:
        code = unpack(payload.tensors["codes"], self.bits, payload.numel).float()
        return (code / self.steps * 2 - 1) * payload.tensors["scale"]

    def spec(self) -> str:
        return f"quant:{self.bits}"
