"""D-PSGD: decentralized parallel SGD on a ring (Lian et al., NeurIPS 2017), a WAGMA baseline.

Every step each worker exchanges its weights with its two ring neighbours and replaces them by
x = (x_left + x + x_right) / 3, then applies its own gradient (computed at the weights before
mixing) with the local optimizer: x_{t+1} = sum_j W_ij x_j - lr * g_i(x_i), W the ring's
doubly stochastic mixing matrix. As in WAGMA's baseline (MPI sends to both neighbours), only
trainable weights are mixed; on two ranks both neighbours are the same rank, which is then
counted twice, as there. Synchronous: each step waits for both neighbours. Evaluation uses the
average of all ranks' models (a copy), and `finalize` makes that average every rank's model.

Point-to-point sends run on a process group of this plugin's own (every rank creates it at
set-up), tagged by direction so that the two messages between the same pair of ranks on a ring
of two cannot be confused.

At 64 workers (docs/workers.md): each worker still mixes with its two ring neighbours only, so
a model needs 32 steps to reach the far side of the ring and the ring mixes ever more slowly as
it grows (its spectral gap falls as 1/N^2); traffic per worker stays two models per step. Any
world of two or more.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from dist_algos import register_algorithm
from dist_algos.comm import p2p
from dist_algos.comm.accounting import now
from dist_algos.comm.pattern import CommOp, OpKind, ParamLayout, PatternConfig, ring
from dist_algos.base import AlgoConfig, DistAlgorithm, Scenario, StepContext, TrainInfo
from dist_algos.consensus.average import average_model_, average_model_copy
from dist_algos.comm.flat import FlatBuffer
from dist_algos.schedules.groups import ring_neighbours

RIGHTWARDS, LEFTWARDS = 0, 1  # message tags: the direction a message travels along the ring


@dataclass
class DpsgdConfig(AlgoConfig):
    name: str = "dpsgd"


def ring_exchange(nbytes: int) -> list[CommOp]:
    """One mixing step's messages in issue order: receives from the left and the right
    neighbour, sends to the right and the left (each the whole weights; posted together, waited
    for together)."""
    return [CommOp(OpKind.RECV, ring(-1), 2, nbytes, 0, recv_bytes=nbytes),
            CommOp(OpKind.RECV, ring(+1), 2, nbytes, 0, recv_bytes=nbytes),
            CommOp(OpKind.SEND, ring(+1), 2, nbytes, nbytes), CommOp(OpKind.SEND, ring(-1), 2, nbytes, nbytes)]


@register_algorithm("dpsgd")
class Dpsgd(DistAlgorithm):
    ft_refusal = "gossip exchanges with fixed neighbours, not an average over whoever is alive"
    Config = DpsgdConfig
    test_world_size = 4
    test_scenarios = {"ring": Scenario()}
    reference = "tests.support.references:DPSGD"

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer, info: TrainInfo) -> None:
        super().setup(model, optimizer, info)
        self.weights = FlatBuffer([p for p in model.parameters() if p.requires_grad])
        self.from_left = [torch.empty_like(b) for b in self.weights]
        self.from_right = [torch.empty_like(b) for b in self.weights]
        self.group = self.ctx.new_group(list(range(self.ctx.world_size))) if self.ctx.world_size > 1 else None
        self.mixes = 0

    def step(self, ctx: StepContext) -> None:
        if self.ctx.world_size > 1:
            self._mix()
        ctx.optimizer_step()

    def _mix(self) -> None:
        left, right = ring_neighbours(self.ctx.rank, self.ctx.world_size)
        issued = now()
        with self.comm.timed():
            works = []
            for buf, from_left, from_right in zip(self.weights, self.from_left, self.from_right):
                works += [p2p.irecv(from_left, src=left, group=self.group, tag=RIGHTWARDS),
                          p2p.irecv(from_right, src=right, group=self.group, tag=LEFTWARDS),
                          p2p.isend(buf, dst=right, group=self.group, tag=RIGHTWARDS),
                          p2p.isend(buf, dst=left, group=self.group, tag=LEFTWARDS)]
            for work in works:
                work.wait()
        completed = now()
        for op in ring_exchange(self.weights.nbytes):
            self.comm.record(op, issued, completed)
        self.comm.add(syncs=1)
        for buf, from_left, from_right in zip(self.weights, self.from_left, self.from_right):
            buf.copy_(from_left.add_(buf).add_(from_right).div_(3))
        self.mixes += 1

    @classmethod
    def comm_pattern(cls, rank: int, step: int, world: int, config: PatternConfig,
                     layout: ParamLayout) -> list[CommOp]:
        """Every step the weights to and from both ring neighbours (`ring_exchange`)."""
        return ring_exchange(layout.total_bytes) if world > 1 and step < config.total_steps else []

    def eval_model(self, model: nn.Module) -> nn.Module:
        return average_model_copy(model, self.ctx.world_size)

    def finalize(self, model: nn.Module) -> None:
        average_model_(model, self.ctx.world_size)

    def state_dict(self) -> dict[str, Any]:
        return {"mixes": self.mixes}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.mixes = int(state["mixes"])
