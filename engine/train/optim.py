"""The `optim` and `sched` sections and what they build: the local optimizer and the per-step
learning rate.

The learning rate of step s is `peak_lr x factor(s)` (linear warm-up, then constant, cosine,
step or multistep decay), a pure function of the step: the trainer writes it into the optimizer
before each step, so a resumed run needs no scheduler state, and plugins read the same function
(`TrainInfo.lr_at`) to plan ahead (QSR's H, DGS's density).
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn as nn

from core.errors import UserError
from core.schema import Section, option
from dist_algos.base import HyperParams


class OptimName(enum.StrEnum):
    sgd = "sgd"
    adamw = "adamw"


class SchedName(enum.StrEnum):
    constant = "constant"
    cosine = "cosine"
    step = "step"
    multistep = "multistep"


@dataclass
class OptimConfig(Section):
    name: OptimName = OptimName.sgd
    lr: float = option(0.1, gt=0)  # peak learning rate (after warm-up)
    momentum: float = option(0.9, ge=0, lt=1)  # sgd
    nesterov: bool = False  # sgd
    weight_decay: float = option(5e-4, ge=0)
    betas: list[float] = option(factory=lambda: [0.9, 0.999], ge=0, lt=1)  # adamw
    eps: float = option(1e-8, gt=0)  # adamw
    # base batch B: lr x update batch / B, the update batch being the global batch (a worker's batch
    # for a parameter server, whose every push is an update of its own)
    scale_lr_with_batch: Optional[int] = option(None, ge=1)


@dataclass
class SchedConfig(Section):
    """Per-step LR schedule: linear warm-up, then constant, cosine, step or multistep."""

    name: SchedName = SchedName.cosine
    warmup_epochs: float = option(0.0, ge=0)
    warmup_steps: Optional[int] = option(None, ge=0)  # overrides warmup_epochs when set
    warmup_start_factor: float = option(0.0, ge=0, le=1)  # warm-up starts at lr x this
    min_lr: float = option(0.0, ge=0)  # cosine floor
    milestones: list[float] = option(factory=list, ge=0)  # multistep, in epochs
    step_epochs: Optional[float] = option(None, gt=0)  # step: decay every this many epochs
    gamma: float = option(0.1, gt=0, le=1)


def check_sched(cfg: SchedConfig) -> None:
    if cfg.name == SchedName.step and not cfg.step_epochs:
        raise UserError("sched.name=step needs sched.step_epochs (decay every that many epochs)")


def check_optim(cfg: OptimConfig) -> None:
    if len(cfg.betas) != 2:
        raise UserError(f"optim.betas={list(cfg.betas)} must be two numbers in [0, 1), e.g. [0.9, 0.999]")


def peak_lr(cfg: OptimConfig, update_batch: int) -> float:
    """The configured LR, scaled linearly with the batch one update is computed from when a recipe
    asks for it (Goyal et al.: lr = base_lr x batch / base_batch; WAGMA uses base batch 256). That
    batch is the global batch where the workers' gradients or models are averaged into one update,
    and a worker's batch for a parameter server, which applies every push on its own: with the
    global batch held at G over N workers, such a push is G / N samples, and an unscaled rate would
    move the model N times as far per sample as at one worker."""
    if cfg.scale_lr_with_batch:
        return cfg.lr * update_batch / cfg.scale_lr_with_batch
    return cfg.lr


def hyper_params(cfg: OptimConfig, lr: float, grad_clip: Optional[float]) -> HyperParams:
    """The optimizer's settings as plain numbers, for plugins that compute their own update."""
    return HyperParams(optimizer=str(cfg.name), peak_lr=lr, momentum=cfg.momentum if cfg.name == "sgd" else 0.0,
                       nesterov=cfg.nesterov, weight_decay=cfg.weight_decay, grad_clip=grad_clip)


def build_optimizer(model: nn.Module, cfg: OptimConfig, lr: float) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.name == OptimName.sgd:
        return torch.optim.SGD(params, lr=lr, momentum=cfg.momentum, nesterov=cfg.nesterov,
                               weight_decay=cfg.weight_decay)
    return torch.optim.AdamW(params, lr=lr, betas=tuple(cfg.betas), eps=cfg.eps,
                             weight_decay=cfg.weight_decay)


def warmup_steps(cfg: SchedConfig, steps_per_epoch: int) -> int:
    if cfg.warmup_steps is not None:
        return cfg.warmup_steps
    return round(cfg.warmup_epochs * steps_per_epoch)


def lr_factor_fn(cfg: SchedConfig, total_steps: int, steps_per_epoch: int, lr: float) -> Callable[[int], float]:
    """Multiplier of the peak LR at optimizer step `s` (0-based): linear warmup, then the decay."""
    warm = warmup_steps(cfg, steps_per_epoch)
    min_ratio = cfg.min_lr / lr if lr > 0 else 0.0
    milestones = sorted(round(m * steps_per_epoch) for m in cfg.milestones)
    step_size = round((cfg.step_epochs or 0) * steps_per_epoch)

    def factor(s: int) -> float:
        if s < warm:
            return cfg.warmup_start_factor + (1 - cfg.warmup_start_factor) * (s + 1) / warm
        if cfg.name == SchedName.cosine:
            t = (s - warm) / max(1, total_steps - warm)
            return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0)))
        if cfg.name == SchedName.step:
            return cfg.gamma ** (s // max(step_size, 1))
        if cfg.name == SchedName.multistep:
            return cfg.gamma ** sum(1 for m in milestones if s >= m)
        return 1.0

    return factor


class Schedule:
    """The LR of every step: `lr_at(s) = peak x factor(s)`, written into the optimizer by `apply`."""

    def __init__(self, cfg: SchedConfig, peak: float, total_steps: int, steps_per_epoch: int) -> None:
        self.peak = peak
        self.factor = lr_factor_fn(cfg, total_steps, steps_per_epoch, peak)
        self.warmup_steps = warmup_steps(cfg, steps_per_epoch)

    def lr_at(self, step: int) -> float:
        # the same product torch's LambdaLR forms (base_lr x factor), so the numbers are unchanged
        return self.peak * self.factor(step)

    def apply(self, optimizer: torch.optim.Optimizer, step: int) -> float:
        lr = self.lr_at(step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        return lr
