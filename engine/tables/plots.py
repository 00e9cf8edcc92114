"""Figures of a paper table: every row in one figure, so methods compare at a glance.

- accuracy: test accuracy against step and against communicated bytes (all ranks), the mean over
  seeds with 95% t error bars (engine/tables/stats.py) where a row has two seeds or more;
- intervals: each row's final test accuracy with its 95% interval, sorted, one panel per variant,
  rows resolved from the baseline coloured (the figure for a many-row table);
- pareto: each row's final test accuracy against its communicated bytes, the rows no other row
  beats on both (as accurate with fewer bytes) joined as the Pareto front, with 95% error bars
  on both axes over seeds;
- series:<key>: a training-record series against step for every row that logs it (QSR's H, lr);
- throughput: samples/s per row as bars (WAGMA under load imbalance);
- wall: test accuracy against wall-clock seconds (what a shorter training time buys);
- speedup:<metric>: each row's <metric> over its baseline row's, against the rows' `x` (e.g. the
  link's bandwidth), one line per `series` (DGS's scalability figure).
"""
from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from engine.report.metrics import read_metrics
from engine.tables.config import TableConfig, row_dir
from engine.tables.stats import half_width


def _rows_metrics(table: Any, out: Path) -> dict[str, list[list[dict[str, Any]]]]:
    return {row.label: [read_metrics(row_dir(out, row, s).metrics) for s in table.seeds]
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
            fig, path = _accuracy_figure(plt, table, metrics), out / "accuracy.png"
        elif plot == "pareto":
            fig = _pareto_figure(plt, table, records)
            path = out / "pareto.png"
        elif plot == "intervals":
            fig, path = _intervals_figure(plt, table, records), out / "intervals.png"
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


def variant_of(label: str) -> str:
    """The variant of a `<row>@<variant>` label ("" for a table without variants)."""
    return label.partition("@")[2]


def row_of(label: str) -> str:
    """The row of a `<row>@<variant>` label (the whole label without variants)."""
    return label.partition("@")[0]


def variants_in(labels: Sequence[str]) -> list[str]:
    """The labels' variants in first-seen order (one panel or front each); [""] for none."""
    return list(dict.fromkeys(variant_of(label) for label in labels)) or [""]


def clipped_error(mean: float, half: Optional[float], low: float = 0.0, high: float = 1.0) -> tuple[float, float]:
    """(below, above) error-bar lengths of a t interval cut at what the metric can take: three
    seeds' intervals of an accuracy run past 1 and below 0, which no accuracy can."""
    half = half or 0.0
    return mean - max(low, mean - half), min(high, mean + half) - mean


def _accuracy_figure(plt: Any, table: Any, metrics: dict[str, list[list[dict[str, Any]]]]) -> Any:
    """Test accuracy against step and against communicated bytes, one row of panels per variant
    (IID and skewed data are different problems), the legend beside them."""
    variants = variants_in(list(metrics))
    fig, axes = plt.subplots(len(variants), 2, figsize=(14, 4.2 * len(variants)), squeeze=False)
    seeds = f" (mean of {len(table.seeds)} seeds, 95% t)" if len(table.seeds) > 1 else ""
    # a row keeps its colour and line in every panel; 20 colours, then dashed, then dotted
    names = list(dict.fromkeys(row_of(label) for label in metrics))
    palette = plt.get_cmap("tab20")
    styles = {n: {"color": palette(i % 20), "fmt": "o" + ["-", "--", ":"][i // 20 % 3]} for i, n in enumerate(names)}
    for n, ((by_step, by_bytes), variant) in enumerate(zip(axes, variants)):
        for label, runs in metrics.items():
            curve = eval_curve(runs) if variant_of(label) == variant else []
            if not curve:
                continue
            steps, mb, acc, err = (list(c) for c in zip(*curve))
            yerr = list(zip(*(clipped_error(a, e) for a, e in zip(acc, err))))
            style = dict(ms=3, capsize=2, lw=1, **styles[row_of(label)])
            by_step.errorbar(steps, acc, yerr=yerr, label=row_of(label), **style)
            by_bytes.errorbar(mb, acc, yerr=yerr, **style)
        name = f" ({variant})" if variant else ""
        by_step.set(xlabel="step", ylabel=f"test accuracy{name}{seeds}", ylim=(-0.02, 1.02))
        by_bytes.set(xlabel="communicated MB (all ranks)", ylabel=f"test accuracy{name}", xscale="symlog",
                     ylim=(-0.02, 1.02))
        if n == 0 and by_step.get_legend_handles_labels()[0]:  # (one legend: the rows are the same below)
            by_bytes.legend(*by_step.get_legend_handles_labels(), fontsize=7, loc="upper left",
                            bbox_to_anchor=(1.02, 1.0), ncol=1 + len(names) // 30)
    fig.suptitle(_title(table, width=140))
    fig.tight_layout()
    return fig


def _intervals_figure(plt: Any, table: Any, records: list[dict[str, Any]]) -> Any:
    """Each row's final test accuracy with its 95% interval over seeds, sorted, one panel per
    variant, the baseline row's mean as a line; a row whose paired difference from the baseline
    is resolved is coloured (red: worse, green: better), the rest grey. What a reader of a
    many-row table wants first: which rows are told apart from the baseline, and which are not."""
    ok = [r for r in records if r.get("test_acc") is not None]
    variants = variants_in([r["label"] for r in ok])
    per = max(sum(1 for r in ok if variant_of(r["label"]) == v) for v in variants)
    fig, axes = plt.subplots(1, len(variants), figsize=(6.5 * len(variants), 1.2 + 0.24 * per), squeeze=False)
    for ax, variant in zip(axes[0], variants):
        rows = sorted((r for r in ok if variant_of(r["label"]) == variant), key=lambda r: r["test_acc"])
        for y, rec in enumerate(rows):
            below, above = clipped_error(rec["test_acc"], rec.get("test_acc_ci95"))
            resolved, diff = rec.get("diff_resolved"), rec.get("diff") or 0.0
            colour = ("black" if rec["label"] == rec.get("baseline") else
                      "tab:red" if resolved and diff < 0 else "tab:green" if resolved else "tab:gray")
            ax.errorbar([rec["test_acc"]], [y], xerr=[[below], [above]], fmt="o", ms=4, capsize=2, color=colour)
        base = next((r for r in rows if r["label"] == r.get("baseline")), None)
        if base is not None:
            ax.axvline(base["test_acc"], color="black", lw=0.8, ls="--")
        ax.set_yticks(range(len(rows)), [row_of(r["label"]) for r in rows], fontsize=8)
        ax.set(xlabel="final test accuracy, mean and 95% t interval over seeds", xlim=(-0.02, 1.02),
               title=f"{variant or table.name}: red/green = resolved from {row_of(base['label']) if base else 'the baseline'}")
        ax.title.set_fontsize(9)
        ax.grid(axis="x", lw=0.3)
    fig.suptitle(_title(table, width=140), fontsize=10)
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
    ax.set_title(_title(table, f"speed-up ({metric})"), fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig, out / f"speedup_{metric}.png"


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the (cost, value) points no other point dominates (cost <= and value >=, one of
    them strictly), by increasing cost: the best value each budget of cost can buy."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front: list[int] = []
    for i in order:
        if not front or points[i][1] > points[front[-1]][1]:
            front.append(i)
    return front


def _pareto_figure(plt: Any, table: Any, records: list[dict[str, Any]]) -> Any:
    """Final test accuracy against communicated MB (symlog: a one-process row sends nothing), the
    Pareto front as a step line through its rows (one front per variant). Rows are numbered by bytes next to their points
    and listed beside the axes (15 names near one another overprint; numbers stay readable)."""
    ok = sorted((r for r in records if r.get("test_acc") is not None and r.get("comm_bytes") is not None),
                key=lambda r: r["comm_bytes"])
    points = [(r["comm_bytes"] / 1e6, r["test_acc"]) for r in ok]
    # one front per variant (`<row>@<variant>` labels: IID and skewed data are different problems)
    variants = list(dict.fromkeys(variant_of(r["label"]) for r in ok))
    fronts = {}
    for v in variants:
        members = [i for i, r in enumerate(ok) if variant_of(r["label"]) == v]
        fronts[v] = [members[j] for j in pareto_front([points[i] for i in members])]
    front = [i for f in fronts.values() for i in f]
    fig, ax = plt.subplots(figsize=(11, 5))
    fig.subplots_adjust(left=0.07, right=0.68, top=0.88, bottom=0.11)
    ax.errorbar([x for x, _ in points], [y for _, y in points], fmt="o", ms=4, color="tab:gray", capsize=2,
                xerr=[(r.get("comm_bytes_ci95") or 0.0) / 1e6 for r in ok],
                yerr=list(zip(*(clipped_error(r["test_acc"], r.get("test_acc_ci95")) for r in ok))), zorder=2)
    colours = ["tab:red", "tab:blue", "tab:green", "tab:purple"]
    for n, (v, members) in enumerate(fronts.items()):
        ax.plot([points[i][0] for i in members], [points[i][1] for i in members], "o-", drawstyle="steps-post",
                color=colours[n % len(colours)], ms=6, zorder=3,
                label=f"Pareto front{f' ({v})' if v else ''}: no row is as accurate with fewer bytes")
    for n, ((x, y), lift) in enumerate(zip(points, _label_lifts([x for x, _ in points])), 1):
        ax.annotate(str(n), (x, y), textcoords="offset points", xytext=(3, 3 + lift), fontsize=7)
    ax.margins(x=0.08, y=0.12)
    bars = " (mean, 95% t interval over seeds)" if len(table.seeds) > 1 else ""
    ax.set(xlabel="communicated MB (all ranks, whole run)", ylabel="final test accuracy" + bars, xscale="symlog")
    ax.legend(fontsize=8, loc="best")
    ax.set_title(_title(table, "accuracy against communication"), fontsize=10)
    for n, (rec, (x, y)) in enumerate(zip(ok, points), 1):
        on_front = n - 1 in front
        colour = colours[variants.index(variant_of(rec["label"])) % len(colours)] if on_front else "black"
        fig.text(0.70, 0.86 - 0.05 * (n - 1) * 15 / max(len(ok), 15), f"{n:>2}  {rec['label']}: {x:.1f} MB, {y:.4f}",
                 fontsize=8, family="monospace", color=colour)
    return fig


def _label_lifts(xs: Sequence[float], close: float = 1.3, step: float = 8.0) -> list[float]:
    """How far (points) to lift each number of points sorted by x so neighbours do not overprint:
    points within a factor `close` of a cluster's first one stack their numbers upwards."""
    lifts, start, count = [], None, 0
    for x in xs:
        if start is None or x > start * close or (start <= 0 < x):
            start, count = x, 0
        lifts.append(count * step)
        count += 1
    return lifts
