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

One pipeline for the whole run, where the data set's graph takes its random draws as inputs
(`DataSet.dali_draws`: CIFAR's crop offsets and flips, digits' none): the training files reach
DALI through an external source fed from `data.sampler`'s order of each epoch, with the draws
computed from `sample_seeds(seed, epoch, index)`, so an epoch boundary costs no rebuild (the
pipeline is reset and fed the next epoch), and `batches(epoch, start)` feeds from batch `start`
on: a resume reads nothing twice. The files are read in Python, from memory once read when the
split's files are small (CIFAR's and digits' copies).

Where the graph draws from DALI's own generators (ImageNet's random crop, drawn inside the
decoder so that only the crop is decoded), one pipeline per epoch, seeded from (seed, epoch,
shard), which is what DALI's maintainers advise instead of saving random state
(NVIDIA/DALI#1378): its random operators draw from counter-based generators, so a pipeline with
that seed, fed the same files, yields the same batches. `batches(epoch, start)` builds the
epoch's pipeline and drops its first `start` batches; what follows equals the uninterrupted
run's. The price: a build per epoch (made when the previous epoch hands out its last batch, so
that its queue fills while that batch trains), and a resume in mid-epoch re-reads that many
batches.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, Callable, Optional

import numpy as np
import torch
from nvidia.dali import fn, pipeline_def, types
from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

from data.config import DataConfig
from data.prepared_files import check_prepared, needs_preparation, prepared_dir
from data.sampler import ShardPlan, eval_slice, sample_seeds
from data.sets import DATASETS
from data.sets.base import KeyedDraws
from data.split import TrainSplit
from data.stream import Batch, DataRequest

#: the training files are kept in memory once read when all of them together are smaller
CACHE_BYTES = 2 * 2**30
_DALI_TYPES = {np.dtype(np.float32): types.FLOAT, np.dtype(np.int32): types.INT32, np.dtype(np.int64): types.INT64}


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


@pipeline_def
def _fed_graph(cfg: DataConfig, feed: Any, train: bool, decoder: str) -> tuple[Any, Any]:
    names = list(feed.draws.dtypes)
    dtypes = [types.UINT8, types.INT64] + [_DALI_TYPES[np.dtype(feed.draws.dtypes[n])] for n in names]
    encoded, label, *drawn = fn.external_source(source=feed, num_outputs=2 + len(names), cycle="raise",
                                                dtype=dtypes, ndim=[1, 0] + [0] * len(names))
    images = DATASETS.get(cfg.name).dali_images(cfg, encoded, train, decoder, draws=dict(zip(names, drawn)))
    return images, (label.gpu() if decoder == "mixed" else label)


