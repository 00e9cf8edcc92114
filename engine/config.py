"""Typed view of the composed Hydra config, validated once before anything is launched.

Hydra composes YAML into an untyped `DictConfig`; this module merges each section onto a
dataclass schema so that a wrong type in an override (``train.epochs=abc``) or an unknown key
(``optim.lr_max=1``) is caught here, with one line naming the key and the fix, instead of deep
inside a rank after the processes have started. The model, data and algorithm sections belong
to their registries (`models`, `data`, `dist_algos`): each entry brings its own schema.
"""
from __future__ import annotations

import dataclasses
import inspect
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from engine.errors import UserError


@dataclass
class ImbalanceConfig:
    """Load-imbalance injector: slow ranks down to study wait-avoiding methods.

    A delay is added after a rank's compute in a step, either a fixed `delay_ms` or `factor`
    times that rank's median undelayed step time (measured over the first steps), with
    probability `prob` per step, independently per rank, from a seeded generator.
    """

    ranks: Optional[list[int]] = None  # None: every training rank
    delay_ms: float = 0.0
    factor: float = 0.0
    prob: float = 1.0
    seed: int = 1234

    @property
    def enabled(self) -> bool:
        return self.delay_ms > 0 or self.factor > 0


@dataclass
class TrainConfig:
    """The training loop: how long, how big a batch, when to log, evaluate and stop."""

    epochs: int = 30
    max_steps: Optional[int] = None  # overrides epochs when set
    batch_size: int = 32  # per worker and optimizer step
    global_batch_size: Optional[int] = None  # when set: batch_size = this / training ranks
    micro_batch_size: Optional[int] = None  # gradient accumulation when < batch_size
    grad_clip: Optional[float] = None  # max global L2 norm of the local gradient
    label_smoothing: float = 0.0
    precision: str = "auto"  # auto (fp32 on CPU, bf16 on GPU) | fp32 | bf16 | fp16
    log_every_steps: int = 10
    eval_every_epochs: Optional[int] = 1
    eval_every_steps: Optional[int] = None
    stop_after: Optional[int] = None  # end after this step as a preemption would
    preempt_check_every: int = 10  # steps between the ranks' agreement on a stop signal
    progress: bool = True
    imbalance: ImbalanceConfig = field(default_factory=ImbalanceConfig)


@dataclass
class OptimConfig:
    name: str = "sgd"  # sgd | adamw
    lr: float = 0.1
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 5e-4
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    scale_lr_with_batch: Optional[int] = None  # base batch B: lr *= global batch / B


@dataclass
class SchedConfig:
    """Per-step LR schedule: linear warmup, then constant, cosine, step or multistep."""

    name: str = "cosine"  # constant | cosine | step | multistep
    warmup_epochs: float = 0.0
    warmup_steps: Optional[int] = None  # overrides warmup_epochs when set
    warmup_start_factor: float = 0.0  # warmup starts at lr * this
    min_lr: float = 0.0  # cosine floor
    milestones: list[float] = field(default_factory=list)  # multistep, in epochs
    step_epochs: Optional[float] = None  # step: decay every this many epochs
    gamma: float = 0.1


@dataclass
class CheckpointConfig:
    every_steps: Optional[int] = None
    every_epochs: Optional[int] = 1
    keep_last: int = 2
    keep_best: bool = True
    best_metric: str = "test_acc"  # higher is better


@dataclass
class LoggerConfig:
    name: str = "none"  # none | wandb
    project: str = "syncopt"
    entity: Optional[str] = None
    tags: list[str] = field(default_factory=list)
    group: Optional[str] = None
    mode: str = "offline"  # online | offline | disabled


@dataclass
class DistConfig:
    backend: str = "auto"  # auto (nccl with CUDA, gloo without) | gloo | nccl
    timeout_s: float = 60.0  # a collective waiting longer than this fails the job


@dataclass
class RunConfig:
    """The whole validated configuration of one run, as every rank sees it."""

    seed: int
    resume: Optional[str]
    init_from: Optional[str]
    run_dir: str
    model: dict[str, Any]
    data: Any  # data.config.DataConfig
    algo: Any  # the plugin's config dataclass
    optim: OptimConfig
    sched: SchedConfig
    train: TrainConfig
    checkpoint: CheckpointConfig
    launch: Any  # engine.launch_config.LaunchConfig
    logger: LoggerConfig
    dist: DistConfig
    raw: DictConfig = field(repr=False)  # the resolved composed config, for saving and logging


_CHOICES = {
    "optim.name": ("sgd", "adamw"),
    "sched.name": ("constant", "cosine", "step", "multistep"),
    "train.precision": ("auto", "fp32", "bf16", "fp16"),
    "logger.name": ("none", "wandb"),
    "logger.mode": ("online", "offline", "disabled"),
    "dist.backend": ("auto", "gloo", "nccl"),
}


