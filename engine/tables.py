"""Paper tables by one command: `python cli.py table=NAME hydra.run.dir=DIR`.

A table config (recipes/tables/NAME.yaml, the `table` config group) lists rows, each a recipe
plus overrides and a label, the baseline row that ratios refer to, the seeds, and the paper's
published numbers for each row with their source. Each row x seed runs as its own cli.py job in
`DIR/<label>/seed_<s>/`, one after another: a run directory that already holds summary.json is
not run again, an interrupted one resumes (cli.py's resume=auto), a failed one is reported as
failed with its log while the others still run. Then the summaries are gathered into
`DIR/table.md` (also printed) and `DIR/table.csv`, and the plots are drawn.

With `table.launcher=slurm`, rows are submitted as Hydra multiruns through the submitit launcher
instead; running the same command again once they are done gathers the table.
"""
from __future__ import annotations

import csv
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig

from engine.config import typed_section
from engine.errors import UserError

REPO = Path(__file__).resolve().parent.parent
#: columns of table.csv, after the label; ratios and paper columns follow
METRICS = ["test_acc", "best_test_acc", "steps", "syncs", "comm_bytes", "wall_s", "samples_per_s"]
RATIOS = ["syncs", "comm_bytes", "wall_s", "samples_per_s"]


@dataclass
class RowConfig:
    label: str
    recipe: Optional[str] = None
    overrides: list[str] = field(default_factory=list)
    paper: dict[str, Any] = field(default_factory=dict)  # metric -> published value, plus "source"
    note: str = ""


@dataclass
class TableConfig:
    name: str = ""
    title: str = ""
    description: str = ""
    paper: str = ""  # the paper the published numbers come from
    baseline: Optional[str] = None  # label of the row that ratios refer to
    seeds: list[int] = field(default_factory=lambda: [0])
    overrides: list[str] = field(default_factory=list)  # added to every row
    paper_metrics: list[str] = field(default_factory=lambda: ["test_acc"])  # published columns shown
    plots: list[str] = field(default_factory=lambda: ["accuracy"])  # accuracy | series:<key> | throughput
    rows: list[RowConfig] = field(default_factory=list)
    dry_run: bool = False
    launcher: str = "local"  # local | slurm
    row_timeout_s: Optional[float] = None


def load_table(node: DictConfig) -> TableConfig:
    table = typed_section(TableConfig, node, "table")
    labels = [r.label for r in table.rows]
    if not labels:
        raise UserError(f"table {table.name}: no rows")
    if len(set(labels)) != len(labels):
        raise UserError(f"table {table.name}: row labels must be unique ({labels})")
    if table.baseline is not None and table.baseline not in labels:
        raise UserError(f"table.baseline={table.baseline} is not a row label; rows: {', '.join(labels)}")
    if table.launcher not in ("local", "slurm"):
        raise UserError(f"table.launcher={table.launcher} is not one of local, slurm")
    return table


def row_args(table: TableConfig, row: RowConfig, seed: int, run_dir: Path) -> list[str]:
    args = [f"recipe={row.recipe}"] if row.recipe else []
    return [*args, *table.overrides, *row.overrides, f"seed={seed}", f"hydra.run.dir={run_dir}"]


def row_dir(out: Path, row: RowConfig, seed: int) -> Path:
    return out / row.label / f"seed_{seed}"


def describe_row(args: list[str]) -> str:
    """Compose and validate a row's config (raises UserError naming the problem); one line."""
    from hydra import compose

    from engine.config import load_run_config

    cfg = compose(config_name="config", overrides=[a for a in args if not a.startswith("hydra.")])
    rc = load_run_config(cfg, "dry-run")
    return (f"{rc.algo.name} | {rc.model['name']} on {rc.data.name} ({rc.data.pipeline}) | "
            f"{rc.launch.nproc} ranks/node | batch {rc.train.global_batch_size or rc.train.batch_size}"
            f"{' global' if rc.train.global_batch_size else '/rank'} | {rc.optim.name} lr {rc.optim.lr:g} | "
            f"{rc.sched.name} | {rc.train.max_steps or rc.train.epochs} {'steps' if rc.train.max_steps else 'epochs'}")


def run_row(args: list[str], run_dir: Path, timeout: Optional[float]) -> tuple[str, float]:
    """Run one row as a cli.py job; returns (status, seconds). Output goes to run_dir/run.log."""
    run_dir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(run_dir / "run.log", "a") as log:
        log.write(f"\n$ cli.py {' '.join(args)}\n")
        log.flush()
        try:
            proc = subprocess.run([sys.executable, str(REPO / "cli.py"), *args, "train.progress=false"],
                                  stdout=log, stderr=subprocess.STDOUT, cwd=REPO, timeout=timeout)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = -1
    status = "done" if code == 0 and (run_dir / "summary.json").exists() else \
        ("stopped" if code == 0 else "failed")
    return status, time.monotonic() - start