class _Feed:
    """What DALI's external source reads: the files of one epoch's shard, batch by batch from a
    chosen batch on, with their labels and keyed draws. DALI calls `iter()` at the start and
    again after each end of epoch (cycle="raise"); the generator's body reads the order set by
    `set` only when DALI first asks it for a batch, so the stream sets the next epoch before
    resetting the pipeline."""

    def __init__(self, files: np.ndarray, labels: np.ndarray, batch_size: int, draws: KeyedDraws) -> None:
        self.files, self.labels, self.batch_size, self.draws = files, labels, batch_size, draws
        self.order = np.zeros(0, dtype=np.int64)
        self.seeds = np.zeros(0, dtype=np.int64)
        self.start = 0
        self._cache: Optional[dict[int, np.ndarray]] = {} if _total_bytes(files) <= CACHE_BYTES else None

    def set(self, order: np.ndarray, seeds: np.ndarray, start: int) -> None:
        self.order, self.seeds, self.start = order, seeds, start

    def _read(self, index: int) -> np.ndarray:
        if self._cache is None:
            return np.fromfile(self.files[index], dtype=np.uint8)
        if index not in self._cache:
            self._cache[index] = np.fromfile(self.files[index], dtype=np.uint8)
        return self._cache[index]

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        order, seeds, bs = self.order, self.seeds, self.batch_size
        for b in range(self.start, len(order) // bs):
            chosen = order[b * bs:(b + 1) * bs]
            drawn = self.draws.make(seeds[b * bs:(b + 1) * bs])
            yield ([self._read(int(i)) for i in chosen], self.labels[chosen],
                   *(drawn[name] for name in self.draws.dtypes))


def _total_bytes(files: np.ndarray) -> int:
    total = 0
    for path in files:
        total += os.path.getsize(path)
        if total > CACHE_BYTES:
            break
    return total


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

    def fed_iterator(self, feed: _Feed, train: bool, seed: int) -> DALIGenericIterator:
        """An iterator over a pipeline that `feed` feeds; each epoch ends when the feed does."""
        pipe = _fed_graph(self.cfg, feed, train, self.decoder, batch_size=feed.batch_size,
                          num_threads=max(1, self.cfg.num_workers), device_id=self.device_id, seed=seed,
                          prefetch_queue_depth=self.cfg.dali.prefetch_queue_depth)
        return DALIGenericIterator([pipe], ["x", "y"], auto_reset=False)


def _pipeline_seed(seed: int, epoch: int, shard: int) -> int:
    return int(np.random.SeedSequence([seed, epoch, shard]).generate_state(1)[0] & 0x7FFFFFFF)


def _batch(out: list[dict[str, torch.Tensor]]) -> Batch:
    return out[0]["x"], out[0]["y"].view(-1).long()


class DALITrainStream:
    """A pipeline per epoch (graphs that draw from DALI's generators). The next epoch's pipeline
    is built when the last batch of an epoch is handed out, so that it fills its prefetch queue
    while that batch trains and the run evaluates, rather than after."""

    def __init__(self, builder: _Builder, files: list[str], labels: list[int], batch_size: int, seed: int,
                 shard: int, num_shards: int, plan: Optional[ShardPlan] = None) -> None:
        self.builder, self.files, self.labels = builder, np.asarray(files), np.asarray(labels)
        self.batch_size, self.seed, self.shard, self.num_shards = batch_size, seed, shard, num_shards
        self.num_samples = len(files)
        self.plan = plan if plan is not None else ShardPlan(self.num_samples, seed, num_shards)
        self.steps_per_epoch = self.plan.per_shard // batch_size
        self._ahead: Optional[tuple[int, DALIGenericIterator]] = None  # (epoch, its fresh iterator)

    def _iterator(self, epoch: int) -> DALIGenericIterator:
        # every shard's part of the epoch, back to back: DALI's shard k is then shard k's part
        order = self.plan.orders(epoch)
        order = order[:, :self.steps_per_epoch * self.batch_size].reshape(-1).numpy()
        return self.builder.iterator(self.files[order].tolist(), self.labels[order].tolist(), self.shard,
                                     self.num_shards, self.batch_size, True,
                                     _pipeline_seed(self.seed, epoch, self.shard))

    def batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        if start >= self.steps_per_epoch:
            return
        if self._ahead is not None and self._ahead[0] == epoch:
            it, self._ahead = self._ahead[1], None
        else:  # (an ahead pipeline for another epoch stays for its own call: a BatchNorm pass reads in between)
            it = self._iterator(epoch)
        for step, out in enumerate(it):
            if step >= start:  # the first `start` batches are replayed to restore DALI's state
                if step == self.steps_per_epoch - 1:
                    self._ahead = (epoch + 1, self._iterator(epoch + 1))
                yield _batch(out)


class DALIFedTrainStream:
    """The training stream of one pipeline for all epochs (see the module docstring).

    The pipeline is in one of these states between calls: none built yet; at an epoch's end
    (the last batch handed out: the feed is done, DALI holds the end-of-epoch signal), ready to
    be reset and fed the next; in use by a generator that is still reading its epoch (a second
    call meanwhile, such as a plugin's BatchNorm pass, reads through a pipeline of its own,
    which yields the same batches since the draws are keyed); or abandoned mid-epoch (its
    batches already prefetched belong to that epoch), then built anew."""

    def __init__(self, builder: _Builder, files: list[str], labels: list[int], batch_size: int, seed: int,
                 shard: int, num_shards: int, draws: KeyedDraws, plan: Optional[ShardPlan] = None) -> None:
        self.builder, self.batch_size, self.seed, self.shard, self.num_shards = builder, batch_size, seed, shard, num_shards
        self.files, self.labels, self.draws = np.asarray(files), np.asarray(labels, dtype=np.int64), draws
        self.num_samples = len(files)
        self.plan = plan if plan is not None else ShardPlan(self.num_samples, seed, num_shards)
        self.steps_per_epoch = self.plan.per_shard // batch_size
        self.feed = _Feed(self.files, self.labels, batch_size, draws)
        self._it: Optional[DALIGenericIterator] = None
        self._state = "none"  # none | end | busy | abandoned
        self.builds = 0  # pipelines built for this stream's main reading (one, unless abandoned)

    def _epoch(self, feed: _Feed, epoch: int, start: int) -> None:
        order = self.plan.order(epoch, self.shard)[:self.steps_per_epoch * self.batch_size]
        feed.set(order.numpy(), sample_seeds(self.seed, epoch, order).numpy(), start)

    def _pipeline_seed(self) -> int:
        return _pipeline_seed(self.seed, 0, self.shard)  # (nothing random is drawn by DALI itself)

    def batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        if start >= self.steps_per_epoch:
            return iter(())
        if self._state == "busy":  # a second reader while the main one is mid-epoch
            feed = _Feed(self.files, self.labels, self.batch_size, self.draws)
            feed._cache = self.feed._cache
            self._epoch(feed, epoch, start)
            return self._read(self.builder.fed_iterator(feed, True, self._pipeline_seed()), start, main=False)
        self._epoch(self.feed, epoch, start)
        if self._state == "end":
            try:
                next(self._it)  # the end-of-epoch signal DALI holds
            except StopIteration:
                pass
            self._it.reset()
        else:  # none yet, or one left mid-epoch
            self._it = self.builder.fed_iterator(self.feed, True, self._pipeline_seed())
            self.builds += 1
        self._state = "busy"
        return self._read(self._it, start, main=True)

    def _read(self, it: DALIGenericIterator, start: int, main: bool) -> Iterator[Batch]:
        last = self.steps_per_epoch - 1
        finished = False
        try:
            for step, out in zip(range(start, self.steps_per_epoch), it):
                if main and step == last:
                    self._state, finished = "end", True
                yield _batch(out)
        finally:
            if main and not finished:
                self._state = "abandoned"


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


def build(cfg: DataConfig, req: DataRequest, make_split: Callable[[np.ndarray], TrainSplit], with_val: bool = True
          ) -> tuple[Any, DALIEvalStream, Optional[DALIEvalStream], TrainSplit]:
    """(training shard or None, test slice, validation slice or None, the split). Validation
    reads the training files at the split's indices through the evaluation graph."""
    check_prepared(cfg)
    builder = _Builder(cfg, torch.device(req.device))
    files, labels = file_list(cfg, "train")
    split = make_split(np.asarray(labels, dtype=np.int64))
    train = val = None
    if req.shard is not None:
        draws = DATASETS.get(cfg.name).dali_draws(cfg, True)
        if draws is None:  # the graph draws from DALI's generators: a pipeline per epoch
            train = DALITrainStream(builder, files, labels, req.batch_size, req.seed, req.shard,
                                    req.num_shards, split.plan)
        else:
            train = DALIFedTrainStream(builder, files, labels, req.batch_size, req.seed, req.shard,
                                       req.num_shards, draws, split.plan)
    if with_val and len(split.val):
        val = DALIEvalStream(builder, [files[i] for i in split.val], [labels[i] for i in split.val],
                             req.eval_batch_size, req.eval_shard, req.eval_num_shards)
    evals = DALIEvalStream(builder, *file_list(cfg, "val"), req.eval_batch_size, req.eval_shard,
                           req.eval_num_shards)
    return train, evals, val, split
