"""Leader SGD with node-local and global leaders (Teng et al., NeurIPS 2019), synchronous.

Workers are split into groups of `group_size` consecutive ranks (default: the launcher's ranks
per node). Each worker keeps the running mean of its last `loss_window` minibatch losses; the
lowest mean in a group is its local leader, the lowest overall the global leader. What follows
is the authors' code (yunfei-teng/LSGD, `local_batch_train` and `dist_lsgd_train`) made
synchronous; names map as p1, p2 -> local_pull, global_pull; c1, c2 -> local_refresh_pull,
global_refresh_pull; l_comm, g_comm -> local_period, global_period; avg_size -> loss_window.

Every step, after the local optimizer step (weights x, cached leader weights, no communication):
    x = (1 - global_pull / global_period) x + (global_pull / global_period) x_global_leader
    x = (1 - local_pull / local_period) x + (local_pull / local_period) x_local_leader
(global first, as in the reference). Every `local_period` steps a local refresh: all_gather of
(rank, running mean) in the group, broadcast of the group leader's weights within the group
into the local cache, x = (1 - local_refresh_pull) x + local_refresh_pull x_local_leader. Every
`global_period` steps the same over all ranks with the global pulls, after the local refresh
(so the global leader sends its weights after its own local pull, as in the reference); then
one all_gather over the world serves both choices. The caches start as the common initial
weights (the reference's too), so the first period pulls towards the start.

Differences from the reference: steps are counted per worker and all workers refresh at the
same steps (its global server counted iterations over all workers); the local leader is
active whenever there are several groups of more than one rank (the reference also switched it
off when l_comm == g_comm); a local-only refresh gathers losses within the group, not over the
world; the process groups are the same on every rank; and evaluation never touches the caches.

Evaluation (`eval_model`): `leader` evaluates the current global leader (lowest running mean at
evaluation time) with its own BatchNorm statistics, broadcast to every rank; `average` the
world average of the weights with BN statistics re-estimated on `bn_batches` training batches
per rank (the reference tested the node average after re-running the whole training set);
`local` rank 0's own weights, evaluated on rank 0 only. Evaluation traffic is not counted.

At 64 workers (docs/workers.md): `group_size` consecutive ranks form a group and must divide the
world (refused before launch otherwise). Left null it is the launcher's ranks per node, so on one
machine (launch.launcher=fork too) all 64 are one group and the local leader is off: only the
global leader pulls. The recipes' groups of 2 make 32 groups whose leaders refresh every
`local_period` steps, the global leader every `global_period`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from dist_algos import register_algorithm
from dist_algos.base import AlgoConfig, DistAlgorithm, HyperParams, RankLayout, Scenario, StepContext, TrainInfo
from dist_algos.comm.accounting import allgather_op, now
from dist_algos.comm.pattern import WORLD, CommOp, OpKind, ParamLayout, PatternConfig, block
from dist_algos.consensus.evaluation import EvalCopy, broadcast_model_, consensus_eval_ranks, consensus_model
from dist_algos.comm.flat import FlatBuffer, average_
from dist_algos.schedules.leader import RunningLoss, choose_leader, gather_losses, pull_towards_
from core.errors import UserError
from core.schema import option

EVAL_MODELS = ("leader", "average", "local")
MESSAGE_BYTES = 16  # (rank, running mean) as two float64


@dataclass
class LSGDConfig(AlgoConfig):
    name: str = "lsgd"
    group_size: Optional[int] = option(None, ge=1)  # ranks per group; None: the launcher's ranks per node
    loss_window: int = option(10, ge=1)  # running mean over this many minibatch losses (paper: 10 CIFAR, 64 ImageNet)
    local_period: int = option(4, ge=1)  # steps between local leader refreshes (l_comm)
    global_period: int = option(16, ge=1)  # steps between global leader refreshes (g_comm), a multiple of local_period
    local_pull: float = option(0.1, ge=0, le=1)  # per-step pull towards the cached local leader, spread over local_period (p1)
    global_pull: float = option(0.1, ge=0, le=1)  # per-step pull towards the cached global leader, spread over global_period (p2)
    local_refresh_pull: float = option(0.1, ge=0, le=1)  # pull towards the fresh local leader at a refresh (c1)
    global_refresh_pull: float = option(0.1, ge=0, le=1)  # pull towards the fresh global leader at a refresh (c2)
    eval_model: str = option("leader", choices=EVAL_MODELS)
    bn_batches: Optional[int] = option(None, ge=0, hint="or null: one epoch")  # `average`: BN re-estimation batches per rank


def broadcast_op(nbytes: int, size: int, group: str, root: Optional[bool]) -> CommOp:
    """A broadcast of `nbytes` from the group's leader: the root sends it to each other member,
    the others receive it once; `root` None (declared): either, so data-dependent."""
    sent, received = nbytes * (size - 1), nbytes
    if root is not None:
        sent, received = (sent, 0) if root else (0, received)
    return CommOp(OpKind.BROADCAST, group, size, nbytes, sent, recv_bytes=received, data_dependent=root is None)


def resolve_group_size(cfg: LSGDConfig, local_size: int) -> int:
    return cfg.group_size if cfg.group_size is not None else local_size


def partition(world_size: int, group_size: int) -> list[list[int]]:
    """Consecutive ranks in groups: with the launcher's rank order, one group per node."""
    return [list(range(start, start + group_size)) for start in range(0, world_size, group_size)]


