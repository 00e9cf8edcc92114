"""The torchvision pipeline: in-memory tensors for digits, DataLoader + torchvision transforms
for CIFAR and ImageNet.

Random augmentation is seeded per sample from (seed, epoch, index) (`data.sampler.sample_seed`),
so the images a rank sees do not depend on how samples were spread over loader workers, and a
resumed run sees exactly the augmented batches the uninterrupted run would have seen.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Callable, Optional

import torch
from torch.utils.data import DataLoader, Dataset

from data.config import DataConfig
from data.sampler import eval_slice, sample_seed, shard_indices
from data.stream import Batch, TensorEvalStream, TensorTrainStream


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
                 num_shards: int, num_workers: int, pin_memory: bool) -> None:
        self.dataset, self.batch_size, self.seed = dataset, batch_size, seed
        self.shard, self.num_shards = shard, num_shards
        self.num_samples = len(dataset)
        self.steps_per_epoch = (len(dataset) // num_shards) // batch_size
        self._sampler = _EpochBatches()
        self._loader = DataLoader(dataset, batch_sampler=self._sampler, num_workers=num_workers,
                                  pin_memory=pin_memory, persistent_workers=num_workers > 0)

    def batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        idx = shard_indices(self.num_samples, self.seed, epoch, self.shard, self.num_shards).tolist()
        bs = self.batch_size
        self._sampler.batches = [
            [(i, sample_seed(self.seed, epoch, i)) for i in idx[b * bs:(b + 1) * bs]]
            for b in range(start, self.steps_per_epoch)
        ]
        yield from self._loader


class LoaderEvalStream:
    def __init__(self, dataset: SeededDataset, batch_size: int, shard: int, num_shards: int,
                 num_workers: int, pin_memory: bool) -> None:
        self.num_samples = len(dataset)
        subset = torch.utils.data.Subset(dataset, list(eval_slice(len(dataset), shard, num_shards)))
        self._loader = DataLoader(subset, batch_size=batch_size, num_workers=num_workers,
                                  pin_memory=pin_memory)

    def batches(self) -> Iterator[Batch]:
        yield from self._loader


def _digits(cfg: DataConfig, req: Any) -> tuple[Optional[TensorTrainStream], TensorEvalStream]:
    from data.digits import load_digits_split

    x_tr, y_tr, x_te, y_te = load_digits_split(cfg.test_fraction, cfg.split_seed)
    train = None
    if req.shard is not None:
        train = TensorTrainStream(x_tr, y_tr, req.batch_size, req.seed, req.shard, req.num_shards)
    return train, TensorEvalStream(x_te, y_te, req.eval_batch_size, req.eval_shard, req.eval_num_shards)


def cifar_transforms(cfg: DataConfig) -> tuple[Callable, Callable]:
    """Padded random crop + flip for training; normalisation for both (uint8 HWC arrays in)."""
    from torchvision import transforms as T

    from data.cifar import MEAN, STD

    to_tensor = T.Compose([T.ToTensor(), T.Normalize(MEAN[cfg.name], STD[cfg.name])])
    if not cfg.augment:
        return to_tensor, to_tensor
    size = cfg.image_size or 32
    train = T.Compose([T.ToPILImage(), T.RandomCrop(size, padding=4), T.RandomHorizontalFlip(), to_tensor])
    return train, to_tensor


def imagenet_transforms(cfg: DataConfig) -> tuple[Callable, Callable]:
    """RandomResizedCrop + flip for training; resize + centre crop for evaluation."""
    from torchvision import transforms as T

    from data.imagenet import MEAN, STD

    size = cfg.image_size or 224
    resize = cfg.eval_resize or round(size * 256 / 224)
    norm = [T.ToTensor(), T.Normalize(MEAN, STD)]
    evals = T.Compose([T.Resize(resize), T.CenterCrop(size), *norm])
    if not cfg.augment:
        return evals, evals
    return T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), *norm]), evals


class _ArrayItems:
    """index -> (image, label) over in-memory arrays; a class, not a closure, so that loader
    workers started by spawn or forkserver (a rank inside a test's forkserver) can unpickle it."""

    def __init__(self, x: Any, y: Any) -> None:
        self.x, self.y = x, y

    def __call__(self, i: int) -> tuple[Any, int]:
        return self.x[i], int(self.y[i])


def _datasets(cfg: DataConfig) -> tuple[SeededDataset, SeededDataset]:
    if cfg.name in ("cifar10", "cifar100"):
        from data.cifar import load_cifar

        train_tf, eval_tf = cifar_transforms(cfg)
        (x_tr, y_tr), (x_te, y_te) = (load_cifar(cfg.root, cfg.name, split) for split in (True, False))
        return (SeededDataset(len(y_tr), _ArrayItems(x_tr, y_tr), train_tf),
                SeededDataset(len(y_te), _ArrayItems(x_te, y_te), eval_tf))
    from torchvision.datasets import ImageFolder

    from data.imagenet import imagefolder_split

    train_tf, eval_tf = imagenet_transforms(cfg)
    out = []
    for split, tf in (("train", train_tf), ("val", eval_tf)):
        folder = ImageFolder(str(imagefolder_split(cfg.root, split)))
        out.append(SeededDataset(len(folder), folder.__getitem__, tf))
    return out[0], out[1]


def build(cfg: DataConfig, req: Any) -> tuple[Any, Any]:
    if cfg.name == "digits":
        return _digits(cfg, req)
    train_set, eval_set = _datasets(cfg)
    pin = str(req.device).startswith("cuda")
    train = None
    if req.shard is not None:
        train = LoaderTrainStream(train_set, req.batch_size, req.seed, req.shard, req.num_shards,
                                  cfg.num_workers, pin)
    evals = LoaderEvalStream(eval_set, req.eval_batch_size, req.eval_shard, req.eval_num_shards,
                             cfg.num_workers, pin)
    return train, evals
