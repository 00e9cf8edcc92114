"""The plugin contract: what a distributed-training algorithm is to the trainer.

The trainer is algorithm-agnostic. Per step it computes this rank's gradient (forward and
backward) and calls `plugin.step(StepContext)`; the plugin decides when and what to
communicate and when to apply the local optimizer update (`ctx.optimizer_step()`). That shape
covers every family this project reproduces:

- synchronous gradient averaging (allreduce): average `.grad`, then `optimizer_step()`;
- periodic or scheduled model averaging (local SGD, QSR, post-local): `optimizer_step()`, then
  average parameters (and chosen optimizer fields) when the schedule says so;
- averaging inside groups that change over time, possibly run by a background communication
  thread on its own process group (WAGMA, D-PSGD, SGP): mix with the group, then step;
- pulling towards a leader chosen from gathered losses (LSGD, EASGD): `ctx.loss` is there;
- ranks in a server role that do not train (a parameter server): `role()` says so; the trainer
  then runs no forward/backward on that rank and never calls `step` there, but still takes it
  through the same evaluation, checkpoint and stop points as the workers, so that a server
  thread started in `setup` serves pushes while the main thread joins those collectives;
- gradient compression with error-feedback memory (top-k, DGC, gradient dropping,
  SAMomentum): residuals are plugin state, saved in `state_dict`.

A plugin owns its per-rank state (`state_dict`/`load_state_dict`; the trainer saves one file
per rank, so workers may differ) and its communication accounting (`self.comm`). Plugins are
registered with `@register_algorithm`; every registered plugin automatically goes through the
registry-wide tests: each of its declared `test_scenarios` through exact resume
(tests/test_resume_registry.py) and, against its declared `reference` (or its reasoned
`reference_exemption`), through reference equivalence (tests/test_reference_registry.py); each
of its `invalid_options` must fail before launch in one line (tests/test_invalid_options.py).
The references live under tests/ and are named here by dotted path only, so the runtime never
imports test code.
"""
from __future__ import annotations

import contextlib
import enum
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Optional

import torch
import torch.nn as nn

from core.distenv import DistContext
from core.schema import Section, check_ranges
from dist_algos.comm.accounting import CommStats
from dist_algos.comm.pattern import CommOp, ParamLayout, PatternConfig
from dist_algos.comm.round_averager import RoundAverager


class Role(str, enum.Enum):
    WORKER = "worker"
    SERVER = "server"


@dataclass
class AlgoConfig(Section):
    """Base of every plugin's config dataclass (`algo.*`). Ranges and choices are declared with
    `core.schema.option` on the fields and checked whenever a config is made: read from the
    command line before launch (`typed_section`), or built in code (a test, a benchmark), so a
    plugin never holds an out-of-range value and its `validate` checks only what relates
    several settings or the world."""

    name: str = ""

    def __post_init__(self) -> None:
        check_ranges(self, "algo")


@dataclass(frozen=True)
class HyperParams:
    """The run's optimizer settings as plain numbers (`optim.*`, `train.grad_clip`), for plugins
    that compute their own update instead of stepping the local optimizer (parameter servers)."""

    optimizer: str = "sgd"
    peak_lr: float = 0.1
    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    grad_clip: Optional[float] = None  # max L2 norm of this rank's gradient, before the update


@dataclass(frozen=True)
class Scenario:
    """One mode of a plugin that the registry-wide tests run: its `algo.*` overrides (merged over
    the plugin's `deterministic_overrides`) on `world_size` ranks, `local_size` of them per node
    (None: all on one node; fewer gives a real multi-node layout, for methods grouped by node).
    `optimizer` is the reference test's local optimizer: sgd (momentum 0.9), nesterov or adamw.
    `task` is what the tests train: `classification` (a small CNN on digits) or `language_model`
    (a tiny GPT on character windows: embeddings, attention and MLP matrices, LayerNorm vectors
    and a tied head), for a plugin whose mechanics depend on parameter shapes or optimizer state.
    The plugin itself never sees it."""

    overrides: dict[str, Any] = field(default_factory=dict)
    world_size: Optional[int] = None  # None: the plugin's test_world_size
    local_size: Optional[int] = None
    optimizer: str = "sgd"
    task: str = "classification"


@dataclass(frozen=True)
class RankLayout:
    """Which ranks train and which evaluate, decided from the config and the world size alone
    (so the run plan knows it before any rank starts)."""

    train: tuple[int, ...]
    evaluate: tuple[int, ...]

    def role(self, rank: int) -> "Role":
        return Role.WORKER if rank in self.train else Role.SERVER


