"""The run plan: everything decided from the config and the world before training starts.

`build_plan` is the one place a run is planned: the algorithm and its validation, which ranks
train and evaluate, the per-rank, micro and global batch, the peak learning rate, the data's task
(`core.task`: the loss, the metrics and their directions) and the validation metric that selects,
what a resume must keep, and the checkpoints it may resume from. cli.py builds it before launching
(`preflight`, so that a mistake is one line and nothing starts), and every rank builds the same
plan from the same config and its real world, then hands it to the trainer.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from typing import Any, Optional

from omegaconf import DictConfig

from core.distenv import plan_devices, sharing_note, visible_gpus
from core.errors import UserError
from core.run_files import FaultLog
from core.rundir import RunDir
from core.schema import freeze
from core.spec import DataSpec
from core.task import Task, task_for
from data import check_data_on_disk, check_shares, data_spec, num_train_samples, split_identity, validation_enabled
from dist_algos import get_algorithm
from dist_algos.base import DistAlgorithm, HyperParams, RankLayout
from models import check_buildable
from engine.checkpoint.files import Manifest
from engine.checkpoint.resume import init_source, resume_candidates
from engine.config import RunConfig, load_run_config
from engine.ft.config import check_ft
from engine.launch.config import Launcher, check_supervision, launch_shape
from engine.launch.start import Start, announce, choose_start
from engine.train.checkpointer import selection_metric
from engine.train.faults import parse_faults
from engine.train.optim import hyper_params, peak_lr, warmup_steps


@dataclass(frozen=True)
class BatchPlan:
    per_rank: int  # samples per training rank and optimizer step
    micro: int  # samples per forward/backward (gradient accumulation below per_rank)
    global_batch: int  # samples per optimizer step over all training ranks


@dataclass(frozen=True)
class RunPlan:
    config: RunConfig
    run_dir: RunDir
    world_size: int
    ranks_per_node: int
    algo: type[DistAlgorithm]
    layout: RankLayout
    batch: BatchPlan
    spec: DataSpec
    task: Task  # what the run optimises and how it is judged (core.task.task_for(spec))
    best_metric: str  # the validation metric that selects, in the task's direction (none without validation)
    hyper: HyperParams
    resume_keys: dict[str, Any]  # settings a resumed run must share with its checkpoint
    resume_from: tuple[Manifest, ...]  # candidates, newest first; the ranks agree on an intact one
    init_from: Optional[Manifest]  # a checkpoint whose model starts a fresh run

    @property
    def num_train_ranks(self) -> int:
        return len(self.layout.train)


def plan_batch(train: Any, n_train: int) -> BatchPlan:
    if train.global_batch_size is not None:
        if train.global_batch_size % n_train:
            raise UserError(f"train.global_batch_size={train.global_batch_size} is not divisible by the "
                            f"{n_train} training ranks; change it or launch.nproc")
        per_rank = train.global_batch_size // n_train
    else:
        per_rank = train.batch_size
    micro = train.micro_batch_size or per_rank
    if per_rank % micro:
        raise UserError(f"train.micro_batch_size={micro} must divide the per-rank batch {per_rank}"
                        + ("" if train.global_batch_size else f" (train.batch_size={per_rank})"))
    return BatchPlan(per_rank=per_rank, micro=micro, global_batch=per_rank * n_train)


def resume_keys(config: RunConfig, world_size: int, algo: type[DistAlgorithm]) -> dict[str, Any]:
    """Settings a resumed run must share with its checkpoint (anything else may be overridden)."""
    return {"world_size": world_size, "model": config.model, "data": config.data.name,
            "algo_family": algo.family or config.algo.name, "data_split": split_identity(config.data)}


def build_plan(config: RunConfig, run_dir: RunDir, world_size: int, ranks_per_node: int) -> RunPlan:
    """Plan the run for this world; `UserError` (one line) for anything that cannot work."""
    algo = get_algorithm(config.algo.name)
    layout = algo.layout(config.algo, world_size)
    batch = plan_batch(config.train, max(len(layout.train), 1))
    update_batch = batch.per_rank if algo.updates_per_worker else batch.global_batch
    hyper = hyper_params(config.optim, peak_lr(config.optim, update_batch), config.train.grad_clip)
    algo.validate(config.algo, world_size, ranks_per_node, hyper)
    parse_faults(config.faults, world_size)
    check_ft(config.ft, config.algo.name, algo.ft_refusal, config.launch, config.algo, replicas=world_size)
    samples = num_train_samples(config.data)
    if samples is not None and batch.global_batch > samples:
        raise UserError(f"launch.nproc={world_size}: {len(layout.train)} training ranks x batch {batch.per_rank} "
                        f"is more than the {samples} training samples of {config.data.name}; use fewer ranks "
                        "or a smaller batch")
    spec = data_spec(config.data)
    task = task_for(spec)
    best_metric = selection_metric(config.checkpoint, task, config.data.name)
    keys = resume_keys(config, world_size, algo)
    candidates = tuple(resume_candidates(config.resume, run_dir, keys))
    return RunPlan(config=config, run_dir=run_dir, world_size=world_size, ranks_per_node=ranks_per_node,
                   algo=algo, layout=layout, batch=batch, spec=spec, task=task, best_metric=best_metric, hyper=hyper,
                   resume_keys=keys, resume_from=candidates,
                   init_from=None if candidates else init_source(config.init_from))


def preflight(raw: DictConfig, run_dir: RunDir) -> RunPlan:
    """Every check that can be made before launching: the config's types, names and ranges, how
    the ranks start (`launch.launcher=auto` decided), the world size against the algorithm and the
    data set, the data on disk and each training rank's share of it (the split the ranks will
    compute: `data.check_shares`), the model, and the checkpoint a resume would load. Returns the
    plan for the launched world."""
    config = load_run_config(raw)
    start = start_of(config)
    config = with_launcher(config, start.launcher)
    world, per_node = launch_shape(config.launch)
    if config.launch.launcher == Launcher.none and config.launch.nproc != 1:
        raise UserError(f"launch.launcher=none trains in this one process; set launch.nproc=1 "
                        f"(not {config.launch.nproc}) or pick launch.launcher=deepspeed")
    check_supervision(config.launch, config.faults)
    plan = build_plan(config, run_dir, world, per_node)
    if plan.resume_from:  # what a resumed run reads back: a hand-edited fault log is one line here
        FaultLog(run_dir).events()
    check_data_on_disk(config.data)
    check_shares(config.data, config.seed, max(plan.num_train_ranks, 1), plan.batch.per_rank)  # as the ranks will split
    check_buildable(config.model, plan.spec)
    warn_endless_warmup(plan)
    warn_no_validation(config)
    announce_devices(config, per_node)  # last: a refused run's error is its only line, on a GPU machine too
    announce(start)
    return plan


def start_of(config: RunConfig) -> Start:
    """How the run's ranks start: `launch.launcher=auto` decided (engine/launch/start.py: fork on
    one machine, DeepSpeed's launcher for what forking cannot carry, one unsupervised rank here);
    an explicit launcher kept (fork checked)."""
    supervised = config.faults.active or config.launch.max_restarts > 0
    return choose_start(config.launch, config.ft.enabled, supervised)


def with_launcher(config: RunConfig, launcher: Launcher) -> RunConfig:
    """The config with `launch.launcher` set to the start chosen (the plan's, and the ranks')."""
    if launcher == config.launch.launcher:
        return config
    return freeze(replace(config, launch=replace(config.launch, launcher=launcher)))


def warn_no_validation(config: RunConfig) -> None:
    """One line when the validation split is off: nothing is selected (no best checkpoint, no
    best_* in summary.json), and test never stands in for it."""
    if not validation_enabled(config.data):
        print("syncopt: warning: no validation split (data.val_*=0): no best checkpoint and no selection; "
              "the test set is reported but never selects", file=sys.stderr, flush=True)


def announce_devices(config: RunConfig, ranks_per_node: int) -> None:
    """Refuse a backend the node's GPUs cannot carry (explicit NCCL with more ranks than GPUs),
    and say once, here rather than on every rank, when the ranks will share GPUs over gloo.
    Skipped where the ranks' nodes are not this machine (a hostfile over ssh): each rank then
    decides the same way with its own node's GPUs."""
    launch = config.launch
    if launch.hostfile and not launch.no_ssh:
        return
    gpus = visible_gpus()
    device = plan_devices(config.dist.backend, ranks_per_node, gpus, 0, config.dist.device)
    if device.shared:
        print(f"syncopt: {sharing_note(ranks_per_node, gpus)}", file=sys.stderr, flush=True)


def warn_endless_warmup(plan: RunPlan) -> None:
    """One line when the learning rate can never leave warm-up (the run is shorter than it):
    legal, but rarely meant."""
    config = plan.config
    samples = num_train_samples(config.data)
    steps_per_epoch = samples // plan.batch.global_batch if samples else None
    if not steps_per_epoch:
        return
    total = config.train.max_steps or config.train.epochs * steps_per_epoch
    warm = warmup_steps(config.sched, steps_per_epoch)
    if warm >= total:
        key = "sched.warmup_steps" if config.sched.warmup_steps is not None else "sched.warmup_epochs"
        print(f"syncopt: warning: {key} makes warm-up {warm} steps, but the run has {total}: the learning rate "
              f"never reaches optim.lr={config.optim.lr}", file=sys.stderr, flush=True)
