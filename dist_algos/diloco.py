"""DiLoCo (Douillard et al., 2023) and its streaming variant (Douillard et al., 2025).

DiLoCo is local training with a second optimizer on top. Every worker takes H inner steps with
its own inner optimizer (AdamW in the paper; here whatever `optim.*` configures, its state kept
per worker and never communicated); then the outer step: the outer gradient is the previous
global model minus the all-reduced mean of the workers' models, an outer SGD with Nesterov
momentum (paper: lr 0.7, momentum 0.9) moves the global model along it, and every worker
restarts from the new global model. With outer lr 1 and no momentum it is local SGD.

It is built on `LocalSGD`: the same persistent flat buffer of parameters (plus BatchNorm
statistics for bn=average), the same round bookkeeping with a constant period, the same
evaluation scratch model and BatchNorm modes. What it adds is the outer step on the averaged
buffer and the state that decides it: the global model and the outer momentum, both in the
checkpoint (they differ from the parameters between outer steps).

Streaming DiLoCo (`fragments` = F > 1). The parameters, in model order, are cut into F
contiguous fragments of nearly equal size (`split_fragments`). Synchronisations come every H/F
inner steps, each one for a single fragment in turn: the k-th (k = 0, 1, ...) comes after
(k + 1) H/F steps and handles fragment k mod F, so fragment f is synchronised after
(f + 1) H/F + n H steps (n = 0, 1, ...): every fragment every H steps, the peak bandwidth F times
lower. At the end of training every fragment with inner steps since its last outer step takes
one more, so the final model is one global model. The paper's overlap of communication with
the next inner steps and its low-precision outer gradients are not modelled here.

Evaluation uses the global model (identical on every rank, no communication), with BatchNorm
statistics per `bn` as in local SGD: `local` (worker 0's), `average` (averaged at every outer
step), `recompute` (re-estimated for the global weights).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.nn as nn

from core.errors import UserError
from core.schema import option
from dist_algos import register_algorithm
from dist_algos.base import AlgoConfig, HyperParams, StepContext, TrainInfo
from dist_algos.comm import allreduce_bytes
from dist_algos.flat import FlatBuffer, average_
from dist_algos.ft_round import run_round
from dist_algos.local_sgd import LocalModelConfig, LocalSGD, check_local_model_options
from dist_algos.sync_schedule import SyncRule

Span = tuple[int, int, int]  # (index of a flat buffer, start, stop)


@dataclass
class DiLoCoConfig(LocalModelConfig):
    name: str = "diloco"
    inner_steps: int = option(20, ge=1)  # H: inner optimizer steps between outer steps (paper: 500)
    outer_lr: float = option(0.7, gt=0)  # outer SGD learning rate (paper: 0.7)
    outer_momentum: float = option(0.9, ge=0, lt=1)  # outer SGD momentum (paper: 0.9)
    nesterov: bool = True  # Nesterov outer momentum (paper: yes)
    fragments: int = option(1, ge=1)  # Streaming DiLoCo: F fragments, one synchronised every H/F steps


@register_algorithm("diloco")
class DiLoCo(LocalSGD):
    Config = DiLoCoConfig  # type: ignore[assignment]
    family = None  # its checkpoints hold the global model and outer momentum: not local SGD's
    cfg: DiLoCoConfig  # type: ignore[assignment]

    @classmethod
    def validate(cls, cfg: AlgoConfig, world_size: int, local_size: int,
                 hyper: HyperParams = HyperParams()) -> None:
        assert isinstance(cfg, DiLoCoConfig)
        check_local_model_options(cfg)
        if cfg.inner_steps % cfg.fragments:
            raise UserError(f"algo.fragments={cfg.fragments} must divide algo.inner_steps={cfg.inner_steps} "
                            "(one fragment is synchronised every inner_steps / fragments steps)")

    def sync_rule(self, info: TrainInfo) -> SyncRule:
        """A synchronisation (of one fragment) every H / F steps, the last one at the last step."""
        stride = self.cfg.inner_steps // self.cfg.fragments
        return SyncRule(schedule="constant", sync_period=stride, warmup_period=stride, alpha=0.0, power=2.0,
                        switch_step=0, warmup_steps=info.warmup_steps, total_steps=info.total_steps)

    def averaged_fields(self) -> list[str]:
        return []  # the inner optimizer is per worker

    # ---- set-up -----------------------------------------------------------------------------
    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer, info: TrainInfo) -> None:
        super().setup(model, optimizer, info)
        ranges = split_fragments([p.numel() for p in self.params], self.cfg.fragments)
        self.fragment_spans = [buffer_spans(self.flat, [p.data for p in self.params[r]]) for r in ranges]
        self.stat_spans = buffer_spans(self.flat, self.stat_buffers) if self.stat_buffers else []
        self.global_model = [b.clone() for b in self.flat.buffers]  # the outer parameters (+ BN statistics)
        self.outer_momentum_buffer = [torch.zeros_like(b) for b in self.flat.buffers]
        self.global_views = global_views(model, self.flat, self.global_model)
        self.next_fragment = 0
        self.pending = [False] * self.cfg.fragments  # inner steps taken since the fragment's outer step

    # ---- training ---------------------------------------------------------------------------
    def step(self, ctx: StepContext) -> None:
        self.pending = [True] * self.cfg.fragments
        super().step(ctx)  # the inner step; `_average_models` when a synchronisation is due

    def _average_models(self) -> bool:
        if not self._outer_step(lambda: [self.next_fragment]):
            return False  # fault-tolerant mode: the same fragment is retried at the next synchronisation
        self.next_fragment = (self.next_fragment + 1) % self.cfg.fragments
        return True

    def _outer_step(self, which: Callable[[], list[int]]) -> bool:
        """Average the fragments' parameters over the workers, apply the outer optimizer to them,
        restart every worker from the new global values (one synchronisation). In fault-tolerant
        mode a failed round restores the fragments' global values (the inner steps since are lost,
        as in torchft's DiLoCo) and returns False."""
        fragments = which()
        spans = [s for f in fragments for s in self.fragment_spans[f]]

        def pieces_now() -> list[torch.Tensor]:
            """Read after the quorum: a heal there may have moved this replica to another fragment."""
            nonlocal fragments, spans
            fragments = which()
            spans = [s for f in fragments for s in self.fragment_spans[f]]
            return [self.flat.buffers[i][lo:hi] for i, lo, hi in spans + self.stat_spans]

        if self.ft_rounds is not None:
            def restore_global(_: object) -> None:
                for i, lo, hi in spans + self.stat_spans:
                    self.flat.buffers[i][lo:hi].copy_(self.global_model[i][lo:hi])
            with self.comm.timed():
                committed = run_round(self.ft_rounds, pieces_now, restore_global)
            pieces = pieces_now()
            nbytes = allreduce_bytes(sum(t.numel() * t.element_size() for t in pieces), self.ft_rounds.participants)
            self.comm.add(sent=nbytes, recv=nbytes, syncs=1)
            if not committed:
                return False
            self._apply_outer(fragments, spans)
            return True
        pieces = pieces_now()
        if self.world > 1:
            with self.comm.timed():
                average_(pieces, None, self.world, bucket_bytes=self.bucket_bytes)
        nbytes = allreduce_bytes(sum(t.numel() * t.element_size() for t in pieces), self.world)
        self.comm.add(sent=nbytes, recv=nbytes, syncs=1)
        self._apply_outer(fragments, spans)
        return True

    def _apply_outer(self, fragments: list[int], spans: list[Span]) -> None:
        """The outer step on the averaged fragments (the flat buffer holds the mean)."""
        cfg = self.cfg
        for i, lo, hi in spans:
            outer_step_(self.global_model[i][lo:hi], self.outer_momentum_buffer[i][lo:hi],
                        self.flat.buffers[i][lo:hi], cfg.outer_lr, cfg.outer_momentum, cfg.nesterov)
        for i, lo, hi in self.stat_spans:  # statistics are averaged, not optimised
            self.global_model[i][lo:hi].copy_(self.flat.buffers[i][lo:hi])
        for f in fragments:
            self.pending[f] = False
        self.synced = not any(self.pending)

    # ---- evaluation and the end -------------------------------------------------------------
    def eval_model(self, model: nn.Module) -> Optional[nn.Module]:
        """The global model (the same on every rank), BatchNorm statistics per `bn`."""
        if self.finalized:
            return model
        scratch, _ = self._scratch_model(model)
        scratch.load_state_dict(model.state_dict())
        scratch.load_state_dict(self.global_views, strict=False)
        self._settle_bn(scratch)
        return scratch

    def finalize(self, model: nn.Module) -> None:
        """One last outer step for every fragment with inner steps since its own, so the final
        model is the global model; then its BatchNorm statistics per `bn`."""
        if self.finalized:
            return
        pending = [f for f, due in enumerate(self.pending) if due]
        if pending:
            local_steps = self.local_steps
            self._outer_step(lambda: [f for f, due in enumerate(self.pending) if due])
            if local_steps:
                self._after_sync(self.info.total_steps, local_steps)
        self._settle_bn(model)
        self.finalized = True

    # ---- state and reporting ----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "global_model": [t.clone() for t in self.global_model],
                "outer_momentum": [t.clone() for t in self.outer_momentum_buffer],
                "next_fragment": self.next_fragment, "pending": list(self.pending)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        for mine, saved in zip(self.global_model + self.outer_momentum_buffer,
                               state["global_model"] + state["outer_momentum"]):
            mine.copy_(saved)
        self.next_fragment = int(state["next_fragment"])
        self.pending = [bool(p) for p in state["pending"]]

    def metrics(self) -> dict[str, float]:
        return {}

    def plot_keys(self) -> list[str]:
        return []

    def summary(self) -> dict[str, Any]:
        cfg = self.cfg
        return {"inner_steps": cfg.inner_steps, "fragments": cfg.fragments, "outer_lr": cfg.outer_lr,
                "outer_momentum": cfg.outer_momentum, "nesterov": cfg.nesterov, "outer_steps": self.comm.syncs,
                "bytes_per_model_sync": allreduce_bytes(self.flat.nbytes, self.world),
                "eval_syncs": self.eval_syncs, "eval_bytes": self.eval_bytes, "bn": cfg.bn}


