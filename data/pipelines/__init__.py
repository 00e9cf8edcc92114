"""The ways to read a data set (`data.pipeline`); docs/pipelines.md compares them.

Each module has `build(cfg, request, make_split, with_val=True) -> (TrainStream or None, test
EvalStream, validation EvalStream or None, TrainSplit)`, where `make_split` turns the training
file's labels into the split (data/split.py), and asks the data set's object (`data.sets`) for
everything particular to it; one whose batches arrive in host memory says so
(`BATCHES_ON_HOST = True`), and `data.build_data` overlaps their copy to a GPU. A pipeline module
imports its package (torchvision, FFCV, DALI) at its top, so it is imported only when chosen.
"""
from __future__ import annotations

import importlib.util
from typing import Optional

from data.config import Pipeline

#: pipeline -> (module implementing `build(cfg, request, make_split, with_val)`, the package it needs)
PIPELINES: dict[Pipeline, tuple[str, Optional[str]]] = {
    Pipeline.torchvision: ("data.pipelines.torchvision", "torchvision"),
    Pipeline.ffcv: ("data.pipelines.ffcv", "ffcv"),
    Pipeline.dali: ("data.pipelines.dali", "nvidia.dali"),
    Pipeline.device: ("data.pipelines.device", None),
}


def installed(pipeline: Pipeline | str) -> bool:
    """Whether the package the pipeline needs can be imported here. Every dotted prefix is looked
    up: `nvidia` alone exists wherever torch's CUDA wheels are installed, DALI or not."""
    package = PIPELINES[Pipeline(pipeline)][1]
    if package is None:
        return True
    parts = package.split(".")
    try:
        return all(importlib.util.find_spec(".".join(parts[:k])) is not None for k in range(1, len(parts) + 1))
    except (ModuleNotFoundError, ValueError):
        return False
