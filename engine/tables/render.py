"""A table's results: one record per row (mean and spread over seeds, ratios to the baseline,
the paper's numbers), as markdown and CSV."""
from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path
from typing import Any

from engine.tables.config import TableConfig, row_dir

#: columns of table.csv, after the label; ratios and paper columns follow
METRICS = ["test_acc", "best_test_acc", "steps", "syncs", "comm_bytes", "wall_s", "samples_per_s"]
RATIOS = ["syncs", "comm_bytes", "wall_s", "samples_per_s"]


def gather(table: TableConfig, out: Path, status: dict[tuple[str, int], str]) -> list[dict[str, Any]]:
    """One record per row: mean/std over seeds of each metric, ratios, the paper's numbers."""
    records = []
    for row in table.rows:
        runs = []
        for seed in table.seeds:
            path = row_dir(out, row, seed).summary
            if path.exists():
                runs.append(json.loads(path.read_text()))
        failed = [s for s in table.seeds if status.get((row.label, s)) == "failed"]
        rec: dict[str, Any] = {"label": row.label, "recipe": row.recipe or "", "seeds": len(runs),
                               "status": "ok" if len(runs) == len(table.seeds) else
                               ("failed" if failed else "missing"),
                               "log": str(row_dir(out, row, (failed or table.seeds)[0]).row_log)}
        for metric in [*METRICS, *table.extra_metrics]:
            values = [float(r[metric]) for r in runs if r.get(metric) is not None]
            rec[metric] = statistics.fmean(values) if values else None
            rec[f"{metric}_std"] = statistics.stdev(values) if len(values) > 1 else None
        for key, value in row.paper.items():
            rec[f"paper_{key}"] = value
        records.append(rec)
    base = next((r for r in records if r["label"] == table.baseline), None)
    for rec in records:
        for metric in RATIOS:
            ok = base and rec[metric] is not None and base[metric]
            rec[f"{metric}_vs_base"] = rec[metric] / base[metric] if ok else None
    return records


def _fmt(value: Any, metric: str, std: Any = None) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
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
    head = ["row", *METRICS, *table.extra_metrics, *(f"{m} vs {table.baseline}" for m in RATIOS if table.baseline),
            *(f"paper {m}" for m in table.paper_metrics), *(["paper source"] if table.paper_metrics else [])]
    lines = [f"# {table.title or table.name}", ""]
    if table.description:
        lines += [table.description.strip(), ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for rec in records:
        if rec["status"] != "ok":
            cells = [rec["label"], f"**{rec['status']}** (log: {rec['log']})"] + [""] * (len(head) - 2)
        else:
            cells = [rec["label"], *(_fmt(rec[m], m, rec.get(f"{m}_std")) for m in [*METRICS, *table.extra_metrics])]
            if table.baseline:
                cells += [_fmt(rec[f"{m}_vs_base"], "ratio") + "x" if rec[f"{m}_vs_base"] else "-" for m in RATIOS]
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


