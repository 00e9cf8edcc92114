"""Deep Gradient Compression (Lin et al. 2018) through an asynchronous parameter server.

Per step a worker clips its gradient locally (`clip_norm` x workers^-1/2, when set), adds weight
decay, applies momentum correction (u = m u + g; v += u), pushes lr x the top `density` of each
layer of v, and masks the momentum factor (u and v cleared where sent). During the first
`warmup_epochs` epochs the density warms up exponentially (0.25, 0.0625, 0.0156, ... never below
`density`), DGC's schedule and the reference code's list. The learning rate multiplies the values
when they are sent, as in the reference code. The reply is DGS's sparse one by default
(`downlink=sparse`, as the reference code runs this baseline), or the whole model (`model`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from dist_algos import register_algorithm
from dist_algos.base import StepContext
from dist_algos.comm.pattern import PatternConfig
from dist_algos.compress.sparse_feedback import clip_by_norm_, dgc_, dgc_warmup_density
from dist_algos.param_server import wire
from dist_algos.param_server.plugin import DOWNLINKS, ParamServerAlgorithm, SparseConfig
from core.schema import option


@dataclass
class DGCConfig(SparseConfig):
    name: str = "dgc"
    downlink: str = option("sparse", choices=DOWNLINKS)  # sparse: DGS's top-k reply | model: the whole model
    warmup_epochs: int = option(4, ge=0)  # epochs of exponentially decreasing density (0: none)
    # local gradient clipping at clip_norm / sqrt(workers) (null: off)
    clip_norm: Optional[float] = option(None, gt=0, hint="or null: no clipping")


@register_algorithm("dgc")
class DGC(ParamServerAlgorithm):
    Config = DGCConfig
    memory = ("momentum_buf", "accum")
    scheduled_density = True

    def setup_worker(self) -> None:
        self.momentum_buf = torch.zeros_like(self.flat)
        self.accum = torch.zeros_like(self.flat)
        self.density = self.cfg.density

    @classmethod
    def push_density(cls, config: PatternConfig, step: int) -> Optional[float]:
        cfg = config.algo
        return dgc_warmup_density(cfg.density, config.epoch_of(step), cfg.warmup_epochs)

    def make_pushes(self, ctx: StepContext) -> list[wire.Message]:
        grad = self.update.copy_(self.grad)  # the persistent scratch buffer, not a fresh clone
        if self.cfg.clip_norm is not None:
            clip_by_norm_(grad, self.cfg.clip_norm / math.sqrt(len(self.train_ranks())))
        grad.add_(self.flat, alpha=self.weight_decay)
        self.density = dgc_warmup_density(self.cfg.density, ctx.epoch, self.cfg.warmup_epochs)
        pushes = []
        for shard in self.shards:
            idx, values = dgc_(shard.of(self.momentum_buf), shard.of(self.accum), shard.of(grad), self.momentum,
                               ctx.lr, shard.sizes, self.density)
            pushes.append(wire.sparse(idx, values, self.value_dtype, ctx.step, self.density))
        return pushes
