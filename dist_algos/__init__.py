"""Distributed-training algorithm plugins and their registry (`algo=NAME`).

The plugins are the modules at this package's root and in `param_server/` (the parameter-server
family); both folders' modules are imported on first use, so a plugin registers itself just by
living there with `@register_algorithm`. The contract is `base.py`; what plugins are built from
lives in subpackages the registry never searches: `comm/` (accounting, flat buffers, buckets, p2p),
`consensus/`, `schedules/` and `compress/` (compression). A plugin's config dataclass is the one source of
its options and their defaults (`register_configs` hands it to Hydra as the `algo=NAME` option),
and tests enumerate `list_algorithms()`.
"""
from __future__ import annotations

from typing import Any, Callable

from hydra.core.config_store import ConfigStore

from core.registry import Registry
from core.schema import typed_section
from dist_algos.base import AlgoConfig, DistAlgorithm

ALGORITHMS: Registry[type[DistAlgorithm]] = Registry(
    "algorithm", "algo.name", packages=["dist_algos", "dist_algos.param_server"])


def register_algorithm(name: str) -> Callable[[type[DistAlgorithm]], type[DistAlgorithm]]:
    return ALGORITHMS.register_named(name)


def list_algorithms() -> list[str]:
    return ALGORITHMS.names()


def get_algorithm(name: str) -> type[DistAlgorithm]:
    return ALGORITHMS.get(name)


def load_algo_config(node: Any) -> AlgoConfig:
    """The `algo` section merged onto the chosen plugin's config dataclass (ranges checked)."""
    name = node.get("name") if node is not None else None
    return typed_section(get_algorithm(name).Config, node, "algo")


def register_configs() -> None:
    """One Hydra option per plugin (`algo=NAME`), its config dataclass as the node."""
    store = ConfigStore.instance()
    for name, cls in ALGORITHMS.items():
        store.store(group="algo", name=name, node=cls.Config)
