"""Compressed synchronous data parallelism (`algo=compressed`): every step the workers' gradients
go through a compressor chain with error feedback (`dist_algos.compress`) instead of a dense
all_reduce, and the combined result drives the ordinary optimizer step on every rank, so the
ranks stay identical. QSGD, TernGrad, signSGD with majority vote, EF-signSGD, EF21, random-k,
low-precision transfer and DeMo are configurations of it (recipes/compress/).

A plugin of its own rather than an option of `allreduce`: allreduce's result is equal to torch
DDP's and is tested so (its bucket hooks all_reduce gradient slices in place); a compressed
exchange needs the whole step's gradient in hand for per-layer selection, error feedback and
gathered payloads, so it runs after backward on one flat gradient buffer, and keeping it apart
keeps the baseline's code path untouched.

`sign_result=true` steps along the sign of the combined vector (DeMo's update; signSGD's when the
compressor is not already a vote). Bytes: what the communicator puts on the wire, exactly.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn

from core.errors import UserError
from dist_algos import register_algorithm
from dist_algos.base import AlgoConfig, DistAlgorithm, HyperParams, StepContext, TrainInfo
from dist_algos.compress import build_chain, check_chain
from dist_algos.compress.communicator import Communicator
from dist_algos.flat import flat_grads


@dataclass
class CompressedConfig(AlgoConfig):
    name: str = "compressed"
    compress: list[str] = field(default_factory=lambda: ["topk:0.01"])  # chain of stages, name:arg:arg
    feedback: str = "ef"  # none | ef | ef21 | decayed:BETA | momentum:BETA
    sign_result: bool = False  # step along sign(combined) (DeMo, signSGD)
    seed: int = 0  # shared randomness (random-k positions); per-worker noise adds the rank


def layer_shapes(params: list[nn.Parameter]) -> tuple[list[int], list[tuple[int, ...]]]:
    return [p.numel() for p in params], [tuple(p.shape) for p in params]


@register_algorithm("compressed")
class CompressedAllreduce(DistAlgorithm):
    Config = CompressedConfig
    cfg: CompressedConfig

    @classmethod
    def validate(cls, cfg: AlgoConfig, world_size: int, local_size: int,
                 hyper: HyperParams = HyperParams()) -> None:
        assert isinstance(cfg, CompressedConfig)
        check_chain(cfg.compress, cfg.feedback)
        if build_chain(cfg.compress) is None:
            raise UserError("algo.compress=[] sends nothing compressed: use algo=allreduce for dense averaging")

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer, info: TrainInfo) -> None:
        super().setup(model, optimizer, info)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.grads = flat_grads(self.params)
        if len(self.grads.buffers) != 1:
            raise UserError("algo=compressed needs every trained parameter in one dtype and device")
        sizes, shapes = layer_shapes(self.params)
        compressor = build_chain(self.cfg.compress)
        assert compressor is not None
        self.exchanger = Communicator(compressor, self.cfg.feedback, self.ctx.world_size, self.ctx.rank,
                                      sizes, seed=self.cfg.seed, shapes=shapes)

    def step(self, ctx: StepContext) -> None:
        grad = self.grads.buffers[0]
        with self.comm.timed():
            combined, nbytes = self.exchanger.exchange(grad, ctx.step)
        if self.cfg.sign_result:
            combined.sign_()
        grad.copy_(combined.view_as(grad))
        self.comm.add(sent=nbytes, recv=nbytes, syncs=1 if self.ctx.world_size > 1 else 0)
        ctx.optimizer_step()

    def state_dict(self) -> dict[str, Any]:
        return {"memory": self.exchanger.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        try:
            self.exchanger.load_state_dict(state["memory"])
        except ValueError as exc:
            raise UserError(f"resume: {exc}; resume with the checkpoint's algo.feedback") from None

    def summary(self) -> dict[str, Any]:
        return {"compress": self.exchanger.compressor.spec(), "feedback": self.cfg.feedback,
                "combine": self.exchanger.compressor.combine.value}
