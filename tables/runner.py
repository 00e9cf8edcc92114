"""Paper tables by one command: `python cli.py table=NAME hydra.run.dir=DIR`.

A table config (recipes/tables/NAME.yaml, the `table` config group) lists rows, each a recipe
plus overrides and a label, the baseline row that ratios refer to, the seeds, and the paper's
published numbers for each row with their source. Each row x seed runs as its own cli.py job in
`DIR/<label>/seed_<s>/`, one after another: a run directory that already holds summary.json is
not run again, an interrupted one resumes (cli.py's resume=auto), a failed one is reported as
failed with its log while the others still run. A tuned row first runs its grid on the tuning
seeds (`DIR/<label>/tune/<setting>/seed_<s>/`, tables/tuning.py) and then its chosen
setting on the table's seeds. Then the summaries are gathered into `DIR/table.md` (also printed),
`DIR/table.csv` and `DIR/runs.csv` (per seed), and the plots are drawn.

A table refuses to start on a dirty tree and flags runs made at other commits
(tables/provenance.py); every job's line in `DIR/jobs.jsonl` carries the commit it started at.

With `table.launcher=slurm`, rows are submitted as Hydra multiruns through the submitit launcher
instead; running the same command again once they are done gathers the table.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Optional

from hydra import compose
from omegaconf import DictConfig

from core.errors import UserError
from core.machine import machine_record
from core.provenance import OUTPUT_FOLDERS_ENV, code_version
from core.rundir import RunDir
from core.user_paths import check_creatable
from data.sets import DATASETS
from engine.config import RunConfig, load_run_config
from tables.cross_task import across_lines, read_verdicts
from tables.compare import n_examples
from tables.config import (RowConfig, SplitSeeds, TableConfig, TableLauncher, headline, load_table, row_args,
                           row_dir, row_grid)
from tables.plots import draw_table_plots
from tables.frontier_files import with_frontier
from tables.projected_files import with_projected
from tables.papers_time import run_papers_time
from tables.jobs import JOBS_FILE, JobRecord, production_lines, read_jobs
from tables.machines import machine_lines
from tables.provenance import check_tree, mixed_notice, provenance_lines, table_folders
from tables.render import collect, render_markdown, write_csv
from tables.run_records import FolderRecords, RunsAt, records_of
from tables.runs import EVALUATED_ON, read_runs, row_rel, split_fact, unit_name, write_runs_csv
from tables.runs_csv import RECORD_PLOTS, CsvRecords, carried_tuning
from tables.store import (append_job, carry_if_missing, check_store, claim_folder, gather_view, restore, save_run,
                                 store_identity, store_path)
from tables.time_left import made_runs, time_left_text
from tables.tuning import Setting, Tuned, setting_overrides, stale_setting
from tables.tuning_runs import (chosen, tune_policy, tuned_so_far, tuning_grid, tuning_jobs, tuning_seeds,
                                tuning_summaries)

__all__ = ["chosen", "compose_row", "describe_run", "run_table", "set_aside_if_stale", "tune_policy", "tuning_grid",
           "tuning_jobs", "tuning_seeds"]

REPO = Path(__file__).resolve().parents[1]


def compose_row(args: list[str]) -> RunConfig:
    """A run's validated config from its cli.py arguments (`row_args`; the hydra.* ones are the
    launch's, not the config's); a mistake raises UserError naming the problem."""
    return load_run_config(compose(config_name="config", overrides=[a for a in args if not a.startswith("hydra.")]))


def describe_row(args: list[str]) -> str:
    """Compose and validate a row's config; one line."""
    return describe_run(compose_row(args))


def describe_run(rc: RunConfig) -> str:
    """A composed run in one line (the dry run's line for a row), apart from composing it, so that a
    caller holding the config (the tests of every shipped table) does not compose it twice."""
    return (f"{rc.algo.name} | {rc.model['name']} on {rc.data.name} ({rc.data.pipeline}) | "
            f"{rc.launch.nproc} ranks/node | batch {rc.train.global_batch_size or rc.train.batch_size}"
            f"{' global' if rc.train.global_batch_size else '/rank'} | {rc.optim.name} lr {rc.optim.lr:g} | "
            f"{rc.sched.name} | {rc.train.max_steps or rc.train.epochs} {'steps' if rc.train.max_steps else 'epochs'}")


