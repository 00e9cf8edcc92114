"""SGP: stochastic gradient push (Assran, Loizou, Ballas, Rabbat; ICML 2019), a WAGMA baseline.

Push-sum gossip over a time-varying directed exponential graph: at step t rank i sends to
i + 2^((t + j) mod m), j < `num_peers` (`dist_algos.schedules.groups.exponential_peers`). Each
rank keeps a push-sum weight w (1 at the start) next to its model; the model the network sees
(forward, backward, the optimizer) is the de-biased z = x / w, where x is the push-sum numerator.
Per step, as in the SGP paper's Algorithm 1:

1. the local optimizer step on z with the gradient computed at z;
2. x = z * w; send (x, w) / (num_peers + 1) to each out-peer and keep the same share;
3. x = own share + received shares, w likewise; z = x / w.

Only trainable weights are gossiped (momentum and BatchNorm statistics stay local), as in
WAGMA's MPI baseline; that baseline uses two peers per step (the recipes do too), the SGP paper
one. Every rank has as many in-peers as out-peers here, so the mixing is doubly stochastic and w
stays 1 up to rounding; it is still carried (and checkpointed), which is what keeps z unbiased
should the graph lose that balance. Synchronous: a step waits for its in-peers' messages.
Evaluation uses the average over all ranks (a copy); `finalize` makes it every rank's model.

At 64 workers (docs/workers.md): the exponential graph has log2(64) = 6 distances (1, 2, ..., 32);
with the recipes' 2 peers a worker pushes to 2 of them per step, the pair shifting by one distance
a step, so every distance is used within 5 steps; traffic per worker stays num_peers models per
step. More peers than distances
(num_peers > ceil(log2 N)) is refused before launch in one line.
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
from dist_algos.base import AlgoConfig, DistAlgorithm, HyperParams, Scenario, StepContext, TrainInfo
from dist_algos.consensus.average import average_model_, average_model_copy
from dist_algos.comm.flat import FlatBuffer
from dist_algos.schedules.groups import exponential_hops, exponential_peers
from core.distenv import DistContext
from core.errors import UserError
from core.schema import option


@dataclass
class SgpConfig(AlgoConfig):
    name: str = "sgp"
    num_peers: int = option(1, ge=1)  # out-peers per step (SGP paper: 1; WAGMA's baseline: 2)


def push_ops(nbytes: int, world: int, step: int, num_peers: int) -> list[CommOp]:
    """One push-sum step's messages in issue order: per peer j, the share received from the rank
    2^h behind and the share sent to the rank 2^h ahead (`exponential_peers`), each the weights
    and the push-sum weight (8 bytes)."""
    out_peers, _ = exponential_peers(0, world, step, num_peers)
    ops = []
    for hop in out_peers:  # rank 0's out-peers are the offsets themselves
        ops += [CommOp(OpKind.RECV, ring(-hop), 2, nbytes + 8, 0, recv_bytes=nbytes + 8),
                CommOp(OpKind.SEND, ring(+hop), 2, nbytes + 8, nbytes + 8)]
    return ops


@register_algorithm("sgp")
class Sgp(DistAlgorithm):
    ft_refusal = "push-sum gossip with fixed out-neighbours, not an average over whoever is alive"
    Config = SgpConfig
    test_world_size = 4
    test_scenarios = {"one_peer": Scenario({"num_peers": 1}), "two_peers": Scenario({"num_peers": 2}, optimizer="nesterov")}
    reference = "tests.support.references:SGP"
    invalid_options = {"algo.num_peers=0": "algo.num_peers=0", "algo.num_peers=3": "algo.num_peers=3"}

    cfg: SgpConfig

    @classmethod
    def validate(cls, cfg: SgpConfig, world_size: int, local_size: int,
                 hyper: HyperParams) -> None:
        hops = exponential_hops(world_size)
        if world_size > 1 and cfg.num_peers > hops:
            raise UserError(f"algo.num_peers={cfg.num_peers}: {world_size} workers have only {hops} distinct "
                            f"exponential-graph peers; use at most {hops}")

    def __init__(self, cfg: SgpConfig, ctx: DistContext) -> None:
        super().__init__(cfg, ctx)
        self.ps_weight = torch.ones((), dtype=torch.float64)
        self.pushes = 0

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer, info: TrainInfo) -> None:
        super().setup(model, optimizer, info)
        self.weights = FlatBuffer([p for p in model.parameters() if p.requires_grad])
        k = self.cfg.num_peers
        self.received = [[torch.empty_like(b) for b in self.weights] for _ in range(k)]
        self.received_w = [torch.empty(1, dtype=torch.float64) for _ in range(k)]
        self.group = self.ctx.new_group(list(range(self.ctx.world_size))) if self.ctx.world_size > 1 else None

    def step(self, ctx: StepContext) -> None:
        ctx.optimizer_step()
        if self.ctx.world_size > 1:
            self._push(ctx.step)

    def _push(self, step: int) -> None:
        k = self.cfg.num_peers
        out_peers, in_peers = exponential_peers(self.ctx.rank, self.ctx.world_size, step, k)
        share_w = float(self.ps_weight) / (k + 1)
        shares = [b.mul(share_w) for b in self.weights]  # x / (k + 1) with x = z * w
        share_w_t = torch.tensor([share_w], dtype=torch.float64)
        n = len(shares) + 1  # messages per peer: the buffers and the weight
        issued = now()
        with self.comm.timed():
            works = []
            for j, (dst, src) in enumerate(zip(out_peers, in_peers)):
                for i, (recv, share) in enumerate(zip([*self.received[j], self.received_w[j]], [*shares, share_w_t])):
                    works.append(p2p.irecv(recv, src=src, group=self.group, tag=j * n + i))
                    works.append(p2p.isend(share, dst=dst, group=self.group, tag=j * n + i))
            for work in works:
                work.wait()
        new_w = share_w + sum(float(r) for r in self.received_w)
        for i, (buf, x) in enumerate(zip(self.weights, shares)):
            for j in range(k):
                x.add_(self.received[j][i])
            buf.copy_(x.div_(new_w))
        self.ps_weight.fill_(new_w)
        completed = now()
        for op in push_ops(self.weights.nbytes, self.ctx.world_size, step, k):
            self.comm.record(op, issued, completed)
        self.comm.add(syncs=1)
        self.pushes += 1

    @classmethod
    def comm_pattern(cls, rank: int, step: int, world: int, config: PatternConfig,
                     layout: ParamLayout) -> list[CommOp]:
        """Every step a share of (x, w) to each out-peer and one from each in-peer (`push_ops`)."""
        if world <= 1 or step >= config.total_steps:
            return []
        return push_ops(layout.total_bytes, world, step, config.algo.num_peers)

    def eval_model(self, model: nn.Module) -> nn.Module:
        return average_model_copy(model, self.ctx.world_size)

    def finalize(self, model: nn.Module) -> None:
        average_model_(model, self.ctx.world_size)

    def state_dict(self) -> dict[str, Any]:
        return {"ps_weight": self.ps_weight.clone(), "pushes": self.pushes}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ps_weight.copy_(state["ps_weight"])
        self.pushes = int(state["pushes"])

    def metrics(self) -> dict[str, float]:
        return {"ps_weight": float(self.ps_weight)}
