"""`DataSet`: everything the runner and the three pipelines ask of one data set, in one object.

A data set's file (data/sets/NAME.py) defines a subclass and registers an instance
(`register_dataset`). The object holds the facts a model and the launch checks need without
reading anything (channels, resolution, classes, training-set size), its `data=NAME` config
defaults, the check that it is on disk (never a download), its splits in one of the shared forms
(`data.samples`, from which `data.prepare` writes FFCV's and DALI's files), and how each pipeline
turns a sample into the model's input: torchvision transforms, FFCV decoders and operations, a
DALI graph. The pipelines hold no code for any particular data set.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Optional

import numpy as np

from omegaconf import DictConfig, OmegaConf

from core.errors import UserError
from core.spec import DataSpec, ImageSpec
from data.config import DataConfig, Partition, Pipeline
from data.samples.base import Samples
from data.split import train_split
from data.device_augment import DeviceAugment

#: `data.*` options that only some sets read (`DataSet.reads`)
SET_OPTIONS = ("num_samples", "generator_seed", "context_length", "split_blocks", "source_unit", "eval_windows")

Transform = Callable[[Any], Any]
Finish = Callable[[Any], Any]  # FFCV: the loader's image tensor -> the model's input


@dataclass(frozen=True)
class KeyedDraws:
    """Per-sample random draws a pipeline computes from the samples' seeds (`data.sampler.
    sample_seeds`) and feeds to a data set's DALI graph: name -> numpy dtype, and the function
    from an int64 array of seeds to one array per name. With them a graph's randomness is a pure
    function of (seed, epoch, index), so one DALI pipeline serves every epoch."""

    dtypes: dict[str, Any] = field(default_factory=dict)
    make: Callable[[np.ndarray], dict[str, np.ndarray]] = lambda seeds: {}


NO_DRAWS = KeyedDraws()  # a graph with nothing random


def check_epoch_share(name: str, per_shard: int, num_shards: int, batch_size: int) -> None:
    """A training rank reads `per_shard` samples (or windows) an epoch: at least one batch."""
    if per_shard < batch_size:
        raise UserError(f"train.batch_size={batch_size} x {num_shards} training ranks is more than the "
                        f"{per_shard * num_shards} training samples of {name}; use fewer ranks or a smaller batch")


class DataSet(ABC):
    """Subclasses set the class attributes (or dataclass fields) below and the abstract methods;
    a pipeline's methods may stay unimplemented when `pipelines` leaves that pipeline out."""

    name: str
    in_channels: int
    image_size: int  # default training resolution (`data.image_size` overrides it)
    num_classes: int  # `data.num_classes` overrides it (a subset of the classes)
    form: ClassVar[type[Any]]  # a `data.samples` Samples class, or `data.text.corpus.TextCorpus`
    #: per-channel mean and std of pixels in [0, 1]; None: the samples are stored normalised
    mean: Optional[tuple[float, ...]] = None
    std: Optional[tuple[float, ...]] = None
    #: `data=NAME`'s values where they differ from `DataConfig`'s defaults (interpolations allowed)
    config: dict[str, Any] = {}  # (read only)
    pipelines: ClassVar[tuple[Pipeline, ...]] = tuple(Pipeline)
    needs_root: ClassVar[bool] = True  # False: it ships with a package (no `data.root`)
    #: the `data.*` options only some sets read (`SET_OPTIONS`) that this one reads; another set
    #: given one of them refuses it in one line rather than ignoring it
    reads: ClassVar[tuple[str, ...]] = ()
    #: the `data.*` options that redraw this set's validation and test sets when changed (another
    #: generator seed, another carve-out); () where the test set is fixed (an official one:
    #: CIFAR's, ImageNet's). A table sets them to each run's seed (`table.split_seeds=per_seed`)
    split_redraw_options: ClassVar[tuple[str, ...]] = ()

    # ---- facts and config ------------------------------------------------------------------
    def spec(self, cfg: DataConfig) -> DataSpec:
        """What a model needs of this set's input; images by default (a set of another kind, a
        signal or a text, overrides it)."""
        return ImageSpec(in_channels=self.in_channels, image_size=cfg.image_size or self.image_size,
                         num_classes=cfg.num_classes or self.num_classes)

    def config_node(self) -> DictConfig:
        """The `data=NAME` option: the schema with this data set's values (checked against it)."""
        return OmegaConf.merge(OmegaConf.structured(DataConfig), {"name": self.name, **self.config})

    def check_config(self, cfg: DataConfig) -> None:
        """One-line `UserError` for a config this data set cannot be read with."""
        if cfg.pipeline not in self.pipelines:
            raise UserError(f"data.pipeline={cfg.pipeline} cannot read data.name={self.name}; "
                            f"use one of {', '.join(self.pipelines)}")
        if cfg.pipeline == Pipeline.device and not self.held_on_device():
            usable = ", ".join(p for p in self.pipelines if p != Pipeline.device)
            raise UserError(f"data.pipeline=device holds a data set in memory on the training device; "
                            f"data.name={self.name} is not held in memory that way: use one of {usable}")
        if cfg.partition == Partition.source and not getattr(self.form, "windows", False):
            raise UserError(f"data.partition=source deals a text's sources (plays, speaking roles) to the ranks; "
                            f"data.name={self.name} has labels: use data.partition=iid, dirichlet or classes")
        for key in SET_OPTIONS:
            if getattr(cfg, key) is not None and key not in self.reads:
                raise UserError(f"data.{key}={getattr(cfg, key)} is not an option of data.name={self.name}; "
                                "remove it")
        if self.needs_root and not cfg.root:
            raise UserError(f"data.root is not set for data.name={self.name}; set paths.data_root "
                            "in conf/local/default.yaml or pass data.root=PATH")

    def num_train_samples(self, cfg: DataConfig) -> Optional[int]:
        """Training-set size when it is known without reading the data (launch-time checks)."""
        return None

    # ---- what the plan checks before launch --------------------------------------------------
    def plan_labels(self, cfg: DataConfig) -> Optional[np.ndarray]:
        """The training file's labels as the plan can know them before launch, or None. The split's
        sizes (validation per class, each rank's pool, `data.split`) depend only on how many
        samples each class has, never on their order, so declared class sizes serve as well as
        the file's labels (CIFAR's official 5,000 a class); a set held in memory gives its own."""
        return None

    def check_shares(self, cfg: DataConfig, seed: int, num_shards: int, batch_size: int) -> None:
        """Refuse before launch (one line) what a training rank would refuse on its first step:
        the split the ranks compute (`data.split.train_split`: validation sizes against the
        training file, classes per worker against its classes, a Dirichlet partition's smallest
        share against the batch), computed here from `plan_labels`, and each rank's share of an
        epoch against its batch. Without labels, what the set declares (its classes)."""
        labels = self.plan_labels(cfg)
        if labels is None:
            classes = cfg.num_classes or self.num_classes
            if cfg.partition == Partition.classes and cfg.classes_per_worker > classes:
                raise UserError(f"data.classes_per_worker={cfg.classes_per_worker} is more than the {classes} classes "
                                f"of data.name={self.name}; use at most {classes}")
            return
        split = train_split(labels, cfg, seed, num_shards, batch_size)
        check_epoch_share(self.name, split.plan.per_shard, num_shards, batch_size)

    # ---- on disk -----------------------------------------------------------------------------
    @abstractmethod
    def check_on_disk(self, cfg: DataConfig) -> None:
        """Raise a one-line `UserError` naming the path, what must be there and how to get it
        when the data set is missing; cheap (cli.py runs it before launch); never downloads."""

    @abstractmethod
    def samples(self, cfg: DataConfig, split: str) -> Samples:
        """Split "train" or "val" in this data set's form, in its reading order. "val" is the data
        set's own held-out split, which the runner reports as the *test* set; the validation
        split that selects is carved out of "train" by index (`data.split`)."""

    def preload(self, cfg: DataConfig) -> None:
        """Compute once, in the launching process, what every rank would otherwise compute alone
        and keep in memory, so that ranks forked from it (`launch.launcher=fork`) share it
        copy-on-write. Only work that gives the same bits in any process and starts no thread
        pool (no parallel torch operation: forked ranks cannot use a pool started before the
        fork): a generated set's numpy procedure, a text read from disk. Nothing by default."""

    def identity(self, cfg: DataConfig) -> dict[str, Any]:
        """Settings beyond the split's (`data.split.split_identity`) that change which samples a
        run reads (a generated set's size and seed): a resumed run must share them."""
        return {}

    def record(self, cfg: DataConfig) -> dict[str, Any]:
        """What summary.json's `data_split` records of this set beyond the split (a generated
        set's size, seed and generation time; a corpus's checksum)."""
        return {}

    def prepared_identity(self, cfg: DataConfig) -> dict[str, Any]:
        """Settings that change the samples (beyond the name): FFCV's and DALI's prepared files
        record them, and a run with other values refuses those files."""
        return {}

    # ---- per pipeline ------------------------------------------------------------------------
    def torchvision_transforms(self, cfg: DataConfig) -> tuple[Transform, Transform]:
        """(training, evaluation) transforms from `samples().item`'s image to a float CHW tensor."""
        raise NotImplementedError(f"{self.name} declares no torchvision transforms")

    def ffcv_image_ops(self, cfg: DataConfig, train: bool, epoch_key: Any) -> tuple[list[Any], Finish]:
        """(FFCV decoder and operations up to uint8 HWC images, the step from the loader's tensor
        to the model's input). Random operations draw from `epoch_key` (`data.ffcv_augment`)
        so that a resumed run repeats them."""
        raise NotImplementedError(f"{self.name} declares no FFCV operations")

    def dali_images(self, cfg: DataConfig, encoded: Any, train: bool, decoder: str,
                    draws: Optional[dict[str, Any]] = None) -> Any:
        """The DALI graph from encoded files to float CHW images; `decoder` is "cpu" or "mixed";
        `draws`: the data nodes of `dali_draws`' arrays, when the pipeline feeds them."""
        raise NotImplementedError(f"{self.name} declares no DALI graph")

    def dali_draws(self, cfg: DataConfig, train: bool) -> Optional[KeyedDraws]:
        """The random draws the DALI graph takes as inputs (NO_DRAWS: it draws nothing); None:
        it draws from DALI's own generators, and the pipeline then builds one DALI pipeline per
        epoch, seeded from (seed, epoch, shard), to repeat them exactly."""
        return None

    def device_augment(self, cfg: DataConfig, train: bool) -> DeviceAugment:
        """What the device pipeline does to a batch of the split (crop, flip, normalisation),
        for forms held in memory (`Samples.in_memory`)."""
        raise NotImplementedError(f"{self.name} declares no device-pipeline batch recipe")

    def held_on_device(self) -> bool:
        """Whether the device pipeline can hold this set: in memory, with a batch recipe."""
        return bool(self.form.in_memory and self.has_device_augment())

    def has_device_augment(self) -> bool:
        return type(self).device_augment is not DataSet.device_augment

    # ---- helpers for subclasses --------------------------------------------------------------
    def dali_normalisation(self) -> dict[str, Any]:
        """`fn.crop_mirror_normalize`'s arguments for this data set's mean and std (pixels 0-255)."""
        from nvidia.dali import types

        return dict(mean=[255 * m for m in self.mean or ()], std=[255 * s for s in self.std or ()],
                    dtype=types.FLOAT, output_layout="CHW")
