"""Name -> entry registries filled by decorators: models, data sets and algorithms alike.

An entry registers itself where it is defined (`@REGISTRY.register("name")`), and a registry
that is given its packages imports every module directly inside them on first use, so adding an
entry is adding one file. A subpackage is searched only when it is listed itself, so helpers that
register nothing live in one (dist_algos/comm/, consensus/, schedules/) instead of on a skip list. Tests enumerate
`names()`, so every entry goes through them without anyone remembering to list it.
"""
from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable
from typing import Generic, Optional, TypeVar

from core.errors import UserError

T = TypeVar("T")


class Registry(Generic[T]):
    """`kind`: what an entry is ("algorithm"); `key`: the config key that names one ("algo.name");
    `packages`: packages whose modules (not their subpackages') are imported before the first
    lookup (their entries register themselves); module names starting with "_" or listed in
    `skip` are not."""

    def __init__(self, kind: str, key: str, packages: Iterable[str] = (), skip: Iterable[str] = ()) -> None:
        self.kind, self.key = kind, key
        self._packages = list(packages)
        self._skip = set(skip)
        self._entries: dict[str, T] = {}
        self._loaded = False

    def register(self, name: str) -> Callable[[T], T]:
        def deco(entry: T) -> T:
            self.add(name, entry)
            return entry

        return deco

    def register_named(self, name: str) -> Callable[[T], T]:
        """`register`, also setting the entry's `name` attribute (plugin classes that know their name)."""
        def deco(entry: T) -> T:
            entry.name = name  # type: ignore[attr-defined]
            self.add(name, entry)
            return entry

        return deco

    def add(self, name: str, entry: T) -> None:
        if name in self._entries and self._entries[name] is not entry:
            raise ValueError(f"{self.kind} {name!r} registered twice")
        self._entries[name] = entry

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        for package in self._packages:
            pkg = importlib.import_module(package)
            for mod in pkgutil.iter_modules(pkg.__path__, prefix=f"{package}."):
                leaf = mod.name.rsplit(".", 1)[1]
                if mod.ispkg or leaf.startswith("_") or leaf in self._skip:
                    continue
                importlib.import_module(mod.name)

    def names(self) -> list[str]:
        self._load()
        return sorted(self._entries)

    def get(self, name: Optional[str]) -> T:
        """The entry called `name`; a `UserError` naming the key and the choices otherwise."""
        self._load()
        if name not in self._entries:
            raise UserError(f"{self.key}={name!r} is not a known {self.kind}; choose one of "
                            f"{', '.join(sorted(self._entries))}")
        return self._entries[name]  # type: ignore[index]

    def items(self) -> list[tuple[str, T]]:
        self._load()
        return sorted(self._entries.items())
