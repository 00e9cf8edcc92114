"""What the reporting rank shows and writes while a run trains: the progress bar, one
metrics.jsonl line per log step and per evaluation (and wandb), and at the end summary.json,
the plots and the one-screen summary, each in the task's metrics (`core.task`). It reads the
shared `TrainState` and the run's fixed `RunFacts`, never the trainer."""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from omegaconf import DictConfig, OmegaConf

from core.machine import machine_record
from core.provenance import code_version
from core.rundir import RunDir
from core.task import Task
from engine.report.metrics import LoggerConfig, Reporter, read_metrics
from engine.report.plots import plot_run, plot_series
from engine.report.summary import print_summary
from engine.report.utilisation import utilisation

#: steps of a log window kept as they came before they are summed (bounds a long window's memory)
FOLD_EVERY = 64


@dataclass(frozen=True)
class RunFacts:
    """What a run is, fixed once it is built (the summary's and the progress bar's facts)."""

    algo: str
    model: str
    data: str
    pipeline: str
    seed: int
    world_size: int
    train_ranks: int
    global_batch: int
    peak_lr: float
    total_steps: int
    steps_per_epoch: int
    network: Optional[dict[str, Any]] = None  # the emulated link (launch.network), None on loopback
    num_gpus: int = 0  # GPUs the job trains on (0: the CPU)
    flops_per_sample: Optional[float] = None  # the model's training FLOPs per sample (models.flops)
    peak_flops: Optional[float] = None  # one GPU's peak at the run's precision (None: unknown, CPU)
    task: str = "classification"  # core.spec's task name (summary.json `task`)
    tokens_per_sample: Optional[int] = None  # a text window's predicted tokens (None: not a text)


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str))
    tmp.replace(path)


