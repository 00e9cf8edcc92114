"""Data sets and the pipelines that read them: what the runner imports from the data floor.

`data.name` picks a data set (`data.sets`: one object per file, behind the `DATASETS` registry)
and `data.pipeline` how it is read (`data.pipelines`: torchvision, FFCV, DALI). Every pipeline
yields the same `TrainStream`/`EvalStream` (`data.stream`), sharded by `data.sampler`'s rules, so
the trainer does not know which one runs; the pipelines ask the data set's object for everything
particular to it. Nothing here downloads: a missing data set is a `UserError` naming the path and
what must be there. FFCV and DALI read files that `python -m data.prepare` writes;
docs/pipelines.md says how the three pipelines differ.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Optional

import torch
from hydra.core.config_store import ConfigStore

from core.errors import UserError
from core.schema import typed_section
from core.spec import DataSpec
from data.config import DataConfig, PathsConfig, Pipeline
from data.pipelines import PIPELINES
from data.pipelines import installed as pipeline_installed
from data.prefetch import prefetched
from data.prepared_files import check_prepared, needs_preparation
from data.sets import DATASETS, register_dataset
from data.sets.base import DataSet
from data.split import split_identity as _split_identity
from data.split import train_split, validation_rule
from data.stream import DataRequest, EvalStream, TrainStream

__all__ = ["DATASETS", "DataConfig", "DataRequest", "DataSet", "DataStreams", "PathsConfig", "Pipeline",
           "build_data", "build_streams", "check_data_on_disk", "check_shares", "data_spec", "load_data_config",
           "num_train_samples", "register_configs", "register_dataset", "split_identity", "validation_enabled"]


def register_configs() -> None:
    """One Hydra option per data set (`data=NAME`): the schema with the data set's own values."""
    store = ConfigStore.instance()
    for name, dataset in DATASETS.items():
        store.store(group="data", name=name, node=dataset.config_node())


def load_data_config(node: Any) -> DataConfig:
    """The `data` section merged onto `DataConfig` (ranges checked), for a known data set that
    can be read with the chosen pipeline, whose package is installed."""
    cfg = typed_section(DataConfig, node, "data")
    DATASETS.get(cfg.name).check_config(cfg)
    validation_rule(cfg)  # two validation sizes at once: one line, before launch
    if not pipeline_installed(cfg.pipeline):
        raise UserError(f"data.pipeline={cfg.pipeline} needs the {PIPELINES[cfg.pipeline][1]} package, which is not "
                        "installed here; run scripts/setup_env.sh (or pick data.pipeline=torchvision)")
    return cfg


def split_identity(cfg: DataConfig) -> dict[str, Any]:
    """The settings that decide which samples train and validate (`data.split.split_identity`),
    plus the data set's own (a generated set's size and seed): a resumed run must share them."""
    own = DATASETS.get(cfg.name).identity(cfg)
    return {**_split_identity(cfg), **({"set": own} if own else {})}


def validation_enabled(cfg: DataConfig) -> bool:
    """Whether the config carves a validation split (selection on; `data.val_*=0` turns it off)."""
    return validation_rule(cfg) is not None


def data_spec(cfg: DataConfig) -> DataSpec:
    return DATASETS.get(cfg.name).spec(cfg)


def num_train_samples(cfg: DataConfig) -> Optional[int]:
    """Size of the training part (the training file less the validation split) when it is known
    without reading the data (for launch-time checks)."""
    dataset = DATASETS.get(cfg.name)
    n = dataset.num_train_samples(cfg)
    rule = validation_rule(cfg)
    if n is None or rule is None:
        return n
    key, value = rule
    held = {"val_fraction": round(value * n), "val_count": int(value),
            "val_per_class": int(value) * (cfg.num_classes or dataset.num_classes)}[key]
    if held >= n:  # (what data.split would find on every rank)
        raise UserError(f"data.{key}={value} leaves no training samples of the {n} in the training file of "
                        f"data.name={cfg.name}; use a smaller data.{key}")
    return n - held


def check_shares(cfg: DataConfig, seed: int, num_shards: int, batch_size: int) -> None:
    """Before launch, what every training rank would otherwise find alone on its first step:
    the split and partition the ranks compute (validation against the training file, classes per
    worker, a text's windows per rank and in the held-out blocks) and each rank's share of an
    epoch against its batch (`DataSet.check_shares`); a one-line `UserError` for the first that
    cannot work. `num_shards`: the training ranks; `batch_size`: samples per rank and step."""
    DATASETS.get(cfg.name).check_shares(cfg, seed, num_shards, batch_size)


def preload(cfg: DataConfig) -> None:
    """What the data set lets the launching process compute once for ranks forked from it
    (`DataSet.preload`; launch.launcher=fork)."""
    DATASETS.get(cfg.name).preload(cfg)


def check_data_on_disk(cfg: DataConfig) -> None:
    """Raise `UserError` when what the configured pipeline reads is missing: the prepared files
    (FFCV; DALI unless it reads the data set in place), naming the command that writes them, or
    the data set itself. Cheap enough for cli.py to run before launch."""
    if needs_preparation(cfg):
        check_prepared(cfg)
    else:
        DATASETS.get(cfg.name).check_on_disk(cfg)


def _pipeline_module(pipeline: Pipeline) -> Any:
    """Import a pipeline's module without changing torch's intra-op thread count, which belongs
    to the trainer (importing FFCV sets it to 1)."""
    threads = torch.get_num_threads()
    try:
        return importlib.import_module(PIPELINES[pipeline][0])
    finally:
        torch.set_num_threads(threads)


@dataclass
class DataStreams:
    """What a rank reads: its training shard (None on serving ranks), its slice of the test set
    and of the validation split (None when validation is off), and the split's record for
    summary.json (`data.split.TrainSplit.record`)."""

    train: Optional[TrainStream]
    test: EvalStream
    val: Optional[EvalStream]
    split: dict[str, Any] = field(default_factory=dict)


def build_streams(cfg: DataConfig, request: DataRequest, with_val: bool = True) -> DataStreams:
    """This rank's streams through the configured pipeline; a pipeline that hands batches over
    in host memory (`BATCHES_ON_HOST`) gets them copied to a GPU one batch ahead
    (`data.prefetch`). The split (validation carve-out, partition) is computed here from the
    training file's labels, identically on every rank (`data.split`)."""
    module = _pipeline_module(cfg.pipeline)
    make_split = partial(_split, cfg=cfg, request=request)
    train, test, val, split = module.build(cfg, request, make_split, with_val)
    if getattr(module, "BATCHES_ON_HOST", False):
        train, test = prefetched(train, request.device), prefetched(test, request.device)
        val = prefetched(val, request.device) if val is not None else None
    if train is not None and train.steps_per_epoch < 1:
        raise UserError(
            f"train.batch_size={request.batch_size} x {request.num_shards} training ranks is more "
            f"than the {split.plan.per_shard * request.num_shards} training samples of {cfg.name}; use fewer "
            "ranks or a smaller batch")
    return DataStreams(train, test, val, {**split.record, **DATASETS.get(cfg.name).record(cfg)})


def _split(labels: Any, cfg: DataConfig, request: DataRequest) -> Any:
    return train_split(labels, cfg, request.seed, request.num_shards, request.batch_size)


def build_data(cfg: DataConfig, request: DataRequest) -> tuple[Optional[TrainStream], EvalStream]:
    """(TrainStream or None, test EvalStream) for this rank (`build_streams` without the
    validation stream: for benchmarks and tests of the training side)."""
    streams = build_streams(cfg, request, with_val=False)
    return streams.train, streams.test