@dataclass
class TrainInfo:
    """What the trainer tells a plugin at set-up."""

    total_steps: int
    steps_per_epoch: int
    lr_at: Callable[[int], float]  # the LR schedule (first param group) at any step
    warmup_steps: int
    # Fresh training batches of this rank's shard (for BatchNorm re-estimation): `train_batches(n)`
    # yields up to n batches without disturbing the training stream's position or the RNG.
    train_batches: Callable[[int], Iterator[tuple[torch.Tensor, torch.Tensor]]]
    forward: Callable[[nn.Module, torch.Tensor], torch.Tensor]  # the trainer's forward (autocast)
    resuming: bool = False  # state will be loaded right after setup (skip initial syncs)
    hyper: HyperParams = field(default_factory=HyperParams)  # optim.* and train.grad_clip as numbers


@dataclass
class StepContext:
    """One optimizer step, as the trainer hands it to the plugin after backward."""

    step: int  # 0-based index of this optimizer step (counted over the whole run)
    epoch: int
    loss: torch.Tensor  # this rank's mean minibatch loss, detached scalar
    lr: float  # current LR of the first param group
    # local update from the current .grad (unscale, clip, step); clip=False skips train.grad_clip, for a
    # plugin that clipped each worker's gradient itself (a sign update: dist_algos/compressed_sync.py)
    optimizer_step: Callable[..., None]
    extras: dict[str, Any] = field(default_factory=dict)


