"""A synchronisation round that may fail: the plugin side of fault-tolerant mode (`ft.enabled`).

In fault-tolerant mode every rank is its own replica group and the replicas average through
torchft's Manager instead of a fixed process group (engine/ft/rank/rounds.py,
docs/fault_tolerance.md). A round is: a quorum (the live replicas agree on who takes part; a
replica that is behind heals there, receiving a live peer's whole state), an all_reduce mean over
the participants, and a commit vote. If any participant failed during the round, the vote says no
on every survivor: the averaged values are garbage and the plugin rolls back as its algorithm
requires (`run_round`'s `restore`). This module holds only the interface, so that dist_algos does
not depend on torchft.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

import torch


class RoundAverager(ABC):
    """What a plugin needs from fault-tolerant averaging; the trainer's fault-tolerant rounds
    (`ManagerRounds` in engine/ft/rank/rounds.py, on torchft's Manager) implement it."""

    @abstractmethod
    def begin(self) -> None:
        """Join a quorum of the live replicas. A replica that is behind heals here: its model,
        optimizer, plugin and trainer state are replaced by a live peer's (taken at the same point
        of that peer's round), so whatever the caller needs to read must be read after this."""

    @abstractmethod
    def average_(self, tensors: Sequence[torch.Tensor]) -> None:
        """Replace each tensor by its mean over this round's participants (in place). After a
        failure the contents are undefined; `commit` then says False."""

    @abstractmethod
    def commit(self) -> bool:
        """Whether every participant finished the round (the same answer on every survivor)."""

    @property
    @abstractmethod
    def participants(self) -> int:
        """How many replicas take part in the current round (valid after `begin`)."""

    @property
    @abstractmethod
    def healed(self) -> bool:
        """Whether the current round's `begin` replaced this replica's state with a peer's."""

    @property
    @abstractmethod
    def step(self) -> int:
        """The trainer's current step (0-based), re-read after a heal has replaced it."""


def run_round(rounds: RoundAverager, tensors: Callable[[], Sequence[torch.Tensor]],
              restore: Callable[[Sequence[torch.Tensor]], None]) -> bool:
    """One round: quorum, mean of `tensors()` (called after a possible heal), commit; on a failed
    round `restore(backup)` gets copies of the tensors as they were before the all_reduce."""
    rounds.begin()
    live = list(tensors())
    backup = [t.detach().clone() for t in live]
    rounds.average_(live)
    if rounds.commit():
        return True
    restore(backup)
    return False
