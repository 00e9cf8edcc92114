"""Synchronous data parallelism: average the gradients every step (the `parallel` baseline).

Gradients live in one flat buffer (`flat_grads`), so a step is a single all_reduce however
many tensors the model has; the mean gradient then drives the ordinary optimizer step, so all
ranks stay identical. Equivalent to one process taking the same step on the K-times batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn

from dist_algos import register_algorithm
from dist_algos.base import AlgoConfig, DistAlgorithm, StepContext, TrainInfo
from dist_algos.comm import allreduce_bytes
from dist_algos.flat import average_, flat_grads


@dataclass
class AllreduceConfig(AlgoConfig):
    name: str = "allreduce"


@register_algorithm("allreduce")
class Allreduce(DistAlgorithm):
    Config = AllreduceConfig

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer, info: TrainInfo) -> None:
        super().setup(model, optimizer, info)
        self.grads = flat_grads(model.parameters())

    def step(self, ctx: StepContext) -> None:
        world = self.ctx.world_size
        if world > 1:
            with self.comm.timed():
                average_(self.grads, group=None, group_size=world)
            self.comm.add(sent=allreduce_bytes(self.grads.nbytes, world),
                          recv=allreduce_bytes(self.grads.nbytes, world), syncs=1)
        ctx.optimizer_step()
