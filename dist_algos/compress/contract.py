"""The compressor contract: encode a flat vector to a payload of exact wire size, decode it back,
and say how the payloads of K workers combine.

A compressor works on one flat vector holding a model's layers back to back (`sizes` gives their
lengths), as `sparse_feedback` does: per-layer rules (top-k per layer, block scales) see
the layer bounds, whole-model rules ignore them. `encode` returns a `Payload`: the tensors that go
on the wire (and nothing else: their bytes are the wire size, so comm accounting is exact) and
the numbers every worker knows without being told (the vector length, the layer sizes, a shared
random seed). `decode` gives back a dense vector of the input's length.

How payloads combine decides the collective:
- `Combine.SUM`: decode is linear in the payload tensors and every worker's tensors have the same
  shapes and meaning (dense fp16, random-k values at shared indices): the tensors are summed by
  one all_reduce and decoded once, divided by K;
- `Combine.GATHER`: per-worker indices or scales (top-k, QSGD norms, int8 block scales): every
  worker's payload is all_gathered and each is decoded, then averaged;
- `Combine.VOTE`: signSGD with majority vote (Bernstein et al. 2018): the signs are gathered and the
  result is the sign of their sum.
"""
from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Optional

import torch


class Combine(str, enum.Enum):
    SUM = "sum"
    GATHER = "gather"
    VOTE = "vote"


@dataclass
class EncodeContext:
    """What every worker knows when it encodes: the layer sizes, the step (shared) and its rank.

    Randomness is derived from these alone (`generator`), so a resumed run draws the same numbers
    and nothing random has to be checkpointed; `shared=True` gives the same stream on every worker
    (random-k's indices), `shared=False` one stream per worker (stochastic rounding)."""

    sizes: Sequence[int]
    step: int = 0
    rank: int = 0
    seed: int = 0
    #: each layer's tensor shape, for compressors that see matrices (DCT chunks, low rank);
    #: None: every layer is a vector
    shapes: Optional[Sequence[tuple[int, ...]]] = None

    def layer_shapes(self) -> list[tuple[int, ...]]:
        return [tuple(s) for s in self.shapes] if self.shapes is not None else [(n,) for n in self.sizes]

    def generator(self, shared: bool, salt: int = 0) -> torch.Generator:
        g = torch.Generator()
        key = (self.seed * 1_000_003 + self.step) * 65_537 + salt * 257 + (0 if shared else self.rank + 1)
        g.manual_seed(key % (2**63 - 1))
        return g


@dataclass
class Payload:
    """What one worker sends: `tensors` (name -> tensor, all on the wire) and the length of the
    vector they encode. `wire_bytes` is the sum of the tensors' bytes: nothing is counted that is
    not sent and nothing sent is left out (indices, scales and packed signs included)."""

    tensors: dict[str, torch.Tensor]
    numel: int
    info: dict[str, object] = field(default_factory=dict)  # known to every worker, never sent

    @property
    def wire_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


class Compressor(ABC):
    """One stage of a chain. Subclasses set `name` (the registry key), `combine`, and take their
    parameters as positional strings from the chain spec (`topk:0.01` -> density 0.01)."""

    name: ClassVar[str] = ""
    combine: ClassVar[Combine] = Combine.GATHER
    #: whether E[decode(encode(x))] = x (QSGD, TernGrad, random-k scaled): tests check it
    unbiased: ClassVar[bool] = False
    #: whether the output has the input's positions (a sparsifier: a chain's next stage then
    #: compresses only its `values` tensor)
    sparsifier: ClassVar[bool] = False
    #: whether the payload's size is fixed by the vector's layout alone; False where the data
    #: decides it (a threshold; a top-k that leaves zeros out), so a declared pattern can give
    #: only its largest size (dist_algos/comm/pattern.py, `data_dependent`)
    fixed_size: ClassVar[bool] = True

    @abstractmethod
    def encode(self, x: torch.Tensor, ctx: EncodeContext) -> Payload:
        """The payload of the flat float vector `x` (not modified)."""

    @abstractmethod
    def decode(self, payload: Payload) -> torch.Tensor:
        """The dense float32 vector the payload stands for."""

    def kept_sizes(self, payload: Payload) -> Optional[list[int]]:
        """For a sparsifier whose count per layer is known from the payload: how many values each
        layer kept, so a chain's next stage can work per layer (None: one segment)."""
        return None

    def spec(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return self.spec()


def layer_bounds(sizes: Sequence[int]) -> list[tuple[int, int]]:
    out, offset = [], 0
    for n in sizes:
        out.append((offset, offset + n))
        offset += n
    return out
