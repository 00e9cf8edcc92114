"""WAGMA-SGD: wait-avoiding group model averaging (Li, Ben-Nun, Nadiradze, Di Girolamo, Dryden,
Alistarh, Hoefler; TPDS 2021).

Every step each worker averages its weights inside a small group, then applies its own
gradient (computed at the weights before averaging) with the local optimizer; the groups change
from step to step (`dist_algos.schedules.groups.GroupSchedule`: recursive doubling, alternating
between consecutive and rank-strided groups) so that information spreads over the whole world;
every tau-th step (`global_period`) the average is global instead, which bounds how far apart
the models can drift and how stale any contribution can be.

Two modes:
- `wait_avoiding=true` (default, the paper's method): a background communication thread per
  rank runs the group collectives on process groups of its own; the first group member to
  arrive at a step starts the group average and slower members contribute the model they
  published last; the training thread waits only at the global average, and a group average
  reaches its model one step later (or more, when communication is slower than a step), as a
  correction that keeps the local steps taken meanwhile. See `dist_algos.schedules.wait_avoiding` for
  the design and why it cannot deadlock. Timing decides which models meet, so this mode is not
  bit-reproducible.
- `wait_avoiding=false`: the same schedule, synchronously, from the training thread; equal to
  a single-process simulation of K models (the reference-equivalence test) and bit-exact on
  resume.

Differences from the authors' code, on purpose: only trainable weights are averaged (as there;
momentum and BatchNorm statistics stay local), but the group update is the plain mean over the
group, (sum of members) / G (applied as a correction in wait-avoiding mode, which conserves
the sum of the models); their MPI operator computes (group sum + own) / (G + 1), which weights
the own model twice, and their training thread waits for each group allreduce to complete.
Their global average comes every 11th step (a limiter of 10); here every tau-th step, as in
the paper.
Evaluation uses the global average of all ranks' weights and BatchNorm statistics (a copy;
training is not changed), and `finalize` makes that average every rank's final model.

At 64 workers (docs/workers.md): the world must be a power of two (recursive doubling) and the
group size a power of two no larger than it; with the recipes' groups of G = 2 a step averages
pairs, the partners cycling over the log2(64) = 6 hypercube distances, so 6 steps of pair averages
make the exact mean (up to the local steps in between), and the global average every tau steps bounds the drift (the paper: G = 8 of 64,
`algo.group_size=8`). Any other world or group size is refused before launch in one line.
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from dist_algos import register_algorithm
from dist_algos.base import AlgoConfig, DistAlgorithm, HyperParams, Scenario, StepContext, TrainInfo
from dist_algos.comm.accounting import allreduce_op, now
from dist_algos.comm.pattern import WORLD, CommOp, OpKind, ParamLayout, PatternConfig, wagma
from dist_algos.consensus.average import average_model_, average_model_copy
from dist_algos.comm.flat import FlatBuffer, average_
from dist_algos.schedules.groups import GroupSchedule, is_global_step, log2_exact
from dist_algos.schedules.wait_avoiding import MESSAGE_BYTES, THREAD, Round, WaitAvoidingAverager
from core.distenv import DistContext
from core.errors import UserError
from core.schema import option

# Activation messages may be hours apart (a long evaluation between two steps): the signal
# group's receives must not time out the way a stuck collective should.
SIGNAL_TIMEOUT = datetime.timedelta(days=7)


@dataclass
class WagmaConfig(AlgoConfig):
    name: str = "wagma"
    group_size: int = 2  # G: a power of two dividing the number of workers (paper: 8 of 64)
    # tau: a global average every tau-th step, the staleness bound
    global_period: int = option(10, ge=1, hint="tau, the steps between global averages")
    wait_avoiding: bool = True  # false: synchronous group averages (deterministic)


@register_algorithm("wagma")
class Wagma(DistAlgorithm):
    ft_refusal = "its averaging groups are fixed sets of ranks chosen in advance, not whoever is alive"
    Config = WagmaConfig
    test_world_size = 4
    deterministic_overrides = {"wait_avoiding": False}
    deterministic_reason = ("in wait-avoiding mode which (possibly stale) models meet in a group average "
                            "depends on timing; the synchronous mode runs the same schedule deterministically")
    # groups of two on two nodes of two ranks, a global average every third step
    test_scenarios = {"groups": Scenario({"group_size": 2, "global_period": 3}, local_size=2),
                      "lm_groups": Scenario({"group_size": 2, "global_period": 3}, local_size=2, task="language_model")}
    reference = "tests.support.references:WAGMA"
    invalid_options = {"algo.group_size=3": "algo.group_size=3", "algo.group_size=8": "algo.group_size=8",
                       "algo.global_period=0": "algo.global_period=0", "launch.nproc=3": "power-of-two number"}

    cfg: WagmaConfig

    @classmethod
    def validate(cls, cfg: WagmaConfig, world_size: int, local_size: int,
                 hyper: HyperParams) -> None:
        if log2_exact(cfg.group_size) is None:
            raise UserError(f"algo.group_size={cfg.group_size} must be a power of two (1, 2, 4, 8, ...)")
        if log2_exact(world_size) is None:
            raise UserError(f"wagma needs a power-of-two number of workers (recursive-doubling groups); "
                            f"got {world_size}: change launch.nproc")
        if cfg.group_size > world_size:
            raise UserError(f"algo.group_size={cfg.group_size} is larger than the {world_size} workers; "
                            f"use at most {world_size}")

    def __init__(self, cfg: WagmaConfig, ctx: DistContext) -> None:
        super().__init__(cfg, ctx)
        self.schedule = GroupSchedule(ctx.world_size, cfg.group_size)
        self.averager: Optional[WaitAvoidingAverager] = None
        self._world_group: Any = None  # wait-avoiding mode: the comm thread's own world group
        self.counts = {"group": 0, "global": 0, "late": 0}
        self._restored_pending: list[torch.Tensor] = []  # corrections a checkpoint carried over

    # ---- set-up -----------------------------------------------------------------------------
    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer, info: TrainInfo) -> None:
        super().setup(model, optimizer, info)
        self.weights = FlatBuffer([p for p in model.parameters() if p.requires_grad])
        self.groups = self._build_groups()
        if self.cfg.wait_avoiding and self.ctx.world_size > 1:
            self._world_group = self.ctx.new_group(list(range(self.ctx.world_size)))
            signal_group = dist.new_group(backend="gloo", timeout=SIGNAL_TIMEOUT)
            self.averager = WaitAvoidingAverager(
                list(self.weights), self.plan, self.ctx.rank, self.schedule.peers(self.ctx.rank),
                signal_group, self.comm, join_timeout_s=self.ctx.timeout_s)

    def _build_groups(self) -> dict[tuple[int, int], Any]:
        """One process group per (phase, group), created in the same order on every rank;
        keyed by (phase, smallest member). A group of one needs none."""
        groups: dict[tuple[int, int], Any] = {}
        if self.cfg.group_size == 1:
            return groups
        for phase in range(self.schedule.num_phases):
            for members in self.schedule.groups(phase):
                if len(members) == self.ctx.world_size and not self.cfg.wait_avoiding:
                    groups[(phase, members[0])] = None  # the default group already is this one
                else:
                    groups[(phase, members[0])] = self.ctx.new_group(members)
        return groups

    def plan(self, step: int) -> Round:
        """What step `step` averages on this rank, and over which process group."""
        if is_global_step(step, self.cfg.global_period):
            return Round(step, True, list(range(self.ctx.world_size)), self._world_group, WORLD)
        phase = self.schedule.phase_at(step)
        members = self.schedule.group_of(self.ctx.rank, phase)
        return Round(step, False, members, self.groups.get((phase, members[0])), wagma(phase))

    # ---- training ---------------------------------------------------------------------------
    def step(self, ctx: StepContext) -> None:
        for buf, pending in zip(self.weights, self._restored_pending):
            buf.add_(pending.to(buf.device))
        self._restored_pending = []
        if self.ctx.world_size > 1:
            if self.averager is not None:
                kind = self.averager.exchange(ctx.step, list(self.weights))
            else:
                kind = self._average_now(self.plan(ctx.step))
            self.counts[kind] += 1
        ctx.optimizer_step()

    def _average_now(self, rnd: Round) -> str:
        """The synchronous mode: this step's average, from the training thread."""
        size = len(rnd.members)
        if size > 1:
            issued = now()
            with self.comm.timed():
                average_(self.weights, group=rnd.group, group_size=size)
            self.comm.record(allreduce_op(self.weights.nbytes, size, rnd.label), issued, now(), syncs=1)
        return "global" if rnd.is_global else "group"

    @classmethod
    def comm_pattern(cls, rank: int, step: int, world: int, config: PatternConfig,
                     layout: ParamLayout) -> list[CommOp]:
        """Every step an all_reduce of the weights: over the world every tau-th step, else over
        this rank's group of the step's phase (`wagma:<phase>`). Wait-avoiding, both run on the
        communication thread, a group round after an activation message to the members that have
        not said they are there (whether this rank sends one, and to how many, depends on who
        arrives first: data-dependent, at most G - 1 messages); the training thread waits only
        for the global rounds. Which step a group round runs beside is left to timing."""
        cfg = config.algo
        if world <= 1 or step >= config.total_steps:
            return []
        schedule = GroupSchedule(world, cfg.group_size)
        glob = is_global_step(step, cfg.global_period)
        size = world if glob else cfg.group_size
        label = WORLD if glob else wagma(schedule.phase_at(step))
        if size <= 1:
            return []
        if not cfg.wait_avoiding:
            return [allreduce_op(layout.total_bytes, size, label)]
        activation = CommOp(OpKind.SEND, label, size, MESSAGE_BYTES, MESSAGE_BYTES * (size - 1), False, THREAD,
                            data_dependent=True)
        ops = [] if glob else [activation]
        return ops + [allreduce_op(layout.total_bytes, size, label, THREAD, blocking=glob)]

    def eval_model(self, model: nn.Module) -> Optional[nn.Module]:
        return average_model_copy(model, self.ctx.world_size)

    def finalize(self, model: nn.Module) -> None:
        if self.averager is not None:
            self.averager.close()
            self.averager.drain(list(self.weights))
        average_model_(model, self.ctx.world_size)

    def close(self) -> None:
        if self.averager is not None:
            self.averager.close()

    # ---- state and reporting ----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"counts": dict(self.counts)}
        if self.averager is not None:  # group averages that reached this rank but not its model yet
            state["pending"] = self.averager.pending_copy()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.counts = {k: int(v) for k, v in state["counts"].items()}
        self._restored_pending = list(state.get("pending", []))

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {"group_averages": self.counts["group"], "global_averages": self.counts["global"]}
        if self.averager is not None:
            st = self.averager.stats
            out.update(late_steps=self.counts["late"], staleness_max=st.staleness_max,
                       staleness_mean=st.staleness_sum / max(st.group_rounds, 1),
                       stale_fraction=st.stale_rounds / max(st.group_rounds, 1),
                       wait_global_s=round(st.wait_global_s, 4))
        return out

    def plot_keys(self) -> list[str]:
        return ["staleness_max"] if self.averager is not None else []

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"group_size": self.cfg.group_size, "global_period": self.cfg.global_period,
                               "wait_avoiding": self.cfg.wait_avoiding, **self.counts}
        if self.averager is not None:
            st = self.averager.stats
            out.update(staleness_max=st.staleness_max, staleness_mean=st.staleness_sum / max(st.group_rounds, 1),
                       wait_global_s=round(st.wait_global_s, 4), comm_behind=st.comm_behind,
                       staleness_hist={str(k): v for k, v in sorted(st.staleness_hist.items())})
        return out

    @classmethod
    def merge_summaries(cls, per_rank: list[dict[str, Any]]) -> dict[str, Any]:
        ranks = [s for s in per_rank if s]
        if not ranks:
            return {}
        merged = dict(ranks[0])
        if "staleness_max" in merged:  # wait-avoiding: per-rank lists where ranks differ
            for key in ("group", "late", "wait_global_s", "comm_behind"):
                merged[key] = [s[key] for s in ranks]
            merged["staleness_max"] = max(s["staleness_max"] for s in ranks)
            merged["staleness_mean"] = sum(s["staleness_mean"] for s in ranks) / len(ranks)
            hist: dict[str, int] = {}
            for s in ranks:
                for k, v in s["staleness_hist"].items():
                    hist[k] = hist.get(k, 0) + v
            merged["staleness_hist"] = dict(sorted(hist.items(), key=lambda kv: int(kv[0])))
        return merged
