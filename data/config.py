"""The `data` config section (one schema for every data set and pipeline).

`data.ffcv` and `data.dali` hold what only that pipeline uses: where `python -m data.prepare`
writes its files (and the pipeline reads them), and the writer's and loader's settings.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from core.spec import DataSpec  # noqa: F401  (re-exported: data sets declare it)


@dataclass
class FFCVConfig:
    dir: Optional[str] = None  # holds train.beton, val.beton; None: <data.root>/ffcv
    # writing ImageFolder data (ffcv-imagenet's settings); CIFAR and digits are stored raw
    max_resolution: int = 500  # longest side kept; larger images are downscaled when written
    jpeg_quality: int = 90
    compress_probability: float = 0.5  # share of images stored as JPEG, the rest as raw pixels
    # reading
    os_cache: bool = True  # read through the page cache (shared by the ranks of a node)
    batches_ahead: int = 3


@dataclass
class DALIConfig:
    # CIFAR/digits: the one-file-per-sample copy `data.prepare` writes (ImageNet is read in
    # place from data.root); None: <data.root>/dali
    dir: Optional[str] = None
    prefetch_queue_depth: int = 2


@dataclass
class DataConfig:
    name: str = "digits"  # digits | cifar10 | cifar100 | imagenet
    pipeline: str = "torchvision"  # torchvision | ffcv | dali
    root: Optional[str] = None  # where the data set lies on disk (not used by digits)
    num_classes: Optional[int] = None  # None: the data set's own
    image_size: Optional[int] = None  # training crop; None: the data set's default
    eval_resize: Optional[int] = None  # ImageNet: resize before the centre crop
    augment: bool = True  # the data set's standard training augmentation
    num_workers: int = 0  # loader processes per rank (torchvision); threads for FFCV/DALI (0: 1)
    eval_batch_size: Optional[int] = None  # None: the training batch size
    test_fraction: float = 0.2  # digits: held-out share, split with split_seed
    split_seed: int = 0
    ffcv: FFCVConfig = field(default_factory=FFCVConfig)
    dali: DALIConfig = field(default_factory=DALIConfig)


@dataclass
class PathsConfig:
    data_root: str = "${oc.env:SYNCOPT_DATA,datasets}"