def typed_section(schema: type, node: Any, where: str) -> Any:
    """Merge a config node onto a dataclass schema; bad keys/types become a `UserError`."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(schema), node if node is not None else {})
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", None) or ""
        msg = str(err).splitlines()[0]
        full = f"{where}.{key}" if key and not key.startswith(where) else (key or where)
        raise UserError(f"{full}: {msg} (fix the override or the config file)") from None


def check_choice(key: str, value: Any) -> None:
    choices = _CHOICES[key]
    if value not in choices:
        raise UserError(f"{key}={value!r} is not one of {', '.join(choices)}")


def check_kwargs(where: str, fn: Any, kwargs: dict[str, Any], skip: tuple[str, ...] = ()) -> None:
    """Check that config keys are keyword arguments of `fn`, with compatible simple types."""
    sig = inspect.signature(fn)
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # pragma: no cover - unresolvable annotations just skip type checks
        hints = {}
    allowed = [p for p in sig.parameters if p not in skip and p != "self"]
    for key, value in kwargs.items():
        if key not in allowed:
            raise UserError(
                f"{where}.{key} is not an option here; options: {', '.join(allowed) or 'none'}"
            )
        hint = hints.get(key)
        base = {int: (int,), float: (int, float), bool: (bool,), str: (str,)}.get(hint)  # type: ignore[arg-type]
        if base and value is not None and (not isinstance(value, base) or (hint is not bool and isinstance(value, bool))):
            raise UserError(f"{where}.{key}={value!r}: expected {hint.__name__}")


def _to_container(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node


def load_run_config(cfg: DictConfig, run_dir: str) -> RunConfig:
    """Validate the composed config and return its typed form.

    Imports the registries, so it also catches unknown model, data and algorithm names; raises
    `UserError` with one line for anything a user could have mistyped.
    """
    from data import data_spec, load_data_config
    from dist_algos import load_algo_config
    from engine.launch_config import load_launch_config
    from models import check_model_config

    try:
        OmegaConf.resolve(cfg)
    except OmegaConfBaseException as err:
        raise UserError(f"config: {str(err).splitlines()[0]}") from None

    known = {"seed", "resume", "init_from", "run_dir", "paths", "model", "data", "algo", "optim",
             "sched", "train", "checkpoint", "launch", "logger", "dist", "recipe", "table", "local"}
    for key in cfg:
        if key not in known:
            raise UserError(f"{key} is not a config section; sections: {', '.join(sorted(known))}")

    optim = typed_section(OptimConfig, cfg.get("optim"), "optim")
    sched = typed_section(SchedConfig, cfg.get("sched"), "sched")
    train = typed_section(TrainConfig, cfg.get("train"), "train")
    checkpoint = typed_section(CheckpointConfig, cfg.get("checkpoint"), "checkpoint")
    logger = typed_section(LoggerConfig, cfg.get("logger"), "logger")
    dist = typed_section(DistConfig, cfg.get("dist"), "dist")
    launch = load_launch_config(cfg.get("launch"))
    for key, section in (("optim.name", optim), ("sched.name", sched), ("train.precision", train),
                         ("logger.name", logger), ("logger.mode", logger), ("dist.backend", dist)):
        check_choice(key, getattr(section, key.split(".")[1]))

    seed = cfg.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise UserError(f"seed={seed!r}: expected an integer")
    resume = cfg.get("resume", "auto")
    if resume is not None and not isinstance(resume, str):
        raise UserError(f"resume={resume!r}: expected auto, null or a checkpoint path")

    data = load_data_config(cfg.get("data"))
    model = _to_container(cfg.get("model")) or {}
    check_model_config(model, data_spec(data))
    algo = load_algo_config(cfg.get("algo"))
    _check_train(train, sched, checkpoint)
    return RunConfig(
        seed=seed, resume=resume, init_from=cfg.get("init_from"), run_dir=run_dir,
        model=model, data=data, algo=algo, optim=optim, sched=sched, train=train,
        checkpoint=checkpoint, launch=launch, logger=logger, dist=dist, raw=cfg,
    )


def _check_train(train: TrainConfig, sched: SchedConfig, ckpt: CheckpointConfig) -> None:
    positive = {"train.epochs": train.epochs, "train.batch_size": train.batch_size,
                "train.log_every_steps": train.log_every_steps,
                "train.preempt_check_every": train.preempt_check_every}
    for key, value in positive.items():
        if value < 1:
            raise UserError(f"{key}={value} must be at least 1")
    for key, value in {"train.max_steps": train.max_steps, "train.stop_after": train.stop_after,
                       "train.micro_batch_size": train.micro_batch_size,
                       "train.global_batch_size": train.global_batch_size,
                       "train.eval_every_steps": train.eval_every_steps,
                       "train.eval_every_epochs": train.eval_every_epochs,
                       "checkpoint.every_steps": ckpt.every_steps,
                       "checkpoint.every_epochs": ckpt.every_epochs}.items():
        if value is not None and value < 1:
            raise UserError(f"{key}={value} must be at least 1 (or null)")
    if train.micro_batch_size and train.global_batch_size is None and train.batch_size % train.micro_batch_size:
        raise UserError(f"train.micro_batch_size={train.micro_batch_size} must divide "
                        f"train.batch_size={train.batch_size}")
    if ckpt.keep_last < 1:
        raise UserError(f"checkpoint.keep_last={ckpt.keep_last} must be at least 1")
    if sched.name == "step" and not sched.step_epochs:
        raise UserError("sched.name=step needs sched.step_epochs (decay every that many epochs)")
    if not 0 <= train.imbalance.prob <= 1:
        raise UserError(f"train.imbalance.prob={train.imbalance.prob} must be in [0, 1]")


def as_dict(obj: Any) -> Any:
    """Dataclass (possibly nested) to plain dict, for summaries and hashing."""
    return dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else obj
