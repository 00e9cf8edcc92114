"""The `data` config section: one schema for every data set and pipeline, and `paths`.

A data set's own defaults (where it lies, its workers and evaluation batch) are the few values
its object changes on top of this schema (`DataSet.config`); `data.register_configs` builds the
`data=NAME` options from them. `data.ffcv` and `data.dali` hold what only that pipeline uses:
where `python -m data.prepare` writes its files (and the pipeline reads them), and the writer's
and loader's settings.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Optional

from core.schema import Section, option


class Pipeline(enum.StrEnum):
    """How a data set is read (docs/pipelines.md compares them)."""

    torchvision = "torchvision"  # DataLoader + torchvision transforms (tensors in memory for digits)
    ffcv = "ffcv"  # .beton files, JIT-compiled decoding on threads
    dali = "dali"  # NVIDIA DALI graphs, CPU or GPU decoding
    device = "device"  # in-memory sets (digits, MNIST-1D, CIFAR) held on the training device, augmented there in batches


class Partition(enum.StrEnum):
    """How the training part is spread over the training ranks (docs/evaluation.md)."""

    iid = "iid"  # every epoch a fresh seeded permutation, strided over the ranks (as DistributedSampler)
    dirichlet = "dirichlet"  # each class split over the ranks in Dirichlet(alpha) proportions, fixed for the run
    classes = "classes"  # each rank holds `classes_per_worker` classes, fixed for the run
    source = "source"  # text: each rank holds whole sources (plays or speaking roles), fixed for the run


class SourceUnit(enum.StrEnum):
    """What a text's source is, for `data.partition=source` (docs/tasks.md)."""

    play = "play"  # each rank reads whole plays
    role = "role"  # each rank reads whole speaking roles (a play's character), as LEAF's Shakespeare


@dataclass
class FFCVConfig(Section):
    dir: Optional[str] = None  # holds train.beton, val.beton; None: <data.root>/ffcv
    # writing ImageFolder data (ffcv-imagenet's settings); CIFAR and digits are stored raw
    max_resolution: int = option(500, ge=1)  # longest side kept; larger images are downscaled when written
    jpeg_quality: int = option(90, ge=1, le=100)
    compress_probability: float = option(0.5, ge=0, le=1)  # share of images stored as JPEG, the rest raw
    # reading
    os_cache: bool = True  # read through the page cache (shared by the ranks of a node)
    batches_ahead: int = option(3, ge=1)


@dataclass
class DALIConfig(Section):
    # CIFAR/digits: the one-file-per-sample copy `data.prepare` writes (ImageNet is read in
    # place from data.root); None: <data.root>/dali
    dir: Optional[str] = None
    prefetch_queue_depth: int = option(2, ge=1)


@dataclass
class DataConfig(Section):
    name: str = "digits"  # a registered data set (data/sets/): digits | mnist1d | cifar10 | cifar100 | imagenet | ...
    pipeline: Pipeline = Pipeline.torchvision
    root: Optional[str] = None  # where the data set lies on disk (not used by digits)
    num_classes: Optional[int] = option(None, ge=1)  # None: the data set's own
    image_size: Optional[int] = option(None, ge=1)  # training crop; None: the data set's default
    eval_resize: Optional[int] = option(None, ge=1)  # ImageNet: resize before the centre crop
    augment: bool = True  # the data set's standard training augmentation
    num_workers: int = option(0, ge=0)  # loader processes per rank (torchvision); threads for FFCV/DALI (0: 1)
    eval_batch_size: Optional[int] = option(None, ge=1)  # None: the training batch size
    test_fraction: float = option(0.2, gt=0, lt=1)  # digits, mnist1d: held-out share (digits: split with split_seed)
    # generated sets (mnist1d; docs/tasks.md): samples in all (train + test) and the generator's seed
    num_samples: Optional[int] = option(None, ge=10)
    generator_seed: Optional[int] = None
    # text sets (shakespeare_char; docs/tasks.md): the window a model reads, the contiguous blocks the
    # corpus is cut into for the train / validation / test split (test_fraction, val_fraction: shares
    # of the blocks), what a source is for data.partition=source
    context_length: Optional[int] = option(None, ge=1)
    split_blocks: Optional[int] = option(None, ge=3)
    source_unit: Optional[SourceUnit] = None
    eval_windows: Optional[int] = option(None, ge=1)  # at most this many of each held-out part's windows (evenly spaced)
    split_seed: int = 0  # also seeds the validation carve-out (one validation set for every run seed)
    # validation: carved from the training set, stratified by class, disjoint from every rank's
    # shard (docs/evaluation.md). Set one of the three; 0 in any turns selection off.
    val_fraction: Optional[float] = option(0.1, ge=0, lt=1)  # share of the training set
    val_count: Optional[int] = option(None, ge=0)  # samples in all
    val_per_class: Optional[int] = option(None, ge=0)  # samples of every class (ImageNet)
    partition: Partition = Partition.iid
    dirichlet_alpha: float = option(0.5, gt=0)  # smaller: more skewed (data.partition=dirichlet)
    classes_per_worker: int = option(2, ge=1)  # data.partition=classes
    ffcv: FFCVConfig = field(default_factory=FFCVConfig)
    dali: DALIConfig = field(default_factory=DALIConfig)


@dataclass
class PathsConfig(Section):
    """The `paths` section: this machine's folders, set once in conf/local/default.yaml (or the
    SYNCOPT_DATA variable). It sits here because only data sets read it: their `data.root`
    defaults are `${paths.data_root}/<name>`."""

    data_root: str = "${oc.env:SYNCOPT_DATA,datasets}"
