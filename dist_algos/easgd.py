"""Elastic averaging SGD (Zhang, Choromanska, LeCun 2015), synchronous: the LSGD paper's baseline.

Version followed: the synchronous EASGD of the EASGD paper's equations (5) and (6) with the
elastic step every `sync_period` (tau) steps, as the LSGD authors' code runs it
(`dist_easgd_train`): after the local optimizer step of every tau-th step, with N workers, the
moving rate beta = `moving_rate` and alpha = beta / N,
    x_i    <- (1 - alpha) x_i + alpha x_centre
    centre <- (1 - beta) centre + beta mean_i(x_i)
where both updates use the same x_i (the workers' weights before their elastic move) and the
old centre. Gradients and momentum buffers are not touched by the elastic step; only
parameters are (BatchNorm statistics stay per worker).

The reference reduces the workers' weights to rank 0, which holds the centre and broadcasts
it. Here one all_reduce gives every rank the mean and every rank updates its own copy of the
centre with the same arithmetic, so the centre is identical everywhere without a broadcast
(the same values, one collective per period instead of two). The centre starts as the common
initial weights. beta = 0.43 is the LSGD authors' setting (their script's c2).

Fault-tolerant mode (`ft.enabled`): the elastic step is a round (`dist_algos.comm.round_averager`) over the
replicas alive at it, N their number (alpha = beta / N); a replica that heals receives a peer's
centre with its model. A round that fails applies nothing (weights and centre stay as they were;
the average it gathered is discarded) and is recorded in `failed_rounds`.

Evaluation (`eval_model`): `center` the centre variable (the reference tests it), `average` the
workers' mean, both with BatchNorm statistics re-estimated on `bn_batches` training batches
per rank and averaged; `local` rank 0's own weights on rank 0 only. Evaluation traffic is not
counted.

At 64 workers (docs/workers.md): alpha = beta / N = 0.43 / 64, so each worker is pulled towards
the centre 16 times more weakly than at 4 workers while the centre still moves by beta towards
the workers' mean; the elastic step is one all_reduce whatever N. Any world size.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.nn as nn

from dist_algos import register_algorithm
from dist_algos.base import AlgoConfig, DistAlgorithm, RankLayout, Scenario, StepContext, TrainInfo
from dist_algos.comm.accounting import allreduce_op, now
from dist_algos.comm.pattern import CommOp, ParamLayout, PatternConfig
from dist_algos.consensus.evaluation import EvalCopy, consensus_eval_ranks, consensus_model
from dist_algos.comm.flat import FlatBuffer, average_
from dist_algos.comm.round_averager import run_round
from dist_algos.schedules.leader import pull_towards_
from core.schema import option

EVAL_MODELS = ("center", "average", "local")


@dataclass
class EASGDConfig(AlgoConfig):
    name: str = "easgd"
    # beta: the centre moves this far towards the workers' mean
    moving_rate: float = option(0.43, gt=0, le=1, hint="the paper's beta; 0.43 in LSGD's runs")
    sync_period: int = option(16, ge=1)  # tau: steps between elastic updates
    eval_model: str = option("center", choices=EVAL_MODELS)
    bn_batches: Optional[int] = option(None, ge=0, hint="or null: one epoch")  # BN re-estimation batches per rank


def elastic_update_(params: list[torch.Tensor], center: list[torch.Tensor], mean: list[torch.Tensor],
                    moving_rate: float, num_workers: int) -> None:
    """One synchronous elastic step, in place: workers towards the old centre by beta / N,
    then the centre towards the workers' mean by beta."""
    pull_towards_(params, center, moving_rate / num_workers)
    pull_towards_(center, mean, moving_rate)


