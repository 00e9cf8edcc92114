"""Evaluating a model that no single worker holds (a leader's, an average, a centre variable).

Local methods let workers differ, but every evaluating rank must evaluate the same model.
`EvalCopy` is a separate, never-trained copy of the model that receives the weights to
evaluate, so building them never disturbs a worker's training state (the reference LSGD code
overwrote its cached leader at test time). Parameters that were averaged or mixed have no
matching BatchNorm statistics; `reestimate_batch_norm` recomputes them from training batches
(the reference re-runs the whole training set; here the number of batches is a setting), and
the per-rank estimates are then averaged so that all ranks agree.
"""
from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from dist_algos.consensus.bn_stats import batch_norms
from dist_algos.comm.flat import FlatBuffer


def consensus_eval_ranks(eval_model: str, world_size: int) -> list[int]:
    """`local` evaluates rank 0's own model; every other choice is the same model on all ranks,
    so every rank evaluates a part of the test set."""
    return [0] if eval_model == "local" else list(range(world_size))


class EvalCopy:
    """A frozen copy of `model` whose parameters are views of one flat buffer per dtype."""

    def __init__(self, model: nn.Module) -> None:
        self.model = copy.deepcopy(model)
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.params = FlatBuffer(self.model.parameters())

    @torch.no_grad()
    def load_params(self, flats: Sequence[torch.Tensor]) -> None:
        for dst, src in zip(self.params, flats):
            dst.copy_(src)

    @torch.no_grad()
    def load_buffers(self, model: nn.Module) -> None:
        for dst, src in zip(self.model.buffers(), model.buffers()):
            dst.copy_(src)


@torch.no_grad()
def reestimate_batch_norm(model: nn.Module, batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
                          forward: Callable[[nn.Module, torch.Tensor], torch.Tensor]) -> int:
    """Recompute BatchNorm running statistics as the plain average over `batches` (momentum
    None); other layers stay in eval mode (no dropout draws). Returns the batches used; with
    none, the statistics are left as they were (not reset to the initial ones)."""
    layers = batch_norms(model)
    if not layers:
        return 0
    was_training = model.training
    momenta = [bn.momentum for bn in layers]
    used = 0
    model.eval()
    try:
        with torch.random.fork_rng(devices=[]):
            for x, _ in batches:
                if used == 0:
                    for bn in layers:
                        bn.reset_running_stats()
                        bn.momentum = None
                        bn.train()
                forward(model, x)
                used += 1
    finally:
        for bn, momentum in zip(layers, momenta):
            bn.momentum = momentum
        model.train(was_training)
    return used


@torch.no_grad()
def average_buffers_(model: nn.Module, group: Optional[Any], group_size: int) -> None:
    """Mean of every floating-point buffer (BN running mean/var) over the group, in place."""
    if group_size <= 1:
        return
    for buf in model.buffers():
        if buf.is_floating_point():
            dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=group)
            buf.div_(group_size)


@torch.no_grad()
def consensus_model(target: EvalCopy, flats: Sequence[torch.Tensor], trained: nn.Module,
                    batches: Callable[[int], Iterator[tuple[torch.Tensor, torch.Tensor]]],
                    bn_batches: int, forward: Callable[[nn.Module, torch.Tensor], torch.Tensor],
                    group: Optional[Any], group_size: int) -> nn.Module:
    """`target` with parameters `flats` (identical on every rank of the group) and BatchNorm
    statistics that all ranks agree on: re-estimated on `bn_batches` training batches per rank
    and averaged (`bn_batches=0`: the ranks' own statistics, averaged)."""
    target.load_params(flats)
    target.load_buffers(trained)
    if bn_batches > 0 and batch_norms(target.model):
        reestimate_batch_norm(target.model, batches(bn_batches), forward)
    average_buffers_(target.model, group, group_size)
    return target.model


@torch.no_grad()
def broadcast_model_(target: EvalCopy, flats: Sequence[torch.Tensor], trained: nn.Module, src: int, rank: int,
                     group: Optional[Any] = None) -> nn.Module:
    """`target` holds rank `src`'s parameters (`flats`, its flat views) and buffers (BatchNorm
    statistics included) on every rank of the group."""
    if rank == src:
        target.load_params(flats)
        target.load_buffers(trained)
    for flat in target.params:
        dist.broadcast(flat, src=src, group=group)
    for buf in target.model.buffers():
        dist.broadcast(buf, src=src, group=group)
    return target.model