def per_seed_options(table: TableConfig, out: Path) -> TableConfig:
    """`table.split_seeds=per_seed`: every row's runs set the data options its data set redraws with
    a seed (`DataSet.split_redraw_options`: MNIST-1D's generator and validation carve-out, the corpus's
    held-out blocks, digits' test split) to the run's seed, so that each seed is evaluated on test
    data of its own and two rows at one seed on the same (they stay paired). Refused in one line
    for a data set whose test set is fixed, and for a row that sets one of those options itself
    (the seed would silently replace it)."""
    if table.split_seeds != SplitSeeds.per_seed:
        return table
    rows = []
    for row in table.rows:
        args = row_args(table, row, table.seeds[0], row_dir(out, row, table.seeds[0]))
        name = compose_row(args).data.name
        redrawn = DATASETS.get(name).split_redraw_options
        if not redrawn:
            raise UserError(f"table.split_seeds=per_seed: row {row.label} trains on data={name}, whose test set is "
                            f"fixed; use table.split_seeds=per_table for it (sets that redraw: "
                            f"{', '.join(n for n, s in DATASETS.items() if s.split_redraw_options)})")
        keys = [f"data.{k}" for k in redrawn]
        clash = [a for a in [*table.overrides, *row.overrides] if a.lstrip("+").split("=")[0] in keys]
        if clash:
            raise UserError(f"table.split_seeds=per_seed sets {', '.join(keys)} to each run's seed, and row "
                            f"{row.label} sets {clash[0]}; remove it or use table.split_seeds=per_table")
        rows.append(replace(row, seed_options=[*row.seed_options, *keys]))
    check_seeded_runs(out)
    return replace(table, rows=rows)


def check_seeded_runs(out: Path) -> None:
    """A finished run in `out` (reported or tuning: `.../seed_<s>/summary.json`) that a per-seed
    table would reuse must have been evaluated on its seed's data; one made for one shared test set
    (the same folder run before with table.split_seeds=per_table) is refused in one line, never
    mixed in."""
    records = FolderRecords(out)
    for rel in records.runs():
        if not Path(rel).name.startswith("seed_"):
            continue
        seed = Path(rel).name.removeprefix("seed_")
        recorded = records.summary(rel) or {}
        wrong = [f"data.{key}={value}" for key in EVALUATED_ON
                 if (value := split_fact(recorded, key)) is not None and str(value) != seed]
        if wrong:
            raise UserError(f"table.split_seeds=per_seed: {out / rel} was evaluated with {wrong[0]}, not its "
                            f"seed {seed} (made with one test set for every seed); use another hydra.run.dir or "
                            f"move that run away")


def job_env(output_folders: Sequence[Path]) -> dict[str, str]:
    """A table job's environment: this one, with the table's run folder and store named as not
    dirt to the job's provenance (core/provenance.py), however the job is started."""
    return {**os.environ, OUTPUT_FOLDERS_ENV: os.pathsep.join(map(str, output_folders))}


def run_row(args: list[str], run_dir: RunDir, timeout: Optional[float],
            output_folders: Sequence[Path] = ()) -> tuple[str, float]:
    """Run one row as a cli.py job; returns (status, seconds). Output goes to the row's run.log.
    `output_folders` (the table's run folder and store) are not dirt to the run's provenance."""
    run_dir.root.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(run_dir.job_log, "a") as log:
        log.write(f"\n$ cli.py {' '.join(args)}\n")
        log.flush()
        try:
            proc = subprocess.run([sys.executable, str(REPO / "cli.py"), *args, "train.progress=false"],
                                  stdout=log, stderr=subprocess.STDOUT, cwd=REPO, timeout=timeout,
                                  env=job_env(output_folders))
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
        subprocess.run(cmd, cwd=REPO, check=False, env=job_env(table_folders(table, out)))


def _log_job(table: TableConfig, out: Path, record: dict[str, object]) -> None:
    """DIR/jobs.jsonl: one line per job run here, with the machine's load average before and after
    it, so that a table's wall-clock columns can be read against what else the machine was doing
    (and in table.store, where there is one)."""
    line = json.dumps(record)
    with open(out / JOBS_FILE, "a") as fh:
        fh.write(line + "\n")
    if table.store:
        append_job(store_path(table), line)


