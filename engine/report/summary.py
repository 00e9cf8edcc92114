"""The run's summary: every rank's communication and plugin records gathered, combined into
summary.json's numbers on the reporting rank, and printed as one screen in the task's metrics
(accuracy for classification; token loss, bits per character, perplexity and next-character
accuracy for a language model)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Optional

import torch.distributed as dist

from core.spec import CLASSIFICATION, LANGUAGE_MODEL
from engine.report.utilisation import utilisation


def selection(state: Any, best_metric: Optional[str], name: str = "val_acc") -> dict[str, Any]:
    """summary.json's selected point (docs/evaluation.md): the best validation value
    (`best_<metric>`: `best_val_acc`, `best_val_loss`) and its step, and the test metrics at that
    evaluation (`test_acc_at_best`, `test_loss_at_best`, ...: what a table reports on test). None
    throughout when there is no validation split (`best_metric` None; `name` is the metric that
    would have selected): test never stands in."""
    at_best = {f"{k}_at_best": v for k, v in state.test_at_best.items()} if best_metric else {}
    return {"best_metric": best_metric,
            f"best_{best_metric or name}": state.best if best_metric else None,
            "best_step": state.best_step if best_metric else None,
            "test_acc_at_best": at_best.get("test_acc_at_best"), **at_best,
            # the old column's name, now the test value at the validation-selected point (tables read it)
            "best_test_acc": at_best.get("test_acc_at_best")}


def gather_summary(mine: dict[str, Any], world_size: int, reporting: bool, result: dict[str, float],
                   state: Any, facts: Any, best_metric: Optional[str],
                   merge_algo: Callable[[list[dict[str, Any]]], dict[str, Any]],
                   split: Optional[dict[str, Any]] = None, selection_name: str = "val_acc",
                   eval_sizes: Optional[dict[str, int]] = None) -> Optional[dict[str, Any]]:
    """A collective: every rank hands in `mine` ({rank, worker, comm, algo, imbalance_s}); the
    reporting rank gets the summary, the others None. `best_metric`: the validation metric that
    selects (None: no validation split; `selection_name`: the one that would); `split`: the data
    split's record (`data.split`); `eval_sizes`: the evaluation sets' sizes (`test_samples`,
    `val_samples`: images, signals or text windows), the floor under a table's intervals."""
    every: list[Any] = [None] * world_size
    dist.all_gather_object(every, mine)
    if not reporting:
        return None
    workers = [e for e in every if e["worker"]]
    syncs = [e["comm"]["syncs"] for e in workers]
    steady_s, steady_samples, steady_wait_s = state.steady()
    samples_per_s = steady_samples / steady_s if steady_s else 0.0
    summary: dict[str, Any] = {
        **result,
        **selection(state, best_metric, selection_name),
        "task": facts.task,
        **(eval_sizes or {}),
        "steps": state.step,
        "epochs": state.step / max(facts.steps_per_epoch, 1),
        "wall_s": round(state.elapsed(), 3),
        "train_s": round(state.train_seconds, 3),
        # steady-state: over training time (evaluation and checkpoints excluded) after each
        # segment's first log window, whose seconds are `warmup_s` (engine/train/clock.py)
        "samples_per_s": samples_per_s,
        # a text's samples are windows: the same rate in tokens (predicted positions)
        **({"tokens_per_s": samples_per_s * facts.tokens_per_sample} if facts.tokens_per_sample else {}),
        "warmup_s": round(state.warmup["seconds"], 3),
        # optimizer steps per second summed over the training ranks: a parameter server's worker updates/s
        "updates_per_s": state.step * facts.train_ranks / state.train_seconds if state.train_seconds else 0.0,
        "data_wait_s": round(state.data_wait_seconds, 3),
        "data_wait_frac": steady_wait_s / steady_s if steady_s else 0.0,  # steady-state, as samples_per_s
        **utilisation(samples_per_s, facts.num_gpus, facts.flops_per_sample, facts.peak_flops),
        "model_flops_per_sample": facts.flops_per_sample,
        "peak_flops_per_gpu": facts.peak_flops,
        "world_size": facts.world_size,
        "train_ranks": facts.train_ranks,
        "global_batch": facts.global_batch,
        "peak_lr": facts.peak_lr,
        "algo": facts.algo,
        "model": facts.model,
        "data": facts.data,
        "pipeline": facts.pipeline,
        "seed": facts.seed,
        "syncs": int(round(sum(syncs) / len(syncs))) if syncs else 0,
        "comm_bytes": int(sum(e["comm"]["comm_bytes"] for e in every)),
        "comm_recv_bytes": int(sum(e["comm"]["comm_recv_bytes"] for e in every)),
        "comm_s": max(e["comm"]["comm_s"] for e in every),
        "imbalance_s": [round(e["imbalance_s"], 3) for e in every],
        "resumed_from": state.resumed_from,
        "network": facts.network,
        "data_split": split or {},  # validation size, partition, per-worker samples, label skew (TV)
    }
    algo_summary = merge_algo([e["algo"] for e in every])
    if algo_summary:
        summary["algo_stats"] = algo_summary
    ft = [e["ft"] for e in every if "ft" in e]  # fault-tolerant mode: a replica's rounds (engine/ft)
    if ft:
        summary["ft"] = ft[0] if len(ft) == 1 else ft
    return summary


