"""Local SGD / local AdamW with scheduled synchronisation (QSR, Gu et al., ICLR 2024).

Every worker steps its own optimizer on its own data; after H local steps the workers average
their models (parameters, plus the BatchNorm statistics and optimizer fields the config names).
H comes from `dist_algos.schedules.sync`: constant, QSR's quadratic rule, the linear rule, or
post-local SGD. The parallel baseline is `algo=allreduce` with the same optimizer. DiLoCo
(`dist_algos.diloco`) is this class with an outer optimizer on the averaged change.

The extension interface (for a method whose workers train their own models between rounds; a
subclass with its own config overrides only what it changes, never `validate` or `summary` just
to dodge a field it lacks):

- `make_sync_rule(cfg, warmup_steps, total_steps)` (what `sync_rule(info)` returns, and what the
  declared pattern replays) and `validate_sync_rule(cfg)`: when rounds end, and their checks;
- `averaged_fields(cfg)`: the optimizer fields averaged with the parameters (checked against the
  run's optimizer before launch);
- `averaged_state()`: everything a round averages, one persistent `FlatBuffer` (parameters, BN
  statistics for bn=average, the averaged optimizer fields as views);
- `sync_round()`: the round hook, what one synchronisation does (here: average
  `averaged_state()`; DiLoCo: its outer step); it sets `synced` and returns False only for a
  round that did not commit (fault-tolerant mode; nothing returned counts as committed);
- `synced` (whether every worker holds the same averaged state: evaluation then needs no
  communication, `finalize` no last round) and `local_steps` (steps since the last round): the
  state the hook and the trainer-facing methods share, saved in the checkpoint.

Everything that is averaged lives in one persistent `FlatBuffer` (parameters, statistics and
optimizer fields are views into it), so a synchronisation is a few pipelined bucket all_reduces
on memory that already holds the values: no per-tensor collectives, no torch.cat per sync.

Evaluation. Between synchronisations the workers hold different models, and the model QSR
reports is the average (its code only evaluates right after an averaging step). The trainer
evaluates at fixed steps instead, so `eval_model` returns a scratch copy holding the global
average (no communication when the workers are in sync anyway), with BatchNorm statistics per
`bn`: `local` takes worker 0's (the statistics are never communicated, as in plain local SGD
code that evaluates rank 0), `average` averages them with the parameters at every sync,
`recompute` re-estimates them for the averaged weights on fresh training batches and averages
the estimates (QSR's procedure). The training state is never touched by an evaluation, so
evaluating does not change the run. At the end `finalize` makes the real model that averaged,
BN-settled model, so the final checkpoint is the model that was evaluated.

At 64 workers (docs/workers.md): nothing but the average depends on the world size (one
all_reduce per round, of one flat buffer); a round averages 64 models that drifted for H steps
(QSR's H grows as the learning rate falls, whatever the world). Any world size.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from dist_algos import register_algorithm
from dist_algos.base import AlgoConfig, DistAlgorithm, HyperParams, Scenario, StepContext, TrainInfo
from dist_algos.consensus.bn_stats import bn_statistics, float_buffers, recompute_bn_statistics, unflatten_into
from dist_algos.comm.accounting import allreduce_bytes, allreduce_op, now
from dist_algos.comm.pattern import CommOp, ParamLayout, PatternConfig
from dist_algos.compress import build_chain, check_chain
from dist_algos.compress.communicator import exchange_ops
from dist_algos.compress.model_delta import ModelDelta
from dist_algos.comm.flat import BUCKET_BYTES, FlatBuffer, Slot, average_, flat_grads
from dist_algos.comm.round_averager import run_round
from dist_algos.schedules.sync import SCHEDULES, RoundSteps, SyncRule, round_steps
from core.errors import UserError
from core.schema import option

OPTIMIZER_FIELDS = ("momentum_buffer", "exp_avg", "exp_avg_sq")
BN_MODES = ("local", "average", "recompute")


@dataclass
class LocalModelConfig(AlgoConfig):
    """What every method whose workers hold their own models between synchronisations shares
    (local SGD, DiLoCo): how the model it evaluates gets its BatchNorm statistics, and the size
    cap of one all_reduce."""

    bn: str = option("local", choices=BN_MODES)
    bn_batches: int = option(16, ge=1)  # recompute: micro-batches over all workers (each takes bn_batches // K)
    # recompute: split training batches to this size; None: whole
    bn_micro_batch: Optional[int] = option(None, ge=1, hint="or null")
    # cap of one all_reduce; None: dist_algos.comm.flat.BUCKET_BYTES
    bucket_mb: Optional[float] = option(None, gt=0, hint="or null for the default")


@dataclass
class LocalSGDConfig(LocalModelConfig):
    name: str = "local_sgd"
    sync_schedule: str = option("constant", choices=SCHEDULES)
    period: int = option(4, ge=1)  # H (constant); H_base (qsr, linear); H after the switch (post_local)
    # qsr/linear: H during LR warmup (QSR's init_h); None: period
    warmup_period: Optional[int] = option(None, ge=1, hint="or null")
    # qsr/linear: H = max(period, floor((alpha / lr)^power))
    alpha: float = option(0.0175, ge=0, hint="0 keeps H at the warmup period")
    power: float = option(2.0, gt=0, hint="QSR uses 2")  # qsr; linear forces 1
    switch_step: int = option(0, ge=0)  # post_local: synchronous data parallelism before this step
    average_optimizer_fields: list[str] = field(default_factory=list)  # momentum_buffer, exp_avg, exp_avg_sq
    compress: list[str] = field(default_factory=list)  # compress the averaged model delta (dist_algos.compress); []: exact average
    feedback: str = "none"  # error feedback of that compression: none | ef | ef21 | decayed:BETA | momentum:BETA


@register_algorithm("local_sgd")
class LocalSGD(DistAlgorithm):
    ft_refusal = ""  # a failed round keeps the local model (see _average)
    Config = LocalSGDConfig
    family = "local_sgd"
    # QSR's rule on 3 ranks (not a power of two: the mean's divide is inexact), H from 3 in warmup
    test_scenarios = {"qsr": Scenario({"sync_schedule": "qsr", "period": 2, "warmup_period": 3, "alpha": 0.08,
                                       "power": 2.0, "switch_step": 6}, world_size=3),
                      # local AdamW on a tiny GPT, its moments averaged with the model every 3 steps
                      "lm_adamw_fields": Scenario({"sync_schedule": "constant", "period": 3, "warmup_period": 3,
                                                   "alpha": 0.008, "power": 2.0, "switch_step": 6,
                                                   "average_optimizer_fields": ["exp_avg", "exp_avg_sq"],
                                                   "bucket_mb": 0.001}, world_size=3, optimizer="adamw",
                                                  task="language_model")}
    reference = "tests.support.references:LOCAL_SGD"
    invalid_options = {"algo.period=0": "algo.period=0", "algo.sync_schedule=cubic": "algo.sync_schedule='cubic'",
                       "algo.average_optimizer_fields=[exp_avg]": "exp_avg needs optim=adamw",
                       "optim=adamw algo.average_optimizer_fields=[momentum_buffer]": "momentum_buffer needs optim=sgd",
                       "algo.bn=global": "algo.bn='global'"}
    cfg: LocalSGDConfig

    @classmethod
    def validate(cls, cfg: AlgoConfig, world_size: int, local_size: int,
                 hyper: HyperParams) -> None:
        assert isinstance(cfg, LocalModelConfig)
        cls.validate_sync_rule(cfg)
        check_fields_for_optimizer(cls.averaged_fields(cfg), hyper)

    @classmethod
    def validate_sync_rule(cls, cfg: AlgoConfig) -> None:
        """One-line errors for the options `sync_rule` reads that no declared range covers (a
        subclass with other options for its rounds overrides both)."""
        assert isinstance(cfg, LocalSGDConfig)
        fields = cfg.average_optimizer_fields
        bad = [f for f in fields if f not in OPTIMIZER_FIELDS]
        if bad or len(set(fields)) != len(fields):
            raise UserError(f"algo.average_optimizer_fields={list(fields)}: use distinct entries of "
                            f"{', '.join(OPTIMIZER_FIELDS)}")
        check_chain(cfg.compress, cfg.feedback)
        if build_chain(cfg.compress) is not None and (cfg.bn == "average" or fields):
            raise UserError("algo.compress compresses the parameters' delta only: use it with algo.bn=local or "
                            "recompute and no algo.average_optimizer_fields")

    # ---- set-up -----------------------------------------------------------------------------
    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer, info: TrainInfo) -> None:
        super().setup(model, optimizer, info)
        cfg = self.cfg
        self.world = self.ctx.world_size
        self.bucket_bytes = int(cfg.bucket_mb * 2**20) if cfg.bucket_mb else BUCKET_BYTES
        self.rule = self.sync_rule(info)
        check_optimizer_fields(optimizer, self.averaged_fields(cfg))
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.stat_buffers = float_buffers(model) if cfg.bn == "average" else []
        self.field_views: list[torch.Tensor] = []
        self.flat = self._build_flat()
        # post-local SGD's first phase is synchronous data parallelism: gradients in one buffer
        self.grads = flat_grads(self.params) if self.rule.parallel_at(0) else None
        self.period = self.rule.period_after(0, info.lr_at(0))
        self.local_steps = 0  # local steps since the last average
        # whether everything `flat` holds is identical on all ranks (false after a local step, and
        # after a post-local parallel step when BN statistics are averaged: those stay per-rank)
        self.synced = True
        self.rounds: list[list[int]] = []  # run-length log of synchronisations: [first_step, H, count]
        self.failed_rounds: list[int] = []  # fault-tolerant mode: steps whose round was not committed
        self.eval_syncs = 0
        self.eval_bytes = 0
        self.finalized = False
        self._scratch: Optional[nn.Module] = None
        self.step_now = 0
        # compressed model deltas (issue 22); None: the exact average of the flat buffer
        self.delta = ModelDelta.build(getattr(cfg, "compress", None), getattr(cfg, "feedback", "none"),
                                      self.params, self.world, self.ctx.rank)

    def sync_rule(self, info: TrainInfo) -> SyncRule:
        """When the workers average: `make_sync_rule` of the run's step counts."""
        return self.make_sync_rule(self.cfg, info.warmup_steps, info.total_steps)

    @classmethod
    def make_sync_rule(cls, cfg: AlgoConfig, warmup_steps: int, total_steps: int) -> SyncRule:
        """The rule from the config alone (a subclass with its own schedule options overrides
        this), so the declared pattern (`comm_pattern`) follows the same rounds."""
        assert isinstance(cfg, LocalSGDConfig)
        return SyncRule(schedule=cfg.sync_schedule, sync_period=cfg.period,
                        warmup_period=cfg.warmup_period or cfg.period, alpha=cfg.alpha, power=cfg.power,
                        switch_step=cfg.switch_step, warmup_steps=warmup_steps, total_steps=total_steps)

    @classmethod
    def averaged_fields(cls, cfg: AlgoConfig) -> list[str]:
        """Optimizer fields averaged with the parameters (none where the optimizer is per worker)."""
        return list(getattr(cfg, "average_optimizer_fields", []))

    def averaged_state(self) -> FlatBuffer:
        """Everything a round averages, as one persistent flat buffer; rebuilt first when the
        optimizer has created (at its first update) or replaced the fields it averages."""
        if self.averaged_fields(self.cfg) and not self._fields_attached():
            self.flat = self._build_flat()
        return self.flat

    def sync_round(self) -> bool:
        """The round hook: one synchronisation of the workers, at the end of a round of the sync
        rule and at `finalize` if steps are left over. Here the average of `averaged_state()`;
        DiLoCo's outer step overrides it. With `compress` set, the averaged model delta goes
        through the compression chain instead (dist_algos/compress/model_delta.py). Sets `synced`
        and returns whether the round committed: always, except in fault-tolerant mode
        (`ft.enabled`), where a failed round keeps the local model and returns False. An override
        that returns nothing counts as committed; only an explicit False is a failed round."""
        if self.delta is not None:
            self.delta.average_(self.step_now, self.comm)
            self.comm.add(syncs=1)
            self.synced = True
            return True
        committed = self._average(self.averaged_state)
        self.synced = committed
        return committed

    def _field_slots(self) -> list[Slot]:
        state = self.optimizer.state

        def slot(p: torch.Tensor, name: str) -> Slot:
            return Slot(lambda: state[p].get(name), lambda v: state[p].__setitem__(name, v))

        return [slot(p, name) for p in self.params for name in self.averaged_fields(self.cfg)]

    def _build_flat(self) -> FlatBuffer:
        """Parameters (+ BN statistics for bn=average) + the optimizer fields that exist: optimizers
        create their state at a parameter's first update, so a fresh run rebuilds at its first sync."""
        owners: list[Any] = list(self.params) + list(self.stat_buffers)
        fields = [s for s in self._field_slots() if s.read() is not None]
        flat = FlatBuffer(owners + fields, getter=lambda o: o.read() if isinstance(o, Slot) else o.data,
                          setter=lambda o, v: o.write(v) if isinstance(o, Slot) else setattr(o, "data", v))
        self.field_views = [s.read() for s in fields]  # type: ignore[misc]
        return flat

    def _fields_attached(self) -> bool:
        """Whether the optimizer fields that exist are exactly the views in the flat buffer (false
        after the first update created them, or if anything replaced the optimizer's state)."""
        present = [t for t in (s.read() for s in self._field_slots()) if t is not None]
        return len(present) == len(self.field_views) and all(a is b for a, b in zip(present, self.field_views))

    # ---- training ---------------------------------------------------------------------------
    def step(self, ctx: StepContext) -> None:
        self.step_now = ctx.step
        if self.rule.parallel_at(ctx.step):
            grads = self.grads
            assert grads is not None
            committed = self._average(lambda: grads, keep_on_failure=False)
            if committed:  # a failed fault-tolerant round skips the update
                ctx.optimizer_step()
            self.synced = committed and not self.stat_buffers
            self._after_sync(self._steps_done(ctx), 1, committed)
            return
        ctx.optimizer_step()
        self.local_steps += 1
        self.synced = False
        if self.local_steps >= self.period:
            committed = self.sync_round() is not False  # a hook that returns nothing committed
            self._after_sync(self._steps_done(ctx), self.local_steps, committed)

    def _steps_done(self, ctx: StepContext) -> int:
        """Steps done after this one; in fault-tolerant mode the trainer's step, which a heal
        during the round may have replaced with the peer's."""
        return (self.ft_rounds.step if self.ft_rounds is not None else ctx.step) + 1

    def _average(self, flat: Callable[[], FlatBuffer], keep_on_failure: bool = True) -> bool:
        """Average the buffer over the workers; False when a fault-tolerant round failed (the
        buffer then holds what it held before the round if `keep_on_failure`: local SGD keeps
        the local model)."""
        if self.ft_rounds is not None:
            def restore(backup: list[torch.Tensor]) -> None:
                if keep_on_failure:
                    for t, b in zip(flat(), backup):
                        t.copy_(b)
            issued = now()
            with self.comm.timed():
                committed = run_round(self.ft_rounds, lambda: list(flat()), restore)
            self.comm.record(allreduce_op(flat().nbytes, self.ft_rounds.participants), issued, now(), syncs=1)
            return committed
        buffer = flat()
        issued = now()
        if self.world > 1:
            with self.comm.timed():
                average_(buffer, None, self.world, bucket_bytes=self.bucket_bytes)
        self.comm.record(allreduce_op(buffer.nbytes, self.world), issued, now(), syncs=1)
        return True

    def _after_sync(self, steps_done: int, period: int, committed: bool = True) -> None:
        """Log the round that just ended and pick the next H (only ever here, as QSR does)."""
        if not committed:
            self.failed_rounds.append(steps_done - 1)
        elif self.rounds and self.rounds[-1][1] == period:
            self.rounds[-1][2] += 1
        else:
            self.rounds.append([steps_done - period, period, 1])
        self.local_steps = 0
        if steps_done < self.info.total_steps:  # at the end the last round's H stays on show
            self.period = self.rule.period_after(steps_done, self.info.lr_at(steps_done))

    # ---- evaluation and the end -------------------------------------------------------------
    def eval_model(self, model: nn.Module) -> Optional[nn.Module]:
        if self.finalized:
            return model  # finalize made it the averaged, BN-settled model on every rank
        scratch, scratch_flat = self._scratch_model(model)
        scratch.load_state_dict(model.state_dict())
        if not self.synced and self.world > 1:
            average_(scratch_flat, None, self.world, bucket_bytes=self.bucket_bytes)
            self._count_eval(scratch_flat.nbytes)
        self._settle_bn(scratch)
        return scratch

    def _scratch_model(self, model: nn.Module) -> tuple[nn.Module, FlatBuffer]:
        if self._scratch is None:
            scratch = copy.deepcopy(model)
            for p in scratch.parameters():
                p.grad = None
                p.requires_grad_(False)
            owners = list(scratch.parameters()) + (float_buffers(scratch) if self.cfg.bn == "average" else [])
            self._scratch = scratch
            self._scratch_flat = FlatBuffer(owners)
        return self._scratch, self._scratch_flat

    def _count_eval(self, nbytes: int) -> None:
        self.eval_syncs += 1
        self.eval_bytes += allreduce_bytes(nbytes, self.world)

    def _settle_bn(self, model: nn.Module) -> None:
        """Make the BatchNorm statistics of an averaged model identical on every rank, per `bn`."""
        stats = bn_statistics(model)
        if not stats or self.world == 1 and self.cfg.bn != "recompute":
            return
        if self.cfg.bn == "local":
            flat = torch.cat([t.reshape(-1) for t in stats])
            dist.broadcast(flat, src=0)
            self.eval_syncs += 1
            self.eval_bytes += flat.numel() * flat.element_size() * (self.world - 1) if self.ctx.rank == 0 else 0
            unflatten_into(flat, stats)
        elif self.cfg.bn == "recompute":
            count = max(1, self.cfg.bn_batches // self.world)  # the QSR code splits bn_batches over workers
            recompute_bn_statistics(model, self.info.train_batches(count), count, self.info.forward,
                                    self.cfg.bn_micro_batch)
            if self.world > 1:
                flat = torch.cat([t.reshape(-1) for t in stats])
                average_([flat], None, self.world)
                self._count_eval(flat.numel() * flat.element_size())
                unflatten_into(flat, stats)

    def finalize(self, model: nn.Module) -> None:
        if self.finalized:
            return
        if not self.synced:  # a run cut short of its schedule's last round (or per-rank BN stats)
            local_steps = self.local_steps
            self.sync_round()
            if local_steps:
                self._after_sync(self.info.total_steps, local_steps)
        self._settle_bn(model)
        self.finalized = True

    # ---- the declared pattern -----------------------------------------------------------------
    @classmethod
    def comm_pattern(cls, rank: int, step: int, world: int, config: PatternConfig,
                     layout: ParamLayout) -> list[CommOp]:
        """At each round's end (`round_steps`; once more at the end when local steps are left) the
        all_reduce of `averaged_state()` or the compressed delta; post-local's first phase: the gradient's."""
        cfg = config.algo
        steps = cls.round_steps_of(config)
        if world <= 1:
            return []
        if step in steps.parallel:
            return [allreduce_op(layout.total_bytes, world)]
        at_end = step == config.total_steps and (steps.local_after_last or (
            config.total_steps - 1 in steps.parallel and cfg.bn == "average"))
        if step not in steps.rounds and not at_end:
            return []
        chain = build_chain(getattr(cfg, "compress", None))
        if chain is not None:
            return exchange_ops(chain, layout.numels, layout.layer_shapes(), world)
        stats = layout.buffer_bytes if cfg.bn == "average" else 0
        return [allreduce_op(layout.total_bytes * (1 + len(cls.averaged_fields(cfg))) + stats, world)]

    @classmethod
    def round_steps_of(cls, config: PatternConfig) -> RoundSteps:
        """The run's rounds (`round_steps`), derived once per config."""
        if "rounds" not in config.memo:
            rule = cls.make_sync_rule(config.algo, config.warmup_steps, config.total_steps)
            config.memo["rounds"] = round_steps(rule, config.lr_at)
        return config.memo["rounds"]

    # ---- state and reporting ----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state = {"period": self.period, "local_steps": self.local_steps, "synced": self.synced,
                 "rounds": [list(r) for r in self.rounds], "eval_syncs": self.eval_syncs,
                 "eval_bytes": self.eval_bytes, "finalized": self.finalized,
                 **({"failed_rounds": list(self.failed_rounds)} if self.failed_rounds else {})}
        if self.delta is not None:
            state["delta"] = self.delta.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.period = int(state["period"])
        self.local_steps = int(state["local_steps"])
        self.synced = bool(state["synced"])
        self.rounds = [[int(v) for v in r] for r in state["rounds"]]
        self.eval_syncs = int(state["eval_syncs"])
        self.eval_bytes = int(state["eval_bytes"])
        self.finalized = bool(state["finalized"])
        if self.delta is not None:
            if "delta" not in state:
                raise UserError("resume: the checkpoint has no compressed-delta state; resume with its algo.compress=[]")
            self.delta.load_state_dict(state["delta"])
        self.failed_rounds = [int(s) for s in state.get("failed_rounds", [])]

    def metrics(self) -> dict[str, float]:
        return {"H": float(self.period)}

    def plot_keys(self) -> list[str]:
        return ["H"]

    def summary(self) -> dict[str, Any]:
        rounds = sum(r[2] for r in self.rounds)
        steps = sum(r[1] * r[2] for r in self.rounds)
        return {"sync_schedule": self.rule.schedule, "rounds": rounds,
                "mean_H": round(steps / rounds, 3) if rounds else None,
                "max_H": max((r[1] for r in self.rounds), default=None),
                "bytes_per_sync": allreduce_bytes(self.flat.nbytes, self.world),
                "H_rounds": [list(r) for r in self.rounds],  # [first step, H, rounds in a row]
                "eval_syncs": self.eval_syncs, "eval_bytes": self.eval_bytes, "bn": self.cfg.bn,
                **({"failed_rounds": list(self.failed_rounds)} if self.ft_rounds is not None else {})}


def check_fields_for_optimizer(fields: list[str], hyper: HyperParams) -> None:
    """Before launch: the fields to average must be ones the run's optimizer will keep."""
    for name in fields:
        if name == "momentum_buffer" and not (hyper.optimizer == "sgd" and hyper.momentum > 0):
            raise UserError("algo.average_optimizer_fields: momentum_buffer needs optim=sgd with momentum > 0")
        if name in ("exp_avg", "exp_avg_sq") and hyper.optimizer != "adamw":
            raise UserError(f"algo.average_optimizer_fields: {name} needs optim=adamw")


def check_optimizer_fields(optimizer: torch.optim.Optimizer, fields: list[str]) -> None:
    """The fields to average must be ones this optimizer keeps."""
    is_adam = isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW))
    for name in fields:
        if name == "momentum_buffer" and not (isinstance(optimizer, torch.optim.SGD)
                                              and all(g.get("momentum", 0) for g in optimizer.param_groups)):
            raise UserError("algo.average_optimizer_fields: momentum_buffer needs optim=sgd with momentum > 0")
        if name in ("exp_avg", "exp_avg_sq") and not is_adam:
            raise UserError(f"algo.average_optimizer_fields: {name} needs optim=adamw")

