"""Models behind one registry: `model.name` picks a builder, the other `model.*` keys are its
keyword arguments (checked against its signature before launch). Input channels, resolution
and number of classes come from the data config (`DataSpec`), never from the model config.
"""
from __future__ import annotations

from typing import Any, Callable

import torch.nn as nn

from data.config import DataSpec
from engine.errors import UserError

Builder = Callable[..., nn.Module]
_REGISTRY: dict[str, Builder] = {}
_SPEC_ARGS = ("in_channels", "image_size", "num_classes")


def register_model(name: str) -> Callable[[Builder], Builder]:
    """Register `fn(in_channels, image_size, num_classes, **options) -> nn.Module` as `name`."""

    def deco(fn: Builder) -> Builder:
        if name in _REGISTRY:
            raise ValueError(f"model {name!r} registered twice")
        _REGISTRY[name] = fn
        return fn

    return deco


def list_models() -> list[str]:
    _load_all()
    return sorted(_REGISTRY)


def _load_all() -> None:
    from models import cifar_resnet, small_cnn, vision  # noqa: F401  (registration side effects)


def check_model_config(cfg: dict[str, Any], spec: DataSpec) -> None:
    from engine.config import check_kwargs

    _load_all()
    name = cfg.get("name")
    if name not in _REGISTRY:
        raise UserError(f"model.name={name!r} is not a model; choose one of {', '.join(sorted(_REGISTRY))}")
    options = {k: v for k, v in cfg.items() if k != "name"}
    check_kwargs("model", _REGISTRY[name], options, skip=_SPEC_ARGS)


def build_model(cfg: dict[str, Any], spec: DataSpec) -> nn.Module:
    check_model_config(cfg, spec)
    options = {k: v for k, v in cfg.items() if k != "name"}
    return _REGISTRY[cfg["name"]](spec.in_channels, spec.image_size, spec.num_classes, **options)
