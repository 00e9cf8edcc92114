"""Distributed-training algorithm plugins and their registry (`algo=NAME`).

Every module in this package is imported on first use, so a plugin registers itself just by
living here with `@register_algorithm`; tests enumerate `list_algorithms()`.
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Callable

from dist_algos.base import AlgoConfig, DistAlgorithm
from engine.errors import UserError

_REGISTRY: dict[str, type[DistAlgorithm]] = {}
_SHARED_MODULES = {"base", "comm", "flat"}


def register_algorithm(name: str) -> Callable[[type[DistAlgorithm]], type[DistAlgorithm]]:
    def deco(cls: type[DistAlgorithm]) -> type[DistAlgorithm]:
        if name in _REGISTRY:
            raise ValueError(f"algorithm {name!r} registered twice")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def _load_all() -> None:
    for mod in pkgutil.iter_modules(__path__):
        if mod.name not in _SHARED_MODULES and not mod.name.startswith("_"):
            importlib.import_module(f"{__name__}.{mod.name}")


def list_algorithms() -> list[str]:
    _load_all()
    return sorted(_REGISTRY)


def get_algorithm(name: str) -> type[DistAlgorithm]:
    _load_all()
    if name not in _REGISTRY:
        raise UserError(f"algo.name={name!r} is not an algorithm; choose one of {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def load_algo_config(node: Any) -> AlgoConfig:
    """The `algo` section merged onto the chosen plugin's config dataclass."""
    from engine.config import typed_section

    name = node.get("name") if node is not None else None
    cls = get_algorithm(name)
    return typed_section(cls.Config, node, "algo")