@register_algorithm("easgd")
class EASGD(DistAlgorithm):
    Config = EASGDConfig
    test_world_size = 4
    test_scenarios = {"tau3": Scenario({"sync_period": 3, "moving_rate": 0.43}, optimizer="nesterov")}
    reference = "tests.support.references:EASGD"
    invalid_options = {"algo.sync_period=0": "algo.sync_period=0", "algo.moving_rate=1.5": "algo.moving_rate=1.5",
                       "algo.eval_model=best": "algo.eval_model"}

    cfg: EASGDConfig
    ft_refusal = ""  # a failed elastic round applies nothing

    @classmethod
    def layout(cls, cfg: AlgoConfig, world_size: int) -> RankLayout:
        return RankLayout(train=tuple(range(world_size)), evaluate=tuple(consensus_eval_ranks(cfg.eval_model, world_size)))

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer, info: TrainInfo) -> None:
        super().setup(model, optimizer, info)
        self.params = FlatBuffer(p for p in model.parameters())
        self.center = [b.detach().clone() for b in self.params]
        self.elastic_steps = 0
        self.failed_rounds: list[int] = []  # fault-tolerant mode: steps whose round was not committed
        self._eval_copy: Optional[EvalCopy] = None

    def step(self, ctx: StepContext) -> None:
        ctx.optimizer_step()
        if (ctx.step + 1) % self.cfg.sync_period:
            return
        if self.ft_rounds is not None:
            self._elastic_round()
            return
        world = self.ctx.world_size
        with self.comm.timed(), torch.no_grad():
            mean = [b.clone() for b in self.params.buffers]
            issued = now()
            average_(mean, group=None, group_size=world)
            self.comm.record(allreduce_op(self.params.nbytes, world), issued, now(), syncs=1)
            elastic_update_(self.params.buffers, self.center, mean, self.cfg.moving_rate, world)
        self.elastic_steps += 1

    def _elastic_round(self) -> None:
        """The elastic step over the replicas alive at this round (fault-tolerant mode): the mean
        is gathered first and applied only once every participant has committed."""
        rounds = self.ft_rounds
        assert rounds is not None
        mean: list[torch.Tensor] = []

        def contribution() -> list[torch.Tensor]:  # read after a possible heal (the peer's weights)
            mean[:] = [b.detach().clone() for b in self.params.buffers]
            return mean

        issued = now()
        with self.comm.timed(), torch.no_grad():
            committed = run_round(rounds, contribution, lambda _: None)
            if committed:
                elastic_update_(self.params.buffers, self.center, mean, self.cfg.moving_rate, rounds.participants)
        self.comm.record(allreduce_op(self.params.nbytes, rounds.participants), issued, now(), syncs=1)
        if committed:
            self.elastic_steps += 1
        else:
            self.failed_rounds.append(rounds.step)

    def eval_model(self, model: nn.Module) -> Optional[nn.Module]:
        mode, world = self.cfg.eval_model, self.ctx.world_size
        if mode == "local":
            return model if self.ctx.rank == 0 else None
        if self._eval_copy is None:
            self._eval_copy = EvalCopy(model)
        with torch.no_grad():
            if mode == "center":
                weights = self.center
            else:
                weights = [b.clone() for b in self.params.buffers]
                average_(weights, group=None, group_size=world)
            n = self.cfg.bn_batches if self.cfg.bn_batches is not None else self.info.steps_per_epoch
            return consensus_model(self._eval_copy, weights, model, self.info.train_batches, n,
                                   self.info.forward, None, world)

    def state_dict(self) -> dict[str, Any]:
        return {"center": [t.clone() for t in self.center], "elastic_steps": self.elastic_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for dst, src in zip(self.center, state["center"]):
            dst.copy_(src)
        self.elastic_steps = int(state["elastic_steps"])

    def metrics(self) -> dict[str, float]:
        return {"elastic_steps": self.elastic_steps}

    @classmethod
    def comm_pattern(cls, rank: int, step: int, world: int, config: PatternConfig,
                     layout: ParamLayout) -> list[CommOp]:
        """Every tau-th step one all_reduce of the parameters (the elastic step's mean)."""
        due = step < config.total_steps and (step + 1) % config.algo.sync_period == 0
        return [allreduce_op(layout.total_bytes, world)] if due and world > 1 else []

    def summary(self) -> dict[str, Any]:
        return {"elastic_steps": self.elastic_steps,
                **({"failed_rounds": list(self.failed_rounds)} if self.ft_rounds is not None else {})}
