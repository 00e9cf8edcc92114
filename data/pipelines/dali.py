"""The DALI pipeline: `fn.readers.file` sharded over the training ranks (shard_id = this rank's
index among them, num_shards = their number), decoding on the CPU without a GPU
(`device_id=None`) and `mixed` (nvJPEG) decoding with one; `DALIGenericIterator` into torch.

What it reads: an ImageFolder data set (ImageNet) in place under `data.root` (torchvision's file
order); CIFAR and digits, the one-file-per-sample copy `python -m data.prepare data.pipeline=dali`
writes (lossless PNG; digits as .npy of the normalised tensor), listed in index order. How a file
becomes the model's input (decoding, augmentation, normalisation) is the data set's DALI graph
(`DataSet.dali_images`).

Order: each epoch the reader gets the file list in `data.sampler`'s order, laid out so that
DALI's contiguous shard `shard_id` is exactly this rank's strided shard: the same samples in the
same order as the torchvision pipeline. Shuffling inside DALI is off.

Resume: one pipeline per epoch, seeded from (seed, epoch, shard), which is what DALI's
maintainers advise instead of saving random state (NVIDIA/DALI#1378): its random operators draw
from counter-based generators, so a pipeline with that seed, fed the same files, yields the same
batches. `batches(epoch, start)` builds the epoch's pipeline and drops its first `start` batches;
what follows equals the uninterrupted run's. The price: a resume in mid-epoch re-reads that
many batches of this rank (none when resuming at an epoch boundary).
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Optional

import numpy as np
import torch
from nvidia.dali import fn, pipeline_def
from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

from data.config import DataConfig
from data.prepared import check_prepared, needs_preparation, prepared_dir
from data.sampler import epoch_shards, eval_slice
from data.sets import DATASETS
from data.stream import Batch, DataRequest


def file_list(cfg: DataConfig, split: str) -> tuple[list[str], list[int]]:
    """(paths, labels) of a split in the data set's index order: its own files where DALI reads
    them in place, else the copy `data.prepare` listed in <dir>/<split>.txt."""
    if not needs_preparation(cfg):
        return DATASETS.get(cfg.name).samples(cfg, split).files_in_place()
    folder = prepared_dir(cfg)
    paths, labels = [], []
    for line in (folder / f"{split}.txt").read_text().splitlines():
        rel, label = line.rsplit(" ", 1)
        paths.append(str(folder / rel))
        labels.append(int(label))
    return paths, labels


@pipeline_def
def _graph(cfg: DataConfig, files: list[str], labels: list[int], shard: int, num_shards: int, train: bool,
           decoder: str, pad_last_batch: bool) -> tuple[Any, Any]:
    encoded, label = fn.readers.file(files=files, labels=labels, shard_id=shard, num_shards=num_shards,
                                     random_shuffle=False, stick_to_shard=True, pad_last_batch=pad_last_batch,
                                     name="reader")
    images = DATASETS.get(cfg.name).dali_images(cfg, encoded, train, decoder)
    return images, (label.gpu() if decoder == "mixed" else label)


class _Builder:
    """Builds this rank's pipelines: device, threads and queue depth from the config."""

    def __init__(self, cfg: DataConfig, device: torch.device) -> None:
        self.cfg = cfg
        self.device_id = device.index if device.type == "cuda" else None  # None: CPU only
        self.decoder = "mixed" if device.type == "cuda" else "cpu"

    def iterator(self, files: list[str], labels: list[int], shard: int, num_shards: int, batch_size: int,
                 train: bool, seed: int) -> DALIGenericIterator:
        pipe = _graph(self.cfg, files, labels, shard, num_shards, train, self.decoder, not train,
                      batch_size=batch_size, num_threads=max(1, self.cfg.num_workers), device_id=self.device_id,
                      seed=seed, prefetch_queue_depth=self.cfg.dali.prefetch_queue_depth)
        policy = LastBatchPolicy.DROP if train else LastBatchPolicy.PARTIAL
        return DALIGenericIterator([pipe], ["x", "y"], reader_name="reader", last_batch_policy=policy,
                                   auto_reset=not train)


def _pipeline_seed(seed: int, epoch: int, shard: int) -> int:
    return int(np.random.SeedSequence([seed, epoch, shard]).generate_state(1)[0] & 0x7FFFFFFF)


def _batch(out: list[dict[str, torch.Tensor]]) -> Batch:
    return out[0]["x"], out[0]["y"].view(-1).long()


class DALITrainStream:
    def __init__(self, builder: _Builder, files: list[str], labels: list[int], batch_size: int, seed: int,
                 shard: int, num_shards: int) -> None:
        self.builder, self.files, self.labels = builder, np.asarray(files), np.asarray(labels)
        self.batch_size, self.seed, self.shard, self.num_shards = batch_size, seed, shard, num_shards
        self.num_samples = len(files)
        self.steps_per_epoch = (self.num_samples // num_shards) // batch_size

    def batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        if start >= self.steps_per_epoch:
            return
        # every shard's part of the epoch, back to back: DALI's shard k is then shard k's part
        order = epoch_shards(self.num_samples, self.seed, epoch, self.num_shards)
        order = order[:, :self.steps_per_epoch * self.batch_size].reshape(-1).numpy()
        it = self.builder.iterator(self.files[order].tolist(), self.labels[order].tolist(), self.shard,
                                   self.num_shards, self.batch_size, True,
                                   _pipeline_seed(self.seed, epoch, self.shard))
        for step, out in enumerate(it):
            if step >= start:  # the first `start` batches are replayed to restore DALI's state
                yield _batch(out)


class DALIEvalStream:
    def __init__(self, builder: _Builder, files: list[str], labels: list[int], batch_size: int, shard: int,
                 num_shards: int) -> None:
        self.num_samples = len(files)
        self._it: Optional[DALIGenericIterator] = None
        if len(eval_slice(len(files), shard, num_shards)):  # DALI's shards are eval_slice's
            self._it = builder.iterator(files, labels, shard, num_shards, batch_size, False, 0)

    def batches(self) -> Iterator[Batch]:
        if self._it is not None:
            for out in self._it:
                yield _batch(out)


def build(cfg: DataConfig, req: DataRequest) -> tuple[Optional[DALITrainStream], DALIEvalStream]:
    check_prepared(cfg)
    builder = _Builder(cfg, torch.device(req.device))
    train = None
    if req.shard is not None:
        train = DALITrainStream(builder, *file_list(cfg, "train"), req.batch_size, req.seed, req.shard,
                                req.num_shards)
    evals = DALIEvalStream(builder, *file_list(cfg, "val"), req.eval_batch_size, req.eval_shard,
                           req.eval_num_shards)
    return train, evals