def outer_step_(global_params: torch.Tensor, momentum: torch.Tensor, averaged: torch.Tensor,
                lr: float, momentum_factor: float, nesterov: bool) -> None:
    """DiLoCo's outer update of one span, in place. The outer gradient is the previous global
    model minus the workers' average; SGD with (Nesterov) momentum on it, as torch.optim.SGD
    computes it (dampening 0); `averaged` (the workers' parameters) becomes the new global model."""
    outer_grad = global_params - averaged
    momentum.mul_(momentum_factor).add_(outer_grad)
    update = outer_grad.add(momentum, alpha=momentum_factor) if nesterov else momentum
    global_params.add_(update, alpha=-lr)
    averaged.copy_(global_params)


def split_fragments(sizes: Sequence[int], count: int) -> list[slice]:
    """Streaming DiLoCo's fragments: `count` contiguous runs of the parameter tensors (model
    order), each at least one tensor, a run closing once the running total reaches its share
    (f + 1) / count of all entries."""
    if count > len(sizes):
        raise UserError(f"algo.fragments={count} is more than the model's {len(sizes)} parameter tensors")
    total, running, bounds = sum(sizes), 0, [0]
    for i, n in enumerate(sizes):
        running += n
        closing = len(bounds)  # fragments closed so far + 1
        left_after = len(sizes) - (i + 1)
        if closing < count and left_after >= count - closing \
                and (running * count >= closing * total or left_after == count - closing):
            bounds.append(i + 1)
    bounds.append(len(sizes))
    return [slice(a, b) for a, b in zip(bounds, bounds[1:])]


