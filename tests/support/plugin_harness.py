"""Driving a plugin directly (no trainer) for reference-equivalence tests.

`plugin_trajectory` runs inside a rank (under `tests.support.harness.run_ranks`): it builds the same
small model and optimizer on every rank, feeds rank r at step s the batch `worker_batch(r, s)`,
calls `plugin.step` as the trainer would, and returns this rank's flat parameters after every
step. A test then replays the same update in one process with K model copies
(`make_workers`, `worker_batch`, `grad_step`) and compares.
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 16


def digits() -> tuple[torch.Tensor, torch.Tensor]:
    from data.sets.digits import load_digits_split

    x, y, _, _ = load_digits_split(0.2, 0)
    return x, y


def make_model(seed: int = 0, batch_norm: bool = False) -> nn.Module:
    from models.small_cnn import small_cnn

    torch.manual_seed(seed)
    return small_cnn(1, 8, 10, width=4, batch_norm=batch_norm)


def make_optimizer(model: nn.Module, kind: str, lr: float = 0.05) -> torch.optim.Optimizer:
    if kind == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)
    if kind == "nesterov":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=1e-4)
    if kind == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=lr * 0.1, weight_decay=0.05)
    raise ValueError(kind)


def worker_batch(worker: int, step: int, num_workers: int, batch: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    """Worker w's batch at step s: a fixed, disjoint slice of the digits training set."""
    x, y = digits()
    start = ((step * num_workers + worker) * batch) % (len(x) - batch)
    return x[start:start + batch], y[start:start + batch]


def loss_of(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(xb), yb)


def flat_params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()


def make_workers(k: int, kind: str, lr: float = 0.05, batch_norm: bool = False
                 ) -> tuple[list[nn.Module], list[torch.optim.Optimizer]]:
    """K identical model copies with their own optimizers (the reference simulation's workers)."""
    base = make_model(batch_norm=batch_norm)
    models = [copy.deepcopy(base) for _ in range(k)]
    return models, [make_optimizer(m, kind, lr) for m in models]


def grad_step(model: nn.Module, opt: torch.optim.Optimizer, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
    """Compute the gradient at the current weights (no update); returns the loss."""
    opt.zero_grad(set_to_none=False)
    loss = loss_of(model, xb, yb)
    loss.backward()
    return loss.detach()


def hyper_of(opt: torch.optim.Optimizer) -> Any:
    """The run's `HyperParams` as the plan derives them, read back from this optimizer."""
    from dist_algos.base import HyperParams

    group = opt.param_groups[0]
    return HyperParams(optimizer="sgd" if isinstance(opt, torch.optim.SGD) else "adamw", peak_lr=group["lr"],
                       momentum=group.get("momentum", 0.0), nesterov=group.get("nesterov", False),
                       weight_decay=group["weight_decay"])


def build_plugin(algo: str, overrides: dict[str, Any], model: nn.Module, opt: torch.optim.Optimizer, steps: int,
                 lr_at: Optional[Callable[[int], float]] = None, warmup_steps: int = 0) -> Any:
    """The plugin `algo` set up on this rank's model and optimizer, as the trainer sets it up."""
    from dist_algos import get_algorithm
    from dist_algos.base import TrainInfo
    from core.schema import typed_section
    from core.distenv import init_distributed

    ctx = init_distributed("gloo", device="cpu")
    cls = get_algorithm(algo)
    cfg = typed_section(cls.Config, {"name": algo, **overrides}, "algo")
    plugin = cls(cfg, ctx)
    sched_lr = lr_at or (lambda s: opt.param_groups[0]["lr"])
    hyper = hyper_of(opt)
    cls.validate(cfg, ctx.world_size, ctx.local_size, hyper)
    info = TrainInfo(total_steps=steps, steps_per_epoch=steps, lr_at=sched_lr, warmup_steps=warmup_steps,
                     train_batches=lambda n: iter(()), forward=lambda m, x: m(x), hyper=hyper)
    plugin.setup(model, opt, info)
    return plugin


def plugin_trajectory(rank: int, world: int, algo: str, overrides: dict[str, Any], steps: int,
                      kind: str = "sgd", lr: float = 0.05, batch_norm: bool = False,
                      lr_at: Optional[Callable[[int], float]] = None,
                      loss_hook: Optional[Callable[[int, int], float]] = None,
                      warmup_steps: int = 0) -> list[torch.Tensor]:
    """This rank's flat parameters after each of `steps` plugin steps."""
    from dist_algos.base import StepContext

    model = make_model(batch_norm=batch_norm)
    opt = make_optimizer(model, kind, lr)
    plugin = build_plugin(algo, overrides, model, opt, steps, lr_at, warmup_steps)
    train_ranks = plugin.train_ranks()
    out = []
    for step in range(steps):
        if lr_at is not None:
            for g in opt.param_groups:
                g["lr"] = lr_at(step)
        if rank in train_ranks:
            w = train_ranks.index(rank)
            xb, yb = worker_batch(w, step, len(train_ranks))
            loss = loss_of(model, xb, yb)
            loss.backward()
            reported = torch.tensor(loss_hook(w, step)) if loss_hook else loss.detach()
            plugin.step(StepContext(step=step, epoch=0, loss=reported, lr=opt.param_groups[0]["lr"],
                                    optimizer_step=opt.step))
            opt.zero_grad(set_to_none=False)
        out.append(flat_params(model))
    plugin.finalize(model)
    out.append(flat_params(model))
    plugin.close()
    return out