class DistAlgorithm(ABC):
    """Base class of the plugins; see the module docstring for the contract."""

    name: ClassVar[str] = ""
    Config: ClassVar[type[AlgoConfig]] = AlgoConfig
    #: Smallest world size the registry-wide tests run this plugin on.
    test_world_size: ClassVar[int] = 2
    #: Overrides that make the plugin deterministic, for the exact-resume test, with the reason
    #: (e.g. wait-avoiding or asynchronous modes depend on timing). Empty: exact as configured.
    deterministic_overrides: ClassVar[dict[str, Any]] = {}
    deterministic_reason: ClassVar[str] = ""
    #: Resuming across plugins of one family is allowed (e.g. constant H -> QSR); None: the name.
    family: ClassVar[Optional[str]] = None
    #: The plugin's own modes (groups, schedules, fragments, roles) by name, each run by the
    #: registry-wide exact-resume and reference tests. Empty: those tests fail, naming this.
    test_scenarios: ClassVar[dict[str, Scenario]] = {}
    #: "module:function" of the one-process simulation of this plugin's update (under tests/, see
    #: tests/support/references.py for its signature); or leave None and give `reference_exemption`.
    reference: ClassVar[Optional[str]] = None
    #: Why there can be no one-process reference (and what tests the update instead).
    reference_exemption: ClassVar[str] = ""
    #: Settings that cannot work, as {"space-separated overrides": "fragment of the one-line error"};
    #: each must fail before launch with exit code 2 (tests/test_invalid_options.py).
    invalid_options: ClassVar[dict[str, str]] = {}
    #: Why this plugin cannot run in fault-tolerant mode (`ft.enabled=true`, checked before launch);
    #: "" where it can: its communication is rounds of averages (`dist_algos.comm.round_averager`).
    ft_refusal: ClassVar[str] = ("it has no fault-tolerant round (its communication is not an average over "
                                 "whoever is alive that a failed round can roll back)")
    #: Fault-tolerant mode: the rounds this plugin averages through instead of the process group.
    ft_rounds: Optional[RoundAverager] = None
    #: Each worker's gradient is an update of the model on its own (an asynchronous parameter
    #: server applies every push as it arrives), so one update is computed from a worker's batch,
    #: not the global batch: what `optim.scale_lr_with_batch` scales the learning rate by
    #: (engine/plan.py). False: one update per step from all workers' samples (an average).
    updates_per_worker: ClassVar[bool] = False

    def __init__(self, cfg: AlgoConfig, ctx: DistContext) -> None:
        self.cfg = cfg
        self.ctx = ctx
        self.comm = CommStats()

    # ---- validation and layout, before any rank is launched ---------------------------------
    @classmethod
    def validate(cls, cfg: AlgoConfig, world_size: int, local_size: int, hyper: HyperParams) -> None:
        """Raise `core.errors.UserError` for settings that cannot work at this world size (or with
        these optimizer settings: `hyper` is the run's real one, so a check of the optimizer
        belongs here, before launch). Ranges and choices declared on the config's fields are
        checked already, when the config was made; what is left is what relates settings to each
        other, to the world or to the optimizer."""

    @classmethod
    def layout(cls, cfg: AlgoConfig, world_size: int) -> RankLayout:
        """Which ranks train (the training set is sharded over them) and which evaluate (the test
        set is sharded over them; `eval_model` must give the same model on all of them)."""
        everyone = tuple(range(world_size))
        return RankLayout(train=everyone, evaluate=everyone)

    # ---- the communication pattern, declared ------------------------------------------------
    @classmethod
    def comm_pattern(cls, rank: int, step: int, world: int, config: PatternConfig,
                     layout: ParamLayout) -> list[CommOp]:
        """Every communication rank `rank` of `world` issues at step `step` (0-based; `step` =
        `config.total_steps` is the end of training, `finalize`), in issue order, as the ledger
        records it (dist_algos/comm/pattern.py): a pure function of its arguments, so the model of
        a machine can ask it at a world that never ran. Evaluation's communication is not part of
        it (nor of the byte counters). A plugin must override this; tests/test_comm_pattern.py
        checks it against the recorded ledger at P = 2, 4 and 8."""
        raise NotImplementedError(f"algo={cls.name} declares no communication pattern: add "
                                  "`comm_pattern` (dist_algos.base.DistAlgorithm, docs/writing_a_plugin.md)")

    @classmethod
    def declares_pattern(cls) -> bool:
        """Whether this plugin overrides `comm_pattern` (the projection refuses one that does not)."""
        return getattr(cls.comm_pattern, "__func__", None) is not DistAlgorithm.comm_pattern.__func__

    # ---- this rank's place in the layout -----------------------------------------------------
    def role(self) -> Role:
        return self.layout(self.cfg, self.ctx.world_size).role(self.ctx.rank)

    def train_ranks(self) -> list[int]:
        return list(self.layout(self.cfg, self.ctx.world_size).train)

    def eval_ranks(self) -> list[int]:
        return list(self.layout(self.cfg, self.ctx.world_size).evaluate)

    # ---- training ---------------------------------------------------------------------------
    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer, info: TrainInfo) -> None:
        """Called once after model, optimizer and (on resume) their state exist, before the
        plugin's own state is loaded. Build flat buffers, process groups, threads here."""
        self.model, self.optimizer, self.info = model, optimizer, info

    @abstractmethod
    def step(self, ctx: StepContext) -> None:
        """Communicate as the algorithm says and apply the local update (`ctx.optimizer_step`)."""

    def attach_ft_rounds(self, rounds: RoundAverager) -> None:
        """Fault-tolerant mode (after `setup`, before state is loaded): average through `rounds`,
        where a round may fail and must then be rolled back as the algorithm requires (see
        `dist_algos.comm.round_averager.run_round`). Only plugins with `ft_refusal == ""` are given one."""
        self.ft_rounds = rounds

    def no_sync(self) -> contextlib.AbstractContextManager[Any]:
        """The trainer runs every micro-batch's backward but the last inside this (gradient
        accumulation), as torch DDP's `no_sync`: a plugin that communicates from gradient hooks
        during backward holds them there. Default: nothing to hold."""
        return contextlib.nullcontext()

    def eval_model(self, model: nn.Module) -> Optional[nn.Module]:
        """The model to evaluate on this rank (None on ranks outside `eval_ranks`)."""
        return model

    def finalize(self, model: nn.Module) -> None:
        """End of training (e.g. a last average); collectives allowed, on every rank."""

    def close(self) -> None:
        """Stop background threads; called on every exit path, errors included."""

    # ---- state and reporting ----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """This rank's algorithm state (tensors, numbers, lists, dicts: loadable weights_only)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        """Extra per-log-step metrics of this rank (H, leader, staleness, ...)."""
        return {}

    def plot_keys(self) -> list[str]:
        """Metric keys (from `metrics`) worth a plot against step beside the LR, e.g. ["H"]."""
        return []

    def summary(self) -> dict[str, Any]:
        """Extra entries for summary.json from this rank; `merge_summaries` combines all ranks'."""
        return {}

    @classmethod
    def merge_summaries(cls, per_rank: list[dict[str, Any]]) -> dict[str, Any]:
        """Combine the ranks' `summary()` dicts (default: the first non-empty one)."""
        return next((s for s in per_rank if s), {})
