"""What the reporting rank shows and writes: progress bar, metrics.jsonl, summary.json, plots,
and the one-screen summary at the end."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import torch
from omegaconf import OmegaConf

from engine.plots import plot_run, plot_series
from engine.reporting import Reporter, read_metrics

if TYPE_CHECKING:
    from engine.trainer import Trainer

STOPPED = "stopped.json"


def write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str))
    tmp.replace(path)


class RunReport:
    def __init__(self, trainer: "Trainer") -> None:
        self.run_dir = trainer.run_dir
        cfg = trainer.cfg
        (self.run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg.raw, resolve=True))
        (self.run_dir / STOPPED).unlink(missing_ok=True)
        config = OmegaConf.to_container(cfg.raw, resolve=True)
        self.reporter = Reporter(self.run_dir, cfg.logger, config, trainer.resumed_from)
        self.log_every = cfg.train.log_every_steps
        self._loss = torch.zeros((), dtype=torch.float64)
        self._correct = 0
        self._seen = 0
        self._window_t = time.perf_counter()
        self._window_samples = 0
        self.bar = None
        if cfg.train.progress:
            from tqdm import tqdm

            self.bar = tqdm(total=trainer.total_steps, initial=trainer.step, desc=cfg.algo.name,
                            unit="step", file=sys.stderr, dynamic_ncols=True, leave=True)

    def train_batch(self, loss: torch.Tensor, correct: torch.Tensor, n: int) -> None:
        self._loss += loss.detach().double().cpu() * n
        self._correct += int(correct)
        self._seen += n

    def after_step(self, t: "Trainer", step_s: float) -> None:
        self._window_samples += t.global_batch if t.is_worker else 0
        if self.bar is not None:
            self.bar.update(1)
        if t.step % self.log_every and t.step != t.total_steps:
            return
        now = time.perf_counter()
        sps = self._window_samples / max(now - self._window_t, 1e-9)
        record: dict[str, Any] = {
            "kind": "train", "step": t.step, "epoch": round(t.step / max(t.steps_per_epoch, 1), 4),
            "lr": t.optimizer.param_groups[0]["lr"],
            "loss": (self._loss / max(self._seen, 1)).item(), "acc": self._correct / max(self._seen, 1),
            "samples_per_s": sps, **t.algo.comm.as_metrics(), **t.algo.metrics(),
        }
        self.reporter.log(record)
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{record['loss']:.3f}", acc=f"{record['acc']:.3f}",
                                 sps=f"{sps:.0f}", refresh=False)
        self._loss.zero_()
        self._correct = self._seen = self._window_samples = 0
        self._window_t = now

    def after_eval(self, t: "Trainer", result: dict[str, float]) -> None:
        self.reporter.log({"kind": "eval", "step": t.step, "epoch": round(t.step / max(t.steps_per_epoch, 1), 4),
                           **result, **t.algo.comm.as_metrics()})
        if self.bar is not None:
            self.bar.write(f"step {t.step}: test_acc {result['test_acc']:.4f}  test_loss {result['test_loss']:.4f}")

    def finish(self, t: "Trainer", summary: dict[str, Any]) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        write_json(self.run_dir / "summary.json", summary)
        self.reporter.finish(summary)
        records = read_metrics(self.run_dir / "metrics.jsonl")
        title = f"{summary['algo']} / {summary['model']} / {summary['data']} ({summary['world_size']} ranks)"
        plot_run(records, self.run_dir / "curves.png", title)
        series = [k for k in t.algo.plot_keys() if any(k in r for r in records)]
        if series:
            plot_series(records, ["lr", *series], self.run_dir / f"{summary['algo']}_schedule.png", title)
        print_summary(summary, self.run_dir)

    def close(self, stopped: Optional[str]) -> None:
        if self.bar is not None:
            self.bar.close()
        self.reporter.close()
        if stopped is not None:
            write_json(self.run_dir / STOPPED, {"reason": stopped, "time": time.time()})


def print_summary(summary: dict[str, Any], run_dir: Path) -> None:
    """A compact table of the run's results on stdout."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"syncopt: {summary['algo']} on {summary['data']}", show_header=False, box=None)
    rows = [
        ("test accuracy", f"{summary['test_acc']:.4f}" + (f"  (top-5 {summary['test_top5']:.4f})" if "test_top5" in summary else "")),
        ("best test accuracy", f"{summary['best_test_acc']:.4f}"),
        ("test loss", f"{summary['test_loss']:.4f}"),
        ("steps / epochs", f"{summary['steps']} / {summary['epochs']:.2f}"),
        ("ranks (training)", f"{summary['world_size']} ({summary['train_ranks']})"),
        ("global batch / peak lr", f"{summary['global_batch']} / {summary['peak_lr']:g}"),
        ("throughput", f"{summary['samples_per_s']:.0f} samples/s"),
        ("synchronisations per worker", str(summary["syncs"])),
        ("communicated", f"{summary['comm_bytes'] / 1e6:.2f} MB sent (all ranks), {summary['comm_s']:.2f} s"),
        ("wall time", f"{summary['wall_s']:.1f} s"),
        ("run directory", str(run_dir)),
    ]
    for key, value in rows:
        table.add_row(key, value)
    Console(file=sys.stdout, width=100).print(table)
