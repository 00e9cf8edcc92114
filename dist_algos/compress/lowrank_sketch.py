"""Low rank in one round: a random sketch M -> M Q, with Q a Gaussian matrix every worker draws
from the shared seed of the step, decoded as (M Q) Q^T.

Why this and not PowerSGD here: PowerSGD's power iteration needs two collectives per step (P, then
Q from the averaged P) and keeps Q between steps, so it is its own plugin (`algo=powersgd`, equal
to PyTorch's DDP hook; its mathematics in `powersgd_math`). A chain stage is one encode, one
collective, one decode; with Q drawn afresh from a seed every worker shares, nothing but M Q goes
on the wire, the sketch is linear in M (the workers' sketches are summed by one all_reduce,
`Combine.SUM`), and since Q's entries are N(0, 1/r), E[Q Q^T] = I: the decode is unbiased (Var of
entry (i, j) = (|M_i|^2 + M_ij^2) / r), so error feedback or plain averaging both apply. This is
the random down/up projection that Flora (Hao et al., ICML 2024) uses to compress gradients,
applied to communication.

Which layers: each layer of at least two dimensions is a matrix of shape[0] rows (a conv kernel:
out channels x in*kh*kw, as PowerSGD reshapes it); it is sketched when r is smaller than its
columns, and sent as it is otherwise, as are vectors (biases, normalisation) - as PowerSGD does.

`lowrank:R:unbiased` decodes (M Q) Q^T as it is. Its error is about sqrt(cols / R) times |M|, more
than M itself, which error feedback cannot absorb (it needs a contraction: E|C(x) - x|^2 < |x|^2).
`lowrank:R` (R = 4 by default) therefore scales each layer's decode by R / (R + cols + 1), the
factor that minimises E|a (M Q) Q^T - M|^2: the expected error is then (cols + 1) / (R + cols + 1)
of |M|^2, a contraction, at the price of a bias towards zero that error feedback carries."""
from __future__ import annotations

import math

import torch

from dist_algos.compress import register_compressor
from dist_algos.compress.contract import Combine, Compressor, EncodeContext, Payload, layer_bounds

_SALT = 7_919  # the sketches' streams, apart from other stages' shared draws at the same step


@register_compressor("lowrank")
class LowRankSketch(Compressor):
    combine = Combine.SUM

    def __init__(self, rank: str = "4", mode: str = "") -> None:
        self.rank = int(rank)
        if self.rank < 1:
            raise ValueError(f"rank {rank!r} must be a positive integer")
        if mode not in ("", "unbiased"):
            raise ValueError(f"second argument {mode!r} must be 'unbiased' or left out")
        self.unbiased = mode == "unbiased"

    def scale(self, cols: int) -> float:
        """The decode's factor: 1 (unbiased) or the mean-square-optimal R / (R + cols + 1)."""
        return 1.0 if self.unbiased else self.rank / (self.rank + cols + 1)

    def layers(self, ctx: EncodeContext) -> list[tuple[int, int, int, int]]:
        """(start, stop, rows, cols) per layer; rows = 0 where the layer is sent as it is."""
        out = []
        for (a, b), shape in zip(layer_bounds(ctx.sizes), ctx.layer_shapes()):
            rows = shape[0] if len(shape) >= 2 else 0
            cols = (b - a) // rows if rows else 0
            out.append((a, b, rows if rows and self.rank < cols else 0, cols))
        return out

    def sketch(self, ctx: EncodeContext, layer: int, cols: int, device: torch.device) -> torch.Tensor:
        """Q (cols x r), the same on every worker at this step."""
        g = ctx.generator(shared=True, salt=_SALT + layer)
        return (torch.randn(cols, self.rank, generator=g) / math.sqrt(self.rank)).to(device)

    def encode(self, x: torch.Tensor, ctx: EncodeContext) -> Payload:
        sketched, dense, plan = [], [], []
        for i, (a, b, rows, cols) in enumerate(self.layers(ctx)):
            segment = x[a:b].float()
            if not rows:
                dense.append(segment)
                plan.append((a, b, 0, None))
                continue
            q = self.sketch(ctx, i, cols, x.device)
            sketched.append((segment.view(rows, cols) @ q).flatten())
            plan.append((a, b, rows, q * self.scale(cols)))  # (the factor rides on Q^T at decode)
        tensors = {}
        if sketched:
            tensors["sketch"] = torch.cat(sketched)
        if dense:
            tensors["dense"] = torch.cat(dense)
        return Payload(tensors, x.numel(), info={"plan": plan})

    def decode(self, payload: Payload) -> torch.Tensor:
        sketch, dense = payload.tensors.get("sketch"), payload.tensors.get("dense")
        device = (sketch if sketch is not None else dense).device  # type: ignore[union-attr]
        out = torch.empty(payload.numel, dtype=torch.float32, device=device)
        at_sketch = at_dense = 0
        for a, b, rows, q in payload.info["plan"]:  # type: ignore[union-attr]
            if not rows:
                out[a:b] = dense[at_dense:at_dense + b - a]  # type: ignore[index]
                at_dense += b - a
                continue
            n = rows * self.rank
            out[a:b] = (sketch[at_sketch:at_sketch + n].view(rows, self.rank) @ q.T).flatten()  # type: ignore[index]
            at_sketch += n
        return out

    def spec(self) -> str:
        return f"lowrank:{self.rank}" + (":unbiased" if self.unbiased else "")
