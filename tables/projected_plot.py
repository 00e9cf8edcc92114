"""projected_bandwidth_<cluster>.png: projected time to target against link bandwidth, per row.

One column of panels per variant, target (a) above and (b) below; x the cluster's NIC bandwidth
(log, Gbit/s), y the projected time to the target (log, seconds), one line per row that reached it
at the sweep's worker count, the baseline row black and thick inside a grey band of the projection's
speedup error (tables/projected.py SPEEDUP_ERROR), the preset's own bandwidth a dotted vertical line.
Where a row's line falls below the baseline's, it reaches the baseline's quality sooner end to end;
only below the band is it sooner by more than the projection can tell. The styles are
tables/plot_style.py's (one colour and line per row, palette PNGs).
"""
from __future__ import annotations

from pathlib import Path

from projection.cluster import GBIT
from tables.config import TableConfig
from tables.plot_style import row_styles, save_png, suptitle
from tables.projected import SPEEDUP_ERROR, Projected, variant_rows
from tables.projected_render import series_of, target_words


def draw_bandwidth(projected: Projected, table: TableConfig, path: Path) -> bool:
    """Draw the figure (module doc) to `path`; False when nothing was swept."""
    gbits = sorted(projected.sweep.get(0, {}))
    by_variant = variant_rows(projected)
    if not gbits or not by_variant:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    names = list(dict.fromkeys(series_of(projected, label) for labels in by_variant.values() for label in labels))
    styles = row_styles(plt, names)
    fig, axes = plt.subplots(2, len(by_variant), figsize=(6.5 * len(by_variant), 9.0), squeeze=False,
                             layout="constrained")
    handles: dict[str, object] = {}
    for which in (0, 1):
        for ax, (variant, labels) in zip(axes[which], by_variant.items()):
            base = projected.baselines[labels[0]]
            for label in labels:
                points = [(g, t) for g in gbits if (t := projected.sweep[which][g].get(label)) is not None]
                if not points:
                    continue
                name = series_of(projected, label)
                style = dict(styles[name])
                fmt = style.pop("fmt")
                if label == base:
                    style.update(color="black", lw=2.5, zorder=3)
                    band = ax.fill_between([p[0] for p in points], [p[1] / (1 + SPEEDUP_ERROR) for p in points],
                                           [p[1] * (1 + SPEEDUP_ERROR) for p in points], color="0.85", lw=0,
                                           zorder=1)
                    handles.setdefault(f"{name} +/- the projection's speedup error ({SPEEDUP_ERROR:.0%})", band)
                line, = ax.plot([p[0] for p in points], [p[1] for p in points], fmt, ms=3, label=name, **style)
                handles.setdefault(name, line)
            if not ax.lines:  # an empty panel says why, rather than showing bare axes
                ax.text(0.5, 0.5, "no row reached this target\non at least half its seeds", ha="center",
                        va="center", transform=ax.transAxes, color="0.4")
                ax.set_xlim(gbits[0], gbits[-1])
            ax.axvline(projected.cluster.nic.bandwidth_Bps / GBIT, color="grey", ls=":", lw=1)
            ax.set(xscale="log", yscale="log", xlabel=f"NIC bandwidth (Gbit/s; dotted: {projected.cluster.name}'s)",
                   ylabel=f"projected s to target ({'ab'[which]})")
            ax.set_title(f"{variant or 'rows'}, {projected.sweep_workers} workers, target ({'ab'[which]}): "
                         f"{target_words(projected, which, table)}", fontsize=8)
            ax.grid(lw=0.3, which="both")
            plain = FuncFormatter(lambda v, _: f"{v:g}")  # plain numbers on log axes, not powers of 10
            ax.xaxis.set_major_formatter(plain)
            ax.yaxis.set_major_formatter(plain)
            ax.yaxis.set_minor_formatter(plain)  # a span under a decade has no major tick to read
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="outside right center", fontsize=8)
    suptitle(fig, table, f"projected time to quality against bandwidth on {projected.cluster.name} (not measured; "
                         "rows that reached the target)")
    save_png(fig, path)
    plt.close(fig)
    return True