def locate(flat: FlatBuffer, tensor: torch.Tensor) -> tuple[int, int]:
    """(buffer index, offset) of a view of one of `flat`'s buffers."""
    ptr = tensor.untyped_storage().data_ptr()
    for i, buf in enumerate(flat.buffers):
        if buf.untyped_storage().data_ptr() == ptr:
            return i, tensor.storage_offset() - buf.storage_offset()
    raise ValueError("tensor is not a view of this flat buffer")


def buffer_spans(flat: FlatBuffer, tensors: Sequence[torch.Tensor]) -> list[Span]:
    """Where consecutive owners of `flat` lie: one contiguous (buffer, start, stop) per buffer."""
    spans: dict[int, list[int]] = {}
    for t in tensors:
        i, start = locate(flat, t)
        lo_hi = spans.setdefault(i, [start, start + t.numel(), 0])
        lo_hi[0], lo_hi[1] = min(lo_hi[0], start), max(lo_hi[1], start + t.numel())
        lo_hi[2] += t.numel()
    if any(hi - lo != n for lo, hi, n in spans.values()):
        raise ValueError("the tensors are not contiguous in the flat buffer")
    return [(i, lo, hi) for i, (lo, hi, _) in sorted(spans.items())]


def global_views(model: nn.Module, flat: FlatBuffer, global_model: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """State-dict entries (parameter and buffer names) viewing the global copy of each tensor
    that `flat` holds, so the evaluation model loads the global model by name."""
    out = {}
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        try:
            i, start = locate(flat, tensor.data)
        except ValueError:
            continue  # not synchronised (a frozen parameter, a counter)
        out[name] = global_model[i][start:start + tensor.numel()].view_as(tensor)
    return out
