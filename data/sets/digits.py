"""digits: scikit-learn's bundled digits set (1,797 real 8x8 handwritten digits), the default.

It ships inside scikit-learn, so the default run needs no download and no data path. The
train/test split is a seeded permutation (`data.split_seed`, `data.test_fraction`), identical on
every rank; images are normalised with the training split's statistics and held in memory as
tensors, which every pipeline yields unchanged (no augmentation: at 8x8 a crop loses the digit).
"""
from __future__ import annotations

import importlib.util
import math
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from core.errors import UserError

from data.config import DataConfig
from data.samples.tensors import TensorSamples
from data.device_augment import DeviceAugment
from data.sets import register_dataset
from data.sets.base import NO_DRAWS, DataSet, Finish, KeyedDraws

NUM_SAMPLES = 1797


def split_sizes(test_fraction: float) -> tuple[int, int]:
    n_test = math.ceil(NUM_SAMPLES * test_fraction)
    return NUM_SAMPLES - n_test, n_test


def read_bundled_digits() -> tuple[np.ndarray, np.ndarray]:
    """(pixels 1797x64, labels) from the file scikit-learn ships (`sklearn/datasets/data/
    digits.csv.gz`, what `load_digits` reads), found without importing scikit-learn: importing
    it (and SciPy behind it) costs every rank about two seconds of start-up."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("data.name=digits reads the digits set bundled with scikit-learn, which is not "
                        "installed here; run scripts/setup_env.sh")
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"
    try:
        table = np.loadtxt(path, delimiter=",")
    except OSError as err:
        raise UserError(f"data.name=digits: cannot read scikit-learn's bundled {path} ({err}); "
                        "reinstall scikit-learn with scripts/setup_env.sh") from None
    return table[:, :-1], table[:, -1].astype(np.int64)


@lru_cache(maxsize=4)
def load_digits_split(test_fraction: float, split_seed: int) -> tuple[torch.Tensor, ...]:
    """(x_train, y_train, x_test, y_test); images normalised with the training set's statistics."""
    pixels, labels = read_bundled_digits()
    x = torch.from_numpy(pixels.astype(np.float32)).reshape(-1, 1, 8, 8) / 16.0
    y = torch.from_numpy(labels)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(split_seed))
    n_train, _ = split_sizes(test_fraction)
    train, test = perm[:n_train], perm[n_train:]
    mean, std = x[train].mean(), x[train].std()
    x = (x - mean) / std
    return x[train].contiguous(), y[train].contiguous(), x[test].contiguous(), y[test].contiguous()


def train_labels(test_fraction: float, split_seed: int) -> np.ndarray:
    """The training split's labels, as `load_digits_split` orders them, without its images: the
    plan reads them in the launching process, whose torch runs on one thread before a fork, and
    images normalised there (a float reduction) and cached could differ in the last bit from
    those a rank computes on its own threads."""
    _, labels = read_bundled_digits()
    perm = torch.randperm(NUM_SAMPLES, generator=torch.Generator().manual_seed(split_seed))
    return labels[perm[:split_sizes(test_fraction)[0]].numpy()]


def _copy(images: torch.Tensor) -> torch.Tensor:
    return images.clone()  # FFCV reuses its batch buffers


class Digits(DataSet):
    name = "digits"
    in_channels, image_size, num_classes = 1, 8, 10
    form = TensorSamples
    needs_root = False
    split_redraw_options = ("split_seed",)  # another carve-out of the same 1,797 images
    config = {"augment": False, "eval_batch_size": 360,  # the whole test split in one batch
              # no data.root: prepared files go under the machine's data folder
              "ffcv": {"dir": "${paths.data_root}/digits/ffcv"},
              "dali": {"dir": "${paths.data_root}/digits/dali"}}

    def num_train_samples(self, cfg: DataConfig) -> Optional[int]:
        return split_sizes(cfg.test_fraction)[0]

    def check_on_disk(self, cfg: DataConfig) -> None:
        """Nothing to check: scikit-learn carries the data."""

    def plan_labels(self, cfg: DataConfig) -> Optional[np.ndarray]:
        return train_labels(cfg.test_fraction, cfg.split_seed)

    def samples(self, cfg: DataConfig, split: str) -> TensorSamples:
        x_tr, y_tr, x_te, y_te = load_digits_split(cfg.test_fraction, cfg.split_seed)
        return TensorSamples(x_tr, y_tr) if split == "train" else TensorSamples(x_te, y_te)

    def prepared_identity(self, cfg: DataConfig) -> dict[str, Any]:
        return {"test_fraction": cfg.test_fraction, "split_seed": cfg.split_seed}

    def device_augment(self, cfg: DataConfig, train: bool) -> DeviceAugment:
        return DeviceAugment(size=self.image_size)  # the normalised tensors as they are

    def ffcv_image_ops(self, cfg: DataConfig, train: bool, epoch_key: Any) -> tuple[list[Any], Finish]:
        from ffcv.fields.ndarray import NDArrayDecoder

        return [NDArrayDecoder()], _copy

    def dali_draws(self, cfg: DataConfig, train: bool) -> Optional[KeyedDraws]:
        return NO_DRAWS

    def dali_images(self, cfg: DataConfig, encoded: Any, train: bool, decoder: str,
                    draws: Optional[dict[str, Any]] = None) -> Any:
        from nvidia.dali import fn, types

        images = fn.decoders.numpy(encoded, dtype=types.FLOAT)
        return images.gpu() if decoder == "mixed" else images


DIGITS = register_dataset(Digits())
