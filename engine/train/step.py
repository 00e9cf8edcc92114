"""One rank's local computation of a step: forward and backward over micro-batches (gradient
accumulation) of the task's loss (`core.task`: cross-entropy over classes, or over every
position's next token), under autocast at the configured precision, in the model's memory layout and
through its compiled forward where configured (`engine.train.compute`), and the local optimizer
update that plugins trigger through `StepContext.optimizer_step` (unscale, clip, step)."""
from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Optional

import torch
import torch.nn as nn

from core.distenv import DistContext
from core.errors import UserError
from core.task import Task
from engine.train.compute import ModelCompute
from engine.train.config import Precision, TrainConfig

AUTOCAST = {Precision.bf16: torch.bfloat16, Precision.fp16: torch.float16}


def resolve_precision(requested: Precision, is_cuda: bool) -> Precision:
    """`auto`: fp32 on the CPU, bf16 on a GPU that has it, else fp16."""
    if requested == Precision.auto:
        if not is_cuda:
            return Precision.fp32
        return Precision.bf16 if torch.cuda.is_bf16_supported() else Precision.fp16
    if requested == Precision.fp16 and not is_cuda:
        raise UserError("train.precision=fp16 needs a GPU (its grad scaler is CUDA-only); use fp32 or bf16 on CPU")
    return requested


class LocalStep:
    def __init__(self, cfg: TrainConfig, ctx: DistContext, model: nn.Module, optimizer: torch.optim.Optimizer,
                 micro_batch: int, task: Task, compute: Optional[ModelCompute] = None,
                 no_sync: Callable[[], AbstractContextManager[Any]] = nullcontext) -> None:
        self.ctx, self.model, self.optimizer, self.micro, self.task = ctx, model, optimizer, micro_batch, task
        self.compute = compute or ModelCompute(channels_last=False, train_module=model)
        self.no_sync = no_sync  # the plugin's: held around every micro-batch's backward but the last
        self.grad_clip: Optional[float] = cfg.grad_clip
        self.precision = resolve_precision(cfg.precision, ctx.is_cuda)
        self.scaler = torch.amp.GradScaler(ctx.device.type, enabled=self.precision == Precision.fp16 and ctx.is_cuda)
        self.label_smoothing = cfg.label_smoothing

    def forward(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """`model`'s output for `x`, in the model's layout and precision (evaluation, plugins'
        BatchNorm passes; training calls it with the compiled module where there is one)."""
        dtype = AUTOCAST.get(self.precision)
        with torch.autocast(self.ctx.device.type, dtype=dtype) if dtype else nullcontext():
            return model(self.compute.layout(x))

    def backward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Gradients of the batch's mean loss in `.grad`; returns (mean loss, which predictions
        were right: `Task.hits`, one entry per sample or next token). Micro-batches are weighted
        by their samples (a text window holds as many tokens as any other, so this is the mean
        over tokens too)."""
        dev = self.ctx.device
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        if not self.model.training:  # (every evaluation restores the mode, recursively: not walked each step)
            self.model.train()
        if len(x) <= self.micro:  # one micro-batch (the usual case): no accumulation to pay for
            logits = self.forward(self.compute.train_module, x)
            loss = self.task.loss(logits, y, self.label_smoothing)
            self.scaler.scale(loss).backward()
            return loss.detach(), self.task.hits(logits, y)
        loss_sum = torch.zeros((), device=dev)
        hits = []
        chunks = list(zip(x.split(self.micro), y.split(self.micro)))
        for i, (xm, ym) in enumerate(chunks):
            logits = self.forward(self.compute.train_module, xm)
            loss = self.task.loss(logits, ym, self.label_smoothing)
            with self.no_sync() if i < len(chunks) - 1 else nullcontext():
                self.scaler.scale(loss * (len(xm) / len(x))).backward()
            loss_sum += loss.detach() * len(xm)
            hits.append(self.task.hits(logits, ym))
        return loss_sum / len(x), torch.cat(hits)

    def optimizer_step(self, clip: bool = True) -> None:
        """The local update from the current `.grad` (what `StepContext.optimizer_step` runs);
        `clip=False`: without train.grad_clip, which the plugin applied before its exchange."""
        if self.grad_clip and clip:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
