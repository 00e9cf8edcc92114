"""Compressed averaging of a model's change since the last synchronisation (local SGD's averaged
model delta, issue 22 (3)).

Every worker keeps the anchor, the model all workers agreed on at the last synchronisation. At a
synchronisation each sends its delta, anchor - local model, through the compressor chain and
error feedback (`Communicator`); the new model on every worker is anchor - combined delta, which
becomes the next anchor. With no compression this is plain model averaging; with compression the
workers still end each round on one identical model, and what the chain dropped stays in each
worker's memory for later rounds."""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn as nn

from dist_algos.comm.accounting import OpSink
from dist_algos.compress import build_chain
from dist_algos.compress.communicator import Communicator


class ModelDelta:
    def __init__(self, communicator: Communicator, params: list[nn.Parameter]) -> None:
        self.exchanger, self.params = communicator, params
        self.anchor = torch.cat([p.detach().reshape(-1).float() for p in params])

    @classmethod
    def build(cls, compress: Any, feedback: str, params: list[nn.Parameter], world: int, rank: int,
              seed: int = 0) -> Optional["ModelDelta"]:
        compressor = build_chain(compress)
        if compressor is None:
            return None
        comm = Communicator(compressor, feedback, world, rank, [p.numel() for p in params], seed=seed,
                            shapes=[tuple(p.shape) for p in params])
        return cls(comm, params)

    def average_(self, step: int, sink: Optional[OpSink] = None) -> int:
        """One synchronisation: every worker's parameters become anchor - combined delta; returns
        the bytes this rank sent (its collectives recorded in `sink`)."""
        current = torch.cat([p.detach().reshape(-1).float() for p in self.params])
        combined, nbytes = self.exchanger.exchange(self.anchor - current, step, sink)
        self.anchor.sub_(combined)
        offset = 0
        for p in self.params:
            p.data.copy_(self.anchor[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        return nbytes

    def state_dict(self) -> dict[str, Any]:
        return {"anchor": self.anchor.clone(), "memory": self.exchanger.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.anchor.copy_(state["anchor"])
        self.exchanger.load_state_dict(state["memory"])
