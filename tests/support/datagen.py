"""Small data sets in the on-disk layouts the pipelines read, with labels a test can check.

Every image carries its own identity: `identity_color(i)` fills the red and green channels
(uniform, so it survives crops, flips, resizing and JPEG), and the blue channel holds a
horizontal ramp so that crops and flips change the tensor. `read_identity` inverts it from a
normalised batch, so a test can say which sample every output row is, and check its label
against `cifar_label(i)` / `imagefolder_label(i)`.

- `write_cifar`: CIFAR-10/100 python-pickle batches (lossless, 32x32).
- `write_imagefolder`: a JPEG ImageFolder (root/train/<class>/*.jpg, root/val/<class>/*.jpg)
  of images of varied sizes; `natural=True` fills them with smooth noise instead, so that
  they compress and decode like photographs (the benchmark's set).
"""
from __future__ import annotations

import pickle
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from data import DATASETS

LEVELS, STEP, BASE = 16, 13, 24  # red/green levels: 16 x 16 identities, 13 apart (JPEG-proof)


def identity_color(i: int) -> tuple[int, int]:
    if not 0 <= i < LEVELS * LEVELS:
        raise ValueError(f"identity {i} outside 0..{LEVELS * LEVELS - 1}")
    return BASE + STEP * (i % LEVELS), BASE + STEP * (i // LEVELS)


def cifar_label(i: int, num_classes: int) -> int:
    return (7 * i + 3) % num_classes


def imagefolder_label(i: int, num_classes: int) -> int:
    return i % num_classes


def sample_image(i: int, height: int, width: int) -> np.ndarray:
    """The image of identity i (uint8 HWC): identity colour in red and green, a ramp in blue."""
    r, g = identity_color(i)
    img = np.empty((height, width, 3), dtype=np.uint8)
    img[..., 0], img[..., 1] = r, g
    img[..., 2] = np.linspace(30, 225, width, dtype=np.float64).round().astype(np.uint8)[None, :]
    return img


def write_cifar(root: str | Path, name: str = "cifar10", n_train: int = 96, n_test: int = 24) -> Path:
    """root/<cifar folder>/ with the official file names; identities 0..n_train-1 (train)
    and n_train.. (test)."""
    cifar = DATASETS.get(name)
    folder, train_files, test_files, label_key = cifar.folder, cifar.train_files, cifar.test_files, cifar.label_key
    num_classes = cifar.num_classes
    path = Path(root) / folder
    path.mkdir(parents=True, exist_ok=True)

    def dump(fname: str, ids: Sequence[int]) -> None:
        data = np.stack([sample_image(i, 32, 32).transpose(2, 0, 1).reshape(-1) for i in ids]) if len(ids) \
            else np.zeros((0, 3072), np.uint8)
        batch = {b"data": data, label_key: [cifar_label(i, num_classes) for i in ids]}
        with open(path / fname, "wb") as fh:
            pickle.dump(batch, fh)

    train_ids = list(range(n_train))
    per_file = -(-n_train // len(train_files))
    for k, fname in enumerate(train_files):
        dump(fname, train_ids[k * per_file:(k + 1) * per_file])
    dump(test_files[0], list(range(n_train, n_train + n_test)))
    return Path(root)


def natural_image(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """Smooth colour noise plus grain: at 300-500 px and quality 90, JPEGs of about 80 KiB, near
    ImageNet's (about 110 KiB), so decoding costs roughly what a photograph's does."""
    from PIL import Image

    coarse = rng.integers(0, 256, (max(2, height // 6), max(2, width // 6), 3), dtype=np.uint8)
    img = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BICUBIC), dtype=np.int16)
    img = img + rng.integers(-20, 21, img.shape, dtype=np.int16)
    return img.clip(0, 255).astype(np.uint8)


def write_imagefolder(root: str | Path, num_classes: int = 3, n_train: int = 48, n_val: int = 12,
                      sizes: tuple[int, int] = (48, 96), natural: bool = False, seed: int = 0,
                      quality: int = 92) -> Path:
    """root/train/class_XXX/img_NNNNN.jpg and root/val/...; identity i is in class
    `imagefolder_label(i)`; heights and widths drawn from `sizes`."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    root = Path(root)
    for split, ids in (("train", range(n_train)), ("val", range(n_train, n_train + n_val))):
        for c in range(num_classes):
            (root / split / f"class_{c:03d}").mkdir(parents=True, exist_ok=True)
        for i in ids:
            h, w = (int(v) for v in rng.integers(sizes[0], sizes[1] + 1, 2))
            img = natural_image(rng, h, w) if natural else sample_image(i, h, w)
            cls = imagefolder_label(i, num_classes)
            Image.fromarray(img).save(root / split / f"class_{cls:03d}" / f"img_{i:05d}.jpg", quality=quality)
    return root


def read_identity(x: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> list[int]:
    """Identities of a normalised N x 3 x H x W batch (the centre region's red and green)."""
    m = torch.tensor(mean, dtype=torch.float64)[:, None, None]
    s = torch.tensor(std, dtype=torch.float64)[:, None, None]
    h, w = x.shape[-2:]
    centre = x[:, :2, h // 4: h - h // 4, w // 4: w - w // 4].double().cpu()
    pixels = (centre * s[:2] + m[:2]) * 255
    levels = ((pixels.mean(dim=(2, 3)) - BASE) / STEP).round().long().clamp(0, LEVELS - 1)
    return (levels[:, 0] + LEVELS * levels[:, 1]).tolist()
