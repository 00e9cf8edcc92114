"""ImageNet (or any data set) in the ImageFolder layout: root/train/<class>/*.JPEG, root/val/<class>/."""
from __future__ import annotations

from pathlib import Path

from engine.errors import UserError

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def imagefolder_split(root: str, split: str) -> Path:
    path = Path(root) / split
    if not path.is_dir() or not any(p.is_dir() for p in path.iterdir()):
        raise UserError(
            f"data.root={root}: no ImageFolder split at {path}; expected {path}/<class name>/<images> "
            "(train/ and val/, one folder per class, as torchvision.datasets.ImageFolder reads)")
    return path


def class_names(root: str) -> list[str]:
    return sorted(p.name for p in imagefolder_split(root, "train").iterdir() if p.is_dir())
