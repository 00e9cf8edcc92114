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

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from engine.report.metrics import read_metrics
from tables.config import headline, row_dir
from tables.measure import is_proportion
from tables.runs import row_of, variant_of
from tables.stats import half_width


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


def _suptitle(fig: Any, table: Any, what: str = "", fontsize: float = 10) -> None:
    """The figure's title, wrapped to the figure's own width (about 13 characters an inch at 10
    points): a title wrapped to a fixed count ran off both edges of the narrower figures."""
    chars = max(40, int(fig.get_figwidth() * 130 / fontsize))
    fig.suptitle(_title(table, what, width=chars), fontsize=fontsize)


def _title(table: Any, what: str = "", width: int = 80) -> str:
    """The table's title (and what the figure shows), wrapped so it fits the figure."""
    text = table.title or table.name
    if getattr(table, "quick", False):  # not the table's result: the figures say so too
        text = f"Quick form (table.quick=true) of: {text}"
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
            fig, path = _differences_figure(plt, table, records), out / "intervals.png"
        elif plot == "levels":
            fig, path = _intervals_figure(plt, table, records), out / "levels.png"
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
                    ax.plot([r["wall_s"] for r in evals], [r.get(table.compare_metric) for r in evals], "o-", ms=3,
                            label=label)
            ax.set(xlabel="wall-clock s", ylabel=_label(table.compare_metric))
            ax.set_title(_title(table, f"{_label(table.compare_metric)} against wall-clock"), fontsize=10)
            ax.legend(fontsize=8)
            fig.tight_layout()
            path = out / "accuracy_wall.png"
        elif plot.startswith("speedup:"):
            fig, path = _speedup(plt, table, records, plot.split(":", 1)[1], out)
        elif plot == "workers":
            fig, path = _workers_figure(plt, table, records), out / "workers.png"
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


def variants_in(labels: Sequence[str]) -> list[str]:
    """The labels' variants in first-seen order (one panel or front each); [""] for none."""
    return list(dict.fromkeys(variant_of(label) for label in labels)) or [""]


def clipped_error(mean: float, half: Optional[float], low: float = 0.0, high: float = 1.0) -> tuple[float, float]:
    """(below, above) error-bar lengths of a t interval cut at what the metric can take: three
    seeds' intervals of an accuracy run past 1 and below 0, which no accuracy can."""
    half = half or 0.0
    return mean - max(low, mean - half), min(high, mean + half) - mean


def _bounds(metric: str) -> tuple[float, float]:
    """What a metric can take: [0, 1] for an accuracy, [0, inf) for a loss or a count."""
    return (0.0, 1.0) if is_proportion(metric) else (0.0, math.inf)


def _label(metric: str) -> str:
    return {"test_acc": "test accuracy", "test_loss": "test loss", "val_acc": "validation accuracy",
            "val_loss": "validation loss"}.get(metric, metric.replace("_", " "))


