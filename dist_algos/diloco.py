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
one more, so the final model is one global model.

Composed outer step (issue 22, `dist_algos.compress.outer`): `outer_compress` sends the outer
gradient through a compressor chain with `outer_feedback` (SparseLoCo: top-k, 2-bit values,
decayed error feedback; Streaming DiLoCo's low-precision outer gradients: int8/fp8 blocks);
`overlap_steps` = tau applies a fragment's new global values tau inner steps after its
synchronisation started (the workers keep training meanwhile), mixed with the local values by
`mixing` = alpha (Streaming DiLoCo's merge). With all four off the plain path above runs.

Evaluation uses the global model (identical on every rank, no communication), with BatchNorm
statistics per `bn` as in local SGD: `local` (worker 0's), `average` (averaged at every outer
step), `recompute` (re-estimated for the global weights).

At 64 workers (docs/workers.md): 64 replicas; the outer gradient is the mean of 64 workers'
deltas after H inner steps each. No constraint on the world size; the outer learning rate and
momentum (0.7, 0.9) are the paper's, chosen there at 8 replicas, and are not rescaled with the
replicas here.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
import torch.nn as nn

from core.errors import UserError
from core.schema import option
from dist_algos import register_algorithm
from dist_algos.compress import build_chain
from dist_algos.base import AlgoConfig, Scenario, StepContext, TrainInfo
from dist_algos.comm.accounting import HeldOps, allreduce_bytes, allreduce_op, now
from dist_algos.comm.flat import FlatBuffer, average_
from dist_algos.comm.pattern import CommOp, ParamLayout, PatternConfig
from dist_algos.compress.outer import OuterExchange, check_outer_options, outer_ops
from dist_algos.comm.round_averager import run_round
from dist_algos.local_sgd import LocalModelConfig, LocalSGD
from dist_algos.schedules.sync import SyncRule

Span = tuple[int, int, int]  # (index of a flat buffer, start, stop)


@dataclass
class DiLoCoConfig(LocalModelConfig):
    name: str = "diloco"
    inner_steps: int = option(20, ge=1)  # H: inner optimizer steps between outer steps (paper: 500)
    outer_lr: float = option(0.7, gt=0)  # outer SGD learning rate (paper: 0.7)
    outer_momentum: float = option(0.9, ge=0, lt=1)  # outer SGD momentum (paper: 0.9)
    nesterov: bool = True  # Nesterov outer momentum (paper: yes)
    fragments: int = option(1, ge=1)  # Streaming DiLoCo: F fragments, one synchronised every H/F steps
    outer_compress: list[str] = field(default_factory=list)  # compress the outer gradient (dist_algos.compress); []: exact
    outer_feedback: str = "none"  # its error feedback: none | ef | ef21 | decayed:BETA (SparseLoCo) | momentum:BETA
    overlap_steps: int = option(0, ge=0)  # Streaming DiLoCo's tau: a fragment's update lands tau inner steps after its sync
    mixing: float = option(0.0, ge=0, le=1)  # Streaming DiLoCo's alpha: local = alpha local + (1 - alpha) global on landing


@register_algorithm("diloco")
class DiLoCo(LocalSGD):
    Config = DiLoCoConfig  # type: ignore[assignment]
    family = None  # its checkpoints hold the global model and outer momentum: not local SGD's
    cfg: DiLoCoConfig  # type: ignore[assignment]
    # Streaming DiLoCo on 3 ranks: two fragments, one synchronised every 3 inner steps; DiLoCo on a
    # tiny GPT with its inner AdamW (the moments stay local across outer steps), every 4 inner steps
    test_scenarios = {"streaming": Scenario({"inner_steps": 6, "fragments": 2}, world_size=3),
                      "lm_adamw": Scenario({"inner_steps": 4}, world_size=3, optimizer="adamw", task="language_model")}
    reference = "tests.support.references:DILOCO"
    invalid_options = {"algo.fragments=3": "algo.fragments=3", "algo.inner_steps=0": "algo.inner_steps",
                       "algo.bn=global": "algo.bn='global'"}

    @classmethod
    def validate_sync_rule(cls, cfg: AlgoConfig) -> None:
        assert isinstance(cfg, DiLoCoConfig)
        if cfg.inner_steps % cfg.fragments:
            raise UserError(f"algo.fragments={cfg.fragments} must divide algo.inner_steps={cfg.inner_steps} "
                            "(one fragment is synchronised every inner_steps / fragments steps)")
        check_outer_options(cfg)

    @classmethod
    def make_sync_rule(cls, cfg: AlgoConfig, warmup_steps: int, total_steps: int) -> SyncRule:
        """A synchronisation (of one fragment) every H / F steps, the last one at the last step."""
        assert isinstance(cfg, DiLoCoConfig)
        stride = cfg.inner_steps // cfg.fragments
        return SyncRule(schedule="constant", sync_period=stride, warmup_period=stride, alpha=0.0, power=2.0,
                        switch_step=0, warmup_steps=warmup_steps, total_steps=total_steps)

    @classmethod
    def averaged_fields(cls, cfg: AlgoConfig) -> list[str]:
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
        # compressed outer gradients, overlap and mixing (issue 22); None when all are off
        self.outer = OuterExchange.build(self.cfg, [self.params[r] for r in ranges], self.fragment_spans,
                                         self.world, self.ctx.rank, self.global_model, self._landed_outer_step,
                                         self.comm.timed)

    # ---- training ---------------------------------------------------------------------------
    def step(self, ctx: StepContext) -> None:
        self.pending = [True] * self.cfg.fragments
        super().step(ctx)  # the inner step; `sync_round` when a synchronisation is due
        if self.outer is not None:
            self.outer.land_due(self.flat, ctx.step + 1)

    def sync_round(self) -> bool:
        """The round hook: the outer step of the next fragment."""
        if not self._outer_step(lambda: [self.next_fragment]):
            return False  # fault-tolerant mode: the same fragment is retried at the next synchronisation
        self.next_fragment = (self.next_fragment + 1) % self.cfg.fragments
        return True

    def _outer_step(self, which: Callable[[], list[int]]) -> bool:
        """Average the fragments' parameters over the workers, apply the outer optimizer to them,
        restart every worker from the new global values (one synchronisation). In fault-tolerant
        mode a failed round restores the fragments' global values (the inner steps since are lost,
        as in torchft's DiLoCo) and returns False. The composed outer step (`outer_compress`,
        `overlap_steps`, `mixing`) has no fault-tolerant form: the plan refuses the pair."""
        fragments = which()
        if self.outer is not None:
            self._outer_step_composed(fragments)
            return True
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
            issued = now()
            with self.comm.timed():
                committed = run_round(self.ft_rounds, pieces_now, restore_global)
            pieces = pieces_now()
            self.comm.record(allreduce_op(sum(t.numel() * t.element_size() for t in pieces),
                                          self.ft_rounds.participants), issued, now(), syncs=1)
            if not committed:
                return False
            self._apply_outer(fragments, spans)
            return True
        pieces = pieces_now()
        issued = now()
        if self.world > 1:
            with self.comm.timed():
                average_(pieces, None, self.world, bucket_bytes=self.bucket_bytes)
        self.comm.record(allreduce_op(sum(t.numel() * t.element_size() for t in pieces), self.world),
                         issued, now(), syncs=1)
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

    def _outer_step_composed(self, fragments: list[int]) -> None:
        """The outer step with a compressed outer gradient and/or Streaming DiLoCo's overlap: each
        fragment's outer gradient (global - local) goes through the chain; the outer optimizer
        moves the global model by the combined one; the workers take it up now or `overlap_steps`
        inner steps later, mixed with their local values by `mixing`."""
        assert self.outer is not None
        pieces = [self.flat.buffers[i][lo:hi] for i, lo, hi in self.stat_spans]
        if pieces:
            issued = now()
            if self.world > 1:
                average_(pieces, None, self.world, bucket_bytes=self.bucket_bytes)
            self.comm.record(allreduce_op(sum(t.numel() * t.element_size() for t in pieces), self.world),
                             issued, now())
        for f in fragments:
            if self.outer.overlapped:  # exchanged during the next tau inner steps, stepped and landed when due
                self.outer.launch(f, self.flat, self.step_now, self.step_now + 1)
            else:
                with self.comm.timed():
                    combined = self.outer.exchange(f, self.flat, self.step_now, self.comm)
                self._apply_outer_gradient(f, combined)
                self.outer.schedule(f, self.step_now + 1)
            self.pending[f] = False
        for i, lo, hi in self.stat_spans:
            self.global_model[i][lo:hi].copy_(self.flat.buffers[i][lo:hi])
        self.comm.add(syncs=1)
        self.synced = not any(self.pending) and not self.outer.in_flight()

    def _apply_outer_gradient(self, f: int, combined: torch.Tensor) -> None:
        """The outer optimizer's step on fragment f's global values from the combined outer gradient."""
        cfg, at = self.cfg, 0
        for i, lo, hi in self.fragment_spans[f]:
            g = combined[at:at + hi - lo].to(self.global_model[i].dtype)
            averaged = self.global_model[i][lo:hi] - g  # what the workers' mean would be
            outer_step_(self.global_model[i][lo:hi], self.outer_momentum_buffer[i][lo:hi], averaged,
                        cfg.outer_lr, cfg.outer_momentum, cfg.nesterov)
            at += hi - lo

    def _landed_outer_step(self, f: int, combined: torch.Tensor, held: HeldOps) -> None:
        """An overlapped exchange has come back: its outer step, and its collectives counted."""
        self._apply_outer_gradient(f, combined)
        held.replay(self.comm)

    # ---- evaluation and the end -------------------------------------------------------------
    def eval_model(self, model: nn.Module) -> Optional[nn.Module]:
        """The global model (the same on every rank), BatchNorm statistics per `bn`."""
        if self.finalized:
            return model
        if self.outer is not None:  # (an overlapped exchange in flight: its outer step first)
            self.outer.resolve_all()
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
        if self.outer is not None:  # updates still in flight land now (their communication ends)
            self.outer.land_due(self.flat, None)
        pending = [f for f, due in enumerate(self.pending) if due]
        if pending:
            local_steps = self.local_steps
            self._outer_step(lambda: [f for f, due in enumerate(self.pending) if due])
            if self.outer is not None:
                self.outer.land_due(self.flat, None)
            if local_steps:
                self._after_sync(self.info.total_steps, local_steps)
        self._settle_bn(model)
        self.finalized = True

    def close(self) -> None:
        if self.outer is not None:
            self.outer.close()
        super().close()

    # ---- state and reporting ----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state = {**super().state_dict(), "global_model": [t.clone() for t in self.global_model],
                 "outer_momentum": [t.clone() for t in self.outer_momentum_buffer],
                 "next_fragment": self.next_fragment, "pending": list(self.pending)}
        if self.outer is not None:
            state["outer"] = self.outer.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        for mine, saved in zip(self.global_model + self.outer_momentum_buffer,
                               state["global_model"] + state["outer_momentum"]):
            mine.copy_(saved)
        self.next_fragment = int(state["next_fragment"])
        self.pending = [bool(p) for p in state["pending"]]
        if self.outer is not None:
            if "outer" not in state:
                raise UserError("resume: the checkpoint has no compressed outer-gradient state; resume with "
                                "algo.outer_compress=[] algo.overlap_steps=0 algo.mixing=0")
            self.outer.load_state_dict(state["outer"])

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


    # ---- the declared pattern -----------------------------------------------------------------
    @classmethod
    def comm_pattern(cls, rank: int, step: int, world: int, config: PatternConfig,
                     layout: ParamLayout) -> list[CommOp]:
        """At the k-th synchronisation (every H / F steps, `round_steps`) fragment k mod F: one
        all_reduce of its parameters (with the BN statistics for bn=average); composed, the
        statistics' all_reduce, then the fragment's exchange (`outer_ops`), on the communication
        thread with overlap_steps > 0. At the end (`finalize`) every fragment with inner steps
        since its own synchronisation, together."""
        cfg = config.algo
        steps = cls.round_steps_of(config)
        if world <= 1:
            return []
        if "fragment_of" not in config.memo:
            config.memo["fragment_of"] = {s: k % cfg.fragments for k, s in enumerate(steps.rounds)}
        if step in config.memo["fragment_of"]:
            fragments = [config.memo["fragment_of"][step]]
        elif step == config.total_steps:
            last = config.memo["fragment_of"].get(config.total_steps - 1)
            fragments = [f for f in range(cfg.fragments) if f != last]
        else:
            return []
        ranges = split_fragments(layout.numels, cfg.fragments)
        sizes = [list(layout.numels[ranges[f]]) for f in fragments]
        stats = layout.buffer_bytes if cfg.bn == "average" else 0
        if not fragments:
            return []
        if build_chain(cfg.outer_compress) is None and cfg.overlap_steps == 0 and cfg.mixing == 0:
            return [allreduce_op(sum(map(sum, sizes)) * layout.element_size + stats, world)]
        shapes = layout.layer_shapes()
        ops = [allreduce_op(stats, world)] if stats else []
        for f, n in zip(fragments, sizes):
            ops += outer_ops(cfg.outer_compress, n, shapes[ranges[f]], world, cfg.overlap_steps > 0)
        return ops


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
