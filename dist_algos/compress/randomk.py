"""Random-k sparsification (Stich et al. 2018; Wangni et al. 2018): k = max(1, int(density x n))
positions drawn without replacement from a seed every worker shares (the step), so no index is
sent and the K workers' values sit at the same positions: the payload is summable. `randomk:D`
sends the values as they are (biased towards zero; for error feedback), `randomk:D:unbiased`
scales them by n / k, which makes E[decode(encode(x))] = x."""
from __future__ import annotations

import torch

from dist_algos.compress import register_compressor
from dist_algos.compress.contract import Combine, Compressor, EncodeContext, Payload
from dist_algos.compress.sparse import dense_from, density_arg


@register_compressor("randomk")
class RandomK(Compressor):
    combine = Combine.SUM
    sparsifier = True

    def __init__(self, density: str = "0.01", mode: str = "") -> None:
        self.density = density_arg(density)
        if mode not in ("", "unbiased"):
            raise ValueError(f"second argument {mode!r} must be 'unbiased' or left out")
        self.scaled = mode == "unbiased"
        self.unbiased = self.scaled

    def indices(self, n: int, ctx: EncodeContext) -> torch.Tensor:
        """The shared positions: identical on every worker at one step."""
        k = min(n, max(1, int(self.density * n)))
        return torch.randperm(n, generator=ctx.generator(shared=True))[:k].sort().values

    def encode(self, x: torch.Tensor, ctx: EncodeContext) -> Payload:
        idx = self.indices(x.numel(), ctx)
        values = x[idx].float()
        if self.scaled:
            values = values * (x.numel() / idx.numel())
        return Payload({"values": values}, x.numel(), info={"indices": idx})

    def decode(self, payload: Payload) -> torch.Tensor:
        return dense_from(payload.info["indices"], payload.tensors["values"], payload.numel)  # type: ignore[arg-type]

    def spec(self) -> str:
        return f"randomk:{self.density:g}" + (":unbiased" if self.scaled else "")
