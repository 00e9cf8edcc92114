"""CIFAR-10/100 read from the python-pickle layout that torchvision and the CIFAR site use.

Read directly rather than through `torchvision.datasets.CIFAR10`, which insists on the official
files' MD5 sums, so the test-generated small sets in the same format load too.
"""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from core.errors import UserError

LAYOUT = {
    "cifar10": ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"], b"labels"),
    "cifar100": ("cifar-100-python", ["train"], ["test"], b"fine_labels"),
}
MEAN = {"cifar10": (0.4914, 0.4822, 0.4465), "cifar100": (0.5071, 0.4865, 0.4409)}
STD = {"cifar10": (0.2470, 0.2435, 0.2616), "cifar100": (0.2673, 0.2564, 0.2762)}


def cifar_dir(root: str, name: str) -> Path:
    folder, train, test, _ = LAYOUT[name]
    path = Path(root) / folder
    missing = [f for f in train + test if not (path / f).is_file()]
    if missing:
        raise UserError(
            f"data.root={root}: no {name} data at {path} (missing {', '.join(missing)}); put the "
            f"extracted python-version archive there ({folder}/ with {', '.join(train + test)})")
    return path


def load_cifar(root: str, name: str, train: bool) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 N x 32 x 32 x 3, labels int64 N)."""
    path = cifar_dir(root, name)
    _, train_files, test_files, label_key = LAYOUT[name]
    images, labels = [], []
    for fname in train_files if train else test_files:
        try:
            with open(path / fname, "rb") as fh:
                batch = pickle.load(fh, encoding="bytes")
            images.append(np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
            labels.append(np.asarray(batch[label_key], dtype=np.int64))
        except (pickle.UnpicklingError, KeyError, ValueError, EOFError) as err:
            raise UserError(f"data.root={root}: {path / fname} is not a CIFAR batch file ({err!r}); "
                            "re-extract the archive") from None
    return np.concatenate(images).transpose(0, 2, 3, 1).copy(), np.concatenate(labels)
