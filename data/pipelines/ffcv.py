"""The FFCV pipeline: `.beton` files (written by `python -m data.prepare`), JIT-compiled decoding
and augmentation on CPU threads, non-blocking copies to the GPU.

Order: each epoch's sharding is `data.sampler`'s (a permutation seeded from the run's seed and
the epoch, strided over the training ranks: `DataRequest.shard` of `num_shards`), the same
samples in the same order as the torchvision pipeline. FFCV's own `distributed=True` order is not
used: it shards over the global ranks (a parameter server's server rank does not train) and
pads shards with repeated samples.

What is read and how it is decoded and augmented is the data set's (`DataSet.ffcv_image_ops`);
this module adds the tensor conversion, the copy to the device and the order.

Resume: augmentation draws come from `data.ffcv_augment` (keyed by seed, epoch and sample index),
so `batches(epoch, start)` hands FFCV the epoch's order from batch `start` on; the skipped
batches are never read, and the rest equal what the uninterrupted run read.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Callable, Optional

import numba
import numpy as np
import torch
from ffcv.fields.basics import IntDecoder
from ffcv.loader import Loader, OrderOption
from ffcv.loader.epoch_iterator import EpochIterator
from ffcv.pipeline.compiler import Compiler
from ffcv.transforms import ToDevice, ToTensor

from data.config import DataConfig
from data.ffcv_augment import EpochKey
from data.prepared_files import check_prepared, prepared_dir
from data.sampler import ShardPlan, epoch_seed, eval_slice
from data.sets import DATASETS
from data.sets.base import Finish
from data.split import TrainSplit
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
                 batch_size: int, seed: int, shard: int, num_shards: int, plan: Optional[ShardPlan] = None) -> None:
        self.loader, self.epoch_key, self.finish = loader, epoch_key, finish
        self.num_samples, self.batch_size, self.seed = num_samples, batch_size, seed
        self.shard, self.num_shards = shard, num_shards
        self.plan = plan if plan is not None else ShardPlan(num_samples, seed, num_shards)
        self.steps_per_epoch = self.plan.per_shard // batch_size

    def batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        order = self.plan.order(epoch, self.shard).numpy()
        self.epoch_key.set(epoch_seed(self.seed, epoch))
        yield from _iterate(self.loader, order[start * self.batch_size:self.steps_per_epoch * self.batch_size],
                            self.finish)


class FFCVEvalStream:
    """This rank's `eval_slice` of a file's samples, or of its samples `indices` (validation:
    samples of train.beton, read with the evaluation decoder)."""

    def __init__(self, loader: _ShardLoader, finish: Finish, num_samples: int, shard: int, num_shards: int,
                 indices: Optional[np.ndarray] = None) -> None:
        every = np.arange(num_samples) if indices is None else np.asarray(indices, dtype=np.int64)
        self.loader, self.finish, self.num_samples = loader, finish, len(every)
        part = eval_slice(len(every), shard, num_shards)
        self.order = every[part.start:part.stop]

    def batches(self) -> Iterator[Batch]:
        yield from _iterate(self.loader, self.order, self.finish)


def _to_device(device: torch.device) -> list:
    return [ToDevice(device, non_blocking=True)] if device.type == "cuda" else []


def _open(cfg: DataConfig, file: str, batch_size: int, key: EpochKey, device: torch.device,
          train: bool) -> tuple[_ShardLoader, Finish]:
    """A loader of `file`.beton: the data set's decoder and operations (augmenting when
    `train`), then a tensor on `device`; and the data set's step after the loader (such as
    normalisation)."""
    ops, finish = DATASETS.get(cfg.name).ffcv_image_ops(cfg, train, key)
    pipelines = {"image": [*ops, ToTensor(), *_to_device(device)],
                 "label": [IntDecoder(), ToTensor(), *_to_device(device)]}
    return _loader(str(prepared_dir(cfg) / f"{file}.beton"), batch_size, cfg, pipelines), finish


def beton_labels(path: str) -> np.ndarray:
    """The labels of a .beton file in index order, from its metadata table (an `IntField` keeps
    its value there): no sample is decoded."""
    from ffcv.reader import Reader

    reader = Reader(path)
    return np.asarray(reader.metadata[f"f{reader.field_names.index('label')}"], dtype=np.int64)


def build(cfg: DataConfig, req: DataRequest, make_split: Callable[[np.ndarray], TrainSplit], with_val: bool = True
          ) -> tuple[Optional[FFCVTrainStream], FFCVEvalStream, Optional[FFCVEvalStream], TrainSplit]:
    """(training shard or None, test slice, validation slice or None, the split). The validation
    samples are indices into train.beton: the prepared files serve every split size."""
    check_prepared(cfg)
    device = torch.device(req.device)
    split = make_split(beton_labels(str(prepared_dir(cfg) / "train.beton")))
    train = val = None
    if req.shard is not None:
        key = EpochKey()
        loader, finish = _open(cfg, "train", req.batch_size, key, device, train=True)
        train = FFCVTrainStream(loader, key, finish, int(loader.reader.num_samples), req.batch_size,
                                req.seed, req.shard, req.num_shards, split.plan)
    if with_val and len(split.val):
        loader, finish = _open(cfg, "train", req.eval_batch_size, EpochKey(), device, train=False)
        val = FFCVEvalStream(loader, finish, int(loader.reader.num_samples), req.eval_shard, req.eval_num_shards,
                             split.val)
    loader, finish = _open(cfg, "val", req.eval_batch_size, EpochKey(), device, train=False)
    return train, FFCVEvalStream(loader, finish, int(loader.reader.num_samples), req.eval_shard,
                                 req.eval_num_shards), val, split