def submit_slurm(table: TableConfig, out: Path) -> None:
    """One Hydra multirun per row through the submitit launcher (seeds swept inside it)."""
    for row in table.rows:
        seeds = ",".join(str(s) for s in table.seeds)
        args = ([f"recipe={row.recipe}"] if row.recipe else []) + [*table.overrides, *row.overrides]
        cmd = [sys.executable, str(REPO / "cli.py"), "-m", "hydra/launcher=slurm", *args,
               f"seed={seeds}", f"hydra.sweep.dir={out / row.label}", "hydra.sweep.subdir=seed_${seed}",
               "train.progress=false"]
        print(f"submitting {row.label}: {' '.join(cmd[2:])}", flush=True)
        subprocess.run(cmd, cwd=REPO, check=False)


def gather(table: TableConfig, out: Path, status: dict[tuple[str, int], str]) -> list[dict[str, Any]]:
    """One record per row: mean/std over seeds of each metric, ratios, the paper's numbers."""
    records = []
    for row in table.rows:
        runs = []
        for seed in table.seeds:
            path = row_dir(out, row, seed) / "summary.json"
            if path.exists():
                runs.append(json.loads(path.read_text()))
        failed = [s for s in table.seeds if status.get((row.label, s)) == "failed"]
        rec: dict[str, Any] = {"label": row.label, "recipe": row.recipe or "", "seeds": len(runs),
                               "status": "ok" if len(runs) == len(table.seeds) else
                               ("failed" if failed else "missing"),
                               "log": str(row_dir(out, row, (failed or table.seeds)[0]) / "run.log")}
        for metric in METRICS:
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
    head = ["row", *METRICS, *(f"{m} vs {table.baseline}" for m in RATIOS if table.baseline),
            *(f"paper {m}" for m in table.paper_metrics), "paper source"]
    lines = [f"# {table.title or table.name}", ""]
    if table.description:
        lines += [table.description.strip(), ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for rec in records:
        if rec["status"] != "ok":
            cells = [rec["label"], f"**{rec['status']}** (log: {rec['log']})"] + [""] * (len(head) - 2)
        else:
            cells = [rec["label"], *(_fmt(rec[m], m, rec.get(f"{m}_std")) for m in METRICS)]
            if table.baseline:
                cells += [_fmt(rec[f"{m}_vs_base"], "ratio") + "x" if rec[f"{m}_vs_base"] else "-" for m in RATIOS]
            cells += [_fmt(rec.get(f"paper_{m}") if rec.get(f"paper_{m}") is not None else "not reported", m)
                      for m in table.paper_metrics]
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


def run_table(node: DictConfig, out: Path) -> int:
    """Run (or dry-run) the table; returns the exit code (non-zero if any row failed)."""
    table = load_table(node)
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(row, seed) for row in table.rows for seed in table.seeds]
    if table.dry_run:
        for row, seed in jobs:
            args = row_args(table, row, seed, row_dir(out, row, seed))
            print(f"{row.label} (seed {seed}): cli.py {' '.join(args)}")
            print(f"    {describe_row(args)}")
        return 0
    if table.launcher == "slurm" and not all((row_dir(out, r, s) / "summary.json").exists() for r, s in jobs):
        submit_slurm(table, out)
        print(f"submitted; run the same command again when the jobs are done to gather the table in {out}")
        return 0
    status: dict[tuple[str, int], str] = {}
    for i, (row, seed) in enumerate(jobs, 1):
        run_dir = row_dir(out, row, seed)
        if (run_dir / "summary.json").exists():
            status[(row.label, seed)] = "done"
            print(f"[{i}/{len(jobs)}] {row.label} seed {seed}: already complete", flush=True)
            continue
        verb = "resuming" if (run_dir / "checkpoints").exists() else "running"
        print(f"[{i}/{len(jobs)}] {row.label} seed {seed}: {verb} ({run_dir})", flush=True)
        state, seconds = run_row(row_args(table, row, seed, run_dir), run_dir, table.row_timeout_s)
        status[(row.label, seed)] = state
        print(f"[{i}/{len(jobs)}] {row.label} seed {seed}: {state} in {seconds:.0f} s"
              + (f" (log: {run_dir / 'run.log'})" if state != "done" else ""), flush=True)
    records = gather(table, out, status)
    markdown = render_markdown(table, records)
    (out / "table.md").write_text(markdown)
    write_csv(out / "table.csv", records)
    from engine.table_plots import draw_table_plots

    draw_table_plots(table, records, out)
    print(markdown)
    return 0 if all(r["status"] == "ok" for r in records) else 1
