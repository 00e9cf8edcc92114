"""Compressed synchronous data parallelism (`algo=compressed`): every step the workers' gradients
go through a compressor chain with error feedback (`dist_algos.compress`) instead of a dense
all_reduce, and the combined result drives the ordinary optimizer step on every rank, so the
ranks stay identical. QSGD, TernGrad, signSGD with majority vote, EF-signSGD, EF21, random-k,
low-precision transfer and DeMo are configurations of it (recipes/compress/).

A plugin of its own rather than an option of `allreduce`: allreduce's result is equal to torch
DDP's and is tested so (its bucket hooks all_reduce gradient slices in place), and keeping the
compressed exchange apart keeps the baseline's code path untouched. By default the exchange runs
after backward on the whole flat gradient (whole-model rules such as topk_global see every layer);
`overlap=true` runs it bucket by bucket during backward, DDP's buckets, on a communication thread
(`dist_algos.compress.overlap`), which any combine kind allows.

`sign_result=true` steps along the sign of the combined vector (DeMo's update; signSGD's when the
compressor is not already a vote). Bytes: what the communicator puts on the wire, exactly.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.nn as nn

from core.errors import UserError
from core.schema import option
from dist_algos import register_algorithm
from dist_algos.allreduce import OverlappedHooks
from dist_algos.base import AlgoConfig, HyperParams, Scenario, StepContext, TrainInfo
from dist_algos.compress import build_chain, check_chain
from dist_algos.compress.contract import Combine
from dist_algos.compress.communicator import Communicator, exchange_ops
from dist_algos.compress.overlap import THREAD, OverlappedExchange
from dist_algos.comm.flat import flat_grads
from dist_algos.comm.grad_buckets import MIB, bucket_members
from dist_algos.comm.pattern import CommOp, ParamLayout, PatternConfig


@dataclass
class CompressedConfig(AlgoConfig):
    name: str = "compressed"
    compress: list[str] = field(default_factory=lambda: ["topk:0.01"])  # chain of stages, name:arg:arg
    feedback: str = "ef"  # none | ef | ef21 | decayed:BETA | momentum:BETA
    sign_result: bool = False  # step along sign(combined) (DeMo, signSGD)
    seed: int = 0  # shared randomness (random-k positions); per-worker noise adds the rank
    overlap: bool = False  # exchange DDP-style buckets during backward on a thread (per-bucket chains)
    bucket_mb: float = option(25.0, gt=0)  # overlap: bucket cap in MiB (DDP's)
    first_bucket_mb: float = option(1.0, gt=0)  # overlap: the first bucket's cap


def layer_shapes(params: list[nn.Parameter]) -> tuple[list[int], list[tuple[int, ...]]]:
    return [p.numel() for p in params], [tuple(p.shape) for p in params]


@register_algorithm("compressed")
class CompressedAllreduce(OverlappedHooks):
    Config = CompressedConfig
    # top-k with classic error feedback after backward; majority vote with momentum-decayed
    # feedback exchanged bucket by bucket during backward (the overlap path); on a tiny GPT, the
    # stages whose work depends on a layer's shape: a low-rank sketch of every matrix with error
    # feedback, and SparseLoCo's chain (top-k of 8 x 8 tiles, then 2-bit bins) with decayed feedback
    test_scenarios = {"topk_ef": Scenario({"compress": ["topk:0.1"], "feedback": "ef"}),
                      "signmv_overlap": Scenario({"compress": ["signmv"], "feedback": "momentum:0.9", "overlap": True,
                                                  "bucket_mb": 0.5 / 1024, "first_bucket_mb": 0.1 / 1024}),
                      "lm_lowrank_ef": Scenario({"compress": ["lowrank:2"], "feedback": "ef"}, task="language_model"),
                      "lm_tile_chain": Scenario({"compress": ["chunk_topk:8:4", "binquant:2:6"],
                                                 "feedback": "decayed:0.95"}, task="language_model")}
    reference = "tests.support.references:COMPRESSED"
    invalid_options = {"algo.compress=[]": "use algo=allreduce", "algo.feedback=sometimes": "algo.feedback",
                       "algo.compress=[nonesuch]": "nonesuch", "algo.bucket_mb=0": "algo.bucket_mb",
                       "algo.compress=[signmv] algo.overlap=true train.grad_clip=1": "algo.overlap=false"}
    cfg: CompressedConfig
    overlapped: Optional[OverlappedExchange] = None

    @classmethod
    def validate(cls, cfg: AlgoConfig, world_size: int, local_size: int,
                 hyper: HyperParams) -> None:
        assert isinstance(cfg, CompressedConfig)
        check_chain(cfg.compress, cfg.feedback)
        chain = build_chain(cfg.compress)
        if chain is None:
            raise UserError("algo.compress=[] sends nothing compressed: use algo=allreduce for dense averaging")
        if hyper.grad_clip and cfg.overlap and cls.sign_update(cfg, chain):
            raise UserError(f"train.grad_clip={hyper.grad_clip} with a sign update and algo.overlap=true: the "
                            f"clip applies to each worker's gradient before compression, which overlapped "
                            f"buckets leave before backward ends; set algo.overlap=false or train.grad_clip=null")

    @staticmethod
    def sign_update(cfg: "CompressedConfig", chain: Any) -> bool:
        """Whether the combined update is a sign (DeMo's sign_result, or a majority vote), whose size
        the learning rate alone sets."""
        return cfg.sign_result or chain.combine == Combine.VOTE

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer, info: TrainInfo) -> None:
        super().setup(model, optimizer, info)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.grads = flat_grads(self.params)
        if len(self.grads.buffers) != 1:
            raise UserError("algo=compressed needs every trained parameter in one dtype and device")
        sizes, shapes = layer_shapes(self.params)
        self.exchanger = self._communicator(sizes, shapes)
        # A sign update is +-1 per coordinate (norm sqrt(d)): train.grad_clip applied to it, as the
        # local step does, would shrink the step about sqrt(d)-fold (on the 0.8M-parameter GPT, 900:
        # no learning). It clips each worker's gradient before compression instead.
        self.clip = info.hyper.grad_clip
        self.clip_first = bool(self.clip) and self.sign_update(self.cfg, self.exchanger.compressor)
        if self.cfg.overlap and self.ctx.world_size > 1:
            self.overlapped = OverlappedExchange(self.params, self.ctx.world_size, self._communicator,
                                                 bucket_bytes=int(self.cfg.bucket_mb * MIB),
                                                 first_bucket_bytes=int(self.cfg.first_bucket_mb * MIB),
                                                 stats=self.comm)
            self.grads = self.overlapped.flat  # the hooks re-pointed the gradients into their own buffer

    def _communicator(self, sizes: list[int], shapes: list[tuple[int, ...]]) -> Communicator:
        compressor = build_chain(self.cfg.compress)
        assert compressor is not None
        return Communicator(compressor, self.cfg.feedback, self.ctx.world_size, self.ctx.rank, sizes,
                            seed=self.cfg.seed, shapes=shapes)

    def step(self, ctx: StepContext) -> None:
        grad = self.grads.buffers[0]
        if self.clip_first:
            torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        if self.overlapped is not None:
            with self.comm.timed():  # what this rank waits for: the exchanges not hidden behind backward
                self.overlapped.wait()  # (counts and logs each bucket's collectives)
        else:
            with self.comm.timed():
                combined, _ = self.exchanger.exchange(grad, ctx.step, self.comm)
            grad.copy_(combined.view_as(grad))
        if self.cfg.sign_result:
            grad.sign_()
        self.comm.add(syncs=1 if self.ctx.world_size > 1 else 0)
        if self.clip_first:
            ctx.optimizer_step(clip=False)
        else:  # no keyword: a test's StepContext may carry a bare torch optimizer's step
            ctx.optimizer_step()

    def state_dict(self) -> dict[str, Any]:
        if self.overlapped is not None:
            return {"buckets": self.overlapped.state_dict()}
        return {"memory": self.exchanger.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        key = "buckets" if self.overlapped is not None else "memory"
        if key not in state:
            raise UserError(f"resume: the checkpoint was written with algo.overlap={key == 'memory'}; "
                            "resume with that setting")
        try:
            if self.overlapped is not None:
                self.overlapped.load_state_dict(state[key])
            else:
                self.exchanger.load_state_dict(state[key])
        except ValueError as exc:
            raise UserError(f"resume: {exc}; resume with the checkpoint's algo.feedback") from None

    def summary(self) -> dict[str, Any]:
        return {"compress": self.exchanger.compressor.spec(), "feedback": self.cfg.feedback,
                "combine": self.exchanger.compressor.combine.value}

    @classmethod
    def comm_pattern(cls, rank: int, step: int, world: int, config: PatternConfig,
                     layout: ParamLayout) -> list[CommOp]:
        """Every step the compressed exchange of the whole gradient (`exchange_ops`: an all_reduce
        of a summable payload; else an all_gather of the lengths, then of the padded payload, whose
        size is data-dependent for a top-k or threshold); overlapped, one exchange per DDP bucket
        on the communication thread, in bucket order."""
        cfg = config.algo
        if world <= 1 or step >= config.total_steps:
            return []
        key = ("exchange", world, layout)
        if key in config.memo:  # (the same every step: derived once)
            return list(config.memo[key])
        chain = build_chain(cfg.compress)
        assert chain is not None
        shapes = layout.layer_shapes()
        ops: list[CommOp] = []
        if not cfg.overlap:
            ops = exchange_ops(chain, layout.numels, shapes, world)
        else:
            sizes = [n * layout.element_size for n in layout.numels]
            buckets = bucket_members(sizes, int(cfg.bucket_mb * MIB), int(cfg.first_bucket_mb * MIB))
            for i, members in enumerate(buckets):
                order = sorted(members)  # a bucket's layers in model order, as its communicator sees them
                ops += exchange_ops(chain, [layout.numels[j] for j in order], [shapes[j] for j in order], world,
                                    thread=THREAD, bucket=i)
        config.memo[key] = ops
        return list(ops)
