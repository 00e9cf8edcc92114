"""Compressors in sequence: the first stage sees the vector; every later stage compresses the
previous stage's `values` tensor (the kept values of a sparsifier), e.g. `[topk:0.01, quant:2]`
(SparseLoCo: top-k, then 2 bits per kept value) or `[randomk:0.01, fp16]`.

A chain is summable only when every stage is (random-k's shared positions with fp16 values add up
position by position); it votes when its last stage votes and the earlier ones are summable;
otherwise its payloads are gathered. Its payload is the first stage's tensors but `values`, plus
the later stage's tensors under the prefix `1.`; the number of kept values is known from the
first stage's `indices` (or, for random-k, from the shared positions). Where the first stage
knows how many values each layer kept (the chunked top-k's), the next stage sees those as its
layers, so a per-layer quantiser quantises each tensor's values on their own, as SparseLoCo does."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from dist_algos.compress.contract import Combine, Compressor, EncodeContext, Payload

PREFIX = "1."


class Chain(Compressor):
    name = "chain"

    def __init__(self, stages: Sequence[Compressor]) -> None:
        if len(stages) < 2:
            raise ValueError("a chain has at least two stages")
        for stage in stages[:-1]:
            if not stage.sparsifier:
                raise ValueError(f"{stage.spec()} cannot be followed by another stage: only a sparsifier "
                                 "(topk, topk_global, randomk, threshold, dct_topk) leaves values to compress")
        self.first = stages[0]
        self.rest: Compressor = stages[1] if len(stages) == 2 else Chain(stages[1:])
        combines = [s.combine for s in stages]
        if all(c == Combine.SUM for c in combines):
            self.combine = Combine.SUM  # type: ignore[misc]
        elif combines[-1] == Combine.VOTE and all(c == Combine.SUM for c in combines[:-1]):
            self.combine = Combine.VOTE  # type: ignore[misc]
        elif Combine.VOTE in combines:
            raise ValueError(f"{'+'.join(s.spec() for s in stages)}: a majority vote needs every earlier stage "
                             "summable (shared positions, as randomk)")
        else:
            self.combine = Combine.GATHER  # type: ignore[misc]
        self.unbiased = False  # type: ignore[misc]
        self.sparsifier = False  # type: ignore[misc]
        self.fixed_size = all(s.fixed_size for s in stages)  # type: ignore[misc]

    def encode(self, x: torch.Tensor, ctx: EncodeContext) -> Payload:
        outer = self.first.encode(x, ctx)
        segments = self.first.kept_sizes(outer)
        values = outer.tensors.pop("values")
        inner_ctx = EncodeContext(sizes=segments or [values.numel()], step=ctx.step, rank=ctx.rank,
                                  seed=ctx.seed * 31 + 7)
        inner = self.rest.encode(values, inner_ctx)
        tensors = dict(outer.tensors)
        tensors.update({PREFIX + k: t for k, t in inner.tensors.items()})
        return Payload(tensors, x.numel(), info={"outer": outer.info, "inner": inner.info, "kept": values.numel()})

    def decode(self, payload: Payload) -> torch.Tensor:
        t = payload.tensors
        kept = t["indices"].numel() if "indices" in t else int(payload.info["kept"])  # type: ignore[arg-type]
        inner_info = dict(payload.info["inner"])  # type: ignore[arg-type]
        segments = self.first.kept_sizes(Payload({}, payload.numel, payload.info["outer"]))  # type: ignore[arg-type]
        if "sizes" in inner_info:
            inner_info["sizes"] = segments or [kept]
        inner = Payload({k[len(PREFIX):]: v for k, v in t.items() if k.startswith(PREFIX)}, kept, inner_info)
        outer = {k: v for k, v in t.items() if not k.startswith(PREFIX)}
        outer["values"] = self.rest.decode(inner)
        return self.first.decode(Payload(outer, payload.numel, payload.info["outer"]))  # type: ignore[arg-type]

    def spec(self) -> str:
        return f"{self.first.spec()}+{self.rest.spec()}"