def local_leader_active(world_size: int, group_size: int) -> bool:
    """A local leader differs from the global one only with several groups of several ranks."""
    return 1 < group_size < world_size


@register_algorithm("lsgd")
class LSGD(DistAlgorithm):
    ft_refusal = "its leader and local groups are fixed ranks, and a lost leader has no peer to heal from"
    Config = LSGDConfig
    test_world_size = 4
    # two nodes of two ranks: local leaders per node and a global one (the paper's layout)
    test_scenarios = {
        "two_groups": Scenario({"loss_window": 3, "local_period": 2, "global_period": 6, "local_pull": 0.2,
                                "global_pull": 0.3, "local_refresh_pull": 0.25, "global_refresh_pull": 0.4},
                               local_size=2, optimizer="nesterov"),
        "one_group": Scenario({"group_size": 4, "loss_window": 4, "global_period": 5, "global_refresh_pull": 0.5}),
    }
    reference = "tests.support.references:LSGD"
    invalid_options = {"algo.group_size=3": "algo.group_size=3", "algo.local_pull=2": "algo.local_pull=2",
                       "algo.group_size=2 algo.local_period=4 algo.global_period=6": "algo.global_period=6"}

    cfg: LSGDConfig

    @classmethod
    def validate(cls, cfg: LSGDConfig, world_size: int, local_size: int,
                 hyper: HyperParams) -> None:
        group = resolve_group_size(cfg, local_size)
        if world_size % group:
            raise UserError(f"algo.group_size={group} must divide the {world_size} ranks "
                            "(set algo.group_size, default: ranks per node)")
        if local_leader_active(world_size, group) and cfg.global_period % cfg.local_period:
            raise UserError(f"algo.global_period={cfg.global_period} must be a multiple of "
                            f"algo.local_period={cfg.local_period}")

    @classmethod
    def layout(cls, cfg: AlgoConfig, world_size: int) -> RankLayout:
        return RankLayout(train=tuple(range(world_size)), evaluate=tuple(consensus_eval_ranks(cfg.eval_model, world_size)))

    # ---- set-up -----------------------------------------------------------------------------
    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer, info: TrainInfo) -> None:
        super().setup(model, optimizer, info)
        world, rank = self.ctx.world_size, self.ctx.rank
        self.group_size = resolve_group_size(self.cfg, self.ctx.local_size)
        self.groups = partition(world, self.group_size)
        self.my_group = self.groups[rank // self.group_size]
        self.local_active = local_leader_active(world, self.group_size)
        # every rank creates every group, in the same order (torch.distributed requires it)
        handles = [self.ctx.new_group(ranks) for ranks in self.groups] if self.local_active else []
        self.group = handles[rank // self.group_size] if handles else None
        self.params = FlatBuffer(p for p in model.parameters())
        # cached leader weights: the common starting point until the first refresh
        self.global_leader = [b.detach().clone() for b in self.params]
        self.local_leader = [b.detach().clone() for b in self.params] if self.local_active else []
        device = self.params.buffers[0].device
        self.losses = RunningLoss(self.cfg.loss_window, device)
        self.led_global = 0
        self.led_local = 0
        self.global_refreshes = 0
        self.local_refreshes = 0
        self.last_global_leader = -1
        self.last_local_leader = -1
        self.leader_loss = float("nan")
        self.global_history: list[list[int]] = []  # [step, leader rank] at every global refresh
        self._eval_copy: Optional[EvalCopy] = None

    # ---- training ---------------------------------------------------------------------------
    def step(self, ctx: StepContext) -> None:
        cfg = self.cfg
        self.losses.add(ctx.loss)
        ctx.optimizer_step()
        with torch.no_grad():
            pull_towards_(self.params.buffers, self.global_leader, cfg.global_pull / cfg.global_period)
            if self.local_active:
                pull_towards_(self.params.buffers, self.local_leader, cfg.local_pull / cfg.local_period)
        done = ctx.step + 1
        local_due = self.local_active and done % cfg.local_period == 0
        global_due = done % cfg.global_period == 0
        if local_due or global_due:
            with self.comm.timed(), torch.no_grad():
                self._refresh(ctx.step, local_due, global_due)

    def _refresh(self, step: int, local_due: bool, global_due: bool) -> None:
        rank, world = self.ctx.rank, self.ctx.world_size
        issued = now()
        if global_due:
            pairs = gather_losses(rank, self.losses.mean(), None, world)
            self.comm.record(allgather_op(MESSAGE_BYTES, world), issued, now())
        else:
            pairs = gather_losses(rank, self.losses.mean(), self.group, self.group_size)
            self.comm.record(allgather_op(MESSAGE_BYTES, self.group_size, block(self.group_size)), issued, now())
        if local_due:
            leader = choose_leader(p for p in pairs if p[0] in self.my_group)
            self._adopt(self.local_leader, leader, self.group, self.group_size, block(self.group_size))
            pull_towards_(self.params.buffers, self.local_leader, self.cfg.local_refresh_pull)
            self.last_local_leader = leader
            self.led_local += int(leader == rank)
            self.local_refreshes += 1
        if global_due:
            leader = choose_leader(pairs)
            self._adopt(self.global_leader, leader, None, world, WORLD)
            pull_towards_(self.params.buffers, self.global_leader, self.cfg.global_refresh_pull)
            self.last_global_leader = leader
            self.leader_loss = dict(pairs)[leader]
            self.led_global += int(leader == rank)
            self.global_refreshes += 1
            self.global_history.append([step + 1, leader])

    def _adopt(self, cache: list[torch.Tensor], leader: int, group: Optional[Any], size: int, label: str) -> None:
        """The leader's current weights into `cache` on every rank of the group (one broadcast)."""
        if self.ctx.rank == leader:
            for dst, src in zip(cache, self.params.buffers):
                dst.copy_(src)
        issued = now()
        if size > 1:
            for buf in cache:
                dist.broadcast(buf, src=leader, group=group)
        self.comm.record(broadcast_op(self.params.nbytes, size, label, self.ctx.rank == leader), issued, now(), syncs=1)

    # ---- the declared pattern -----------------------------------------------------------------
    @classmethod
    def comm_pattern(cls, rank: int, step: int, world: int, config: PatternConfig,
                     layout: ParamLayout) -> list[CommOp]:
        """At a refresh, the all_gather of (rank, running loss) over the world (global refresh) or
        this rank's block, then the local leader's broadcast in the block and the global leader's
        over the world. Who leads is decided by the losses, so each broadcast is data-dependent:
        at most the leader's bytes sent, a follower's received."""
        cfg, done = config.algo, step + 1
        size = resolve_group_size(cfg, config.local_size)
        local_due = local_leader_active(world, size) and done % cfg.local_period == 0
        global_due = done % cfg.global_period == 0
        if step >= config.total_steps or not (local_due or global_due):
            return []
        ops = [allgather_op(MESSAGE_BYTES, world) if global_due else allgather_op(MESSAGE_BYTES, size, block(size))]
        if local_due:
            ops.append(broadcast_op(layout.total_bytes, size, block(size), None))
        if global_due:
            ops.append(broadcast_op(layout.total_bytes, world, WORLD, None))
        return [op for op in ops if op.group_size > 1]

    # ---- evaluation -------------------------------------------------------------------------
    def eval_model(self, model: nn.Module) -> Optional[nn.Module]:
        mode, world = self.cfg.eval_model, self.ctx.world_size
        if mode == "local" or world == 1:
            return model if self.ctx.rank in self.eval_ranks() else None
        if self._eval_copy is None:
            self._eval_copy = EvalCopy(model)
        with torch.no_grad():
            if mode == "leader":
                leader = choose_leader(gather_losses(self.ctx.rank, self.losses.mean(), None, world))
                return broadcast_model_(self._eval_copy, self.params.buffers, model, leader, self.ctx.rank)
            mean = [b.clone() for b in self.params.buffers]
            average_(mean, group=None, group_size=world)
            n = self.cfg.bn_batches if self.cfg.bn_batches is not None else self.info.steps_per_epoch
            return consensus_model(self._eval_copy, mean, model, self.info.train_batches, n,
                                   self.info.forward, None, world)

    # ---- state and reporting ----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "global_leader": [t.clone() for t in self.global_leader],
            "local_leader": [t.clone() for t in self.local_leader],
            "losses": self.losses.state_dict(),
            "led_global": self.led_global, "led_local": self.led_local,
            "global_refreshes": self.global_refreshes, "local_refreshes": self.local_refreshes,
            "last_global_leader": self.last_global_leader, "last_local_leader": self.last_local_leader,
            "leader_loss": self.leader_loss,
            "global_history": [list(h) for h in self.global_history],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if len(state["local_leader"]) != len(self.local_leader):
            raise UserError("the checkpoint was written with a different LSGD grouping "
                            f"(local leader {'on' if state['local_leader'] else 'off'}); keep algo.group_size")
        for dst, src in zip(self.global_leader + self.local_leader, state["global_leader"] + state["local_leader"]):
            dst.copy_(src)
        self.losses.load_state_dict(state["losses"])
        for key in ("led_global", "led_local", "global_refreshes", "local_refreshes",
                    "last_global_leader", "last_local_leader"):
            setattr(self, key, int(state[key]))
        self.leader_loss = float(state["leader_loss"])
        self.global_history = [list(map(int, h)) for h in state["global_history"]]

    def metrics(self) -> dict[str, float]:
        return {"global_leader": self.last_global_leader, "local_leader": self.last_local_leader,
                "leader_loss": self.leader_loss, "running_loss": float(self.losses.mean())}

    def plot_keys(self) -> list[str]:
        return ["global_leader"]

    def summary(self) -> dict[str, Any]:
        return {"rank": self.ctx.rank, "led_global": self.led_global, "led_local": self.led_local,
                "global_refreshes": self.global_refreshes, "local_refreshes": self.local_refreshes,
                "groups": self.groups if self.local_active else [list(range(self.ctx.world_size))],
                "global_history": self.global_history}

    @classmethod
    def merge_summaries(cls, per_rank: list[dict[str, Any]]) -> dict[str, Any]:
        """How often each rank led (globally and within its group), and the global leader at
        every global refresh (the paper's Figure 5)."""
        rows = sorted((s for s in per_rank if s), key=lambda s: s["rank"])
        if not rows:
            return {}
        first = rows[0]
        return {
            "global_leader_counts": [s["led_global"] for s in rows],
            "local_leader_counts": [s["led_local"] for s in rows],
            "global_refreshes": first["global_refreshes"],
            "local_refreshes": first["local_refreshes"],
            "groups": first["groups"],
            "global_leader_history": first["global_history"],
        }
