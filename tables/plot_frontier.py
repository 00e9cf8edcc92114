"""frontier.png (tables/frontier.py): each method's settings as one curve of final quality against
the bytes each worker sent, one panel per partition. A curve, not a cloud of points, because the
question is what each further byte buys within one method; the baseline (a method with one
setting) is drawn as the band of its interval across the panel, so a setting whose interval meets
the band is not told apart from it by eye either."""
from __future__ import annotations

from typing import Any

from tables.config import TableConfig
from tables.frontier import Best, Point, curves
from tables.plot_style import metric_label, suptitle


def frontier_figure(plt: Any, table: TableConfig, found: list[Point], bests: list[Best]) -> Any:
    """The figure; a panel per variant, a line per method through its settings by bytes per worker
    (log axis; symlog where a row sent nothing), each point's 95% interval, each method's best
    setting on validation a star, every point labelled with its setting."""
    by_variant = curves(found) or {"": {}}
    methods = list(dict.fromkeys(m for ms in by_variant.values() for m in ms))
    # the baseline's method, from the points its records mark (variants make it per row: `allreduce@iid`)
    baseline = next((p.method for p in found if p.baseline), "")
    others = [m for m in methods if m != baseline]  # tab10's 10 distinct hues (tab20 pairs light and dark
    colours = {m: plt.get_cmap("tab10")(i % 10) for i, m in enumerate(others)}  # of one hue); the baseline black
    colours[baseline] = "black"
    lines = {m: "o-" if i < 10 else "s--" for i, m in enumerate(others)}
    chosen = {b.point.label for b in bests}
    fig, axes = plt.subplots(1, len(by_variant), figsize=(6.5 * len(by_variant) + 2.5, 5.5), squeeze=False)
    for ax, (variant, per_method) in zip(axes[0], by_variant.items()):
        zero = False
        for method, pts in per_method.items():
            shown = [p for p in pts if p.value is not None and p.bytes_per_worker is not None]
            if not shown:
                continue
            zero = zero or any(p.bytes_per_worker == 0 for p in shown)
            colour = colours[method]
            xs, ys = [p.bytes_per_worker / 1e6 for p in shown], [p.value for p in shown]
            errors = [_error(p) for p in shown]
            if len(shown) == 1 and method == baseline:  # the baseline: a band across the panel
                p = shown[0]
                ax.axhspan(p.low if p.low is not None else p.value, p.high if p.high is not None else p.value,
                           color=colour, alpha=0.18, zorder=1)
                ax.axhline(p.value, color=colour, ls="--", lw=1, zorder=1)
            ax.errorbar(xs, ys, yerr=list(zip(*errors)), fmt=lines.get(method, "o-"), color=colour, ms=4,
                        capsize=2, lw=1.2, label=method, zorder=3)
            for p, x, y in zip(shown, xs, ys):
                if p.label in chosen and len(pts) > 1:
                    ax.plot([x], [y], marker="*", ms=14, color=colour, mec="black", mew=0.6, zorder=4)
                if p.setting:
                    ax.annotate(p.setting + (" (unstable)" if p.unstable else ""), (x, y), textcoords="offset points",
                                xytext=(7, 5), fontsize=7, color=colour)
        ax.set_xscale("symlog", linthresh=1e-3) if zero else ax.set_xscale("log")
        ax.set(xlabel="MB sent per worker (whole run)",
               ylabel=f"final {metric_label(table.compare_metric)} (mean, 95% interval over seeds)")
        ax.set_title(f"partition {variant}" if variant else "", fontsize=9)
        ax.grid(alpha=0.3, which="both")
    handles, labels = axes[0][0].get_legend_handles_labels()
    if handles:
        star = plt.Line2D([], [], marker="*", ms=12, color="white", mec="black", ls="", label="best on validation")
        fig.legend([*handles, star], [*labels, "best on validation"], loc="center right", fontsize=8)
    suptitle(fig, table, f"{metric_label(table.compare_metric)} against bytes per worker, each method's knob")
    fig.tight_layout(rect=(0, 0, 1 - 2.3 / fig.get_figwidth(), 0.93))
    return fig


def _error(p: Point) -> tuple[float, float]:
    """(below, above) error-bar lengths: to the ends of the point's interval, already cut at the
    metric's range (tables/render.py); none without one."""
    if p.value is None or p.low is None or p.high is None:
        return 0.0, 0.0
    return p.value - p.low, p.high - p.value
