"""Image files in torchvision's ImageFolder layout: root/<split>/<class name>/<image file>.

Classes are the sorted folder names and files are listed in torchvision's `ImageFolder` order,
which every pipeline shares. DALI decodes the files where they lie; FFCV stores them as its
writer settings say (`data.ffcv`: longest side, JPEG share and quality).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Sequence

import numpy as np

from core.errors import UserError
from data.config import FFCVConfig
from data.samples.base import Samples


def imagefolder_split(root: str, split: str) -> Path:
    """root/split, or a `UserError` naming it and the layout it must have."""
    path = Path(root) / split
    if not path.is_dir() or not any(p.is_dir() for p in path.iterdir()):
        raise UserError(
            f"data.root={root}: no ImageFolder split at {path}; expected {path}/<class name>/<images> "
            "(train/ and val/, one folder per class, as torchvision.datasets.ImageFolder reads)")
    return path


def load_rgb(path: str) -> Any:
    """The image as an RGB PIL image (what torchvision's ImageFolder loader returns)."""
    from PIL import Image

    with Image.open(path) as img:
        return img.convert("RGB")


@dataclass(frozen=True)
class ImageFolderSamples(Samples):
    files: list[str]
    labels: list[int]

    dali_reads_in_place: ClassVar[bool] = True

    @classmethod
    def read(cls, root: str, split: str) -> ImageFolderSamples:
        """The files of root/split and their labels, in torchvision's ImageFolder order."""
        from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

        path = str(imagefolder_split(root, split))
        _, class_to_idx = find_classes(path)
        found = make_dataset(path, class_to_idx, extensions=IMG_EXTENSIONS)
        return cls([p for p, _ in found], [c for _, c in found])

    def __len__(self) -> int:
        return len(self.files)

    def label_array(self) -> np.ndarray:
        return np.asarray(self.labels, dtype=np.int64)

    def item(self, index: int) -> tuple[Any, int]:
        return load_rgb(self.files[index]), self.labels[index]

    def ffcv_field(self, ffcv: FFCVConfig) -> Any:
        from ffcv.fields import RGBImageField

        return RGBImageField(write_mode="proportion", **self.ffcv_settings(ffcv))

    def ffcv_rows(self) -> Sequence[tuple[Any, int]]:
        return _LoadedRows(self)

    def files_in_place(self) -> tuple[list[str], list[int]]:
        return list(self.files), list(self.labels)

    @classmethod
    def ffcv_settings(cls, ffcv: FFCVConfig) -> dict[str, Any]:
        return {"max_resolution": ffcv.max_resolution, "jpeg_quality": ffcv.jpeg_quality,
                "compress_probability": ffcv.compress_probability}


class _LoadedRows(Sequence):
    """Rows loaded when FFCV's writer asks for them, not all at once (ImageNet does not fit)."""

    def __init__(self, samples: ImageFolderSamples) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: Any) -> tuple[Any, int]:
        return self.samples.item(index)
