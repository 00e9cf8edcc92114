"""The all-rank average of a model, for methods whose ranks hold different models.

Decentralized and group-averaging methods (WAGMA, D-PSGD, SGP, AD-PSGD) leave every rank with its
own model between global synchronisations. Evaluation needs one model that is the same on every
rank, and the end of training one final model: both are the plain mean over ranks of the
weights and the floating-point buffers (BatchNorm statistics). Collectives on the default
process group, so callable only where every rank calls them (eval, finalize).
"""
from __future__ import annotations

import copy

import torch.distributed as dist
import torch.nn as nn


def average_model_(model: nn.Module, world: int) -> None:
    """Replace `model`'s weights and float buffers by their mean over all ranks, in place."""
    if world <= 1:
        return
    for t in [*model.parameters(), *model.buffers()]:
        if t.is_floating_point():
            dist.all_reduce(t.data, op=dist.ReduceOp.SUM)
            t.data.div_(world)


def average_model_copy(model: nn.Module, world: int) -> nn.Module:
    """A copy of `model` holding the all-rank mean; training is left as it was."""
    avg = copy.deepcopy(model)
    average_model_(avg, world)
    return avg
