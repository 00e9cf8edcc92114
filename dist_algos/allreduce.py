"""Synchronous data parallelism: average the gradients every step (the `parallel` baseline).

The baseline a user would actually run is torch's DistributedDataParallel, which overlaps the
gradient all_reduce with the backward pass; a baseline that averages after backward pays the
whole transfer on top of the compute and makes every "local method vs parallel" comparison look
better than it is on a slow link. So by default (`overlap=true`) the gradients are averaged the
way DDP does (`dist_algos.comm.grad_buckets`: bucketed gradient hooks, reverse parameter order,
asynchronous all_reduce per bucket, waited for before the optimizer step), with DDP's bucket
sizes; its results equal DDP's (tests/test_allreduce.py). `overlap=false` keeps the older form,
one flat all_reduce after backward, for comparison.

Either way the mean gradient then drives the ordinary optimizer step, so all ranks stay
identical: equivalent to one process taking the same step on the K-times batch.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn as nn

from core.schema import option
from dist_algos import register_algorithm
from dist_algos.base import AlgoConfig, DistAlgorithm, Scenario, StepContext, TrainInfo
from dist_algos.comm.accounting import allreduce_bytes_split, allreduce_op, now
from dist_algos.comm.flat import average_, flat_grads
from dist_algos.comm.pattern import WORLD, CommOp, OpKind, ParamLayout, PatternConfig
from dist_algos.comm.round_averager import run_round
from dist_algos.comm.grad_buckets import MIB, OverlappedAverage, bucket_members


@dataclass
class AllreduceConfig(AlgoConfig):
    name: str = "allreduce"
    overlap: bool = True  # all_reduce gradient buckets during backward, as torch DDP (false: one after backward)
    bucket_mb: float = option(25.0, gt=0)  # bucket cap in MiB (DDP's bucket_cap_mb)
    first_bucket_mb: float = option(1.0, gt=0)  # the first (last layers') bucket, small so it starts early


class OverlappedHooks(DistAlgorithm):
    """A plugin that may average from gradient hooks during backward (`overlapped`, set in setup
    when overlapping): held under `no_sync`, their thread stopped on `close`."""
    overlapped: Optional[OverlappedAverage] = None

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        with self.overlapped.paused() if self.overlapped is not None else contextlib.nullcontext():
            yield

    def close(self) -> None:
        if self.overlapped is not None:
            self.overlapped.close()


@register_algorithm("allreduce")
class Allreduce(OverlappedHooks):
    ft_refusal = ""  # a failed round skips the update
    Config = AllreduceConfig
    test_scenarios = {"overlapped": Scenario()}
    reference = "tests.support.references:ALLREDUCE"
    invalid_options = {"algo.bucket_mb=0": "algo.bucket_mb"}

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer, info: TrainInfo) -> None:
        super().setup(model, optimizer, info)
        self.failed_rounds: list[int] = []  # fault-tolerant mode: steps whose round was not committed
        world = self.ctx.world_size
        if self.cfg.overlap and world > 1:
            self.overlapped = OverlappedAverage(list(model.parameters()), world,
                                                bucket_bytes=int(self.cfg.bucket_mb * MIB),
                                                first_bucket_bytes=int(self.cfg.first_bucket_mb * MIB),
                                                stats=self.comm)
            self.nbytes = self.overlapped.nbytes
        else:
            self.grads = flat_grads(model.parameters())
            self.nbytes = self.grads.nbytes

    def step(self, ctx: StepContext) -> None:
        if self.ft_rounds is not None:
            self._fault_tolerant_step(ctx)
            return
        world = self.ctx.world_size
        if world > 1:
            with self.comm.timed():  # what this rank waits for: the transfer not hidden behind backward
                if self.overlapped is not None:
                    self.overlapped.wait()  # (counts and logs each bucket's all_reduce)
                else:
                    issued = now()
                    average_(self.grads, group=None, group_size=world)
                    self.comm.record(allreduce_op(self.nbytes, world), issued, now())
            self.comm.add(syncs=1)
        ctx.optimizer_step()

    def _fault_tolerant_step(self, ctx: StepContext) -> None:
        """One round per step: the mean gradient over the live replicas, then the update; a failed
        round skips the update (its gradient is discarded, as torchft's OptimizerWrapper does). A
        replica that healed in this round holds the peer's model, so its own gradient (computed on
        the model it had) is stale: it contributes zeros for that one round."""
        rounds = self.ft_rounds
        assert rounds is not None

        def contribution() -> list[torch.Tensor]:
            if rounds.healed:
                for buf in self.grads:
                    buf.zero_()
            return list(self.grads)

        issued = now()
        with self.comm.timed():
            committed = run_round(rounds, contribution, lambda _: None)
        self.comm.record(allreduce_op(self.nbytes, rounds.participants), issued, now(), syncs=1)
        if committed:
            ctx.optimizer_step()
        else:
            self.failed_rounds.append(rounds.step)

    def summary(self) -> dict[str, object]:
        return {"failed_rounds": list(self.failed_rounds)} if self.ft_rounds is not None else {}

    @classmethod
    def comm_pattern(cls, rank: int, step: int, world: int, config: PatternConfig,
                     layout: ParamLayout) -> list[CommOp]:
        """One all_reduce of the gradient per step; overlapped, one per DDP bucket in bucket order
        (each issued when backward has filled it). Fault-tolerant rounds (their participants
        decided at run time) are not declared."""
        cfg = config.algo
        if world <= 1 or step >= config.total_steps:
            return []
        if not cfg.overlap:
            return [allreduce_op(layout.total_bytes, world)]
        key = ("buckets", world, layout)
        if key not in config.memo:  # (the same every step: derived once)
            sizes = [n * layout.element_size for n in layout.numels]
            nbytes = [sum(sizes[i] for i in members)
                      for members in bucket_members(sizes, int(cfg.bucket_mb * MIB), int(cfg.first_bucket_mb * MIB))]
            config.memo[key] = [CommOp(OpKind.ALLREDUCE, WORLD, world, n, wire, bucket=i, recv_bytes=wire)
                                for i, (n, wire) in enumerate(zip(nbytes, allreduce_bytes_split(nbytes, world)))]
        return list(config.memo[key])
