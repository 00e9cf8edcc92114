"""A frontier table's files (tables/frontier.py): table.md's section "Each method's knob",
frontier.csv (every point, for a reader's own plots) and frontier.png, written at a gather of a
table whose `plots` name `frontier`, like the projected files beside them."""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Any, Optional

from tables.config import TableConfig
from tables.frontier import Best, Point, best_settings, curves, points
from tables.plot_frontier import frontier_figure
from tables.plot_style import save_png
from tables.render import cell_text, diff_text
from tables.runs import Summary

FRONTIER_CSV = "frontier.csv"


def _mb(value: Optional[float]) -> str:
    return "-" if value is None else f"{value / 1e6:.2f}"


def frontier_lines(table: TableConfig, records: list[dict[str, Any]], bests: list[Best]) -> list[str]:
    """table.md's section: what the frontier figure shows and each method's best setting."""
    metric, select = table.compare_metric, table.select_metric
    by_label = {r["label"]: r for r in records}
    lines = ["", "## Each method's knob (frontier.png, frontier.csv)", "",
             f"frontier.png draws each method's settings as one curve: the final {metric} (mean, 95% interval) "
             f"against the MB each worker sent (every rank's bytes over the training ranks), one panel per "
             f"partition, the baseline's interval as a band; frontier.csv holds the points. A method's best setting "
             f"is the one with the best mean {select} over the reported seeds (validation chose; the test set "
             f"did not); the settings validation cannot tell apart from it (paired by seed, "
             + ("the validation set's floor" if table.tune_resolution is None
                else f"within {table.tune_resolution} or the paired interval") +
             ") are listed beside it. Its test value and its difference from the baseline are its row's above "
             "(Holm-corrected across the table).", "",
             f"| method | partition | settings run | best on validation | mean {select} | {metric} | "
             f"difference from the baseline | MB per worker | not told apart on validation |",
             "|---|---|---|---|---|---|---|---|---|"]
    for b in bests:
        rec = by_label[b.point.label]
        lines.append(f"| {b.method} | {b.variant or '-'} | {b.settings} | {b.point.setting or '(no knob)'} | "
                     f"{b.point.selected_mean:.4f} | {cell_text(rec, metric)} | "
                     f"{diff_text(rec)} | {_mb(b.point.bytes_per_worker)} | {', '.join(b.alike) or 'none'} |")
    if not bests:
        lines.append("| (no row has every seed yet) | | | | | | | | |")
    return lines


def write_frontier_csv(path: Path, found: list[Point], bests: list[Best]) -> None:
    """frontier.csv: one line a point, with whether it is its method's best on validation."""
    chosen = {b.point.label for b in bests}
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["method", "setting", "variant", "label", "bytes_per_worker", "value", "low", "high",
                    "selected_mean", "best_on_validation", "unstable"])
        for variant, methods in curves(found).items():
            for method, pts in methods.items():
                for p in pts:
                    w.writerow([method, p.setting, variant, p.label, p.bytes_per_worker, p.value, p.low, p.high,
                                p.selected_mean,
                                p.label in chosen, p.unstable])


def with_frontier(markdown: str, table: TableConfig, out: Path, records: list[dict[str, Any]],
                  runs: dict[str, dict[int, Summary]]) -> str:
    """table.md's text with the frontier section added, frontier.csv and frontier.png written, for
    a table that plots `frontier` (unchanged otherwise)."""
    if "frontier" not in table.plots:
        return markdown
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    found = points(table, records, runs)
    bests = best_settings(table, found, runs)
    write_frontier_csv(out / FRONTIER_CSV, found, bests)
    fig = frontier_figure(plt, table, found, bests)
    save_png(fig, out / "frontier.png")
    plt.close(fig)
    return markdown.rstrip("\n") + "\n" + "\n".join(frontier_lines(table, records, bests)) + "\n"