def _selected(summary: dict[str, Any]) -> str:
    metric = summary.get("best_metric")
    best = summary.get(f"best_{metric}") if metric else None
    if best is None:
        return "- (no validation split: nothing selected)"
    test = f"test_{metric.removeprefix('val_')}_at_best"
    at = summary.get(test)
    return f"{best:.4f} at step {summary['best_step']}" + (f" (test there {at:.4f})" if at is not None else "")


def _classification_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    top5 = f"  (top-5 {summary['test_top5']:.4f})" if "test_top5" in summary else ""
    val = f"  (validation {summary['val_acc']:.4f})" if "val_acc" in summary else ""
    return [("test accuracy", f"{summary['test_acc']:.4f}{top5}{val}"),
            (f"best validation {_metric_words(summary, 'accuracy')}", _selected(summary)),
            ("test loss", f"{summary['test_loss']:.4f}")]


def _language_model_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    val = f"  (validation {summary['val_loss']:.4f})" if "val_loss" in summary else ""
    return [("test loss", f"{summary['test_loss']:.4f} nats per character{val}"),
            ("test bits per character", f"{summary['test_bpc']:.4f}  (perplexity {summary['test_ppl']:.2f})"),
            ("next-character accuracy", f"{summary['test_acc']:.4f}"),
            (f"best validation {_metric_words(summary, 'loss')}", _selected(summary))]


def _task_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """Any other task's results: each test metric it recorded (validation beside it), then the
    selection; a task registered from its own files needs no line here (docs/tasks.md)."""
    names = sorted(k.removeprefix("test_") for k, v in summary.items()
                   if k.startswith("test_") and not k.endswith("_at_best") and isinstance(v, (int, float))
                   and not isinstance(v, bool) and k != "test_samples")
    rows = []
    for name in names:
        val = summary.get(f"val_{name}")
        rows.append((f"test {name}", f"{summary[f'test_{name}']:.4f}"
                     + (f"  (validation {val:.4f})" if isinstance(val, (int, float)) else "")))
    metric = summary.get("best_metric")
    return rows + [(f"best validation {metric.removeprefix('val_') if metric else 'metric'}", _selected(summary))]


def _result_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The task's results, in the words of its kind."""
    task = summary.get("task")
    if task == LANGUAGE_MODEL:
        return _language_model_rows(summary)
    if task in (CLASSIFICATION, None) and "test_acc" in summary and "test_loss" in summary:
        return _classification_rows(summary)
    return _task_rows(summary)


def _metric_words(summary: dict[str, Any], default: str) -> str:
    """The selecting metric in words for the summary screen (`val_acc`: accuracy, `val_bpc`: bpc)."""
    metric = summary.get("best_metric")
    if not metric:
        return default
    name = metric.removeprefix("val_")
    return {"acc": "accuracy", "loss": "loss", "top5": "top-5 accuracy"}.get(name, name)


def _unit(summary: dict[str, Any]) -> str:
    return "windows" if summary.get("task") == LANGUAGE_MODEL else "samples"


def _per_gpu(summary: dict[str, Any]) -> str:
    per_gpu, mfu = summary.get("samples_per_s_per_gpu"), summary.get("mfu")
    if per_gpu is None:
        return ""
    return f" ({per_gpu:.0f} per GPU" + (f", MFU {mfu:.1%})" if mfu is not None else ")")


def print_summary(summary: dict[str, Any], run_dir: Path) -> None:
    """A compact table of the run's results on stdout."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"syncopt: {summary['algo']} on {summary['data']}", show_header=False, box=None)
    lm = summary.get("task") == LANGUAGE_MODEL
    tokens = f", {summary['tokens_per_s']:.0f} tokens/s" if lm and summary.get("tokens_per_s") else ""
    rows = [
        *_result_rows(summary),
        ("steps / epochs", f"{summary['steps']} / {summary['epochs']:.2f}"),
        ("ranks (training)", f"{summary['world_size']} ({summary['train_ranks']})"),
        ("global batch / peak lr", f"{summary['global_batch']} / {summary['peak_lr']:g}"),
        ("throughput", f"{summary['samples_per_s']:.0f} {_unit(summary)}/s{tokens}{_per_gpu(summary)}"),
        ("waiting for data", f"{summary['data_wait_frac']:.1%} of training time"),
        ("synchronisations per worker", str(summary["syncs"])),
        ("communicated", f"{summary['comm_bytes'] / 1e6:.2f} MB sent (all ranks), {summary['comm_s']:.2f} s"),
        ("wall time", f"{summary['wall_s']:.1f} s"),
        ("run directory", str(run_dir)),
    ]
    net = summary.get("network")
    if net:
        extra = "".join(f", {k} {net[k]:g}" for k in ("latency_ms", "jitter_ms", "loss_pct") if net.get(k))
        rows.insert(-2, ("emulated network", f"{net['nodes']} nodes, {net['bandwidth_mbit']:g} Mbit/s links{extra}"))
    for key, value in rows:
        table.add_row(key, value)
    Console(file=sys.stdout, width=100).print(table)
