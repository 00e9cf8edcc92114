"""A table's results: one record per row (mean, spread and 95% t interval over seeds, ratios to
the baseline, the difference from the baseline with its interval, the paper's numbers, the tuning
grid and its choice), as markdown and CSV. See engine/tables/stats.py for the intervals."""
from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path
from typing import Any, Optional

from engine.report.metrics import read_metrics
from engine.tables.config import RowConfig, TableConfig, row_dir, row_grid
from engine.tables.stats import LEVEL, difference, half_width
from engine.tables.tuning import Tuned, grid_settings, setting_name

#: the default columns of table.csv, after the label (TableConfig.columns); ratios and paper columns follow
METRICS = ["test_acc", "val_acc", "best_val_acc", "test_acc_at_best", "steps", "syncs", "comm_bytes", "wall_s", "samples_per_s"]
RATIOS = ["syncs", "comm_bytes", "wall_s", "samples_per_s"]
NOT_REACHED = "not reached"


def to_target(run_dir: Any, target: float, metric: str = "test_acc") -> tuple[Optional[float], Optional[int]]:
    """Wall-clock seconds and bytes sent (all ranks) of the run at its first evaluation with
    `metric` >= target ((None, None): never)."""
    for rec in read_metrics(run_dir.metrics):
        if rec.get("kind") == "eval" and rec.get(metric, 0.0) >= target and rec.get("wall_s") is not None:
            sent = rec.get("comm_bytes_total")
            return float(rec["wall_s"]), (int(sent) if sent is not None else None)
    return None, None


def time_to_target(run_dir: Any, target: float, metric: str = "test_acc") -> Optional[float]:
    """Wall-clock seconds of the run at its first evaluation with `metric` >= target (None: never)."""
    return to_target(run_dir, target, metric)[0]


def _run_values(table: TableConfig, row: RowConfig, seed: int, out: Path) -> Optional[dict[str, Any]]:
    """A finished run's summary, with time_to_target_s and bytes_to_target added when the table
    has a target."""
    run_dir = row_dir(out, row, seed)
    if not run_dir.summary.exists():
        return None
    summary = json.loads(run_dir.summary.read_text())
    if table.target_acc is not None:
        summary["time_to_target_s"], summary["bytes_to_target"] = to_target(run_dir, table.target_acc,
                                                                            table.target_metric)
    return summary


def gather(table: TableConfig, out: Path, status: dict[tuple[str, int], str],
           tuned: Optional[dict[str, Tuned]] = None) -> list[dict[str, Any]]:
    """One record per row: mean/std/95% half-width over seeds of each metric, ratios, the
    difference of `compare_metric` from the baseline row, the paper's numbers, the tuning."""
    records = []
    per_seed: dict[str, dict[int, float]] = {}
    for row in table.rows:
        by_seed = {seed: _run_values(table, row, seed, out) for seed in table.seeds}
        runs = [r for r in by_seed.values() if r is not None]
        per_seed[row.label] = {s: float(r[table.compare_metric]) for s, r in by_seed.items()
                               if r is not None and isinstance(r.get(table.compare_metric), (int, float))}
        failed = [s for s in table.seeds if status.get((row.label, s)) == "failed"]
        rec: dict[str, Any] = {"label": row.label, "recipe": row.recipe or "", "seeds": len(runs),
                               "status": "ok" if len(runs) == len(table.seeds) else
                               ("failed" if failed else "missing"),
                               "log": str(row_dir(out, row, (failed or table.seeds)[0]).row_log),
                               "baseline": row.baseline or table.baseline, "x": row.x,
                               "series": row.series or row.label}
        for metric in dict.fromkeys(table.columns + table.ratios):
            values = [float(r[metric]) for r in runs if isinstance(r.get(metric), (int, float))]
            rec[metric] = statistics.fmean(values) if values else None
            rec[f"{metric}_std"] = statistics.stdev(values) if len(values) > 1 else None
            rec[f"{metric}_ci95"] = half_width(values)
            if metric in ("time_to_target_s", "bytes_to_target") and runs and len(values) < len(runs):
                rec[metric] = NOT_REACHED  # some seed never reached the target: no mean to show
                rec[f"{metric}_ci95"] = None
        if tuned and row.label in tuned:
            rec["tuned"] = setting_name(tuned[row.label].winner) if tuned[row.label].winner else "none"
        for key, value in row.paper.items():
            rec[f"paper_{key}"] = value
        records.append(rec)
    by_label = {r["label"]: r for r in records}
    for rec in records:
        base = by_label.get(rec["baseline"]) if rec["baseline"] else None
        for metric in table.ratios:
            ok = base and isinstance(rec[metric], float) and isinstance(base[metric], float) and base[metric]
            rec[f"{metric}_vs_base"] = rec[metric] / base[metric] if ok else None
        diff = difference(per_seed[rec["label"]], per_seed[base["label"]]) if base and base is not rec else None
        rec["diff"] = diff.mean if diff else None
        rec["diff_low"], rec["diff_high"] = (diff.low, diff.high) if diff else (None, None)
        rec["diff_method"] = diff.method if diff else None
        rec["diff_resolved"] = diff.resolved if diff else None
    return records


