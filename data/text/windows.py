"""Windows of a character corpus on the training device: seeded random training windows per rank,
fixed evaluation windows of the held-out blocks.

A window of context T at position s is the T + 1 tokens s .. s + T: the input is the first T, the
target the last T (position t predicts token t + 1). Training windows are drawn uniformly from a
rank's pool (`Pool`: intervals of a token tensor, a window lying wholly inside one interval), one
draw per (seed, epoch, rank, position in the epoch) through the counter-based generator of the
device pipeline (`data.sampler.sample_seeds`, `data.device_augment.draw`). So a batch is a
pure function of where it is: `batches(epoch, start)` resumes at the exact batch with no state,
ranks read different windows (their positions differ), and nothing touches torch's generator.

An epoch is as many windows as tile the training part once (`WindowPlan.num_windows`), shared
equally by the training ranks, whatever their pools (as `data.sampler.ShardPlan` gives every rank
of a skewed partition the same steps). Evaluation windows tile each held-out block without
overlap (the block's last partial window is left out), so every held-out character but the
first of each window's block is predicted once; they are split over the evaluating ranks by
`data.sampler.eval_slice`.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from data.device_augment import draw
from data.sampler import eval_slice, sample_seeds

Batch = tuple[torch.Tensor, torch.Tensor]
SALT_WINDOW = 0x5EED10  # the window draws' own stream (device_ops' crops use 0x5EED01..03)


@dataclass(frozen=True, eq=False)
class Pool:
    """Where one rank's training windows start: in `tokens` (the corpus, or the rank's own text),
    inside the intervals [lo, lo + count + T]: `count` start positions each."""

    tokens: torch.Tensor  # uint8 token ids
    lo: np.ndarray  # int64, each interval's first start
    count: np.ndarray  # int64, start positions of each interval (its length - T, at least 0)

    @classmethod
    def of(cls, tokens: torch.Tensor, intervals: Sequence[tuple[int, int]], context: int) -> "Pool":
        spans = np.asarray(intervals, dtype=np.int64).reshape(-1, 2)
        count = np.maximum(spans[:, 1] - spans[:, 0] - context, 0)
        keep = count > 0
        return cls(tokens, spans[keep, 0], count[keep])

    @property
    def size(self) -> int:
        return int(self.count.sum())


def window_batch(tokens: torch.Tensor, starts: torch.Tensor, context: int) -> Batch:
    """(inputs, targets), both len(starts) x T int64, of the windows at `starts`."""
    rows = tokens[starts[:, None] + torch.arange(context + 1, device=tokens.device)].long()
    return rows[:, :-1], rows[:, 1:]


class WindowPlan:
    """Every training rank's pool and the epoch's length: `per_shard` windows a rank, an epoch."""

    def __init__(self, pools: Sequence[Pool], num_windows: int, seed: int, context: int) -> None:
        self.pools, self.num_windows, self.seed, self.context = list(pools), num_windows, seed, context
        self.num_shards = len(self.pools)
        self.per_shard = num_windows // self.num_shards
        self._tables: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}

    def _table(self, shard: int, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
        """(each interval's first start, the pool positions where it begins) on `device`, made once."""
        key = (shard, str(device))
        if key not in self._tables:
            pool = self.pools[shard]
            offsets = np.concatenate([[0], np.cumsum(pool.count)[:-1]]).astype(np.int64)
            self._tables[key] = (torch.as_tensor(pool.lo, device=device), torch.as_tensor(offsets, device=device))
        return self._tables[key]

    def starts(self, epoch: int, shard: int, first: int, count: int, device: torch.device | str = "cpu"
               ) -> torch.Tensor:
        """Positions (in the pool's tokens) of rank `shard`'s windows first .. first + count - 1 of
        the epoch: one draw each, keyed by (seed, epoch, shard x per_shard + position)."""
        lo, offsets = self._table(shard, device)
        index = torch.arange(first, first + count, dtype=torch.int64, device=device) + shard * self.per_shard
        k = draw(sample_seeds(self.seed, epoch, index), SALT_WINDOW, self.pools[shard].size)
        interval = torch.searchsorted(offsets, k, right=True) - 1
        return lo[interval] + (k - offsets[interval])


class WindowTrainStream:
    """One rank's training windows, its pool's tokens held on `device`."""

    def __init__(self, plan: WindowPlan, shard: int, batch_size: int, device: torch.device | str) -> None:
        self.plan, self.shard, self.batch_size, self.device = plan, shard, batch_size, torch.device(device)
        self.tokens = plan.pools[shard].tokens.to(self.device)
        self.num_samples = plan.num_windows
        self.steps_per_epoch = plan.per_shard // batch_size

    def batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        bs = self.batch_size
        for b in range(start, self.steps_per_epoch):
            yield window_batch(self.tokens, self.plan.starts(epoch, self.shard, b * bs, bs, self.device),
                               self.plan.context)


def tiling_starts(intervals: Sequence[tuple[int, int]], context: int, limit: int | None = None) -> np.ndarray:
    """Starts of the non-overlapping windows that tile each interval (a window needs T + 1 tokens);
    with `limit`, at most that many of them, evenly spaced over the whole list (a fixed subset: the
    same windows at every evaluation and in every run)."""
    starts = [np.arange(lo, hi - context, context, dtype=np.int64) for lo, hi in intervals]
    every = np.concatenate(starts) if starts else np.zeros(0, dtype=np.int64)
    if limit is None or len(every) <= limit:
        return every
    return every[np.unique(np.round(np.linspace(0, len(every) - 1, limit)).astype(np.int64))]


class WindowEvalStream:
    """This rank's `eval_slice` of a held-out part's fixed windows."""

    def __init__(self, tokens: torch.Tensor, starts: np.ndarray, context: int, batch_size: int, shard: int,
                 num_shards: int, device: torch.device | str) -> None:
        self.num_samples = len(starts)
        part = eval_slice(len(starts), shard, num_shards)
        self.starts = torch.as_tensor(starts[part.start:part.stop], device=device)
        self.tokens, self.context, self.batch_size = tokens.to(device), context, batch_size

    def batches(self) -> Iterator[Batch]:
        for i in range(0, len(self.starts), self.batch_size):
            yield window_batch(self.tokens, self.starts[i:i + self.batch_size], self.context)
