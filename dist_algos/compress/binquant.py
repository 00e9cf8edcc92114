"""`binquant:BITS:RANGE` (default 2 bits, 6 standard deviations): the statistical quantiser of
SparseLoCo's kept values (Sarfi et al. 2025; the design of templar's compressor). The values are
centred on their mean; the bin width is RANGE sigma / 2^BITS (sigma the centred values' standard
deviation, n - 1 in its denominator); each value gets the bin round(c / width) + 2^(BITS-1),
clamped to the 2^BITS bins; and each bin decodes to the mean of the centred values that fell in it
(a lookup table sent with the codes), plus the shift. Per layer (each tensor's values on their
own, as templar quantises per parameter). On the wire: BITS bits per value and, per layer,
2^BITS float32 table entries and the float32 shift. Biased; for error feedback."""
from __future__ import annotations

import math

import torch

from dist_algos.compress import register_compressor
from dist_algos.compress.bits import pack, unpack
from dist_algos.compress.contract import Combine, Compressor, EncodeContext, Payload


@register_compressor("binquant")
class BinQuant(Compressor):
    combine = Combine.GATHER

    def __init__(self, bits: str = "2", sigmas: str = "6") -> None:
        self.bits, self.sigmas = int(bits), float(sigmas)
        if self.bits not in (1, 2, 4, 8) or self.sigmas <= 0:
            raise ValueError(f"bits {self.bits} must be 1, 2, 4 or 8 and the range {self.sigmas} positive")
        self.bins = 2**self.bits

    def _segment(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        shift = x.mean() if x.numel() else torch.zeros(())
        centred = x - shift
        std = centred.norm() / math.sqrt(max(1, centred.numel() - 1))
        width = self.sigmas * std / self.bins
        if not bool(torch.isfinite(width)) or float(width) == 0:
            width = torch.ones(())
        code = (centred / width + self.bins // 2).round().clamp(0, self.bins - 1).to(torch.uint8)
        sums = torch.zeros(self.bins).scatter_add_(0, code.long(), centred)
        counts = torch.zeros(self.bins).scatter_add_(0, code.long(), torch.ones_like(centred))
        table = torch.where(counts > 0, sums / counts.clamp(min=1), torch.zeros_like(sums))
        return code, table, shift.reshape(1)

    def encode(self, x: torch.Tensor, ctx: EncodeContext) -> Payload:
        parts = [self._segment(seg) for seg in x.float().split(list(ctx.sizes))]
        codes = torch.cat([c for c, _, _ in parts]) if parts else torch.zeros(0, dtype=torch.uint8)
        return Payload({"codes": pack(codes, self.bits), "table": torch.cat([t for _, t, _ in parts]),
                        "shift": torch.cat([s for _, _, s in parts])}, x.numel(), info={"sizes": list(ctx.sizes)})

    def decode(self, payload: Payload) -> torch.Tensor:
        sizes = payload.info["sizes"]
        code = unpack(payload.tensors["codes"], self.bits, payload.numel).long()
        seg = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes, dtype=torch.long))  # type: ignore[arg-type]
        table = payload.tensors["table"].view(-1, self.bins)
        return table[seg, code] + payload.tensors["shift"][seg]

    def spec(self) -> str:
        return f"binquant:{self.bits}:{self.sigmas:g}"
