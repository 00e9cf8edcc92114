"""Figures of a paper table: every row in one figure, so methods compare at a glance.

- accuracy: test accuracy against step and against communicated bytes (all ranks);
- series:<key>: a training-record series against step for every row that logs it (QSR's H, lr);
- throughput: samples/s per row as bars (WAGMA under load imbalance);
- wall: test accuracy against wall-clock seconds (what a shorter training time buys);
- speedup:<metric>: each row's <metric> over its baseline row's, against the rows' `x` (e.g. the
  link's bandwidth), one line per `series` (DGS's scalability figure).
"""
from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from engine.report.metrics import read_metrics
from engine.tables.config import TableConfig, row_dir


def _rows_metrics(table: Any, out: Path) -> dict[str, list[list[dict[str, Any]]]]:
    return {row.label: [read_metrics(row_dir(out, row, s).metrics) for s in table.seeds]
            for row in table.rows}


def _title(table: Any, what: str = "", width: int = 80) -> str:
    """The table's title (and what the figure shows), wrapped so it fits the figure."""
    text = table.title or table.name
    return textwrap.fill(f"{text}: {what}" if what else text, width)


def draw_table_plots(table: Any, records: list[dict[str, Any]], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = _rows_metrics(table, out)
    made = []
    for plot in table.plots:
        if plot == "accuracy":
            fig, (by_step, by_bytes) = plt.subplots(1, 2, figsize=(12, 4.5))
            for label, runs in metrics.items():
                evals = [r for r in (runs[0] if runs else []) if r.get("kind") == "eval"]
                if not evals:
                    continue
                acc = [r["test_acc"] for r in evals]
                by_step.plot([r["step"] for r in evals], acc, "o-", ms=3, label=label)
                by_bytes.plot([r.get("comm_bytes_total", 0) / 1e6 for r in evals], acc, "o-", ms=3, label=label)
            by_step.set(xlabel="step", ylabel="test accuracy")
            by_bytes.set(xlabel="communicated MB (all ranks)", ylabel="test accuracy", xscale="symlog")
            by_step.legend(fontsize=8)
            fig.suptitle(_title(table, width=120))
            fig.tight_layout()
            path = out / "accuracy.png"
        elif plot.startswith("series:"):
            key = plot.split(":", 1)[1]
            fig, ax = plt.subplots(figsize=(8, 4))
            for label, runs in metrics.items():
                rows = [r for r in (runs[0] if runs else []) if r.get("kind") == "train" and r.get(key) is not None]
                if rows:
                    ax.plot([r["step"] for r in rows], [r[key] for r in rows], drawstyle="steps-post", label=label)
            ax.set(xlabel="step", ylabel=key)
            ax.set_title(_title(table, key), fontsize=10)
            ax.legend(fontsize=8)
            fig.tight_layout()
            path = out / f"{key}.png"
        elif plot == "wall":
            fig, ax = plt.subplots(figsize=(8, 4.5))
            for label, runs in metrics.items():
                evals = [r for r in (runs[0] if runs else []) if r.get("kind") == "eval" and r.get("wall_s") is not None]
                if evals:
                    ax.plot([r["wall_s"] for r in evals], [r["test_acc"] for r in evals], "o-", ms=3, label=label)
            ax.set(xlabel="wall-clock s", ylabel="test accuracy")
            ax.set_title(_title(table, "accuracy against wall-clock"), fontsize=10)
            ax.legend(fontsize=8)
            fig.tight_layout()
            path = out / "accuracy_wall.png"
        elif plot.startswith("speedup:"):
            fig, path = _speedup(plt, table, records, plot.split(":", 1)[1], out)
        elif plot == "throughput":
            fig, ax = plt.subplots(figsize=(8, 4))
            ok = [r for r in records if r.get("samples_per_s")]
            bars = ax.bar([r["label"] for r in ok], [r["samples_per_s"] for r in ok])
            base = next((r["samples_per_s"] for r in ok if r["label"] == table.baseline), None)
            if base:  # each bar's speed-up over the baseline row, the number the paper quotes
                ax.bar_label(bars, labels=[f"{r['samples_per_s'] / base:.2f}x" for r in ok], fontsize=8)
            ax.set(ylabel=f"samples/s (labels: x {table.baseline})" if base else "samples/s")
            ax.set_title(_title(table, "throughput"), fontsize=10)
            ax.tick_params(axis="x", labelrotation=20)
            fig.tight_layout()
            path = out / "throughput.png"
        else:
            continue
        fig.savefig(path, dpi=100)
        plt.close(fig)
        made.append(path)
    return made


def _speedup(plt: Any, table: Any, records: list[dict[str, Any]], metric: str, out: Path) -> tuple[Any, Path]:
    """Each row's `metric` over its baseline row's against the rows' x, one line per series."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    series: dict[str, list[tuple[float, float]]] = {}
    for rec in records:
        ratio = rec.get(f"{metric}_vs_base")
        if rec.get("x") is not None and ratio:
            series.setdefault(rec["series"], []).append((float(rec["x"]), ratio))
    for name, points in series.items():
        points.sort()
        ax.plot([p[0] for p in points], [p[1] for p in points], "o-", label=name)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set(xscale="log", xlabel=table.x_label or "x", ylabel=f"{metric} / baseline row's")
    ax.set_title(_title(table, f"speed-up ({metric})"), fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig, out / f"speedup_{metric}.png"