def _fmt(value: Any, metric: str, ci: Any = None) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if metric == "time_to_target_s" and isinstance(value, float):
        return f"{value:.1f} s" + (f" ± {ci:.1f}" if ci is not None else "")
    if metric in ("comm_bytes", "bytes_to_target"):
        text = f"{value / 1e6:.1f} MB"
    elif metric in ("steps", "syncs"):
        text = f"{value:.0f}"
    elif "_acc" in metric or metric.endswith("acc"):
        text = f"{value:.4f}"
    elif isinstance(value, float):
        text = f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    else:
        text = str(value)
    return f"{text} ± {ci:.4f}" if ci is not None and ("_acc" in metric or metric.endswith("acc")) else text


def _fmt_diff(rec: dict[str, Any]) -> str:
    """`+0.0123 [+0.0050, +0.0196] resolved` (or the mean alone without an interval)."""
    if rec.get("diff") is None:
        return "-"
    if rec["diff_low"] is None:
        return f"{rec['diff']:+.4f}"
    mark = " **resolved**" if rec["diff_resolved"] else ""
    return f"{rec['diff']:+.4f} [{rec['diff_low']:+.4f}, {rec['diff_high']:+.4f}]{mark}"


def _tuning_lines(table: TableConfig, tuned: dict[str, Tuned], failed: list[str]) -> list[str]:
    """The grids, each setting's mean validation result, and the chosen setting."""
    lines = ["## Tuning", "",
             f"Each tuned row ran its grid on seeds {table.tune_seeds}; the setting with the best mean "
             f"{tuned[next(iter(tuned))].metric} (validation) was then run on seeds {table.seeds}, whose test "
             f"results are above. Test accuracy chose nothing.", "",
             "| row | setting | mean " + tuned[next(iter(tuned))].metric + " | runs | chosen |", "|---|---|---|---|---|"]
    for label, result in tuned.items():
        for setting, mean, runs in result.results:
            lines.append(f"| {label} | {setting_name(setting)} | {'-' if mean is None else f'{mean:.4f}'} | "
                         f"{runs}/{len(table.tune_seeds)} | {'**yes**' if setting == result.winner else ''} |")
    rows = {r.label: r for r in table.rows}
    extended = [label for label, result in tuned.items()
                if label in rows and len(result.results) > len(grid_settings(row_grid(table, rows[label])))]
    if extended:
        lines += ["", f"Grids extended beyond a winning edge (table.tune_extend={table.tune_extend}): "
                      f"{', '.join(extended)}."]
    at_edge = [label for label, result in tuned.items() if _chosen_at_edge(result)]
    if at_edge:
        lines += ["", f"Chosen at an edge of the grid as run (the best setting may lie beyond it; these rows' "
                      f"tuning is not resolved): {', '.join(at_edge)}."]
    if failed:
        lines += ["", f"Tuning runs that did not complete (no mean, cannot be chosen): {', '.join(failed)}."]
    return lines + [""]


