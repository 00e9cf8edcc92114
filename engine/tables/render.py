"""A table's results: one record per row (mean and spread over seeds, ratios to the baseline,
the paper's numbers), as markdown and CSV."""
from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path
from typing import Any, Optional

from engine.report.metrics import read_metrics
from engine.tables.config import RowConfig, TableConfig, row_dir

#: the default columns of table.csv, after the label (TableConfig.columns); ratios and paper columns follow
METRICS = ["test_acc", "best_test_acc", "steps", "syncs", "comm_bytes", "wall_s", "samples_per_s"]
RATIOS = ["syncs", "comm_bytes", "wall_s", "samples_per_s"]
NOT_REACHED = "not reached"


def time_to_target(run_dir: Any, target: float) -> Optional[float]:
    """Wall-clock seconds of the run at its first evaluation with test_acc >= target (None: never)."""
    for rec in read_metrics(run_dir.metrics):
        if rec.get("kind") == "eval" and rec.get("test_acc", 0.0) >= target and rec.get("wall_s") is not None:
            return float(rec["wall_s"])
    return None


def _run_values(table: TableConfig, row: RowConfig, seed: int, out: Path) -> Optional[dict[str, Any]]:
    """A finished run's summary, with time_to_target_s added when the table asks for it."""
    run_dir = row_dir(out, row, seed)
    if not run_dir.summary.exists():
        return None
    summary = json.loads(run_dir.summary.read_text())
    if table.target_acc is not None:
        summary["time_to_target_s"] = time_to_target(run_dir, table.target_acc)
    return summary


def gather(table: TableConfig, out: Path, status: dict[tuple[str, int], str]) -> list[dict[str, Any]]:
    """One record per row: mean/std over seeds of each metric, ratios, the paper's numbers."""
    records = []
    for row in table.rows:
        runs = [r for r in (_run_values(table, row, seed, out) for seed in table.seeds) if r is not None]
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
            if metric == "time_to_target_s" and runs and len(values) < len(runs):
                rec[metric] = NOT_REACHED  # some seed never reached the target: no mean to show
        for key, value in row.paper.items():
            rec[f"paper_{key}"] = value
        records.append(rec)
    by_label = {r["label"]: r for r in records}
    for rec in records:
        base = by_label.get(rec["baseline"]) if rec["baseline"] else None
        for metric in table.ratios:
            ok = base and isinstance(rec[metric], float) and isinstance(base[metric], float) and base[metric]
            rec[f"{metric}_vs_base"] = rec[metric] / base[metric] if ok else None
    return records


def _fmt(value: Any, metric: str, std: Any = None) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if metric == "time_to_target_s" and isinstance(value, float):
        return f"{value:.1f} s"
    if metric == "comm_bytes":
        text = f"{value / 1e6:.1f} MB"
    elif metric in ("steps", "syncs"):
        text = f"{value:.0f}"
    elif metric.endswith("acc"):
        text = f"{value:.4f}"
    elif isinstance(value, float):
        text = f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    else:
        text = str(value)
    return f"{text} ± {std:.4f}" if std is not None and metric.endswith("acc") else text


def render_markdown(table: TableConfig, records: list[dict[str, Any]]) -> str:
    per_row = any(r.baseline for r in table.rows)  # rows with their own baseline: name it per row
    base = "baseline" if per_row else table.baseline
    has_base = per_row or table.baseline is not None
    head = ["row", *table.columns, *(["baseline"] if per_row else []),
            *(f"{m} vs {base}" for m in table.ratios if has_base),
            *(f"paper {m}" for m in table.paper_metrics), *(["paper source"] if table.paper_metrics else [])]
    lines = [f"# {table.title or table.name}", ""]
    if table.description:
        lines += [table.description.strip(), ""]
    if table.target_acc is not None and "time_to_target_s" in table.columns:
        lines += [f"time_to_target_s: wall-clock of the run at its first evaluation with test_acc >= "
                  f"{table.target_acc:g}.", ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for rec in records:
        if rec["status"] != "ok":
            cells = [rec["label"], f"**{rec['status']}** (log: {rec['log']})"] + [""] * (len(head) - 2)
        else:
            cells = [rec["label"], *(_fmt(rec[m], m, rec.get(f"{m}_std")) for m in table.columns)]
            if per_row:
                cells.append(rec["baseline"] or "-")
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


