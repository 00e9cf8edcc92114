"""Optimizer and per-step LR schedule from the `optim` and `sched` sections."""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn as nn

from engine.config import OptimConfig, SchedConfig


def peak_lr(cfg: OptimConfig, global_batch: int) -> float:
    """The configured LR, scaled linearly with the global batch when a recipe asks for it
    (Goyal et al.: lr = base_lr x global_batch / base_batch; WAGMA uses base batch 256)."""
    if cfg.scale_lr_with_batch:
        return cfg.lr * global_batch / cfg.scale_lr_with_batch
    return cfg.lr


def build_optimizer(model: nn.Module, cfg: OptimConfig, lr: float) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.name == "sgd":
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
        if cfg.name == "cosine":
            t = (s - warm) / max(1, total_steps - warm)
            return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0)))
        if cfg.name == "step":
            return cfg.gamma ** (s // max(step_size, 1))
        if cfg.name == "multistep":
            return cfg.gamma ** sum(1 for m in milestones if s >= m)
        return 1.0

    return factor


def build_scheduler(optimizer: torch.optim.Optimizer, factor: Callable[[int], float]) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