def row_styles(plt: Any, names: list[str]) -> dict[str, dict[str, Any]]:
    """A colour and line per row, the same in every panel: tab20's 20 colours, then dashed, then
    dotted, so that past matplotlib's 10-colour default cycle no two rows share a look."""
    palette = plt.get_cmap("tab20")
    return {n: {"color": palette(i % 20), "fmt": "o" + ["-", "--", ":"][i // 20 % 3]} for i, n in enumerate(names)}


def _accuracy_figure(plt: Any, table: Any, metrics: dict[str, list[list[dict[str, Any]]]]) -> Any:
    """The headline metric against step and against communicated bytes, one row of panels per
    variant (IID and skewed data are different problems), the legend beside them."""
    metric = table.compare_metric
    low, high = _bounds(metric)
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
        by_step.set(xlabel="step", ylabel=f"{_label(metric)}{name}{seeds}", **limits)
        by_bytes.set(xlabel="communicated MB (all ranks)", ylabel=f"{_label(metric)}{name}", xscale="symlog", **limits)
        if n == 0 and by_step.get_legend_handles_labels()[0]:  # (one legend: the rows are the same below)
            by_bytes.legend(*by_step.get_legend_handles_labels(), fontsize=7, loc="upper left",
                            bbox_to_anchor=(1.02, 1.0), ncol=1 + len(styles) // 30)
    _suptitle(fig, table)
    fig.tight_layout()
    return fig


def _verdict_colour(rec: dict[str, Any], sign: int) -> str:
    """Green: resolved better than its baseline (Holm-corrected), red: resolved worse, grey: not
    resolved, black: the baseline itself."""
    if rec["label"] == rec.get("baseline"):
        return "black"
    if not rec.get("diff_resolved"):
        return "tab:gray"
    return "tab:green" if sign * (rec.get("diff") or 0.0) > 0 else "tab:red"


def _intervals_figure(plt: Any, table: Any, records: list[dict[str, Any]]) -> Any:
    """`levels`: each row's final headline value with its 95% interval over seeds, sorted (best at
    the top), one panel per variant, the baseline row's mean as a line; a row resolved from its
    baseline coloured (red: worse, green: better), the rest grey. The absolute level; the
    differences themselves are `_differences_figure`."""
    metric = table.compare_metric
    sign = headline(table).sign
    low, high = _bounds(metric)
    ok = [r for r in records if r.get(metric) is not None]
    variants = variants_in([r["label"] for r in ok])
    per = max(sum(1 for r in ok if variant_of(r["label"]) == v) for v in variants)
    fig, axes = plt.subplots(1, len(variants), figsize=(6.5 * len(variants), 1.2 + 0.24 * per), squeeze=False)
    for ax, variant in zip(axes[0], variants):
        rows = sorted((r for r in ok if variant_of(r["label"]) == variant), key=lambda r: sign * r[metric])
        for y, rec in enumerate(rows):
            below, above = clipped_error(rec[metric], rec.get(f"{metric}_ci95"), low, high)
            ax.errorbar([rec[metric]], [y], xerr=[[below], [above]], fmt="o", ms=4, capsize=2,
                        color=_verdict_colour(rec, sign))
        base = next((r for r in rows if r["label"] == r.get("baseline")), None)
        if base is not None:
            ax.axvline(base[metric], color="black", lw=0.8, ls="--")
        ax.set_yticks(range(len(rows)), [row_of(r["label"]) for r in rows], fontsize=8)
        ax.set(xlabel=f"final {_label(metric)}, mean and 95% interval over seeds",
               title=f"{variant or table.name}: red/green = resolved from {row_of(base['label']) if base else 'the baseline'}")
        if is_proportion(metric):
            ax.set_xlim(-0.02, 1.02)
        ax.title.set_fontsize(9)
        ax.grid(axis="x", lw=0.3)
    _suptitle(fig, table)
    fig.tight_layout()
    return fig


def _difference_bar(rec: dict[str, Any]) -> tuple[float, float]:
    """(below, above) of a row's Holm-corrected interval of its difference (the raw 95% one where
    there is no correction; (0, 0) without an interval)."""
    low, high = rec.get("diff_low_holm"), rec.get("diff_high_holm")
    if low is None:
        low, high = rec.get("diff_low"), rec.get("diff_high")
    if low is None or high is None:
        return 0.0, 0.0
    return rec["diff"] - low, high - rec["diff"]


def _linear_span(extents: list[float]) -> Optional[float]:
    """Where a differences axis stops being linear, from each row's reach (the farther end of its
    interval from 0): None (one linear axis fits every row) unless the farthest row reaches more
    than 8 times as far as the median row, then the median row's reach, so half the rows lie
    wholly in the linear part. Beyond it the axis is logarithmic (symlog): a panel whose rows
    differ by orders of magnitude (methods that collapse under skew beside ones within a few
    images of the baseline) shows every row with its interval in full, the typical rows readable."""
    ends = sorted(e for e in extents if e > 0)
    if not ends or ends[-1] <= 8 * ends[len(ends) // 2]:
        return None
    return ends[len(ends) // 2]


def _differences_figure(plt: Any, table: Any, records: list[dict[str, Any]]) -> Any:
    """`intervals`: each row's difference from its baseline (paired by seed, Welch's where marked)
    with its Holm-corrected interval, sorted (best at the top), one panel per variant, on an axis
    scaled to the differences; resolved better green, worse red, the rest grey; 0, the baseline,
    as a line. Where some rows lie far out, the axis is linear near 0 and logarithmic beyond
    (`_linear_span`): every row and every interval is drawn where it lies, none clipped."""
    from matplotlib.ticker import FuncFormatter

    metric = table.compare_metric
    sign = headline(table).sign
    ok = [r for r in records if r.get("diff") is not None and r["label"] != r.get("baseline")]
    variants = variants_in([r["label"] for r in ok]) if ok else [""]
    per = max([sum(1 for r in ok if variant_of(r["label"]) == v) for v in variants] or [1])
    fig, axes = plt.subplots(1, len(variants), figsize=(6.5 * len(variants), 1.8 + 0.24 * per), squeeze=False)
    for ax, variant in zip(axes[0], variants):
        rows = sorted((r for r in ok if variant_of(r["label"]) == variant), key=lambda r: sign * r["diff"])
        bars = [_difference_bar(r) for r in rows]
        intervals = any(r.get("diff_low") is not None for r in rows)
        span = _linear_span([max(abs(r["diff"] - below), abs(r["diff"] + above))
                             for r, (below, above) in zip(rows, bars)])
        for y, (rec, (below, above)) in enumerate(zip(rows, bars)):
            marker = "s" if rec.get("diff_method") == "welch" else "o"
            ax.errorbar([rec["diff"]], [y], xerr=[[below], [above]], fmt=marker, ms=4, capsize=2,
                        color=_verdict_colour(rec, sign))
        ax.axvline(0.0, color="black", lw=0.8, ls="--")
        base = rows[0].get("baseline") if rows else None
        ax.set_yticks(range(len(rows)), [row_of(r["label"]) + (" (Welch)" if r.get("diff_method") == "welch" else "")
                                         for r in rows], fontsize=8)
        scale = ""
        ax.margins(x=0.05)
        if span is not None:
            ax.set_xscale("symlog", linthresh=span, linscale=2.0)
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:+.3g}" if v else "0"))
            limits = ax.get_xlim()
            ax.axvspan(-span, span, color="0.93", zorder=0)
            ax.set_xlim(limits)  # the shading marks the linear part; it does not widen the axis
            scale = f"\nlinear within ±{span:.3g} (shaded), logarithmic beyond"
        corrected = ("Holm-corrected interval" if any(r.get("diff_level") not in (None, 0.05) for r in rows) else
                     "95% interval") if intervals else "one seed: no interval"
        ax.set(xlabel=f"{_label(metric)} - {row_of(base) if base else 'baseline'} ({corrected}; "
                      f"{'higher' if sign > 0 else 'lower'} is better{scale})",
               title=f"{variant or table.name}: difference from {row_of(base) if base else 'the baseline'}; "
                     f"green/red = resolved better/worse")
        ax.title.set_fontsize(9)
        ax.xaxis.label.set_fontsize(8)
        ax.grid(axis="x", lw=0.3)
    _suptitle(fig, table)
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


def workers_series(records: list[dict[str, Any]], key: str, variant: str) -> dict[str, list[tuple[float, float, float]]]:
    """series -> (workers, mean `key`, its 95% half-width or 0) sorted by workers, for the rows of
    one variant that have `x` (the workers axis) and a value."""
    found: dict[str, list[tuple[float, float, float]]] = {}
    for rec in records:
        value = rec.get(key)
        if rec.get("x") is None or variant_of(rec["label"]) != variant or not isinstance(value, (int, float)):
            continue
        found.setdefault(row_of(rec["series"]), []).append((float(rec["x"]), float(value),
                                                            float(rec.get(f"{key}_ci95") or 0.0)))
    return {name: sorted(points) for name, points in found.items()}


def _workers_figure(plt: Any, table: Any, records: list[dict[str, Any]]) -> Any:
    """The headline metric (left) and MB sent (right, log) against training workers (log 2), one
    line per method, one row of panels per variant; error bars are 95% intervals over seeds
    (an accuracy's with the test set's floor, cut at 0 and 1)."""
    metric = table.compare_metric
    low, high = _bounds(metric)
    variants = variants_in([r["label"] for r in records])
    fig, axes = plt.subplots(len(variants), 2, figsize=(13, 4.2 * len(variants)), squeeze=False,
                             layout="constrained")
    bars = " (mean, 95% interval over seeds)" if len(table.seeds) > 1 else ""
    handles: dict[str, Any] = {}
    styles = row_styles(plt, list(dict.fromkeys(row_of(r["series"]) for r in records if r.get("x") is not None)))
    for row, variant in enumerate(variants):
        acc_ax, bytes_ax = axes[row]
        for name, points in workers_series(records, metric, variant).items():
            err = list(zip(*(clipped_error(m, h, low, high) for _, m, h in points)))
            line = acc_ax.errorbar([p[0] for p in points], [p[1] for p in points], yerr=err, ms=3,
                                   capsize=2, label=name, **styles[name])
            handles.setdefault(name, line)
        for name, points in workers_series(records, "comm_bytes", variant).items():
            bytes_ax.errorbar([p[0] for p in points], [max(p[1] / 1e6, 1e-3) for p in points],
                              yerr=[p[2] / 1e6 for p in points], ms=3, capsize=2, label=name, **styles[name])
        where = f" ({variant})" if variant else ""
        acc_ax.set(xscale="log", xlabel=table.x_label or "training workers", ylabel=f"final {_label(metric)}" + bars)
        acc_ax.set_title(f"{_label(metric)} against workers{where}", fontsize=9)
        bytes_ax.set(xscale="log", yscale="log", xlabel=table.x_label or "training workers",
                     ylabel="MB sent (all ranks, whole run)")
        bytes_ax.set_title(f"communication against workers{where}", fontsize=9)
        for ax in (acc_ax, bytes_ax):
            counts = sorted({p[0] for pts in workers_series(records, metric, variant).values() for p in pts})
            if counts:
                ax.set_xticks(counts, [f"{c:g}" for c in counts])
                ax.minorticks_off()
            ax.grid(lw=0.3)
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="outside right center", fontsize=8)
    _suptitle(fig, table, f"{_label(metric)} and bytes against workers")
    return fig


LIST_LINE_IN = 0.15  # one line of pareto.png's list of rows (8 pt monospace), in inches


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
    """The final headline value against communicated MB (symlog: a one-process row sends nothing),
    the Pareto front (in the metric's direction) as a step line through its rows (one front per
    variant). Rows are numbered by bytes next to their points and listed beside the axes (15
    names near one another overprint; numbers stay readable), one line a row: the figure is as
    tall as its list (55 rows of MNIST-1D overprinted each other in a fixed 5 inches)."""
    metric = table.compare_metric
    sign = headline(table).sign
    low, high = _bounds(metric)
    ok = sorted((r for r in records if isinstance(r.get(metric), float) and r.get("comm_bytes") is not None),
                key=lambda r: r["comm_bytes"])
    points = [(r["comm_bytes"] / 1e6, r[metric]) for r in ok]
    # one front per variant (`<row>@<variant>` labels: IID and skewed data are different problems)
    variants = list(dict.fromkeys(variant_of(r["label"]) for r in ok))
    fronts = {}
    for v in variants:
        members = [i for i, r in enumerate(ok) if variant_of(r["label"]) == v]
        fronts[v] = [members[j] for j in pareto_front([(points[i][0], sign * points[i][1]) for i in members])]
    front = [i for f in fronts.values() for i in f]
    # the list beside the axes needs a line a row: the figure grows with the rows
    height = max(5.0, 1.3 + LIST_LINE_IN * len(ok))
    fig, ax = plt.subplots(figsize=(12, height))
    fig.subplots_adjust(left=0.065, right=0.64, top=1 - 0.6 / height, bottom=0.55 / height)
    ax.errorbar([x for x, _ in points], [y for _, y in points], fmt="o", ms=4, color="tab:gray", capsize=2,
                xerr=[(r.get("comm_bytes_ci95") or 0.0) / 1e6 for r in ok],
                yerr=list(zip(*(clipped_error(r[metric], r.get(f"{metric}_ci95"), low, high) for r in ok)))
                if ok else None, zorder=2)
    colours = ["tab:red", "tab:blue", "tab:green", "tab:purple"]
    for n, (v, members) in enumerate(fronts.items()):
        ax.plot([points[i][0] for i in members], [points[i][1] for i in members], "o-", drawstyle="steps-post",
                color=colours[n % len(colours)], ms=6, zorder=3,
                label=f"Pareto front{f' ({v})' if v else ''}: no row is as good with fewer bytes")
    ax.set_xscale("symlog")  # before the limits are read: a one-process row sends 0 bytes
    ax.margins(x=0.08, y=0.12)
    # a point's number stacks away from the nearer edge of the axes, so the stack stays inside
    bottom, top = ax.get_ylim()
    up = [y <= (bottom + top) / 2 for _, y in points]
    lifts = [0.0] * len(points)
    for side in (True, False):
        members = [i for i in range(len(points)) if up[i] == side]
        for i, lift in zip(members, _label_lifts([points[i][0] for i in members])):
            lifts[i] = lift
    for n, ((x, y), lift, rising) in enumerate(zip(points, lifts, up), 1):
        ax.annotate(str(n), (x, y), textcoords="offset points", xytext=(3, 3 + lift if rising else -9 - lift),
                    fontsize=7)
    bars = " (mean, 95% t interval over seeds)" if len(table.seeds) > 1 else ""
    ax.set(xlabel="communicated MB (all ranks, whole run)", ylabel=f"final {_label(metric)}" + bars)
    if ok:
        ax.legend(fontsize=8, loc="best")
    ax.set_title(_title(table, f"{_label(metric)} against communication"), fontsize=10)
    for n, (rec, (x, y)) in enumerate(zip(ok, points), 1):
        on_front = n - 1 in front
        colour = colours[variants.index(variant_of(rec["label"])) % len(colours)] if on_front else "black"
        fig.text(0.66, 1 - (0.65 + LIST_LINE_IN * (n - 1)) / height, f"{n:>2}  {rec['label']}: {x:.1f} MB, {y:.4f}",
                 fontsize=8, family="monospace", color=colour)
    return fig


def _label_lifts(xs: Sequence[float], close: float = 1.3, step: float = 8.0) -> list[float]:
    """How far (points) to move each number of points sorted by x so neighbours do not overprint:
    points within a factor `close` of a cluster's first one stack their numbers, each a `step`
    further from its point (the caller chooses the direction)."""
    lifts, start, count = [], None, 0
    for x in xs:
        if start is None or x > start * close or (start <= 0 < x):
            start, count = x, 0
        lifts.append(count * step)
        count += 1
    return lifts