def _run_jobs(table: TableConfig, jobs: list[tuple[str, list[str], RunDir]], phase: str,
              out: Optional[Path] = None) -> dict[str, str]:
    """Run each (name, args, run directory) not already complete; returns status by name. The
    tree is checked again before each job: one edited while the table runs stops it there."""
    status: dict[str, str] = {}
    records = read_jobs(out / JOBS_FILE)[0] if out is not None else []  # for the time-left estimate
    to_make = [not r.summary.exists() for _, _, r in jobs]  # as at the start: for the runs-left count
    output_folders = table_folders(table, out) if out is not None else []  # not dirt to the runs' provenance
    for i, (name, args, run_dir) in enumerate(jobs, 1):
        tag = f"[{phase} {i}/{len(jobs)}] {name}"
        if run_dir.summary.exists():
            status[name] = "done"
            carried = out is not None and table.store and carry_if_missing(store_path(table), out, run_dir.root)
            print(f"{tag}: already complete" + (" (carried into table.store now: its runner stopped before)"
                                                if carried else ""), flush=True)
            continue
        version = check_tree(table, out) if out is not None else code_version()
        verb = "resuming" if run_dir.checkpoints.exists() else "running"
        print(f"{tag}: {verb} ({run_dir.root})", flush=True)
        load_before = os.getloadavg()
        state, seconds = run_row(args, run_dir, table.row_timeout_s, output_folders)
        status[name] = state
        record = JobRecord(name, phase, state, round(seconds, 1), time.time(), ())
        records.append(record)
        if out is not None:
            if table.store and state == "done":
                save_run(store_path(table), out, run_dir.root)
            _log_job(table, out, {"phase": phase, "job": name, "status": state, "seconds": record.seconds,
                           "load_before": [round(v, 2) for v in load_before],
                           "load_after": [round(v, 2) for v in os.getloadavg()], "ended": record.ended,
                           "commit": version.commit, "dirty": version.dirty, "machine": machine_record()})
        remaining = [n for (n, _, _), make in zip(jobs[i:], to_make[i:]) if make]
        print(f"{tag}: {state} in {seconds:.0f} s" + (f" (log: {run_dir.job_log})" if state != "done" else "")
              + time_left_text(remaining, made_runs(records), phase), flush=True)
    return status


def final_jobs(table: TableConfig, out: Path, tuned: dict[str, Tuned]) -> list[tuple[RowConfig, int, list[str]]]:
    """(row, seed, arguments) of the reported runs; a tuned row without a winner has none."""
    jobs = []
    for row in table.rows:
        setting: list[str] = []
        if row.label in tuned:
            if tuned[row.label].winner is None:
                continue
            setting = setting_overrides(tuned[row.label].winner)
        jobs += [(row, seed, row_args(table, row, seed, row_dir(out, row, seed), setting)) for seed in table.seeds]
    return jobs


def set_aside_if_stale(run_dir: RunDir, setting: Setting) -> None:
    """Move a reported run made with another setting to `<dir>.stale-<k>` (kept, not overwritten),
    so that the chosen setting runs there; one line saying so."""
    why = stale_setting(run_dir, setting)
    if why is None:
        return
    k = 1
    while run_dir.root.with_name(f"{run_dir.root.name}.stale-{k}").exists():
        k += 1
    target = run_dir.root.with_name(f"{run_dir.root.name}.stale-{k}")
    run_dir.root.rename(target)
    print(f"{run_dir.root}: made with {why}; moved to {target.name} and run again", flush=True)


def _pending(table: TableConfig, out: Path) -> bool:
    """Whether any tuning or reported run of the table is still to be made (as far as known now)."""
    return any(not run_dir.summary.exists() for _, _, run_dir in tuning_jobs(table, out)) or \
        any(not row_dir(out, row, seed).summary.exists() for row in table.rows for seed in table.seeds)


def made_so_far(table: TableConfig, out: RunsAt) -> tuple[TableConfig, list[str]]:
    """table.gather_only: the table cut to the rows whose every seed is made (its comparisons, the
    Holm family and the plots are those rows'), and table.md's lines saying what is left out; none
    when every run is made, so that gathering a finished store gives the finished table, not a
    "Partial" one with the same rows and corrections."""
    records = records_of(out)
    made = {r.label: sum(records.has(row_rel(r, s)) for s in table.seeds) for r in table.rows}
    n = len(table.seeds)
    done = [r for r in table.rows if made[r.label] == n]
    if len(done) == len(table.rows):
        return table, []
    started = [f"{label} ({k} of {n})" for label, k in made.items() if 0 < k < n]
    left = [label for label, k in made.items() if k == 0]
    lines = [f"**Partial** (table.gather_only=true): {sum(made.values())} of {len(table.rows) * n} reported runs "
             f"made; {len(done)} of {len(table.rows)} rows have every seed and are shown. Their comparisons are "
             f"Holm-corrected among themselves only, so the finished table's corrections will be stricter.", ""]
    if started:
        lines += [f"Rows with some seeds made (not shown): {', '.join(started)}.", ""]
    if left:
        lines += [f"Rows not yet started ({len(left)}): {', '.join(left)}.", ""]
    return replace(table, rows=done), lines


