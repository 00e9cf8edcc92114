"""Everything that decides a rank's future, declared once: name -> object with state_dict and
load_state_dict.

The trainer declares its parts here (model, optimizer, grad scaler, plugin, communication
counters, imbalance injector, training state, RNG, and in fault-tolerant mode the round record),
and three readers use the one declaration: the checkpoint (`capture`), resume (`load`, in two
phases) and fault-tolerant healing (`heal`). As in torchtitan's checkpointer, a new part is one
more entry, not four more lines in four places.

Order is part of the contract, because a resume must continue bit for bit: the parts load in
the order declared, and those marked `before_setup` (model, optimizer, scaler) load before the
plugin's `setup`, which reads them; the rest after it, which would otherwise overwrite what set-up
built. Healing takes a live peer's parts but not those marked `heals=False` (this replica's own
RNG stream and round history).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch.nn as nn

from engine.train.compute import plain_state_dict
from engine.train.rng import capture_rng, restore_rng


class Stateful(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> Any: ...


@dataclass(frozen=True)
class Part:
    """One declared part of the rank's state."""

    obj: Stateful
    before_setup: bool = False  # loaded before the plugin's set-up (which reads it)
    heals: bool = True  # taken from a live peer when healing
    optional: bool = False  # a checkpoint without it still loads (written before the part existed)


class RankState:
    """The declaration: name -> `Part`, in load order."""

    def __init__(self, parts: dict[str, Part]) -> None:
        self.parts = dict(parts)

    def add(self, name: str, part: Part) -> None:
        """A part that exists only once the run has started (the fault-tolerant round record)."""
        self.parts[name] = part

    def capture(self) -> dict[str, Any]:
        """Every part's state, for the checkpoint file or a healing peer."""
        return {name: part.obj.state_dict() for name, part in self.parts.items()}

    def load(self, state: dict[str, Any], before_setup: bool) -> None:
        """Resume: the parts of one phase (before the plugin's set-up, or after it) from `state`."""
        for name, part in self.parts.items():
            if part.before_setup == before_setup and (name in state or not part.optional):
                part.obj.load_state_dict(state[name])

    def heal(self, state: dict[str, Any]) -> None:
        """Fault-tolerant mode: a live peer's parts (its `capture()`), all but those it must not give."""
        for name, part in self.parts.items():
            if part.heals:
                part.obj.load_state_dict(state[name])


class ModelState:
    """The model as a part: saved as is, loaded without torch.compile's key prefix."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model

    def state_dict(self) -> dict[str, Any]:
        return self.model.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(plain_state_dict(state))


class RngState:
    """Every RNG of the process (Python, NumPy, torch; CUDA's for a rank on a GPU) as a part."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda

    def state_dict(self) -> dict[str, Any]:
        return capture_rng(self.cuda)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        restore_rng(state, self.cuda)
