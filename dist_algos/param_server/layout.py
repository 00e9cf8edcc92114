"""Which server owns which layers: the model's flat parameter vector cut into shards.

With `algo.servers` = S, ranks 0..S-1 serve and the others train. The layers (parameter tensors,
in model order) are split into S contiguous runs of roughly equal size, so that each server owns
one slice [start, end) of the flat vector; per-layer top-k selection never crosses a shard, and
messages carry positions relative to the shard's start (int32 is enough for shards below 2^31
entries).
"""
from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from core.errors import UserError


@dataclass(frozen=True)
class Shard:
    server: int  # the serving rank that owns it
    start: int
    end: int
    sizes: tuple[int, ...]  # its layers' lengths

    @property
    def numel(self) -> int:
        return self.end - self.start

    def of(self, flat: torch.Tensor) -> torch.Tensor:
        """This shard's view of a flat vector."""
        return flat[self.start:self.end]


def partition(sizes: Sequence[int], servers: Sequence[int]) -> list[Shard]:
    """Contiguous runs of layers, one per server, balanced by size (every server gets a layer)."""
    parts = len(servers)
    if parts > len(sizes):
        raise UserError(f"algo.servers={parts} is more than the model's {len(sizes)} parameter tensors; "
                        f"use at most {len(sizes)} servers")
    cumulative = list(itertools.accumulate(sizes))
    total = cumulative[-1] if cumulative else 0
    bounds = [0]
    for s in range(1, parts):
        cut = bisect.bisect_left(cumulative, total * s / parts) + 1
        cut = min(max(cut, bounds[-1] + 1), len(sizes) - (parts - s))
        bounds.append(cut)
    bounds.append(len(sizes))
    offsets = [0, *cumulative]
    return [Shard(server, offsets[a], offsets[b], tuple(sizes[a:b]))
            for server, a, b in zip(servers, bounds[:-1], bounds[1:])]
