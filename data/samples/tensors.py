"""Samples already in the model's input form (normalised float tensors), held in memory.

The torchvision pipeline slices them per batch (no loader, no transform); FFCV stores them as
float32 arrays and DALI reads them from .npy files, so every pipeline yields the same tensors.
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
class TensorSamples(Samples):
    x: torch.Tensor  # N x C x H x W (images) or N x C x L (signals), float32, normalised
    y: torch.Tensor  # N, int64

    dali_suffix: ClassVar[str] = ".npy"
    in_memory: ClassVar[bool] = True

    def __len__(self) -> int:
        return len(self.y)

    def label_array(self) -> np.ndarray:
        return self.y.numpy().astype(np.int64)

    def item(self, index: int) -> tuple[torch.Tensor, int]:
        return self.x[index], int(self.y[index])

    def tensors_nhwc(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x.movedim(1, -1), self.y  # channels last: N x H x W x C, or N x L x C

    def ffcv_field(self, ffcv: FFCVConfig) -> Any:
        from ffcv.fields import NDArrayField

        return NDArrayField(dtype=np.dtype("float32"), shape=tuple(self.x.shape[1:]))

    def ffcv_rows(self) -> Sequence[tuple[Any, int]]:
        return list(zip(self.x.numpy(), self.y.tolist()))

    def write_dali_file(self, index: int, path: Path) -> None:
        np.save(path, np.ascontiguousarray(self.x[index].numpy(), dtype=np.float32))
