"""Dual-way gradient sparsification (DGS; Yan, Xiao, Chen, Zhou, Wu, ICPP 2020).

Both directions of an asynchronous parameter server are sparse. The worker runs SAMomentum:
u = m u + lr (g + wd w), pushes the top `density` of each layer of u, and keeps the entries it did
not send as an un-decayed residual (divided by m, as the reference code does); its model changes
only through the server's replies. The server subtracts the push from the global model and replies
with the per-layer top `reply_density` of global - synced - sent_w (what this worker is missing),
recording what it sent; every `resync_period` server versions it sends each worker the whole model
once (see `param_server/server.py`). With `density_follows_lr` the push density is scaled by
lr / peak lr, as the reference code does (so it drops with each LR decay); the reply's is not.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from dist_algos import register_algorithm
from dist_algos.base import StepContext
from dist_algos.comm.pattern import PatternConfig
from dist_algos.compress.sparse_feedback import samomentum_
from dist_algos.param_server import wire
from dist_algos.param_server.plugin import ParamServerAlgorithm, SparseConfig


@dataclass
class DGSConfig(SparseConfig):
    name: str = "dgs"
    density_follows_lr: bool = False  # push density x lr / peak lr (the reference code's rule)


@register_algorithm("dgs")
class DGS(ParamServerAlgorithm):
    Config = DGSConfig
    memory = ("velocity",)
    scheduled_density = True
    fixed_downlink = "sparse"
    momentum_required = "SAMomentum divides the unsent residual by it"

    def setup_worker(self) -> None:
        self.velocity = torch.zeros_like(self.flat)
        self.density = self.cfg.density

    @classmethod
    def push_density(cls, config: PatternConfig, step: int) -> Optional[float]:
        cfg = config.algo
        return cfg.density * (config.lr_at(step) / config.peak_lr if cfg.density_follows_lr else 1.0)

    def make_pushes(self, ctx: StepContext) -> list[wire.Message]:
        step = self.decayed_update(ctx.lr)
        self.density = self.cfg.density * (ctx.lr / self.peak_lr if self.cfg.density_follows_lr else 1.0)
        pushes = []
        for shard in self.shards:
            idx, values = samomentum_(shard.of(self.velocity), shard.of(step), self.momentum, shard.sizes,
                                      self.density)
            pushes.append(wire.sparse(idx, values, self.value_dtype, ctx.step, self.density))
        return pushes