class RunReport:
    def __init__(self, run_dir: RunDir, raw: DictConfig, logger: LoggerConfig, log_every: int,
                 progress: bool, facts: RunFacts, state: Any, plot_keys: list[str], task: Task) -> None:
        self.run_dir, self.facts, self.log_every, self.plot_keys = run_dir, facts, log_every, plot_keys
        self.task = task
        # the code this segment runs, read as it starts (a commit landing mid-run is not this run's)
        self.code = code_version()
        run_dir.config.write_text(OmegaConf.to_yaml(raw, resolve=True))
        run_dir.stopped.unlink(missing_ok=True)
        self.reporter = Reporter(run_dir, logger, OmegaConf.to_container(raw, resolve=True), state.resumed_from)
        if facts.network is not None:  # what the following records ran on (a resumed part may differ)
            self.reporter.log({"kind": "run", "step": state.step, "network": facts.network})
        # the window's steps stay on the loss's device until a log step reads them (reading every
        # step would wait for the GPU), as they came: summing them each step cost more tensor
        # operations than a small model's step has to spare
        self._losses: list[torch.Tensor] = []
        self._sizes: list[int] = []
        self._hits: list[torch.Tensor] = []
        self._folded: Optional[tuple[torch.Tensor, int, torch.Tensor, int]] = None  # (loss sum, samples, hits, predictions)
        self._window_samples = 0
        self._window_train_s, self._window_wait_s = state.train_seconds, state.data_wait_seconds
        self.bar = None
        if progress:
            from tqdm import tqdm

            self.bar = tqdm(total=facts.total_steps, initial=state.step, desc=facts.algo, unit="step",
                            file=sys.stderr, dynamic_ncols=True, leave=True)

    def train_batch(self, loss: torch.Tensor, hits: torch.Tensor, n: int) -> None:
        """One step's batch on this rank: its mean loss over `n` samples, and which of its
        predictions (a sample's class, or a text's next tokens: `Task.hits`) were right."""
        self._losses.append(loss.detach())
        self._sizes.append(n)
        self._hits.append(hits)
        if len(self._losses) >= FOLD_EVERY:  # a long log window keeps sums, not every step's tensors
            self._folded = self._fold()
            self._losses, self._sizes, self._hits = [], [], []

    def _fold(self) -> Optional[tuple[torch.Tensor, int, torch.Tensor, int]]:
        """The window's sums so far, on the loss's device: (loss x samples, samples, right
        predictions, predictions); None before the first batch."""
        if not self._losses:
            return self._folded
        losses = torch.stack(self._losses).double()
        sizes = torch.tensor(self._sizes, dtype=torch.float64, device=losses.device)
        hits = torch.cat([h.reshape(-1) for h in self._hits])
        loss_sum, seen, right, counted = (losses * sizes).sum(), sum(self._sizes), hits.sum(), hits.numel()
        if self._folded is not None:
            f_loss, f_seen, f_right, f_counted = self._folded
            loss_sum, seen, right, counted = f_loss + loss_sum, f_seen + seen, f_right + right, f_counted + counted
        return loss_sum, seen, right, counted

    def _window_loss_acc(self) -> tuple[float, float]:
        """The window's mean training loss (over samples) and accuracy (over predictions)."""
        sums = self._fold()
        if sums is None:  # a rank that serves: no training batches
            return 0.0, 0.0
        loss_sum, seen, right, counted = sums
        return loss_sum.item() / max(seen, 1), int(right) / max(counted, 1)

    def after_step(self, state: Any, lr: float, trained: bool, metrics: Callable[[], dict[str, float]]) -> None:
        """`trained`: this rank took a training step (the window counts the global batch);
        `metrics`: the plugin's and its communication's numbers, read at log steps only."""
        self._window_samples += self.facts.global_batch if trained else 0
        if self.bar is not None:
            self.bar.update(1)
        if state.step % self.log_every and state.step != self.facts.total_steps:
            return
        # the trainer's clock has counted the window's training time (device synchronised)
        train_s = max(state.train_seconds - self._window_train_s, 1e-9)
        sps = self._window_samples / train_s
        f = self.facts
        used = utilisation(sps, f.num_gpus, f.flops_per_sample, f.peak_flops)
        loss, acc = self._window_loss_acc()
        record: dict[str, Any] = {
            "kind": "train", "step": state.step, "epoch": self._epoch(state), "lr": lr,
            "loss": loss, "acc": acc,
            "samples_per_s": sps, "data_wait_frac": (state.data_wait_seconds - self._window_wait_s) / train_s,
            **({"mfu": used["mfu"]} if used["mfu"] is not None else {}), **metrics(),
        }
        self.reporter.log(record)
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{record['loss']:.3f}", acc=f"{record['acc']:.3f}", sps=f"{sps:.0f}",
                                 refresh=False)
        self._losses, self._sizes, self._hits = [], [], []
        self._folded = None
        self._window_samples = 0
        self._window_train_s, self._window_wait_s = state.train_seconds, state.data_wait_seconds

    def note(self, record: dict[str, Any]) -> None:
        """A record outside the step and evaluation rhythm (a restart: where and after what)."""
        self.reporter.log(record)

    def _epoch(self, state: Any) -> float:
        return round(state.step / max(self.facts.steps_per_epoch, 1), 4)

    def after_eval(self, state: Any, result: dict[str, float], comm: dict[str, float]) -> None:
        self.reporter.log({"kind": "eval", "step": state.step, "epoch": self._epoch(state),
                           "wall_s": round(state.elapsed(), 3), **result, **comm})
        if self.bar is not None:
            shown = [f"{prefix}_{name} {result[f'{prefix}_{name}']:.4f}" for prefix in ("val", "test")
                     for name in self.task.shown if f"{prefix}_{name}" in result]
            self.bar.write(f"step {state.step}: " + "  ".join(shown))

    def finish(self, summary: dict[str, Any]) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        # provenance (core/provenance.py, core/machine.py): tables gather it per run and refuse to
        # mix commits, or pair machine types, in silence
        summary.update(commit=self.code.commit, dirty=self.code.dirty, machine=machine_record())
        write_json(self.run_dir.summary, summary)
        self.reporter.finish(summary)
        records = read_metrics(self.run_dir.metrics)
        f = self.facts
        title = f"{f.algo} / {f.model} / {f.data} ({f.world_size} ranks)"
        plot_run(records, self.run_dir.curves, title, self.task.plotted)
        series = [k for k in self.plot_keys if any(k in r for r in records)]
        if series:
            plot_series(records, ["lr", *series], self.run_dir.schedule_plot(f.algo), title)
        print_summary(summary, self.run_dir.root)

    def close(self, stopped: Optional[str]) -> None:
        if self.bar is not None:
            self.bar.close()
        self.reporter.close()
        if stopped is not None:
            write_json(self.run_dir.stopped, {"reason": stopped, "time": time.time()})