def run_table(node: DictConfig, out: Path, cluster: Optional[Any] = None) -> int:
    """Run (or dry-run) the table; returns the exit code (non-zero if any row failed). `cluster`: the
    command's `cluster=NAME`, onto which the gather projects time to quality (tables/projected_files.py)."""
    if node.get("claims") is not None:  # papers' figures projected, not rows of runs (tables/papers_time.py)
        return run_papers_time(node, out)
    table = per_seed_options(load_table(node), out)
    if not table.dry_run:  # before anything is written: a store or run folder of another table is refused
        if table.store:
            check_creatable(store_path(table), "table.store", "give table.store=PATH, a folder this user can write")
            check_store(store_path(table), store_identity(table))
        claim_folder(out, store_identity(table), {row.label for row in table.rows})
    out.mkdir(parents=True, exist_ok=True)
    runs_at: RunsAt = out  # where the table's finished runs are read (a gather reads its store where it is)
    if table.runs_csv and not table.dry_run:
        return rerender(table, out)
    if table.store and not table.dry_run and table.gather_only:
        runs_at = gather_view(store_path(table), out, store_identity(table))
        print(f"table {table.name}: reading the finished runs of table.store {store_path(table)} where they are "
              f"({len(runs_at.runs())} with the run folder's own)", flush=True)
    elif table.store and not table.dry_run:
        put_back = restore(store_path(table), out, store_identity(table))
        print(f"table {table.name}: {put_back} finished run{'s' * (put_back != 1)} put back from table.store "
              f"{store_path(table)}", flush=True)
    if not table.dry_run:
        # a run still to make is refused on a dirty tree now, before any starts; a table whose runs
        # are all there only gathers (table.md says which tree it was gathered on)
        version = check_tree(table, out) if not table.gather_only and _pending(table, out) \
            else code_version(ignore=table_folders(table, out))
        notice = mixed_notice(table, read_runs(table, runs_at), version)
        if notice:
            print(notice, flush=True)
    if table.dry_run:
        for name, args, _ in tuning_jobs(table, out):
            print(f"{name} (tuning): cli.py {' '.join(args)}")
            print(f"    {describe_row(args)}")
        for row, seed, args in final_jobs(table, out, {}):
            grid = row_grid(table, row)
            print(f"{row.label} (seed {seed}): cli.py {' '.join(args)}"
                  + (f" + the setting of {grid} best on {table.select_metric}" if grid else ""))
            print(f"    {describe_row(args)}")
        return 0
    jobs = [(row, seed) for row in table.rows for seed in table.seeds]
    if table.launcher == TableLauncher.slurm and not all(row_dir(out, r, s).summary.exists() for r, s in jobs):
        if any(row_grid(table, r) for r in table.rows):
            raise UserError(f"table {table.name}: tuning grids run with table.launcher=local only")
        submit_slurm(table, out)
        print(f"submitted; run the same command again when the jobs are done to gather the table in {out}")
        return 0
    if table.gather_only:
        shown, partial = made_so_far(table, runs_at)
        tuned, tuning = tuned_so_far(table, shown, runs_at) if partial else (chosen(table, runs_at), [])
        return write_table(shown, out, {(row.label, seed): "done" for row, seed, _ in final_jobs(shown, out, tuned)},
                           tuned, [], partial + tuning, runs_at, cluster=cluster)
    tune_status: dict[str, str] = {}
    while True:  # a grid extended beyond a winning edge adds jobs; run until none is new
        new = [job for job in tuning_jobs(table, out) if job[0] not in tune_status]
        if not new:
            break
        tune_status.update(_run_jobs(table, new, "tune", out))
    tuned = chosen(table, out)
    finals = final_jobs(table, out, tuned)
    for row, seed, _ in finals:  # a reported run made with another setting (the choice changed) is set aside
        if row.label in tuned and tuned[row.label].winner is not None:
            set_aside_if_stale(row_dir(out, row, seed), tuned[row.label].winner)
    by_name = _run_jobs(table, [(f"{row.label} seed {seed}", args, row_dir(out, row, seed))
                                for row, seed, args in finals], "rows", out)
    status = {(row.label, seed): by_name[f"{row.label} seed {seed}"] for row, seed, _ in finals}
    for label, result in tuned.items():  # a row whose grid could not choose: failed
        if result.winner is None:
            status.update({(label, s): "failed" for s in table.seeds})
            print(f"{label}: no setting of its grid has {table.select_metric} on every tuning seed (failed runs, "
                  f"or no validation split: data.val_fraction=0); the row is not run", flush=True)
    failed_tuning = [name for name, state in tune_status.items() if state != "done"]
    return write_table(table, out, status, tuned, failed_tuning, [], cluster=cluster)


