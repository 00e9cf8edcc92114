"""Data sets and pipelines behind one registry.

`data.name` picks the data set (digits, cifar10, cifar100, imagenet) and `data.pipeline` how it
is read (torchvision, ffcv, dali). Every pipeline yields the same `TrainStream`/`EvalStream`
(`data.stream`), sharded by `data.sampler`'s rules, so the trainer does not know which one runs.
Nothing here downloads: a missing data set is a `UserError` naming the path and what must be there.
FFCV and DALI read files that `python -m data.prepare` writes (`data/prepare.py`);
docs/pipelines.md says how the three pipelines differ.
"""
from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from typing import Any, Optional

from data.config import DataConfig, DataSpec, PathsConfig  # noqa: F401
from core.errors import UserError


@dataclass(frozen=True)
class DatasetInfo:
    in_channels: int
    image_size: int
    num_classes: int
    pipelines: tuple[str, ...]


DATASETS: dict[str, DatasetInfo] = {
    "digits": DatasetInfo(1, 8, 10, ("torchvision", "ffcv", "dali")),
    "cifar10": DatasetInfo(3, 32, 10, ("torchvision", "ffcv", "dali")),
    "cifar100": DatasetInfo(3, 32, 100, ("torchvision", "ffcv", "dali")),
    "imagenet": DatasetInfo(3, 224, 1000, ("torchvision", "ffcv", "dali")),
}

#: pipeline name -> (module implementing `build(cfg, request)`, package it needs)
PIPELINES: dict[str, tuple[str, Optional[str]]] = {
    "torchvision": ("data.torchvision_pipeline", "torchvision"),
    "ffcv": ("data.ffcv_pipeline", "ffcv"),
    "dali": ("data.dali_pipeline", "nvidia.dali"),
}


@dataclass(frozen=True)
class DataRequest:
    """What the trainer asks of a pipeline on this rank."""

    batch_size: int  # per training rank
    eval_batch_size: int
    seed: int
    shard: Optional[int]  # index among the training ranks; None: this rank does not train
    num_shards: int
    eval_shard: int
    eval_num_shards: int
    device: Any = "cpu"


def dataset_names() -> list[str]:
    return sorted(DATASETS)


def register_configs() -> None:
    """(temporary: conf/data/*.yaml)"""


def load_data_config(node: Any) -> DataConfig:
    from core.schema import typed_section

    cfg = typed_section(DataConfig, node, "data")
    if cfg.name not in DATASETS:
        raise UserError(f"data.name={cfg.name!r} is not a data set; choose one of {', '.join(DATASETS)}")
    info = DATASETS[cfg.name]
    if cfg.pipeline not in PIPELINES:
        raise UserError(f"data.pipeline={cfg.pipeline!r} is not a pipeline; choose one of {', '.join(PIPELINES)}")
    if cfg.pipeline not in info.pipelines:
        raise UserError(f"data.pipeline={cfg.pipeline} cannot read data.name={cfg.name}; "
                        f"use one of {', '.join(info.pipelines)}")
    package = PIPELINES[cfg.pipeline][1]
    if package and importlib.util.find_spec(package.split(".")[0]) is None:
        raise UserError(f"data.pipeline={cfg.pipeline} needs the {package} package, which is not "
                        "installed here; run scripts/setup_env.sh (or pick data.pipeline=torchvision)")
    if cfg.num_workers < 0:
        raise UserError(f"data.num_workers={cfg.num_workers} must be 0 or more")
    if not 0 < cfg.test_fraction < 1:
        raise UserError(f"data.test_fraction={cfg.test_fraction} must be between 0 and 1")
    if cfg.name != "digits" and not cfg.root:
        raise UserError(f"data.root is not set for data.name={cfg.name}; set paths.data_root "
                        "in conf/local/default.yaml or pass data.root=PATH")
    return cfg


def data_spec(cfg: DataConfig) -> DataSpec:
    info = DATASETS[cfg.name]
    return DataSpec(
        in_channels=info.in_channels,
        image_size=cfg.image_size or info.image_size,
        num_classes=cfg.num_classes or info.num_classes,
    )


def num_train_samples(cfg: DataConfig) -> Optional[int]:
    """Training-set size when it is known without reading the data (for launch-time checks)."""
    if cfg.name == "digits":
        from data.digits import split_sizes

        return split_sizes(cfg.test_fraction)[0]
    return {"cifar10": 50_000, "cifar100": 50_000}.get(cfg.name)


def _pipeline_module(pipeline: str) -> Any:
    """Import a pipeline's module without changing torch's intra-op thread count, which belongs
    to the trainer (importing FFCV sets it to 1)."""
    import torch

    threads = torch.get_num_threads()
    try:
        return importlib.import_module(PIPELINES[pipeline][0])
    finally:
        torch.set_num_threads(threads)


def build_data(cfg: DataConfig, request: DataRequest) -> tuple[Any, Any]:
    """(TrainStream or None, EvalStream) for this rank, through the configured pipeline."""
    train, evals = _pipeline_module(cfg.pipeline).build(cfg, request)
    if train is not None and train.steps_per_epoch < 1:
        raise UserError(
            f"train.batch_size={request.batch_size} x {request.num_shards} training ranks is more "
            f"than the {train.num_samples} training samples of {cfg.name}; use fewer ranks or a "
            "smaller batch")
    return train, evals


def check_data_on_disk(cfg: DataConfig) -> None:
    """(temporary re-export until the data registry lands)"""
    from data.preflight import check_data_on_disk as check

    check(cfg)
