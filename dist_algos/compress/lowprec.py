"""Plain low-precision transfer.

- `fp16`, `bf16`: each entry cast (round to nearest); summable, so the K payloads are added by one
  all_reduce in that precision (as DDP's fp16/bf16 compression hooks do);
- `int8:BLOCK` (default 256): per block of BLOCK entries a float32 scale max|x| / 127 and one
  int8 per entry, rounded to nearest (the block-wise quantisation of 8-bit optimizers and of
  Streaming DiLoCo's low-precision outer gradients); scales differ per worker, so gathered;
- `fp8:BLOCK`: float8 e4m3 values with a float32 scale per block (max|x| maps to 448), gathered.
"""
from __future__ import annotations

import torch

from dist_algos.compress import register_compressor
from dist_algos.compress.blocks import as_blocks
from dist_algos.compress.contract import Combine, Compressor, EncodeContext, Payload


class Cast(Compressor):
    combine = Combine.SUM
    dtype = torch.float16

    def encode(self, x: torch.Tensor, ctx: EncodeContext) -> Payload:
        return Payload({"values": x.to(self.dtype)}, x.numel())

    def decode(self, payload: Payload) -> torch.Tensor:
        return payload.tensors["values"].float()


@register_compressor("fp16")
class Fp16(Cast):
    dtype = torch.float16


@register_compressor("bf16")
class Bf16(Cast):
    dtype = torch.bfloat16


@register_compressor("int8")
class Int8Blocks(Compressor):
    combine = Combine.GATHER
    top = 127.0

    def __init__(self, block: str = "256") -> None:
        self.block = int(block)
        if self.block < 1:
            raise ValueError(f"block {self.block} must be at least 1")

    def _scales(self, v: torch.Tensor) -> torch.Tensor:
        amax = v.abs().amax(dim=1, keepdim=True)
        return torch.where(amax > 0, amax / self.top, torch.ones_like(amax))

    def encode(self, x: torch.Tensor, ctx: EncodeContext) -> Payload:
        v = as_blocks(x.float(), self.block)
        scales = self._scales(v)
        q = torch.round(v / scales).clamp_(-self.top, self.top).to(torch.int8)
        return Payload({"scales": scales.flatten(), "values": q.flatten()[:x.numel()]}, x.numel())

    def decode(self, payload: Payload) -> torch.Tensor:
        scales = payload.tensors["scales"]
        q = payload.tensors["values"].float()
        return q * scales.repeat_interleave(self.block)[:payload.numel]

    def spec(self) -> str:
        return f"{self.name}:{self.block}"


@register_compressor("fp8")
class Fp8Blocks(Int8Blocks):
    top = 448.0  # float8 e4m3's largest finite value

    def encode(self, x: torch.Tensor, ctx: EncodeContext) -> Payload:
        v = as_blocks(x.float(), self.block)
        scales = self._scales(v)
        q = (v / scales).clamp_(-self.top, self.top).to(torch.float8_e4m3fn)
        return Payload({"scales": scales.flatten(), "values": q.flatten()[:x.numel()].view(torch.uint8)}, x.numel())

    def decode(self, payload: Payload) -> torch.Tensor:
        q = payload.tensors["values"].view(torch.float8_e4m3fn).float()
        return q * payload.tensors["scales"].repeat_interleave(self.block)[:payload.numel]
