"""Evaluation on the validation split and the test set, each sharded over the evaluating ranks
and summed over all ranks, and the evaluation cadence of a run (`Evaluator`).

Selection (the best checkpoint, `best_*` in summary.json, tuning in tables) reads validation
metrics only (`val_*`), in the direction the task gives the metric (`core.task`: accuracy
higher, loss lower); test metrics are reported at the same points for the curves and for the
test value at the selected point (`test_acc_at_best`), and never choose anything. docs/evaluation.md."""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from core.task import Task


@torch.no_grad()
def evaluate(model: Optional[nn.Module], batches: Any, forward: Callable[[nn.Module, torch.Tensor], torch.Tensor],
             device: torch.device, task: Task, group: Optional[dist.ProcessGroup] = None,
             prefix: str = "test") -> dict[str, float]:
    """The task's metrics over a whole evaluation set, as `{prefix}_<metric>` (classification:
    `_loss`, `_acc`, and `_top5` with more than 5 classes; a language model: `_loss`, `_ppl`,
    `_bpc`, `_acc`): each batch's `task.batch_sums` added, all-reduced over ranks, then finished.

    Every rank calls this (a collective); ranks that do not evaluate pass `model=None` and add
    zeros. `batches` yields this rank's slice of the set.
    """
    return task.finish(evaluation_sums(model, batches, forward, device, task, group), prefix)


def evaluate_scored(model: Optional[nn.Module], batches: Any,
                    forward: Callable[[nn.Module, torch.Tensor], torch.Tensor], device: torch.device, task: Task,
                    prefix: str = "test") -> dict[str, float]:
    """`evaluate`'s metrics and, beside them, what they were counted over (`Task.scored`:
    `{prefix}_units`, `{prefix}_loss_se`), which summary.json keeps so that a table's floor
    counts the units a metric scores (a language model's characters, not its windows)."""
    sums = evaluation_sums(model, batches, forward, device, task)
    return {**task.finish(sums, prefix), **task.scored(sums, prefix)}


@torch.no_grad()
def evaluation_sums(model: Optional[nn.Module], batches: Any,
                    forward: Callable[[nn.Module, torch.Tensor], torch.Tensor], device: torch.device, task: Task,
                    group: Optional[dist.ProcessGroup] = None) -> torch.Tensor:
    """The task's batch sums over the whole set, added over batches and all-reduced over ranks (a
    collective, as `evaluate`)."""
    sums = task.zero_sums()
    if model is not None:
        was_training = model.training
        model.eval()
        for x, y in batches:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            sums += task.batch_sums(forward(model, x), y)
        model.train(was_training)
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(sums, group=group)
    return sums


class Evaluator:
    """When to evaluate (every N steps, every N epochs; the last step is evaluated at the end,
    after the plugin's finalize) and how: the plugin's evaluation model on the evaluating ranks,
    the validation split (when there is one) and the test set sharded over them, plus the bytes
    all ranks have sent so far (the x-axis of accuracy-against-communication plots). Updates the
    best validation metric in the training state (better in the task's direction; a tie keeps
    the first), and the test metrics at it; with no validation split (`best_metric` None)
    nothing is selected."""

    def __init__(self, train_cfg: Any, best_metric: Optional[str], total_steps: int, algo: Any, model: nn.Module,
                 ctx: Any, evaluates: bool, eval_stream: Any,
                 forward: Callable[[nn.Module, torch.Tensor], torch.Tensor], task: Task, quiesce: bool,
                 val_stream: Any = None) -> None:
        self.every_steps, self.every_epochs = train_cfg.eval_every_steps, train_cfg.eval_every_epochs
        self.best_metric, self.total_steps = best_metric, total_steps
        self.algo, self.model, self.ctx, self.evaluates = algo, model, ctx, evaluates
        self.eval_stream, self.forward, self.task = eval_stream, forward, task
        self.val_stream, self.quiesce = val_stream, quiesce

    def due(self, step: int, epoch: int, epoch_end: bool) -> bool:
        if step >= self.total_steps:
            return False  # the final evaluation comes after the plugin's finalize
        return bool((self.every_steps and step % self.every_steps == 0)
                    or (epoch_end and self.every_epochs and epoch % self.every_epochs == 0))

    def run(self, state: Any) -> tuple[dict[str, float], bool]:
        """Evaluate now (a collective on every rank); returns (result, whether it is a new best)."""
        if self.quiesce:
            # Serving ranks run no steps: without this barrier a server's main thread would
            # evaluate a global model that workers are still updating. Nobody pushes again before
            # the evaluation's all_reduce. (Checkpoints get the same from their opening barrier.)
            dist.barrier()
        model = self.algo.eval_model(self.model) if self.evaluates else None
        result: dict[str, float] = {}
        for prefix, stream in (("val", self.val_stream), ("test", self.eval_stream)):
            if stream is not None:  # (every rank has a validation stream, or none: a collective)
                result.update(evaluate_scored(model, stream.batches() if model is not None else iter(()),
                                              self.forward, self.ctx.device, self.task, prefix=prefix))
        sent = torch.tensor([float(self.algo.comm.as_metrics()["comm_bytes"])], dtype=torch.float64)
        dist.all_reduce(sent)
        result = {**result, "comm_bytes_total": int(sent.item())}
        state.last_eval = result
        metric = result.get(self.best_metric) if self.best_metric else None
        improved = metric is not None and self.task.better(self.best_metric, metric, state.best)
        if improved:
            state.best, state.best_step = metric, state.step
            state.test_at_best = {k: v for k, v in result.items() if k.startswith("test_")}
        return result, improved
