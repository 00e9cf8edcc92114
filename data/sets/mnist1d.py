"""mnist1d: MNIST-1D (Greydanus & Kobak 2024), 1-D signals of 40 points in ten classes, generated
in memory from its published procedure (`data.mnist1d_generator`), never downloaded.

The paper's set is `data.num_samples=5000` with seed 42 (`data.generator_seed`), the first 80 %
training and the rest test (`data.test_fraction=0.2`: 4,000 / 1,000). Larger sets are the same
procedure with more samples, e.g. `data.num_samples=70000 data.test_fraction=0.142857142857`
(60,000 / 10,000: a test set that resolves 0.001). Generation takes about 0.2 s for the paper's
set and 3 s for 70,000 samples here, once per process (kept in memory, keyed by size and seed).

Signals are held as float32 tensors N x 1 x 40 (already standardised by the procedure), read
unchanged by the torchvision pipeline (sliced per batch) and the device pipeline; FFCV and DALI,
which exist to decode files, are refused in one line. The validation split is carved from the
training part by `data.split` as for any set (`data.val_fraction`, stratified by label), and the
Dirichlet and classes partitions work on its labels.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch

from core.errors import UserError
from core.spec import DataSpec, SignalSpec
from data.config import DataConfig, Pipeline
from data.samples.tensors import TensorSamples
from data.mnist1d_generator import NUM_CLASSES, Procedure, generate
from data.device_augment import DeviceAugment
from data.sets import register_dataset
from data.sets.base import DataSet

PAPER = Procedure()  # 5,000 samples, seed 42, 40 points


def split_sizes(cfg: DataConfig) -> tuple[int, int]:
    """(training, test) samples: the test set is the last round(N x test_fraction) of the N
    generated (the paper's 4,000 / 1,000 for N = 5,000 and 0.2)."""
    n = cfg.num_samples or PAPER.num_samples
    n_test = round(n * cfg.test_fraction)
    return n - n_test, n_test


class Mnist1D(DataSet):
    name = "mnist1d"
    in_channels, length, num_classes = 1, PAPER.final_seq_length, NUM_CLASSES
    form = TensorSamples
    needs_root = False
    pipelines = (Pipeline.torchvision, Pipeline.device)
    reads = ("num_samples", "generator_seed")
    split_redraw_options = ("generator_seed", "split_seed")  # signals drawn afresh, the training set with them
    config = {"augment": False, "num_samples": PAPER.num_samples, "generator_seed": PAPER.seed,
              "eval_batch_size": 1000}

    def spec(self, cfg: DataConfig) -> DataSpec:
        return SignalSpec(in_channels=self.in_channels, length=self.length, num_classes=self.num_classes)

    def check_config(self, cfg: DataConfig) -> None:
        super().check_config(cfg)
        n = cfg.num_samples or PAPER.num_samples
        if n % NUM_CLASSES:
            raise UserError(f"data.num_samples={n}: MNIST-1D makes the same number of samples of each of its "
                            f"{NUM_CLASSES} classes; use a multiple of {NUM_CLASSES}")
        if cfg.image_size is not None or cfg.num_classes is not None:
            key = "image_size" if cfg.image_size is not None else "num_classes"
            raise UserError(f"data.{key} does not apply to data.name=mnist1d (40-point signals, 10 classes); "
                            "remove it")
        n_train, n_test = split_sizes(cfg)
        if min(n_train, n_test) < 1:
            raise UserError(f"data.test_fraction={cfg.test_fraction} leaves {n_train} training and {n_test} test "
                            f"samples of data.num_samples={n}; change either")

    def num_train_samples(self, cfg: DataConfig) -> Optional[int]:
        return split_sizes(cfg)[0]

    def check_on_disk(self, cfg: DataConfig) -> None:
        """Nothing to check: the set is generated."""

    def plan_labels(self, cfg: DataConfig) -> Optional[np.ndarray]:
        """The generated training part's labels (generated once here: forked ranks share them)."""
        return self.arrays(cfg)[1][:split_sizes(cfg)[0]]

    def preload(self, cfg: DataConfig) -> None:
        """Generate the set once for ranks forked from this process (numpy, one thread, the same
        bits anywhere): 64 ranks each generating 70,000 samples took 64 x 0.7 GB at once here
        and the kernel's OOM killer ended the job."""
        self.arrays(cfg)

    def arrays(self, cfg: DataConfig) -> tuple[np.ndarray, np.ndarray, float]:
        seed = PAPER.seed if cfg.generator_seed is None else cfg.generator_seed
        return generate(cfg.num_samples or PAPER.num_samples, seed)

    def samples(self, cfg: DataConfig, split: str) -> TensorSamples:
        x, y, _ = self.arrays(cfg)
        n_train, _ = split_sizes(cfg)
        part = slice(0, n_train) if split == "train" else slice(n_train, len(y))
        signals = torch.from_numpy(x[part].astype(np.float32)).unsqueeze(1)  # N x 1 x 40
        return TensorSamples(signals.contiguous(), torch.from_numpy(y[part]).contiguous())

    def identity(self, cfg: DataConfig) -> dict[str, Any]:
        return {"num_samples": cfg.num_samples, "generator_seed": cfg.generator_seed,
                "test_fraction": cfg.test_fraction}

    def record(self, cfg: DataConfig) -> dict[str, Any]:
        n_train, n_test = split_sizes(cfg)
        return {"generated": {"procedure": "mnist1d", "num_samples": n_train + n_test, "test_samples": n_test,
                              "generator_seed": cfg.generator_seed, "seconds": round(self.arrays(cfg)[2], 3)}}

    def device_augment(self, cfg: DataConfig, train: bool) -> DeviceAugment:
        return DeviceAugment(size=self.length)  # the standardised signals as they are


MNIST1D = register_dataset(Mnist1D())
