"""The DALI pipeline: `fn.readers.file` sharded over the training ranks (shard_id = this rank's
index among them, num_shards = their number), decoding on the CPU without a GPU
(`device_id=None`) and `mixed` (nvJPEG) decoding with one; `DALIGenericIterator` into torch.

What it reads: ImageNet, the ImageFolder under `data.root` in place (torchvision's file order);
CIFAR and digits, the one-file-per-sample copy `python -m data.prepare data.pipeline=dali`
writes (lossless PNG; digits as .npy of the normalised tensor), listed in index order.

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
from nvidia.dali import fn, pipeline_def, types
from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

from data.config import DataConfig
from data.prepared import check_prepared, prepared_dir
from data.sampler import epoch_shards, eval_slice
from data.stream import Batch


def file_list(cfg: DataConfig, split: str) -> tuple[list[str], list[int]]:
    """(paths, labels) of a split in the data set's index order."""
    if cfg.name == "imagenet":
        from data.imagenet import imagefolder_files

        return imagefolder_files(cfg.root, split)
    folder = prepared_dir(cfg)
    paths, labels = [], []
    for line in (folder / f"{split}.txt").read_text().splitlines():
        rel, label = line.rsplit(" ", 1)
        paths.append(str(folder / rel))
        labels.append(int(label))
    return paths, labels


def _normalisation(cfg: DataConfig) -> tuple[list[float], list[float]]:
    if cfg.name == "imagenet":
        from data.imagenet import MEAN, STD
    else:
        from data.cifar import MEAN as M, STD as S

        MEAN, STD = M[cfg.name], S[cfg.name]  # noqa: N806
    return [255 * m for m in MEAN], [255 * s for s in STD]


def _images(cfg: DataConfig, encoded: Any, train: bool, decoder: str) -> Any:
    """The graph from encoded files to float CHW images (normalised) for one data set."""
    if cfg.name == "digits":  # stored normalised
        images = fn.decoders.numpy(encoded, dtype=types.FLOAT)
        return images.gpu() if decoder == "mixed" else images
    mean, std = _normalisation(cfg)
    norm = dict(mean=mean, std=std, dtype=types.FLOAT, output_layout="CHW")
    augment = train and cfg.augment
    if cfg.name in ("cifar10", "cifar100"):
        images = fn.decoders.image(encoded, device=decoder, output_type=types.RGB)
        if not augment:
            return fn.crop_mirror_normalize(images, **norm)
        size, pad = cfg.image_size or 32, 4  # torchvision's RandomCrop(size, padding=4) + flip
        padded = fn.crop(images, crop=(size + 2 * pad, size + 2 * pad), out_of_bounds_policy="pad", fill_values=0)
        offsets = [k / (2 * pad) for k in range(2 * pad + 1)]  # integer pixel offsets 0..2*pad
        return fn.crop_mirror_normalize(padded, crop=(size, size), crop_pos_x=fn.random.uniform(values=offsets),
                                        crop_pos_y=fn.random.uniform(values=offsets),
                                        mirror=fn.random.coin_flip(), **norm)
    size = cfg.image_size or 224
    if augment:  # RandomResizedCrop(size) + flip
        images = fn.decoders.image_random_crop(encoded, device=decoder, output_type=types.RGB,
                                               random_area=[0.08, 1.0], random_aspect_ratio=[3 / 4, 4 / 3],
                                               num_attempts=10)
        images = fn.resize(images, size=(size, size))
        return fn.crop_mirror_normalize(images, mirror=fn.random.coin_flip(), **norm)
    images = fn.decoders.image(encoded, device=decoder, output_type=types.RGB)
    images = fn.resize(images, resize_shorter=cfg.eval_resize or round(size * 256 / 224))
    return fn.crop_mirror_normalize(images, crop=(size, size), **norm)


@pipeline_def
def _graph(cfg: DataConfig, files: list[str], labels: list[int], shard: int, num_shards: int, train: bool,
           decoder: str, pad_last_batch: bool) -> tuple[Any, Any]:
    encoded, label = fn.readers.file(files=files, labels=labels, shard_id=shard, num_shards=num_shards,
                                     random_shuffle=False, stick_to_shard=True, pad_last_batch=pad_last_batch,
                                     name="reader")
    return _images(cfg, encoded, train, decoder), (label.gpu() if decoder == "mixed" else label)


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


def build(cfg: DataConfig, req: Any) -> tuple[Optional[DALITrainStream], DALIEvalStream]:
    check_prepared(cfg)
    builder = _Builder(cfg, torch.device(req.device))
    train = None
    if req.shard is not None:
        train = DALITrainStream(builder, *file_list(cfg, "train"), req.batch_size, req.seed, req.shard,
                                req.num_shards)
    evals = DALIEvalStream(builder, *file_list(cfg, "val"), req.eval_batch_size, req.eval_shard,
                           req.eval_num_shards)
    return train, evals
