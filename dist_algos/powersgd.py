"""PowerSGD (Vogels, Karimireddy, Jaggi, NeurIPS 2019): all-reduce of low-rank gradients.

Synchronous data parallelism whose gradient all_reduce is compressed. Per step, after the first
`start_iter` steps (plain all_reduce of the whole gradient, while training is most sensitive):

1. error feedback: each gradient matrix gets back what compression left out last step;
2. power iteration (`dist_algos.compress.powersgd_math`): P = M Q from the warm-started Q (kept
   from the last step; random, from a seeded generator, the first time or without warm start),
   all-reduce P (summed: it is orthogonalised next, so its scale does not matter), orthogonalise
   it, Q = M^T P, all-reduce Q as a mean;
3. the update direction is P Q^T, the same on every rank; what it missed of this rank's M is
   its new error. Vectors (biases, norm weights) and matrices whose compression would not send
   `min_compression_rate` times fewer numbers are all-reduced uncompressed, with P.

So all ranks keep identical models and take the ordinary optimizer step on the decompressed
gradient (momentum and weight decay as configured). The error buffers, the Q's and the count of
Q initialisations decide the future and are checkpointed. PyTorch's `powerSGD_hook` for DDP does
the same per gradient bucket; tests/test_powersgd.py compares the two step for step.

Fault-tolerant mode (`ft.enabled`): each step is one round over the live replicas
(`dist_algos.comm.round_averager`): quorum, the two means (P with the vectors, then Q) over its
participants, commit vote. A failed round takes no optimizer step and puts back what the step
changed (error buffers, Q's, warm-start flag, initialisation count), so the next round starts
from the same state on every survivor. A replica that healed in the round holds a peer's model,
Q's and error buffers: its gradient (computed on the model it had) is stale and the error
buffers are the peer's, so it contributes a zero gradient with zero error and keeps zero error
after the round.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from core.errors import UserError
from core.schema import option
from dist_algos import register_algorithm
from dist_algos.base import AlgoConfig, DistAlgorithm, Scenario, StepContext, TrainInfo
from dist_algos.comm.accounting import allreduce_op, now
from dist_algos.comm.flat import average_, flat_grads
from dist_algos.comm.pattern import CommOp, ParamLayout, PatternConfig
from dist_algos.compress.powersgd_math import compressed_shape, orthogonalize_


@dataclass
class PowerSGDConfig(AlgoConfig):
    name: str = "powersgd"
    rank: int = option(2, ge=1)  # r: rank of each gradient matrix's approximation (paper: 2 for ResNet-18)
    start_iter: int = option(10, ge=0)  # steps of plain all_reduce before compressing
    min_compression_rate: float = option(2.0, ge=1)  # compress a matrix only if it sends this many times fewer numbers
    warm_start: bool = True  # start each power iteration from the last step's Q
    error_feedback: bool = True  # add what compression left out back into the next gradient
    seed: int = 0  # the k-th initialisation of the Q's draws from a generator seeded with seed + k


class LowRankMatrices:
    """The compressed gradients of one model: each as a (1, n, m) view of a flat gradient buffer,
    with its P (1, n, r) and Q (1, m, r) as views of one P and one Q buffer (one collective each).

    The leading 1 is a batch dimension: the products are batched matrix products (`torch.bmm`),
    as PyTorch's hook computes them, whose rounding on the CPU differs from plain `mm` for some
    shapes; with the same kernels the two implementations agree to the last bit per step."""

    def __init__(self, params: list[nn.Parameter], shapes: list[tuple[int, int, int]]) -> None:
        self.grads = flat_grads(params)
        if len(self.grads.buffers) > 1:
            raise UserError("algo=powersgd needs every compressed gradient in one dtype and device")
        ref = self.grads.buffers[0]
        self.p_buffer = ref.new_zeros(sum(n * r for n, _, r in shapes))
        self.q_buffer = ref.new_zeros(sum(m * r for _, m, r in shapes))
        self.ms: list[torch.Tensor] = [p.grad.view(1, n, m) for p, (n, m, _) in zip(params, shapes)]  # type: ignore[union-attr]
        self.ps = _views(self.p_buffer, [(n, r) for n, _, r in shapes])
        self.qs = _views(self.q_buffer, [(m, r) for _, m, r in shapes])

    @property
    def flat(self) -> torch.Tensor:
        return self.grads.buffers[0]


def _views(buffer: torch.Tensor, shapes: list[tuple[int, int]]) -> list[torch.Tensor]:
    out, offset = [], 0
    for rows, cols in shapes:
        out.append(buffer[offset:offset + rows * cols].view(1, rows, cols))
        offset += rows * cols
    return out


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@register_algorithm("powersgd")
class PowerSGD(DistAlgorithm):
    Config = PowerSGDConfig
    # P and Q per matrix layer: a CNN's kernels, and a GPT's attention, MLP and (tied) embedding matrices
    test_scenarios = {"compressing": Scenario(), "lm_matrices": Scenario(task="language_model")}
    reference_exemption = ("its reference is PyTorch's own PowerSGD DDP hook, which needs torch DDP on gloo ranks, "
                           "not one process: tests/test_powersgd.py compares the two step for step")
    invalid_options = {"algo.rank=0": "algo.rank=0", "algo.min_compression_rate=0.5": "algo.min_compression_rate"}
    ft_refusal = ""  # a failed round takes no step and restores the error buffers and Q's
    cfg: PowerSGDConfig

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer, info: TrainInfo) -> None:
        super().setup(model, optimizer, info)
        cfg = self.cfg
        params = [p for p in model.parameters() if p.requires_grad]
        shapes = [compressed_shape(p.shape, cfg.rank, cfg.min_compression_rate) for p in params]
        self.vector_grads = flat_grads([p for p, s in zip(params, shapes) if s is None])
        # last layer first: the order backward produces gradients, in which DDP's buckets (and so
        # PyTorch's hook) hold them; it fixes the order of the Q's random draws
        compressed = [(p, s) for p, s in zip(params, shapes) if s is not None][::-1]
        self.low_rank = LowRankMatrices([p for p, _ in compressed], [s for _, s in compressed]) if compressed else None
        # error feedback over the whole gradient, as PyTorch's hook keeps it per bucket: for what
        # travels uncompressed the error is this rank's value minus the mean, which sums to zero
        # over the ranks and so changes the applied mean only by rounding (kept for that rounding:
        # with it the two implementations agree to the last bit)
        self.error_pairs = [(g, torch.zeros_like(g)) for g in [*self.vector_grads, *self.low_rank_buffers()]] \
            if self.low_rank and cfg.error_feedback else []
        self.q_inits = 0  # initialisations of the Q's so far (each draws from seed + that count)
        self.q_ready = False  # whether the Q's hold the last step's (warm start)
        self.gradient_bytes = sum(_nbytes(b) for b in [*self.vector_grads, *self.low_rank_buffers()])
        self.failed_rounds: list[int] = []  # fault-tolerant mode: steps whose round was not committed

    def low_rank_buffers(self) -> list[torch.Tensor]:
        return [self.low_rank.flat] if self.low_rank else []

    # ---- training ---------------------------------------------------------------------------
    def step(self, ctx: StepContext) -> None:
        if self.ft_rounds is not None:
            if self._ft_round(ctx.step):
                ctx.optimizer_step()
            return
        if ctx.step < self.cfg.start_iter or self.low_rank is None:
            self._allreduce_gradients()
        else:
            self._compressed_allreduce(self.low_rank)
        ctx.optimizer_step()

    def _mean(self, tensors: list[torch.Tensor], world: int) -> None:
        """Mean over the ranks, or over this round's participants in fault-tolerant mode."""
        if self.ft_rounds is not None:
            self.ft_rounds.average_(tensors)
        elif world > 1:
            average_(tensors, None, world)

    def _ft_round(self, step: int) -> bool:
        """One fault-tolerant step (see the module doc); whether it was committed."""
        rounds = self.ft_rounds
        assert rounds is not None
        rounds.begin()
        step = rounds.step  # a heal replaced the trainer's step with the peer's
        if rounds.healed:
            for buf in [*self.vector_grads, *self.low_rank_buffers()]:
                buf.zero_()
            for _, error in self.error_pairs:
                error.zero_()
        saved = self.state_dict()
        if step < self.cfg.start_iter or self.low_rank is None:
            self._allreduce_gradients(rounds.participants)
        else:
            self._compressed_allreduce(self.low_rank, rounds.participants)
        committed = rounds.commit()
        if not committed:
            self.load_state_dict(saved)
            self.failed_rounds.append(step)
        elif rounds.healed:
            for _, error in self.error_pairs:
                error.zero_()
        return committed

    def _allreduce_gradients(self, world: int = 0) -> None:
        world = world or self.ctx.world_size
        issued = now()
        with self.comm.timed():
            self._mean([*self.vector_grads, *self.low_rank_buffers()], world)
        self.comm.record(allreduce_op(self.gradient_bytes, world), issued, now(), syncs=1)

    def _compressed_allreduce(self, low: LowRankMatrices, world: int = 0) -> None:
        world = world or self.ctx.world_size
        for grad, error in self.error_pairs:
            grad.add_(error)
            error.copy_(grad)  # this rank's corrected gradient; minus what the ranks apply, below
        if not (self.cfg.warm_start and self.q_ready):
            self._initial_qs(low.qs)
        for q in low.qs:
            orthogonalize_(q[0])
        for m, p, q in zip(low.ms, low.ps, low.qs):
            torch.bmm(m, q, out=p)
        issued = now()
        with self.comm.timed():
            if self.ft_rounds is not None:  # the mean, not the sum: P is orthogonalised next, its scale is lost
                self.ft_rounds.average_([low.p_buffer, *self.vector_grads])
            elif world > 1:
                pending = dist.all_reduce(low.p_buffer, async_op=True)
                average_(list(self.vector_grads), None, world)
                pending.wait()
        # P and the vectors: two collectives at once, one operation of their bytes (as counted)
        self.comm.record(allreduce_op(_nbytes(low.p_buffer) + sum(map(_nbytes, self.vector_grads)), world),
                         issued, now())
        for p in low.ps:
            orthogonalize_(p[0])
        for m, p, q in zip(low.ms, low.ps, low.qs):
            torch.bmm(m.transpose(1, 2), p, out=q)
        issued = now()
        with self.comm.timed():
            if self.ft_rounds is not None:
                self.ft_rounds.average_([low.q_buffer])
            elif world > 1:
                dist.all_reduce(low.q_buffer)
                low.q_buffer.div_(world)
        self.comm.record(allreduce_op(_nbytes(low.q_buffer), world), issued, now(), syncs=1)
        for m, p, q in zip(low.ms, low.ps, low.qs):
            torch.bmm(p, q.transpose(1, 2), out=m)
        for grad, error in self.error_pairs:
            error.sub_(grad)
        self.q_ready = True

    @classmethod
    def comm_pattern(cls, rank: int, step: int, world: int, config: PatternConfig,
                     layout: ParamLayout) -> list[CommOp]:
        """The first `start_iter` steps (and a model with no matrix worth compressing) one all_reduce
        of the gradient; then two: P with the uncompressed vectors, and Q."""
        cfg = config.algo
        if world <= 1 or step >= config.total_steps:
            return []
        es = layout.element_size
        shapes = [compressed_shape(shape, cfg.rank, cfg.min_compression_rate) for shape in layout.layer_shapes()]
        if step < cfg.start_iter or all(s is None for s in shapes):
            return [allreduce_op(layout.total_bytes, world)]
        vectors = sum(n for n, s in zip(layout.numels, shapes) if s is None) * es
        p = sum(n * r for n, _, r in filter(None, shapes)) * es
        q = sum(m * r for _, m, r in filter(None, shapes)) * es
        return [allreduce_op(p + vectors, world), allreduce_op(q, world)]

    def _initial_qs(self, qs: list[torch.Tensor]) -> None:
        """Standard normal Q's, the same on every rank: the k-th initialisation draws them, last
        layer first, from a CPU generator seeded with seed + k."""
        generator = torch.Generator().manual_seed(self.cfg.seed + self.q_inits)
        for q in qs:
            q.copy_(torch.randn(q.shape, generator=generator, dtype=q.dtype))
        self.q_inits += 1

    # ---- state and reporting ----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"q_inits": self.q_inits, "q_ready": self.q_ready}
        if self.low_rank is not None:
            state["q"] = self.low_rank.q_buffer.clone()
        if self.error_pairs:
            state["errors"] = [error.clone() for _, error in self.error_pairs]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.q_inits = int(state["q_inits"])
        self.q_ready = bool(state["q_ready"])
        if self.low_rank is not None:
            self.low_rank.q_buffer.copy_(state["q"])
        for (_, error), saved in zip(self.error_pairs, state.get("errors", [])):
            error.copy_(saved)

    def summary(self) -> dict[str, Any]:
        low = self.low_rank
        compressed = (_nbytes(low.p_buffer) + _nbytes(low.q_buffer)) if low else 0
        vectors = sum(map(_nbytes, self.vector_grads))
        return {"rank": self.cfg.rank, "start_iter": self.cfg.start_iter,
                "compressed_matrices": len(low.ms) if low else 0,
                "gradient_bytes": self.gradient_bytes, "bytes_per_compressed_step": compressed + vectors,
                "compression_ratio": round(self.gradient_bytes / (compressed + vectors), 2) if low else 1.0,
                **({"failed_rounds": list(self.failed_rounds)} if self.ft_rounds is not None else {})}
