"""The `data` config section (one schema for every data set and pipeline)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class DataConfig:
    name: str = "digits"  # digits | cifar10 | cifar100 | imagenet
    pipeline: str = "torchvision"  # torchvision | ffcv | dali
    root: Optional[str] = None  # where the data set lies on disk (not used by digits)
    num_classes: Optional[int] = None  # None: the data set's own
    image_size: Optional[int] = None  # training crop; None: the data set's default
    eval_resize: Optional[int] = None  # ImageNet: resize before the centre crop
    augment: bool = True  # the data set's standard training augmentation
    num_workers: int = 0  # loader worker processes (threads for FFCV/DALI) per rank
    eval_batch_size: Optional[int] = None  # None: the training batch size
    test_fraction: float = 0.2  # digits: held-out share, split with split_seed
    split_seed: int = 0
    options: dict[str, Any] = field(default_factory=dict)  # pipeline-specific settings


@dataclass(frozen=True)
class DataSpec:
    """What a model needs to know about its input, known without reading the data."""

    in_channels: int
    image_size: int
    num_classes: int
