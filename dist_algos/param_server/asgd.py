"""ASGD through a parameter server: push lr x (g + wd w) densely, get the whole model back.

The asynchronous baseline of the DGS paper (and of Dean et al.'s Downpour): each worker pushes its
full update, the server subtracts it from the global model and replies with the model, which
replaces the worker's copy. No momentum (as in the reference code); `optim.momentum` is unused.
With one worker it is plain SGD with weight decay.
"""
from __future__ import annotations

from dataclasses import dataclass

from dist_algos import register_algorithm
from dist_algos.base import StepContext
from dist_algos.param_server import wire
from dist_algos.param_server.plugin import ParamServerAlgorithm, ParamServerConfig


@dataclass
class ASGDConfig(ParamServerConfig):
    name: str = "asgd"


@register_algorithm("asgd")
class ASGD(ParamServerAlgorithm):
    Config = ASGDConfig
    fixed_downlink = "model"

    def make_pushes(self, ctx: StepContext) -> list[wire.Message]:
        update = self.decayed_update(ctx.lr)
        return [wire.dense(shard.of(update), self.value_dtype, ctx.step) for shard in self.shards]
