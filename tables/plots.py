"""Figures of a paper table: every row in one figure, so methods compare at a glance.

- accuracy: test accuracy against step and against communicated bytes (all ranks), the mean over
  seeds with 95% t error bars (tables/stats.py) where a row has two seeds or more;
- intervals: each row's final test accuracy with its 95% interval, sorted, one panel per variant,
  rows resolved from the baseline coloured (the figure for a many-row table);
- pareto: each row's final test accuracy against its communicated bytes, the rows no other row
  beats on both (as accurate with fewer bytes) joined as the Pareto front, with 95% error bars
  on both axes over seeds;
- series:<key>: a training-record series against step for every row that logs it (QSR's H, lr);
- throughput: samples/s per row as bars (WAGMA under load imbalance);
- wall: test accuracy against wall-clock seconds (what a shorter training time buys);
- speedup:<metric>: each row's <metric> over its baseline row's, against the rows' `x` (e.g. the
  link's bandwidth), one line per `series` (DGS's scalability figure);
- workers: the headline metric and the bytes sent (all ranks, whole run) against the number of
  training workers (the table's `workers` axis), one line per method, 95% error bars over seeds,
  one row of panels per variant: which methods hold their accuracy as workers grow, at what cost.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from tables.measure import is_proportion
from tables.plot_levels import differences_figure, levels_figure, pareto_figure, workers_figure
from tables.plot_style import bounds, clipped_error, metric_label, row_styles, save_png, suptitle, title, variants_in
from tables.run_records import Record, RunsAt, records_of
from tables.runs import row_of, row_rel, variant_of
from tables.stats import half_width

Curves = dict[str, list[list[Record]]]  # row label -> one list of records per seed (the seeds in order)


def rows_metrics(table: Any, runs_at: RunsAt, kind: str, seeds: Optional[int] = None) -> Curves:
    """Each row's records of `kind` (`eval`, `train`), per seed (the first `seeds` seeds if given),
    read through tables/run_records.py (a run not there: no records)."""
    records = records_of(runs_at)
    return {row.label: [records.metrics(row_rel(row, s), kind) or [] for s in table.seeds[:seeds]]
            for row in table.rows}


def eval_curve(runs: list[list[dict[str, Any]]], key: str = "test_acc") -> list[tuple[int, float, float, float]]:
    """(step, mean bytes so far, mean `key`, its 95% half-width or 0) at each evaluation step that
    every seed's run reached, over the seeds' eval records."""
    by_step: dict[int, list[tuple[float, float]]] = {}
    seeds = [r for r in runs if r]
    for records in seeds:
        for rec in records:
            if rec.get("kind") == "eval" and rec.get(key) is not None:
                by_step.setdefault(int(rec["step"]), []).append((rec.get("comm_bytes_total", 0) / 1e6, rec[key]))
    curve = []
    for step in sorted(by_step):
        points = by_step[step]
        if len(points) < len(seeds):
            continue
        values = [v for _, v in points]
        curve.append((step, sum(b for b, _ in points) / len(points), sum(values) / len(values),
                      half_width(values) or 0.0))
    return curve


def draw_table_plots(table: Any, records: list[dict[str, Any]], out: Path,
                     runs_at: Optional[RunsAt] = None) -> list[Path]:
    """Draw the table's `plots` into `out` as palette PNGs (tables/plot_style.py); the curves are
    read from `runs_at` (tables/run_records.py; default: the table's folder `out`), only where a
    figure draws them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs_at = out if runs_at is None else runs_at
    curves = {kind: {} for kind in ("eval", "train")}

    def of(kind: str) -> Curves:  # every seed's evaluations; the first seed's training records
        if not curves[kind]:
            curves[kind] = rows_metrics(table, runs_at, kind, None if kind == "eval" else 1)
        return curves[kind]

    made = []
    for plot in table.plots:
        if plot == "accuracy":
            fig, path = accuracy_figure(plt, table, of("eval")), out / "accuracy.png"
        elif plot == "pareto":
            fig = pareto_figure(plt, table, records)
            path = out / "pareto.png"
        elif plot == "intervals":
            fig, path = differences_figure(plt, table, records), out / "intervals.png"
        elif plot == "levels":
            fig, path = levels_figure(plt, table, records), out / "levels.png"
        elif plot.startswith("series:"):
            key = plot.split(":", 1)[1]
            fig, ax = plt.subplots(figsize=(8, 4))
            for label, runs in of("train").items():
                rows = [r for r in (runs[0] if runs else []) if r.get("kind") == "train" and r.get(key) is not None]
                if rows:
                    ax.plot([r["step"] for r in rows], [r[key] for r in rows], drawstyle="steps-post", label=label)
            ax.set(xlabel="step", ylabel=key)
            ax.set_title(title(table, key), fontsize=10)
            ax.legend(fontsize=8)
            fig.tight_layout()
            path = out / f"{key}.png"
        elif plot == "wall":
            fig, ax = plt.subplots(figsize=(8, 4.5))
            for label, runs in of("eval").items():
                evals = [r for r in (runs[0] if runs else []) if r.get("kind") == "eval" and r.get("wall_s") is not None]
                if evals:
                    ax.plot([r["wall_s"] for r in evals], [r.get(table.compare_metric) for r in evals], "o-", ms=3,
                            label=label)
            ax.set(xlabel="wall-clock s", ylabel=metric_label(table.compare_metric))
            ax.set_title(title(table, f"{metric_label(table.compare_metric)} against wall-clock"), fontsize=10)
            ax.legend(fontsize=8)
            fig.tight_layout()
            path = out / "accuracy_wall.png"
        elif plot.startswith("speedup:"):
            fig, path = _speedup(plt, table, records, plot.split(":", 1)[1], out)
        elif plot == "workers":
            fig, path = workers_figure(plt, table, records), out / "workers.png"
        elif plot == "throughput":
            fig, ax = plt.subplots(figsize=(8, 4))
            ok = [r for r in records if r.get("samples_per_s")]
            bars = ax.bar([r["label"] for r in ok], [r["samples_per_s"] for r in ok])
            base = next((r["samples_per_s"] for r in ok if r["label"] == table.baseline), None)
            if base:  # each bar's speed-up over the baseline row, the number the paper quotes
                ax.bar_label(bars, labels=[f"{r['samples_per_s'] / base:.2f}x" for r in ok], fontsize=8)
            ax.set(ylabel=f"samples/s (labels: x {table.baseline})" if base else "samples/s")
            ax.set_title(title(table, "throughput"), fontsize=10)
            ax.tick_params(axis="x", labelrotation=20)
            fig.tight_layout()
            path = out / "throughput.png"
        else:
            continue
        save_png(fig, path)
        plt.close(fig)
        made.append(path)
    return made


def accuracy_figure(plt: Any, table: Any, metrics: dict[str, list[list[dict[str, Any]]]]) -> Any:
    """The headline metric against step and against communicated bytes, one row of panels per
    variant (IID and skewed data are different problems), the legend beside them."""
    metric = table.compare_metric
    low, high = bounds(metric)
    limits = {"ylim": (-0.02, 1.02)} if is_proportion(metric) else {}
    variants = variants_in(list(metrics))
    fig, axes = plt.subplots(len(variants), 2, figsize=(14, 4.2 * len(variants)), squeeze=False)
    seeds = f" (mean of {len(table.seeds)} seeds, 95% t)" if len(table.seeds) > 1 else ""
    styles = row_styles(plt, list(dict.fromkeys(row_of(label) for label in metrics)))
    for n, ((by_step, by_bytes), variant) in enumerate(zip(axes, variants)):
        for label, runs in metrics.items():
            curve = eval_curve(runs, metric) if variant_of(label) == variant else []
            if not curve:
                continue
            steps, mb, acc, err = (list(c) for c in zip(*curve))
            yerr = list(zip(*(clipped_error(a, e, low, high) for a, e in zip(acc, err))))
            style = dict(ms=3, capsize=2, lw=1, **styles[row_of(label)])
            by_step.errorbar(steps, acc, yerr=yerr, label=row_of(label), **style)
            by_bytes.errorbar(mb, acc, yerr=yerr, **style)
        name = f" ({variant})" if variant else ""
        by_step.set(xlabel="step", ylabel=f"{metric_label(metric)}{name}{seeds}", **limits)
        by_bytes.set(xlabel="communicated MB (all ranks)", ylabel=f"{metric_label(metric)}{name}", xscale="symlog",
                     **limits)
        if n == 0 and by_step.get_legend_handles_labels()[0]:  # (one legend: the rows are the same below)
            by_bytes.legend(*by_step.get_legend_handles_labels(), fontsize=7, loc="upper left",
                            bbox_to_anchor=(1.02, 1.0), ncol=1 + len(styles) // 30)
    suptitle(fig, table)
    fig.tight_layout()
    return fig


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
    ax.set_title(title(table, f"speed-up ({metric})"), fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig, out / f"speedup_{metric}.png"


