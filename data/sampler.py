"""Deterministic, resumable sharding of a data set over ranks, reshuffled every epoch.

The permutation of epoch e is a pure function of (seed, e), so every rank computes the same one
without communicating, and a run resumed at (epoch, batch) reads exactly the batches the
uninterrupted run would have read. Each rank takes a strided slice of it (as
`DistributedSampler` does) truncated to an equal length, so the shards of an epoch are disjoint
and all ranks take the same number of steps; at most num_shards - 1 samples sit out an epoch,
different ones each epoch.
"""
from __future__ import annotations

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
