"""The figures of each row's final value: its level with its interval (`levels`), its difference
from the baseline with the Holm-corrected interval (`intervals`), the Pareto front of value against
bytes (`pareto`), and the value and bytes against the number of workers (`workers`). The curves
over a run are tables/plots.py's; both draw through tables/plot_style.py.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from tables.config import headline
from tables.measure import is_proportion
from tables.plot_style import (bounds, clipped_error, metric_label, row_styles, suptitle, title, unstable_mark,
                               unstable_name, variants_in)
from tables.runs import row_of, variant_of


def _verdict_colour(rec: dict[str, Any], sign: int) -> str:
    """Green: resolved better than its baseline (Holm-corrected), red: resolved worse, grey: not
    resolved, black: the baseline itself."""
    if rec["label"] == rec.get("baseline"):
        return "black"
    if not rec.get("diff_resolved"):
        return "tab:gray"
    return "tab:green" if sign * (rec.get("diff") or 0.0) > 0 else "tab:red"


def levels_figure(plt: Any, table: Any, records: list[dict[str, Any]]) -> Any:
    """`levels`: each row's final headline value with its 95% interval over seeds, sorted (best at
    the top), one panel per variant, the baseline row's mean as a line; a row resolved from its
    baseline coloured (red: worse, green: better), the rest grey. The absolute level; the
    differences themselves are `differences_figure`."""
    metric = table.compare_metric
    sign = headline(table).sign
    low, high = bounds(metric)
    ok = [r for r in records if r.get(metric) is not None]
    variants = variants_in([r["label"] for r in ok])
    per = max(sum(1 for r in ok if variant_of(r["label"]) == v) for v in variants)
    fig, axes = plt.subplots(1, len(variants), figsize=(6.5 * len(variants), 1.2 + 0.24 * per), squeeze=False)
    for ax, variant in zip(axes[0], variants):
        rows = sorted((r for r in ok if variant_of(r["label"]) == variant), key=lambda r: sign * r[metric])
        for y, rec in enumerate(rows):
            below, above = clipped_error(rec[metric], rec.get(f"{metric}_ci95"), low, high)
            ax.errorbar([rec[metric]], [y], xerr=[[below], [above]], fmt="o", ms=4, capsize=2,
                        color=_verdict_colour(rec, sign), **unstable_mark(rec))
        base = next((r for r in rows if r["label"] == r.get("baseline")), None)
        if base is not None:
            ax.axvline(base[metric], color="black", lw=0.8, ls="--")
        ax.set_yticks(range(len(rows)), [unstable_name(r, row_of(r["label"])) for r in rows], fontsize=8)
        ax.set(xlabel=f"final {metric_label(metric)}, mean and 95% interval over seeds",
               title=f"{variant or table.name}: red/green = resolved from {row_of(base['label']) if base else 'the baseline'}"
                     f"{'; hollow: unstable (seeds spread past the range)' if any(r.get('unstable') for r in rows) else ''}")
        if is_proportion(metric):
            ax.set_xlim(-0.02, 1.02)
        ax.title.set_fontsize(9)
        ax.grid(axis="x", lw=0.3)
    suptitle(fig, table)
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


def differences_figure(plt: Any, table: Any, records: list[dict[str, Any]]) -> Any:
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
                        color=_verdict_colour(rec, sign), **unstable_mark(rec))
        ax.axvline(0.0, color="black", lw=0.8, ls="--")
        base = rows[0].get("baseline") if rows else None
        ax.set_yticks(range(len(rows)), [unstable_name(r, row_of(r["label"]) + (" (Welch)" if r.get("diff_method")
                                                                               == "welch" else "")) for r in rows],
                      fontsize=8)
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
        ax.set(xlabel=f"{metric_label(metric)} - {row_of(base) if base else 'baseline'} ({corrected}; "
                      f"{'higher' if sign > 0 else 'lower'} is better{scale})",
               title=f"{variant or table.name}: difference from {row_of(base) if base else 'the baseline'}; "
                     f"green/red = resolved better/worse"
                     f"{'; hollow: unstable' if any(r.get('unstable') for r in rows) else ''}")
        ax.title.set_fontsize(9)
        ax.xaxis.label.set_fontsize(8)
        ax.grid(axis="x", lw=0.3)
    suptitle(fig, table)
    fig.tight_layout()
    return fig


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


def workers_figure(plt: Any, table: Any, records: list[dict[str, Any]]) -> Any:
    """The headline metric (left) and MB sent (right, log) against training workers (log 2), one
    line per method, one row of panels per variant; error bars are 95% intervals over seeds
    (an accuracy's with the test set's floor, cut at 0 and 1)."""
    metric = table.compare_metric
    low, high = bounds(metric)
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
        shaky = [r for r in records if r.get("unstable") and r.get("x") is not None
                 and variant_of(r["label"]) == variant and isinstance(r.get(metric), (int, float))]
        for rec in shaky:  # hollow: seeds spread past the metric's range (tables/ranges.py)
            acc_ax.plot([float(rec["x"])], [float(rec[metric])], "o", ms=6, mfc="white", mew=1.2,
                        color=styles[row_of(rec["series"])]["color"], zorder=3)
        if shaky:
            acc_ax.annotate("hollow: unstable", (0.01, 0.02), xycoords="axes fraction", fontsize=7)
        for name, points in workers_series(records, "comm_bytes", variant).items():
            bytes_ax.errorbar([p[0] for p in points], [max(p[1] / 1e6, 1e-3) for p in points],
                              yerr=[p[2] / 1e6 for p in points], ms=3, capsize=2, label=name, **styles[name])
        where = f" ({variant})" if variant else ""
        acc_ax.set(xscale="log", xlabel=table.x_label or "training workers",
                   ylabel=f"final {metric_label(metric)}" + bars)
        acc_ax.set_title(f"{metric_label(metric)} against workers{where}", fontsize=9)
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
    suptitle(fig, table, f"{metric_label(metric)} and bytes against workers")
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


def pareto_figure(plt: Any, table: Any, records: list[dict[str, Any]]) -> Any:
    """The final headline value against communicated MB (symlog: a one-process row sends nothing),
    the Pareto front (in the metric's direction) as a step line through its rows (one front per
    variant). Rows are numbered by bytes next to their points and listed beside the axes (15
    names near one another overprint; numbers stay readable), one line a row: the figure is as
    tall as its list (55 rows of MNIST-1D overprinted each other in a fixed 5 inches)."""
    metric = table.compare_metric
    sign = headline(table).sign
    low, high = bounds(metric)
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
    ax.set(xlabel="communicated MB (all ranks, whole run)", ylabel=f"final {metric_label(metric)}" + bars)
    if ok:
        ax.legend(fontsize=8, loc="best")
    ax.set_title(title(table, f"{metric_label(metric)} against communication"), fontsize=10)
    for n, (rec, (x, y)) in enumerate(zip(ok, points), 1):
        on_front = n - 1 in front
        colour = colours[variants.index(variant_of(rec["label"])) % len(colours)] if on_front else "black"
        fig.text(0.66, 1 - (0.65 + LIST_LINE_IN * (n - 1)) / height,
                 f"{n:>2}  {unstable_name(rec, rec['label'])}: {x:.1f} MB, {y:.4f}",
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
