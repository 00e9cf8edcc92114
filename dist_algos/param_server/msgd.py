"""Single-node momentum SGD: the DGS paper's baseline and the reference point of its speed-ups.

One process, no server: the run's SGD optimizer steps on the local gradient (u = m u + g + wd w;
w -= lr u, the reference code's `sgd` mode). A world of one, so that its results sit in the same
tables as the parameter-server runs.
"""
from __future__ import annotations

from dataclasses import dataclass

from dist_algos import register_algorithm
from dist_algos.base import AlgoConfig, DistAlgorithm, HyperParams, Scenario, StepContext
from dist_algos.comm.pattern import CommOp, ParamLayout, PatternConfig
from core.errors import UserError


@dataclass
class MSGDConfig(AlgoConfig):
    name: str = "msgd"


@register_algorithm("msgd")
class MSGD(DistAlgorithm):
    Config = MSGDConfig
    test_world_size = 1
    test_scenarios = {"single_node": Scenario()}
    reference = "tests.support.references:MSGD"
    invalid_options = {"launch.nproc=2": "set launch.nproc=1"}

    @classmethod
    def validate(cls, cfg: MSGDConfig, world_size: int, local_size: int,
                 hyper: HyperParams) -> None:
        if world_size != 1:
            raise UserError(f"algo=msgd is the single-node momentum SGD baseline: set launch.nproc=1 "
                            f"(not {world_size})")

    def step(self, ctx: StepContext) -> None:
        ctx.optimizer_step()

    @classmethod
    def comm_pattern(cls, rank: int, step: int, world: int, config: PatternConfig,
                     layout: ParamLayout) -> list[CommOp]:
        """A world of one: nothing is communicated."""
        return []
