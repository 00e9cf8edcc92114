"""ImageNet (or any data set) in the ImageFolder layout: root/train/<class>/*.JPEG, root/val/<class>/."""
from __future__ import annotations

from pathlib import Path

from core.errors import UserError

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def imagefolder_split(root: str, split: str) -> Path:
    path = Path(root) / split
    if not path.is_dir() or not any(p.is_dir() for p in path.iterdir()):
        raise UserError(
            f"data.root={root}: no ImageFolder split at {path}; expected {path}/<class name>/<images> "
            "(train/ and val/, one folder per class, as torchvision.datasets.ImageFolder reads)")
    return path


def imagefolder_files(root: str, split: str) -> tuple[list[str], list[int]]:
    """The files of an ImageFolder split and their labels, in torchvision's ImageFolder order."""
    from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

    path = str(imagefolder_split(root, split))
    _, class_to_idx = find_classes(path)
    samples = make_dataset(path, class_to_idx, extensions=IMG_EXTENSIONS)
    return [p for p, _ in samples], [c for _, c in samples]


def class_names(root: str) -> list[str]:
    return sorted(p.name for p in imagefolder_split(root, "train").iterdir() if p.is_dir())