def rerender(table: TableConfig, out: Path) -> int:
    """`table.runs_csv`: the table gathered from a published runs.csv under today's rules
    (tables/runs_csv.py): its jobs.jsonl beside it, each tuned row's setting from its table.csv, the
    figures drawn from records alone."""
    path = REPO / str(table.runs_csv)
    runs_at = CsvRecords(path)
    if (path.parent / JOBS_FILE).is_file():
        shutil.copyfile(path.parent / JOBS_FILE, out / JOBS_FILE)
    shown, partial = made_so_far(table, runs_at)
    carried = carried_tuning(path)
    note = [f"Re-rendered from {path.parent.name}/runs.csv (table.runs_csv) under the rules of issue 88: runs.csv "
            f"holds each reported run's facts and final values, not the tuning runs nor any curve, so each tuned "
            f"row keeps the setting its table.csv names (its grid is in the original table.md, in git) and only "
            f"the figures drawn from final values are redrawn.", ""]
    plots = [p for p in shown.plots if p in RECORD_PLOTS or p.startswith("speedup:")]
    status = {(r.label, s): "done" for r in shown.rows for s in shown.seeds}
    return write_table(replace(shown, plots=plots), out, status, {}, [], partial, runs_at, carried, note)


def write_table(table: TableConfig, out: Path, status: dict[tuple[str, int], str], tuned: dict[str, Tuned],
                failed_tuning: list[str], partial: list[str], runs_at: Optional[RunsAt] = None,
                carried: Optional[dict[str, dict[str, Any]]] = None, preface: Optional[list[str]] = None,
                cluster: Optional[Any] = None) -> int:
    """Gather the runs into table.md (also printed), table.csv, runs.csv and the plots; returns the
    exit code (non-zero if any row is not complete). `partial`: table.gather_only's lines; `runs_at`:
    where the runs are read (default: `out`; a gather's: its store too, tables/store.py)."""
    runs_at = out if runs_at is None else runs_at
    gathered = collect(table, out, status, tuned, runs_at)
    for rec in gathered.records:  # (a re-render's tuned rows: their table.csv's setting)
        rec.update((carried or {}).get(rec["label"], {}))
    version = code_version(ignore=table_folders(table, out))  # the commit the table is gathered at (it may have moved)
    n_test = n_examples(table, gathered.runs, [r.label for r in table.rows], table.compare_metric)
    tuning_runs = tuning_summaries(table, runs_at, tuned)
    finished = sum(len(by_seed) for found in (gathered.runs, tuning_runs) for by_seed in found.values())
    against = (across_lines(table.compare_metric, read_verdicts(gathered.records, headline(table).better)[0],
                            table.compare_with) if table.compare_with else None)
    mixed = [c.machines for c in gathered.family.comparisons if c.machines]
    markdown = render_markdown(table, gathered.records, tuned, failed_tuning, gathered.family,
                               provenance_lines(table, version, gathered.runs, tuning_runs)
                               + machine_lines(gathered.runs, mixed, tuning_runs)
                               + production_lines(out / JOBS_FILE, finished),
                               n_test, partial, against, unit_name(gathered.runs), preface)
    markdown = with_projected(markdown, table, out, runs_at, cluster)  # (no cluster named: unchanged)
    markdown = with_frontier(markdown, table, out, gathered.records, gathered.runs)  # (no `frontier` plot: unchanged)
    (out / "table.md").write_text(markdown)
    write_csv(out / "table.csv", gathered.records)
    write_runs_csv(out / "runs.csv", table, gathered.runs)
    draw_table_plots(table, gathered.records, out, runs_at)
    print(markdown)
    return 0 if all(r["status"] == "ok" for r in gathered.records) else 1
