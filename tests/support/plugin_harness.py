"""Driving a plugin directly (no trainer) for reference-equivalence tests.

`plugin_trajectory` runs inside a rank (under `tests.support.harness.run_ranks`): it builds the same
small model and optimizer on every rank, feeds rank r at step s the batch `worker_batch(r, s)`,
calls `plugin.step` as the trainer would, and returns this rank's flat parameters after every
step. A test then replays the same update in one process with K model copies
(`make_workers`, `worker_batch`, `grad_step`) and compares.

What is trained is the task's workload (`task_workload`): by default a small CNN on digits
(classification); under `with task_workload("language_model")` a tiny GPT on windows of a fixed
token sequence, so that a plugin's shape- or optimizer-state-dependent mechanics (low-rank
matrices, tiles, AdamW moments) meet a transformer's parameters. `make_model`, `worker_batch` and
`loss_of` follow the active workload, so every reference written against them runs on either.
"""
from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 16
TEXT_VOCAB, TEXT_CONTEXT = 75, 8  # the language-model workload: shakespeare_char's vocabulary size, short windows


def digits() -> tuple[torch.Tensor, torch.Tensor]:
    from data.sets.digits import load_digits_split

    x, y, _, _ = load_digits_split(0.2, 0)
    return x, y


def _cnn(seed: int, batch_norm: bool) -> nn.Module:
    from models.small_cnn import small_cnn

    torch.manual_seed(seed)
    return small_cnn(1, 8, 10, width=4, batch_norm=batch_norm)


def _digits_batch(worker: int, step: int, num_workers: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = digits()
    start = ((step * num_workers + worker) * batch) % (len(x) - batch)
    return x[start:start + batch], y[start:start + batch]


def _cross_entropy(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(xb), yb)


def _tiny_gpt(seed: int, batch_norm: bool) -> nn.Module:
    from models.gpt import gpt

    assert not batch_norm, "the GPT has no BatchNorm"
    torch.manual_seed(seed)
    return gpt(TEXT_VOCAB, TEXT_CONTEXT, layers=1, heads=2, width=8)


@lru_cache(maxsize=1)
def text_tokens() -> torch.Tensor:
    """A fixed token sequence (seeded, no corpus to read): what the windows are cut from."""
    return torch.randint(0, TEXT_VOCAB, (8192,), generator=torch.Generator().manual_seed(0))


def _text_batch(worker: int, step: int, num_workers: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Windows of T + 1 tokens, disjoint between workers and steps (wrapping over the sequence)."""
    tokens = text_tokens()
    first = (step * num_workers + worker) * batch
    starts = (torch.arange(first, first + batch) * TEXT_CONTEXT) % (len(tokens) - TEXT_CONTEXT - 1)
    rows = tokens[starts[:, None] + torch.arange(TEXT_CONTEXT + 1)]
    return rows[:, :-1], rows[:, 1:]


def _token_loss(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
    from core.task.language_model import LanguageModel

    return LanguageModel(TEXT_VOCAB).loss(model(xb), yb)


@dataclass(frozen=True)
class Workload:
    make_model: Callable[[int, bool], nn.Module]
    batch: Callable[[int, int, int, int], tuple[torch.Tensor, torch.Tensor]]
    loss: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


WORKLOADS = {"classification": Workload(_cnn, _digits_batch, _cross_entropy),
             "language_model": Workload(_tiny_gpt, _text_batch, _token_loss)}
_active = ["classification"]


@contextmanager
def task_workload(task: str) -> Iterator[None]:
    """Inside it, `make_model`, `worker_batch` and `loss_of` are `task`'s (a Scenario's `task`)."""
    if task not in WORKLOADS:
        raise ValueError(f"no test workload for task {task!r}; one of {', '.join(WORKLOADS)}")
    _active.append(task)
    try:
        yield
    finally:
        _active.pop()


def workload() -> Workload:
    return WORKLOADS[_active[-1]]


def make_model(seed: int = 0, batch_norm: bool = False) -> nn.Module:
    return workload().make_model(seed, batch_norm)


def make_optimizer(model: nn.Module, kind: str, lr: float = 0.05) -> torch.optim.Optimizer:
    if kind == "sgd":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)
    if kind == "nesterov":
        return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True, weight_decay=1e-4)
    if kind == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=lr * 0.1, weight_decay=0.05)
    raise ValueError(kind)


def worker_batch(worker: int, step: int, num_workers: int, batch: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    """Worker w's batch at step s: a fixed, disjoint slice of the digits training set (or of the
    language-model workload's token windows)."""
    return workload().batch(worker, step, num_workers, batch)


def loss_of(model: nn.Module, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
    return workload().loss(model, xb, yb)


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
