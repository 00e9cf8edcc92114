"""The device pipeline: an in-memory data set (digits, MNIST-1D, CIFAR) copied to the training device
once, batches gathered and augmented there (`data.device_augment`); a text (a `TextCorpus`)
copied there once and cut into windows there (`data.text.windows`).

Why: reading CIFAR through a DataLoader costs a PIL crop and flip per sample in worker
processes, which on a GPU caps ResNet training at a fraction of what the GPU computes (and on
the CPU spends cores the model could use). Here a batch is an index gather, one crop-and-flip
gather and a normalisation: a few kernels per step, no workers, no host-to-device copies after
the first.

Same samples, same shards: each epoch's order is `data.sampler`'s (the permutation of (seed,
epoch), strided over the training ranks), the evaluation slices `eval_slice`'s, as in every
other pipeline; the indices go to the device once per epoch. Draws come from `sample_seeds(seed,
epoch, index)`, so `batches(epoch, start)` needs no state: a resumed run reads the batches the
uninterrupted one read, and nothing here touches torch's global generator.

A data set takes part by being held in memory (`Samples.in_memory`: uint8 HWC arrays or
normalised tensors) and saying what its batches get (`DataSet.device_augment`).
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Callable, Optional

import numpy as np
import torch

from data.config import DataConfig
from data.samples.base import Samples
from data.device_augment import DeviceAugment
from data.sampler import ShardPlan, eval_slice, sample_seeds
from data.sets import DATASETS
from data.split import TrainSplit
from data.stream import Batch, DataRequest
from data.text.split import TextSplit, text_split
from data.text.windows import WindowEvalStream, WindowTrainStream


def to_device(samples: Samples, device: torch.device, part: Optional[range] = None,
              indices: Optional[np.ndarray] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(images N x H x W x C, labels int64 N) of an in-memory split (or of its samples `indices`,
    then of their `part`) on `device`, copied once."""
    images, labels = samples.tensors_nhwc()
    if indices is not None:
        chosen = torch.as_tensor(np.asarray(indices), dtype=torch.int64)
        images, labels = images[chosen], labels[chosen]
    if part is not None:
        images, labels = images[part.start:part.stop], labels[part.start:part.stop]
    return images.contiguous().to(device), labels.long().to(device)


class DeviceTrainStream:
    def __init__(self, images: torch.Tensor, labels: torch.Tensor, augment: DeviceAugment, batch_size: int,
                 seed: int, shard: int, num_shards: int, plan: Optional[ShardPlan] = None) -> None:
        self.images, self.labels, self.augment = images, labels, augment
        self.batch_size, self.seed, self.shard, self.num_shards = batch_size, seed, shard, num_shards
        self.num_samples = len(labels)
        self.plan = plan if plan is not None else ShardPlan(self.num_samples, seed, num_shards)
        self.steps_per_epoch = self.plan.per_shard // batch_size

    def batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        order = self.plan.order(epoch, self.shard)
        order = order[:self.steps_per_epoch * self.batch_size].to(self.images.device)
        seeds = sample_seeds(self.seed, epoch, order) if self.augment.random else None
        bs = self.batch_size
        for b in range(start, self.steps_per_epoch):
            chosen = order[b * bs:(b + 1) * bs]
            x = self.augment(self.images.index_select(0, chosen), None if seeds is None else seeds[b * bs:(b + 1) * bs])
            yield x, self.labels.index_select(0, chosen)


class DeviceEvalStream:
    def __init__(self, images: torch.Tensor, labels: torch.Tensor, augment: DeviceAugment, batch_size: int,
                 num_samples: int) -> None:
        """images, labels: this rank's `eval_slice` of the `num_samples` test samples."""
        self.images, self.labels, self.augment = images, labels, augment
        self.batch_size, self.num_samples = batch_size, num_samples

    def batches(self) -> Iterator[Batch]:
        for i in range(0, len(self.labels), self.batch_size):
            yield self.augment(self.images[i:i + self.batch_size], None), self.labels[i:i + self.batch_size]


def build_text(cfg: DataConfig, req: DataRequest, with_val: bool = True
               ) -> tuple[Optional[WindowTrainStream], WindowEvalStream, Optional[WindowEvalStream], TextSplit]:
    """A text set (a `TextCorpus`): the corpus's split by blocks and partition (`data.text.split`),
    then this rank's random training windows and its slices of the held-out windows."""
    dataset = DATASETS.get(cfg.name)
    corpus = dataset.samples(cfg, "train")
    context = dataset.spec(cfg).context_length
    split = text_split(corpus, cfg, context, cfg.split_blocks or 0, str(cfg.source_unit), req.seed, req.num_shards)
    train = val = None
    if req.shard is not None:
        train = WindowTrainStream(split.plan, req.shard, req.batch_size, req.device)
    if with_val and len(split.val):
        val = WindowEvalStream(corpus.ids, split.val, context, req.eval_batch_size, req.eval_shard,
                               req.eval_num_shards, req.device)
    test = WindowEvalStream(corpus.ids, split.test, context, req.eval_batch_size, req.eval_shard,
                            req.eval_num_shards, req.device)
    return train, test, val, split


def build(cfg: DataConfig, req: DataRequest, make_split: Callable[[np.ndarray], TrainSplit], with_val: bool = True
          ) -> tuple[Optional[DeviceTrainStream], DeviceEvalStream, Optional[DeviceEvalStream], TrainSplit]:
    """(training shard or None, test slice, validation slice or None, the split)."""
    dataset = DATASETS.get(cfg.name)
    if getattr(dataset.form, "windows", False):
        return build_text(cfg, req, with_val)  # type: ignore[return-value]
    device = torch.device(req.device)
    samples = dataset.samples(cfg, "train")
    split = make_split(samples.label_array())
    train = val = None
    if req.shard is not None:
        images, labels = to_device(samples, device)
        train = DeviceTrainStream(images, labels, dataset.device_augment(cfg, train=True), req.batch_size,
                                  req.seed, req.shard, req.num_shards, split.plan)
    plain = dataset.device_augment(cfg, train=False)
    if with_val and len(split.val):
        images, labels = to_device(samples, device, eval_slice(len(split.val), req.eval_shard, req.eval_num_shards),
                                   split.val)
        val = DeviceEvalStream(images, labels, plain, req.eval_batch_size, len(split.val))
    test = dataset.samples(cfg, "val")
    images, labels = to_device(test, device, eval_slice(len(test), req.eval_shard, req.eval_num_shards))
    return train, DeviceEvalStream(images, labels, plain, req.eval_batch_size, len(test)), val, split
