"""Deterministic, resumable sharding of a data set over ranks, reshuffled every epoch.

The permutation of epoch e is a pure function of (seed, e), so every rank computes the same one
without communicating, and a run resumed at (epoch, batch) reads exactly the batches the
uninterrupted run would have read. Each rank takes a strided slice of it (as
`DistributedSampler` does) truncated to an equal length, so the shards of an epoch are disjoint
and all ranks take the same number of steps; at most num_shards - 1 samples sit out an epoch,
different ones each epoch.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

_EPOCH_STRIDE = 1_000_003  # keeps (seed, epoch) pairs apart in the generator's seed space


def epoch_seed(seed: int, epoch: int) -> int:
    return (seed * _EPOCH_STRIDE + epoch) % (2**63)


def epoch_shards(n: int, seed: int, epoch: int, num_shards: int) -> torch.Tensor:
    """Every shard's sample indices for the epoch (num_shards x n // num_shards), in reading order."""
    gen = torch.Generator().manual_seed(epoch_seed(seed, epoch))
    perm = torch.randperm(n, generator=gen)
    per_shard = n // num_shards
    return perm[:per_shard * num_shards].view(per_shard, num_shards).t()


def shard_indices(n: int, seed: int, epoch: int, shard: int, num_shards: int) -> torch.Tensor:
    """This shard's sample indices for the epoch, in reading order."""
    if not 0 <= shard < num_shards:
        raise ValueError(f"shard {shard} outside 0..{num_shards - 1}")
    return epoch_shards(n, seed, epoch, num_shards)[shard].contiguous()


class ShardPlan:
    """Every training rank's sample indices (into the training file) of an epoch, in reading order.

    IID over the whole file (`train_idx` None, no `pools`) is exactly `epoch_shards`. IID over a
    training part (the file less the validation samples) permutes the part the same way. With
    `pools` (a label-skewed partition, `data.split`) rank k reads only its pool, in a fresh
    permutation every epoch seeded by (seed, epoch, k). Every rank reads `per_shard` samples an
    epoch: the training part's size over the ranks (the mean pool size), so ranks take equal steps
    and an epoch holds as many samples as IID's. A smaller pool wraps around (its next laps are
    new permutations), a larger one leaves samples out (different ones each epoch).
    """

    def __init__(self, n: int, seed: int, num_shards: int, train_idx: Optional[np.ndarray] = None,
                 pools: Optional[Sequence[np.ndarray]] = None) -> None:
        self.n, self.seed, self.num_shards = n, seed, num_shards
        self.train_idx = None if train_idx is None else torch.as_tensor(np.asarray(train_idx), dtype=torch.int64)
        self.pools = None if pools is None else [torch.as_tensor(np.asarray(p), dtype=torch.int64) for p in pools]
        size = n if self.train_idx is None else len(self.train_idx)
        if self.pools is not None:
            size = sum(len(p) for p in self.pools)
        self.per_shard = size // num_shards

    def orders(self, epoch: int) -> torch.Tensor:
        """num_shards x per_shard: row k is rank k's order for the epoch."""
        if self.pools is None:
            size = self.n if self.train_idx is None else len(self.train_idx)
            shards = epoch_shards(size, self.seed, epoch, self.num_shards)
            return shards if self.train_idx is None else self.train_idx[shards]
        return torch.stack([self._pool_order(epoch, k) for k in range(self.num_shards)])

    def order(self, epoch: int, shard: int) -> torch.Tensor:
        if not 0 <= shard < self.num_shards:
            raise ValueError(f"shard {shard} outside 0..{self.num_shards - 1}")
        if self.pools is None:
            return self.orders(epoch)[shard].contiguous()
        return self._pool_order(epoch, shard)

    def _pool_order(self, epoch: int, shard: int) -> torch.Tensor:
        pool = self.pools[shard]
        gen = torch.Generator().manual_seed((epoch_seed(self.seed, epoch) * _SHARD_STRIDE + shard) % (2**63))
        laps = -(-self.per_shard // max(len(pool), 1))
        order = torch.cat([pool[torch.randperm(len(pool), generator=gen)] for _ in range(laps)])
        return order[:self.per_shard].contiguous()


_SHARD_STRIDE = 1_000_033
_SAMPLE_STRIDE = 2_654_435_761


def sample_seed(seed: int, epoch: int, index: int) -> int:
    """Seed for one sample's random augmentation: independent of worker scheduling, so that
    resumed and uninterrupted runs augment every sample identically."""
    return (epoch_seed(seed, epoch) * _SAMPLE_STRIDE + index) % (2**63)


def sample_seeds(seed: int, epoch: int, indices: torch.Tensor) -> torch.Tensor:
    """`sample_seed` of every index (int64, on the indices' device): one tensor operation, for
    pipelines that augment whole batches on the device."""
    base = (epoch_seed(seed, epoch) * _SAMPLE_STRIDE) % (2**63)
    return (indices.long() + base) & (2**63 - 1)  # int64 addition wraps; the mask is the modulo


def eval_slice(n: int, shard: int, num_shards: int) -> range:
    """Contiguous, nearly equal evaluation shards that together cover all n samples."""
    start = n * shard // num_shards
    stop = n * (shard + 1) // num_shards
    return range(start, stop)
