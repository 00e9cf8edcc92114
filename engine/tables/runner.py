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

import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from hydra import compose
from omegaconf import DictConfig

from core.rundir import RunDir
from engine.config import load_run_config
from engine.tables.config import TableConfig, TableLauncher, load_table, row_args, row_dir
from engine.tables.plots import draw_table_plots
from engine.tables.render import gather, render_markdown, write_csv

REPO = Path(__file__).resolve().parents[2]


def describe_row(args: list[str]) -> str:
    """Compose and validate a row's config (raises UserError naming the problem); one line."""
    cfg = compose(config_name="config", overrides=[a for a in args if not a.startswith("hydra.")])
    rc = load_run_config(cfg)
    return (f"{rc.algo.name} | {rc.model['name']} on {rc.data.name} ({rc.data.pipeline}) | "
            f"{rc.launch.nproc} ranks/node | batch {rc.train.global_batch_size or rc.train.batch_size}"
            f"{' global' if rc.train.global_batch_size else '/rank'} | {rc.optim.name} lr {rc.optim.lr:g} | "
            f"{rc.sched.name} | {rc.train.max_steps or rc.train.epochs} {'steps' if rc.train.max_steps else 'epochs'}")


def run_row(args: list[str], run_dir: RunDir, timeout: Optional[float]) -> tuple[str, float]:
    """Run one row as a cli.py job; returns (status, seconds). Output goes to the row's run.log."""
    run_dir.root.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(run_dir.row_log, "a") as log:
        log.write(f"\n$ cli.py {' '.join(args)}\n")
        log.flush()
        try:
            proc = subprocess.run([sys.executable, str(REPO / "cli.py"), *args, "train.progress=false"],
                                  stdout=log, stderr=subprocess.STDOUT, cwd=REPO, timeout=timeout)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            code = -1
    status = "done" if code == 0 and run_dir.summary.exists() else \
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
    if table.launcher == TableLauncher.slurm and not all(row_dir(out, r, s).summary.exists() for r, s in jobs):
        submit_slurm(table, out)
        print(f"submitted; run the same command again when the jobs are done to gather the table in {out}")
        return 0
    status: dict[tuple[str, int], str] = {}
    for i, (row, seed) in enumerate(jobs, 1):
        run_dir = row_dir(out, row, seed)
        if run_dir.summary.exists():
            status[(row.label, seed)] = "done"
            print(f"[{i}/{len(jobs)}] {row.label} seed {seed}: already complete", flush=True)
            continue
        verb = "resuming" if run_dir.checkpoints.exists() else "running"
        print(f"[{i}/{len(jobs)}] {row.label} seed {seed}: {verb} ({run_dir.root})", flush=True)
        state, seconds = run_row(row_args(table, row, seed, run_dir), run_dir, table.row_timeout_s)
        status[(row.label, seed)] = state
        print(f"[{i}/{len(jobs)}] {row.label} seed {seed}: {state} in {seconds:.0f} s"
              + (f" (log: {run_dir.row_log})" if state != "done" else ""), flush=True)
    records = gather(table, out, status)
    markdown = render_markdown(table, records)
    (out / "table.md").write_text(markdown)
    write_csv(out / "table.csv", records)
    draw_table_plots(table, records, out)
    print(markdown)
    return 0 if all(r["status"] == "ok" for r in records) else 1
