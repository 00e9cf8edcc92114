"""The `train` section: how long, how big a batch, at what precision, when to log, evaluate
and stop. Its dataclass is the one source of these defaults (Hydra's ConfigStore holds it)."""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Optional

from core.errors import UserError
from core.schema import Section, option
from engine.train.imbalance import ImbalanceConfig


class Precision(enum.StrEnum):
    auto = "auto"  # fp32 on CPU, bf16 on a GPU that has it (else fp16)
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


@dataclass
class TrainConfig(Section):
    epochs: int = option(30, ge=1)
    max_steps: Optional[int] = option(None, ge=1)  # overrides epochs when set
    batch_size: int = option(32, ge=1)  # per worker and optimizer step
    global_batch_size: Optional[int] = option(None, ge=1)  # when set: batch_size = this / training ranks
    micro_batch_size: Optional[int] = option(None, ge=1)  # gradient accumulation when < batch_size
    grad_clip: Optional[float] = option(None, gt=0)  # max global L2 norm of the local gradient
    label_smoothing: float = option(0.0, ge=0, lt=1)
    precision: Precision = Precision.auto
    # memory layout of conv models: auto = channels_last for convolutional models on a GPU
    channels_last: Any = option("auto", choices=("auto", True, False))
    compile: bool = False  # torch.compile the training forward (plugins and checkpoints keep the plain module)
    compile_backend: str = "inductor"  # torch.compile's backend ("eager": no C++ compiler needed, for tests)
    log_every_steps: int = option(10, ge=1)
    eval_every_epochs: Optional[int] = option(5, ge=1)
    eval_every_steps: Optional[int] = option(None, ge=1)
    stop_after: Optional[int] = option(None, ge=1)  # end after this step as a preemption would
    preempt_check_every: int = option(10, ge=1)  # steps between the ranks' agreement on a stop signal
    # Budgets (engine/train/stop.py): the run ends, evaluated, checkpointed and summarised, at the
    # first step where one is spent; samples exactly, bytes and wall-clock at the agreement steps
    budget_samples: Optional[int] = option(None, ge=1)  # training samples over all training ranks
    budget_bytes: Optional[int] = option(None, ge=1)  # bytes sent, all ranks (the plugins' comm accounting)
    budget_wall_s: Optional[float] = option(None, gt=0)  # wall-clock seconds of the run, all segments
    progress: bool = True
    imbalance: ImbalanceConfig = option(factory=ImbalanceConfig)


def check_train(cfg: TrainConfig) -> None:
    """What the ranges alone cannot say (the per-rank batch under a global batch size is checked
    when the run is planned, once the number of training ranks is known)."""
    if cfg.micro_batch_size and cfg.global_batch_size is None and cfg.batch_size % cfg.micro_batch_size:
        raise UserError(f"train.micro_batch_size={cfg.micro_batch_size} must divide "
                        f"train.batch_size={cfg.batch_size}")
