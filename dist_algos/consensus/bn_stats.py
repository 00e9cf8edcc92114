"""BatchNorm running statistics for local methods: which tensors they are, and re-estimating them.

Averaging the weights of workers that trained apart does not give BatchNorm statistics that
fit the averaged weights: each worker's running mean and variance describe its own model. QSR
therefore re-estimates them before every evaluation: forward passes in training mode over
fresh training batches with momentum 1 / (1 + i) (so the running values become the plain
average over the batches seen), then an average over the workers.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Callable, Optional

import torch
import torch.nn as nn
from torch.nn.modules.batchnorm import _BatchNorm


def batch_norms(model: nn.Module) -> list[_BatchNorm]:
    return [m for m in model.modules() if isinstance(m, _BatchNorm) and m.track_running_stats]


def bn_statistics(model: nn.Module) -> list[torch.Tensor]:
    """The running means and variances of the model's BatchNorm layers (what an average moves)."""
    return [t for m in batch_norms(model) for t in (m.running_mean, m.running_var) if t is not None]


def float_buffers(model: nn.Module) -> list[torch.Tensor]:
    """All floating-point buffers (BN statistics and any others); counters are left out."""
    return [b for b in model.buffers() if b.is_floating_point()]


def micro_batches(batches: Iterator[tuple[torch.Tensor, torch.Tensor]], size: Optional[int]
                  ) -> Iterator[torch.Tensor]:
    for x, _ in batches:
        yield from (x.split(size) if size else (x,))


@torch.no_grad()
def recompute_bn_statistics(model: nn.Module, batches: Iterator[tuple[torch.Tensor, torch.Tensor]],
                            count: int, forward: Callable[[nn.Module, torch.Tensor], torch.Tensor],
                            micro_batch: Optional[int] = None) -> int:
    """Re-estimate the running statistics on `count` micro-batches, as the QSR code does.

    Momentum 1 / (1 + i) for the i-th micro-batch makes each running value the mean of the
    per-batch statistics. Returns the number of micro-batches used (fewer if the stream ran out).
    The layers' momentum and the model's mode are restored; `batches` is closed at the end so a
    generator that forked the RNG restores it.
    """
    layers = batch_norms(model)
    if not layers or count < 1:
        return 0
    momenta = [m.momentum for m in layers]
    was_training = model.training
    model.train()
    used = 0
    try:
        with contextlib.closing(micro_batches(batches, micro_batch)) as stream:
            for x in stream:
                for m in layers:
                    m.momentum = 1.0 / (1 + used)
                forward(model, x)
                used += 1
                if used >= count:
                    break
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()
        for m, momentum in zip(layers, momenta):
            m.momentum = momentum
        model.train(was_training)
    return used


def unflatten_into(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    """Copy the consecutive pieces of `flat` (one averaged or broadcast vector) back into `tensors`."""
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()
