"""The torchvision pipeline: samples held as tensors (digits) are sliced in memory; any other
form is read item by item through a DataLoader and the data set's torchvision transforms.

Random augmentation is seeded per sample from (seed, epoch, index) (`data.sampler.sample_seed`),
so the images a rank sees do not depend on how samples were spread over loader workers, and a
resumed run sees exactly the augmented batches the uninterrupted run would have seen.

Each DataLoader has its own generator, seeded from (seed, epoch) before every pass: starting an
iterator draws the workers' base seed, which without a generator comes from torch's global RNG,
so every epoch would shift the training RNG (dropout, the plugins' draws) by one draw that a
resumed run, starting mid-epoch, would not repeat.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Callable, Optional

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from data.config import DataConfig
from data.samples.base import Samples
from data.samples.tensors import TensorSamples
from data.sampler import ShardPlan, epoch_seed, eval_slice, sample_seed
from data.sets import DATASETS
from data.split import TrainSplit
from data.stream import Batch, DataRequest, EvalStream, TensorEvalStream, TensorTrainStream, TrainStream

#: batches are handed over in host memory (pinned on a GPU run): `data.build_data` copies them
#: to the GPU one batch ahead
BATCHES_ON_HOST = True


class SeededDataset(Dataset):
    """Wraps (load, transform): item (index, seed) is transformed under torch RNG seeded so."""

    def __init__(self, size: int, load: Callable[[int], tuple[Any, int]], transform: Callable) -> None:
        self.size, self.load, self.transform = size, load, transform

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, key: Any) -> tuple[torch.Tensor, int]:
        index, seed = key if isinstance(key, tuple) else (key, None)
        image, label = self.load(index)
        if seed is None:
            return self.transform(image), label
        in_worker = torch.utils.data.get_worker_info() is not None
        if in_worker:  # worker processes own their RNG; no need to restore it
            torch.manual_seed(seed)
            return self.transform(image), label
        with torch.random.fork_rng(devices=[]):  # do not disturb the training RNG
            torch.manual_seed(seed)
            return self.transform(image), label


class _EpochBatches:
    """Batch sampler whose content is set per epoch; lets loader workers persist across epochs."""

    def __init__(self) -> None:
        self.batches: list[list[tuple[int, int]]] = []

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


class LoaderTrainStream:
    def __init__(self, dataset: SeededDataset, batch_size: int, seed: int, shard: int,
                 num_shards: int, num_workers: int, pin_memory: bool, plan: Optional[ShardPlan] = None) -> None:
        self.dataset, self.batch_size, self.seed = dataset, batch_size, seed
        self.shard, self.num_shards = shard, num_shards
        self.num_samples = len(dataset)
        self.plan = plan if plan is not None else ShardPlan(len(dataset), seed, num_shards)
        self.steps_per_epoch = self.plan.per_shard // batch_size
        self._sampler = _EpochBatches()
        self._generator = torch.Generator()
        self._loader = DataLoader(dataset, batch_sampler=self._sampler, num_workers=num_workers,
                                  pin_memory=pin_memory, persistent_workers=num_workers > 0,
                                  generator=self._generator)

    def batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        idx = self.plan.order(epoch, self.shard).tolist()
        bs = self.batch_size
        self._sampler.batches = [
            [(i, sample_seed(self.seed, epoch, i)) for i in idx[b * bs:(b + 1) * bs]]
            for b in range(start, self.steps_per_epoch)
        ]
        self._generator.manual_seed(epoch_seed(self.seed, epoch))
        yield from self._loader

    def close(self) -> None:
        """End the persistent loader workers now; left to the interpreter's exit, each is joined
        in turn with a timeout, which kept finished runs alive for seconds."""
        shutdown_workers(self._loader)


class LoaderEvalStream:
    """This rank's `eval_slice` of a split's samples, or of `indices` into it (validation)."""

    def __init__(self, dataset: SeededDataset, batch_size: int, seed: int, shard: int, num_shards: int,
                 num_workers: int, pin_memory: bool, indices: Optional[np.ndarray] = None) -> None:
        every = np.arange(len(dataset)) if indices is None else np.asarray(indices)
        self.num_samples, self.seed = len(every), seed
        part = eval_slice(len(every), shard, num_shards)
        subset = torch.utils.data.Subset(dataset, every[part.start:part.stop].tolist())
        self._generator = torch.Generator()
        self._loader = DataLoader(subset, batch_size=batch_size, num_workers=num_workers,
                                  pin_memory=pin_memory, generator=self._generator)

    def batches(self) -> Iterator[Batch]:
        self._generator.manual_seed(self.seed)  # (the test set is read in order, unaugmented)
        yield from self._loader

    def close(self) -> None:
        shutdown_workers(self._loader)


def shutdown_workers(loader: DataLoader) -> None:
    """Stop a DataLoader's worker processes (a persistent iterator keeps them between epochs).
    DataLoader has no public call for this; dropping its iterator runs the iterator's own
    orderly shutdown (a sentinel per worker, then join)."""
    iterator = getattr(loader, "_iterator", None)
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
    loader._iterator = None


def _train_stream(samples: Samples, transform: Optional[Callable], cfg: DataConfig,
                  req: DataRequest, plan: ShardPlan) -> TrainStream:
    if isinstance(samples, TensorSamples):  # the model's input already: sliced, not loaded
        return TensorTrainStream(samples.x, samples.y, req.batch_size, req.seed, req.shard, req.num_shards, plan)
    return LoaderTrainStream(SeededDataset(len(samples), samples.item, transform), req.batch_size, req.seed,
                             req.shard, req.num_shards, cfg.num_workers, _pin(req), plan)


def _eval_stream(samples: Samples, transform: Optional[Callable], cfg: DataConfig,
                 req: DataRequest, indices: Optional[np.ndarray] = None) -> EvalStream:
    """The evaluation stream of a split, or of the samples `indices` of it (validation)."""
    if isinstance(samples, TensorSamples):
        x, y = samples.x, samples.y
        if indices is not None:
            x, y = x[torch.as_tensor(indices)], y[torch.as_tensor(indices)]
        return TensorEvalStream(x, y, req.eval_batch_size, req.eval_shard, req.eval_num_shards)
    return LoaderEvalStream(SeededDataset(len(samples), samples.item, transform), req.eval_batch_size,
                            req.seed, req.eval_shard, req.eval_num_shards, cfg.num_workers, _pin(req), indices)


def _pin(req: DataRequest) -> bool:
    return str(req.device).startswith("cuda")


def build(cfg: DataConfig, req: DataRequest, make_split: Callable[[np.ndarray], TrainSplit], with_val: bool = True
          ) -> tuple[Optional[TrainStream], EvalStream, Optional[EvalStream], TrainSplit]:
    """(training shard or None, test slice, validation slice or None, the split); `make_split`
    turns the training file's labels into the split."""
    dataset = DATASETS.get(cfg.name)
    train_tf = eval_tf = None
    if not issubclass(dataset.form, TensorSamples):
        train_tf, eval_tf = dataset.torchvision_transforms(cfg)
    train = val = None
    samples = dataset.samples(cfg, "train")
    split = make_split(samples.label_array())
    if req.shard is not None:
        train = _train_stream(samples, train_tf, cfg, req, split.plan)
    if with_val and len(split.val):
        val = _eval_stream(samples, eval_tf, cfg, req, split.val)
    return train, _eval_stream(dataset.samples(cfg, "val"), eval_tf, cfg, req), val, split