def _chosen_at_edge(result: Tuned) -> bool:
    """A one-key grid whose winner is its smallest or largest value and strictly the best."""
    if result.winner is None or len(result.winner) != 1 or len(result.results) < 2:
        return False
    scored = [(setting[0][1], mean) for setting, mean, _ in result.results if mean is not None]
    if not all(isinstance(v, (int, float)) for v, _ in scored):
        return False
    scored.sort()
    best = max(m for _, m in scored)
    winner = result.winner[0][1]
    strictly = sum(1 for _, m in scored if m == best) == 1
    return strictly and winner in (scored[0][0], scored[-1][0])


def render_markdown(table: TableConfig, records: list[dict[str, Any]], tuned: Optional[dict[str, Tuned]] = None,
                    failed_tuning: Optional[list[str]] = None) -> str:
    per_row = any(r.baseline for r in table.rows)  # rows with their own baseline: name it per row
    base = "baseline" if per_row else table.baseline
    has_base = per_row or table.baseline is not None
    diff_col = has_base and len(table.seeds) > 1
    head = ["row", *table.columns, *(["tuned"] if tuned else []), *(["baseline"] if per_row else []),
            *([f"{table.compare_metric} - baseline (95% CI)"] if diff_col else []),
            *(f"{m} vs {base}" for m in table.ratios if has_base),
            *(f"paper {m}" for m in table.paper_metrics), *(["paper source"] if table.paper_metrics else [])]
    lines = [f"# {table.title or table.name}", ""]
    if table.description:
        lines += [table.description.strip(), ""]
    if table.target_acc is not None and {"time_to_target_s", "bytes_to_target"} & set(table.columns):
        lines += [f"time_to_target_s, bytes_to_target: wall-clock and bytes sent (all ranks) of the run at its "
                  f"first evaluation with {table.target_metric} >= {table.target_acc:g}.", ""]
    if table.quick:
        lines += [f"**Quick form** (table.quick=true): rows {', '.join(r.label for r in table.rows)}, seed "
                  f"{table.seeds[0]}, no tuning, overrides {' '.join(table.overrides)}; not the table's result.", ""]
    if len(table.seeds) > 1:
        lines += [f"Cells: mean over seeds {table.seeds} ± the half-width of its {LEVEL:.0%} Student-t interval. "
                  f"The difference from the baseline row is paired by seed (Welch's interval where a row misses "
                  f"seeds); **resolved**: its interval excludes 0.", ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for rec in records:
        if rec["status"] != "ok":
            cells = [rec["label"], f"**{rec['status']}** (log: {rec['log']})"] + [""] * (len(head) - 2)
        else:
            cells = [rec["label"], *(_fmt(rec[m], m, rec.get(f"{m}_ci95")) for m in table.columns)]
            if tuned:
                cells.append(rec.get("tuned", "-"))
            if per_row:
                cells.append(rec["baseline"] or "-")
            if diff_col:
                cells.append(_fmt_diff(rec))
            if has_base:
                cells += [_fmt(rec[f"{m}_vs_base"], "ratio") + "x" if rec[f"{m}_vs_base"] else "-"
                          for m in table.ratios]
            cells += [_fmt(rec.get(f"paper_{m}") if rec.get(f"paper_{m}") is not None else "not reported", m)
                      for m in table.paper_metrics]
            if table.paper_metrics:
                cells.append(str(rec.get("paper_source", "-")))
        lines.append("| " + " | ".join(cells) + " |")
    notes = [f"- {r.label}: {r.note}" for r in table.rows if r.note]
    if notes:
        lines += ["", *notes]
    if tuned:
        lines += ["", *_tuning_lines(table, tuned, failed_tuning or [])]
    return "\n".join(lines) + "\n"


def write_csv(path: Path, records: list[dict[str, Any]]) -> None:
    keys = ["label", "recipe", "status", "seeds", "log"]
    rest = sorted({k for r in records for k in r} - set(keys),
                  key=lambda k: (not k.startswith(tuple(METRICS)), k.startswith("paper"), k))
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=keys + rest)
        writer.writeheader()
        for rec in records:
            writer.writerow({k: ("" if rec.get(k) is None else rec.get(k)) for k in keys + rest})


