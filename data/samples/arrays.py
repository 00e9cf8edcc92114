"""uint8 images held in memory as one N x H x W x 3 array (CIFAR's batches, decoded once).

FFCV stores them raw and DALI reads lossless PNG copies, so no pipeline changes a pixel.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Sequence

import numpy as np
import torch

from data.config import FFCVConfig
from data.samples.base import Samples


@dataclass(frozen=True, eq=False)  # arrays: compared by identity
class ArraySamples(Samples):
    images: np.ndarray  # N x H x W x 3, uint8
    labels: np.ndarray  # N, int64

    dali_suffix: ClassVar[str] = ".png"
    in_memory: ClassVar[bool] = True

    def __len__(self) -> int:
        return len(self.labels)

    def label_array(self) -> np.ndarray:
        return np.asarray(self.labels, dtype=np.int64)

    def item(self, index: int) -> tuple[np.ndarray, int]:
        return self.images[index], int(self.labels[index])

    def tensors_nhwc(self) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.from_numpy(self.images), torch.from_numpy(self.labels)

    def ffcv_field(self, ffcv: FFCVConfig) -> Any:
        from ffcv.fields import RGBImageField

        return RGBImageField(write_mode="raw")

    def ffcv_rows(self) -> Sequence[tuple[Any, int]]:
        return list(zip(self.images, self.labels.tolist()))

    def write_dali_file(self, index: int, path: Path) -> None:
        from PIL import Image

        Image.fromarray(self.images[index]).save(path)
