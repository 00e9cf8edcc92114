"""The FFCV pipeline: `.beton` files (written by `python -m data.prepare`), JIT-compiled decoding
and augmentation on CPU threads, non-blocking copies to the GPU.

Order: each epoch's sharding is `data.sampler`'s (a permutation seeded from the run's seed and
the epoch, strided over the training ranks: `DataRequest.shard` of `num_shards`), the same
samples in the same order as the torchvision pipeline. FFCV's own `distributed=True` order is not
used: it shards over the global ranks (a parameter server's server rank does not train) and
pads shards with repeated samples.

What is read and how it is decoded and augmented is the data set's (`DataSet.ffcv_image_ops`);
this module adds the tensor conversion, the copy to the device and the order.

Resume: augmentation draws come from `data.pipelines.ffcv_ops` (keyed by seed, epoch and sample index),
so `batches(epoch, start)` hands FFCV the epoch's order from batch `start` on; the skipped
batches are never read, and the rest equal what the uninterrupted run read.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Optional

import numba
import numpy as np
import torch
from ffcv.fields.basics import IntDecoder
from ffcv.loader import Loader, OrderOption
from ffcv.loader.epoch_iterator import EpochIterator
from ffcv.pipeline.compiler import Compiler
from ffcv.transforms import ToDevice, ToTensor

from data.config import DataConfig
from data.pipelines.ffcv_ops import EpochKey
from data.prepared import check_prepared, prepared_dir
from data.sampler import epoch_seed, eval_slice, shard_indices
from data.sets import DATASETS
from data.sets.base import Finish
from data.stream import Batch, DataRequest


def _numba_threads_only(cls: type, n: int) -> None:
    """FFCV's `Compiler.set_num_threads` also sets torch's intra-op thread count, from its loader
    thread too; that count belongs to the trainer (OMP_NUM_THREADS per rank). This keeps FFCV's
    effect to numba's threads."""
    cls.num_threads = n if n >= 1 else os.cpu_count() or 1
    numba.set_num_threads(min(cls.num_threads, numba.config.NUMBA_NUM_THREADS))


Compiler.set_num_threads = classmethod(_numba_threads_only)
# The training epoch's loader thread keeps prefetching while an evaluation epoch's thread decodes:
# two threads launching parallel kernels at once, which numba's fallback `workqueue` layer does
# not survive. Insist on a layer that does (TBB or OpenMP).
numba.config.THREADING_LAYER = "threadsafe"


class _ShardLoader(Loader):
    """An FFCV `Loader` that reads a given sample order (one epoch of a shard, from a batch on)."""

    def read(self, order: np.ndarray) -> EpochIterator:
        Compiler.set_num_threads(self.num_workers)
        return EpochIterator(self, order.astype(np.uint64))


def _loader(path: str, batch_size: int, cfg: DataConfig, pipelines: dict[str, list]) -> _ShardLoader:
    return _ShardLoader(path, batch_size=batch_size, num_workers=max(1, cfg.num_workers),
                        os_cache=cfg.ffcv.os_cache, order=OrderOption.SEQUENTIAL,
                        pipelines=pipelines, batches_ahead=cfg.ffcv.batches_ahead, drop_last=False)


def _iterate(loader: _ShardLoader, order: np.ndarray, finish: Finish) -> Iterator[Batch]:
    if len(order) == 0:
        return
    epoch = loader.read(order)
    try:
        for images, labels in epoch:
            yield finish(images), labels.view(-1).long().clone()
    finally:
        epoch.close()  # an abandoned epoch must stop its thread


class FFCVTrainStream:
    def __init__(self, loader: _ShardLoader, epoch_key: EpochKey, finish: Finish, num_samples: int,
                 batch_size: int, seed: int, shard: int, num_shards: int) -> None:
        self.loader, self.epoch_key, self.finish = loader, epoch_key, finish
        self.num_samples, self.batch_size, self.seed = num_samples, batch_size, seed
        self.shard, self.num_shards = shard, num_shards
        self.steps_per_epoch = (num_samples // num_shards) // batch_size

    def batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        order = shard_indices(self.num_samples, self.seed, epoch, self.shard, self.num_shards).numpy()
        self.epoch_key.set(epoch_seed(self.seed, epoch))
        yield from _iterate(self.loader, order[start * self.batch_size:self.steps_per_epoch * self.batch_size],
                            self.finish)


class FFCVEvalStream:
    def __init__(self, loader: _ShardLoader, finish: Finish, num_samples: int, shard: int, num_shards: int) -> None:
        self.loader, self.finish, self.num_samples = loader, finish, num_samples
        part = eval_slice(num_samples, shard, num_shards)
        self.order = np.arange(part.start, part.stop)

    def batches(self) -> Iterator[Batch]:
        yield from _iterate(self.loader, self.order, self.finish)


def _to_device(device: torch.device) -> list:
    return [ToDevice(device, non_blocking=True)] if device.type == "cuda" else []


def _open(cfg: DataConfig, split: str, batch_size: int, key: EpochKey,
          device: torch.device) -> tuple[_ShardLoader, Finish]:
    """The split's loader: the data set's decoder and operations (augmenting for "train"), then
    a tensor on `device`; and the data set's step after the loader (such as normalisation)."""
    ops, finish = DATASETS.get(cfg.name).ffcv_image_ops(cfg, split == "train", key)
    pipelines = {"image": [*ops, ToTensor(), *_to_device(device)],
                 "label": [IntDecoder(), ToTensor(), *_to_device(device)]}
    return _loader(str(prepared_dir(cfg) / f"{split}.beton"), batch_size, cfg, pipelines), finish


def build(cfg: DataConfig, req: DataRequest) -> tuple[Optional[FFCVTrainStream], FFCVEvalStream]:
    check_prepared(cfg)
    device = torch.device(req.device)
    train = None
    if req.shard is not None:
        key = EpochKey()
        loader, finish = _open(cfg, "train", req.batch_size, key, device)
        train = FFCVTrainStream(loader, key, finish, int(loader.reader.num_samples), req.batch_size,
                                req.seed, req.shard, req.num_shards)
    loader, finish = _open(cfg, "val", req.eval_batch_size, EpochKey(), device)
    return train, FFCVEvalStream(loader, finish, int(loader.reader.num_samples), req.eval_shard,
                                 req.eval_num_shards)
