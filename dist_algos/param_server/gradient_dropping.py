"""Gradient dropping (Aji and Heafield 2017) through an asynchronous parameter server.

A worker adds lr x (g + wd w) to its residual, pushes the top `density` of each layer by magnitude
and keeps the rest in the residual for later steps. No momentum (as in the reference code's
`aji` mode); `optim.momentum` is unused. The reply is DGS's sparse one by default
(`downlink=sparse`, as the reference code runs this baseline), or the whole model (`model`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from dist_algos import register_algorithm
from dist_algos.base import StepContext
from dist_algos.comm.pattern import PatternConfig
from dist_algos.compress.sparse_feedback import gradient_dropping_
from dist_algos.param_server import wire
from dist_algos.param_server.plugin import DOWNLINKS, ParamServerAlgorithm, SparseConfig
from core.schema import option


@dataclass
class GradientDroppingConfig(SparseConfig):
    name: str = "gradient_dropping"
    downlink: str = option("sparse", choices=DOWNLINKS)  # sparse: DGS's top-k reply | model: the whole model


@register_algorithm("gradient_dropping")
class GradientDropping(ParamServerAlgorithm):
    Config = GradientDroppingConfig
    memory = ("residual",)

    def setup_worker(self) -> None:
        self.residual = torch.zeros_like(self.flat)

    @classmethod
    def push_density(cls, config: PatternConfig, step: int) -> Optional[float]:
        return config.algo.density

    def make_pushes(self, ctx: StepContext) -> list[wire.Message]:
        update = self.decayed_update(ctx.lr)
        pushes = []
        for shard in self.shards:
            idx, values = gradient_dropping_(shard.of(self.residual), shard.of(update), shard.sizes, self.cfg.density)
            pushes.append(wire.sparse(idx, values, self.value_dtype, ctx.step, self.cfg.density))
        return pushes
