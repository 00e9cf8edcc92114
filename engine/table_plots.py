"""Figures of a paper table: every row in one figure, so methods compare at a glance.

- accuracy: test accuracy against step and against communicated bytes (all ranks);
- series:<key>: a training-record series against step for every row that logs it (QSR's H, lr);
- throughput: samples/s per row as bars (WAGMA under load imbalance).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.reporting import read_metrics


def _rows_metrics(table: Any, out: Path) -> dict[str, list[list[dict[str, Any]]]]:
    from engine.tables import row_dir

    return {row.label: [read_metrics(row_dir(out, row, s) / "metrics.jsonl") for s in table.seeds]
            for row in table.rows}


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
            fig.suptitle(table.title or table.name)
            fig.tight_layout()
            path = out / "accuracy.png"
        elif plot.startswith("series:"):
            key = plot.split(":", 1)[1]
            fig, ax = plt.subplots(figsize=(8, 4))
            for label, runs in metrics.items():
                rows = [r for r in (runs[0] if runs else []) if r.get("kind") == "train" and r.get(key) is not None]
                if rows:
                    ax.plot([r["step"] for r in rows], [r[key] for r in rows], drawstyle="steps-post", label=label)
            ax.set(xlabel="step", ylabel=key, title=f"{table.title or table.name}: {key}")
            ax.legend(fontsize=8)
            fig.tight_layout()
            path = out / f"{key}.png"
        elif plot == "throughput":
            fig, ax = plt.subplots(figsize=(8, 4))
            ok = [r for r in records if r.get("samples_per_s")]
            ax.bar([r["label"] for r in ok], [r["samples_per_s"] for r in ok])
            ax.set(ylabel="samples/s", title=f"{table.title or table.name}: throughput")
            fig.tight_layout()
            path = out / "throughput.png"
        else:
            continue
        fig.savefig(path, dpi=100)
        plt.close(fig)
        made.append(path)
    return made
