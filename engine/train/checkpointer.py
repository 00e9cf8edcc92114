"""When to checkpoint, and the `checkpoint` section that says so.

The trainer calls `after_step` at every step boundary (every rank, servers included, at the same
steps): a checkpoint is written when the cadence is due (every N steps, every N epochs) or when
the evaluation just found a new best; `save` is also called directly for a stop or at the end.
The same step is never written twice. What is written is `engine.checkpoint.collective`'s
per-rank files plus a manifest; `capture` gives this rank's state when the ranks are in step.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from core.distenv import DistContext
from core.errors import UserError
from core.rundir import RunDir
from core.schema import Section, option
from core.task import Task
from engine.checkpoint import files
from engine.checkpoint.collective import save_checkpoint
from engine.train.train_state import TrainState


@dataclass
class CheckpointConfig(Section):
    every_steps: Optional[int] = option(None, ge=1)
    every_epochs: Optional[int] = option(1, ge=1)
    keep_last: int = option(2, ge=1)  # complete checkpoints kept (the best is kept besides)
    keep_best: bool = True
    # the validation metric that selects (val_acc, val_top5, val_loss, val_bpc, ...: any of the
    # task's), in the task's direction; null: the task's own (val_acc for classification, val_loss
    # for a language model; core/task.py)
    best_metric: Optional[str] = None


def check_checkpoint(cfg: CheckpointConfig) -> None:
    """Selection reads validation only: a test metric is refused before launch, in one line
    (whether the name is a metric of the run's task is `selection_metric`'s, once the data's task
    is known)."""
    if cfg.best_metric is not None and cfg.best_metric.startswith("test_"):
        raise UserError(f"checkpoint.best_metric={cfg.best_metric} selects on the test set, which must never "
                        f"choose anything; use checkpoint.best_metric=val_{cfg.best_metric[5:]} (validation: "
                        "data.val_fraction / data.val_count)")


def selection_metric(cfg: CheckpointConfig, task: Task, data: str) -> str:
    """The validation metric that selects: `checkpoint.best_metric`, or the task's default; a name
    that is not one of the task's validation metrics is refused in one line naming those that are."""
    metric = cfg.best_metric or task.selection_metric
    names = [f"val_{m.name}" for m in task.metrics]
    if metric not in names:
        raise UserError(f"checkpoint.best_metric={metric} is not a validation metric of data={data} (a "
                        f"{task.name} task); use one of {', '.join(names)}")
    return metric


class Checkpointer:
    def __init__(self, cfg: CheckpointConfig, run_dir: RunDir, ctx: DistContext, algo: str,
                 keys: dict[str, Any], capture: Callable[[], dict[str, Any]], total_steps: int,
                 best_metric: Optional[str] = None) -> None:
        self.cfg, self.run_dir, self.ctx = cfg, run_dir, ctx
        self.best_metric = best_metric or cfg.best_metric  # the plan's `selection_metric`
        self.algo, self.keys, self.capture, self.total_steps = algo, keys, capture, total_steps
        self._saved_step: Optional[int] = None

    def due(self, state: TrainState, epoch_end: bool) -> bool:
        cfg = self.cfg
        return bool((cfg.every_steps and state.step % cfg.every_steps == 0)
                    or (epoch_end and cfg.every_epochs and state.epoch % cfg.every_epochs == 0))

    def will_save(self, state: TrainState, epoch_end: bool, improved: bool) -> bool:
        """Whether `after_step` writes (or marks) a checkpoint at this step."""
        best = improved and self.cfg.keep_best
        return best or (self.due(state, epoch_end) and state.step < self.total_steps)

    def after_step(self, state: TrainState, epoch_end: bool, improved: bool) -> None:
        """The cadence: periodic checkpoints, and one at each new best (not at the last step,
        which `at_end` saves after the final evaluation)."""
        due = self.due(state, epoch_end)
        best = improved and self.cfg.keep_best
        if (due or best) and state.step < self.total_steps:
            self.save(state, "best" if best and not due else "periodic")
        if best:
            self.mark_best(state)

    def save(self, state: TrainState, reason: str) -> Path:
        """Every rank's state at this step (a collective); a second call at a step is a no-op."""
        if self._saved_step == state.step:
            return self.run_dir.step_dir(state.step)
        extra = {"reason": reason, "total_steps": self.total_steps, "best": state.best}
        path = save_checkpoint(self.run_dir, state.step, state.epoch, self.ctx.rank, self.ctx.world_size,
                               self.algo, self.keys, self.capture, extra, self.cfg.keep_last, self.cfg.keep_best)
        self._saved_step = state.step
        return path

    def at_end(self, state: TrainState, improved: bool) -> None:
        """The final checkpoint, unless this segment only re-reports a finished run."""
        if state.resumed_from != state.step:
            self.save(state, "final")
        if improved and self.cfg.keep_best:
            self.mark_best(state)

    def mark_best(self, state: TrainState) -> None:
        if self.ctx.rank == 0:
            files.mark_best(self.run_dir, state.step, str(self.best_metric), state.best)
