"""Paper tables: rows run, gathered, resumed, dry-run, and failures reported."""
from __future__ import annotations

import csv
import json
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.support.cli_runs import REPO, run_cli, run_cli_here

FAST = "[launch.launcher=none, launch.nproc=1, train.max_steps=6, train.eval_every_steps=3]"


def write_table(folder: Path, name: str, rows: str, extra: str = "") -> list[str]:
    """A table config of these rows (`extra`: more of its keys, YAML lines) and the arguments that run it."""
    (folder / "table").mkdir(parents=True, exist_ok=True)
    (folder / "table" / f"{name}.yaml").write_text(
        f"# @package table\ndefaults: [_schema, _self_]\nname: {name}\nbaseline: a\noverrides: {FAST}\nplots: [accuracy, throughput]\n"
        # (a table refuses a dirty tree; these tests run on a developer's, whose table.md says so)
        f"allow_dirty: true\n{extra}"
        f"rows:\n{rows}")
    return [f"table={name}", f"hydra.searchpath=[file://{folder}]"]


ROWS = """  - {label: a, overrides: []}
  - {label: b, overrides: [optim.lr=0.05], paper: {test_acc: 0.99, source: Table 1}}
  - {label: c, overrides: [optim=adamw, optim.lr=0.003]}
"""


def read_csv(path: Path) -> dict[str, dict[str, str]]:
    with open(path) as fh:
        return {row["label"]: row for row in csv.DictReader(fh)}


#: a row whose run fails (its data set is missing): the table reports it and completes the others
BROKEN = "  - {label: broken, overrides: [data=cifar10, data.root=/nonexistent]}\n"


def test_table_runs_rows_and_csv_matches_summaries(cli_env: dict, tmp_path: Path) -> None:
    """Three rows and a failing one (one table run, not two, for CI's 30 minutes): the CSV matches
    each run's summary, the failed row is reported with its log and the table exits 1; every run
    and every job carries the checkout's commit (summary.json, jobs.jsonl, runs.csv) and table.md
    counts the jobs; a rerun runs only the rows without a result."""
    out = tmp_path / "out"
    args = write_table(tmp_path / "conf", "three", ROWS + BROKEN)
    proc = run_cli([*args, f"hydra.run.dir={out}"], cli_env)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = read_csv(out / "table.csv")
    assert list(rows) == ["a", "b", "c", "broken"]
    assert rows["broken"]["status"] == "failed" and all(rows[lbl]["status"] == "ok" for lbl in "abc")
    log = out / rows["broken"]["log"]  # (relative to the table's folder: no path of this machine, issue 88)
    assert not Path(rows["broken"]["log"]).is_absolute() and log.is_file() and "/nonexistent" in log.read_text()
    table_md = (out / "table.md").read_text()
    assert "failed" in table_md
    # provenance, per run and per job: tables refuse to mix commits in silence
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()
    for label in "abc":
        row = rows[label]
        (seed_dir,) = (out / label).glob("seed_*")  # the quick form reports the first of table.seeds only
        summary = json.loads((seed_dir / "summary.json").read_text())
        assert float(row["test_acc"]) == pytest.approx(summary["test_acc"])
        assert float(row["steps"]) == summary["steps"] == 6
        assert float(row["comm_bytes"]) == summary["comm_bytes"]
        assert summary["commit"] == head and isinstance(summary["dirty"], bool), summary
    assert float(rows["a"]["wall_s_vs_base"]) == pytest.approx(1.0)
    assert rows["b"]["paper_test_acc"] == "0.99" and rows["b"]["paper_source"] == "Table 1"
    assert "| b |" in table_md and "| b |" in proc.stdout
    assert (out / "accuracy.png").is_file() and (out / "throughput.png").is_file()
    jobs = [json.loads(line) for line in (out / "jobs.jsonl").read_text().splitlines()]
    assert len(jobs) == 4 and all(j["commit"] == head for j in jobs), jobs
    with open(out / "runs.csv") as fh:
        assert {r["commit"] for r in csv.DictReader(fh)} == {head}
    production = table_md.split("## Production", 1)[1]
    assert "ran 4 jobs (3 made a run; 1 ended without one" in production and "in 1 sitting" in production, production

    # an interrupted table (row c lost its result) runs only the missing row
    (out / "c" / "seed_0" / "summary.json").unlink()
    before = {lbl: (out / lbl / "seed_0" / "summary.json").stat().st_mtime for lbl in ("a", "b")}
    again = run_cli([*args, f"hydra.run.dir={out}"], cli_env)
    assert again.returncode == 1  # the broken row, run again, fails again
    assert again.stdout.count("already complete") == 2 and "c seed 0: " in again.stdout
    assert all((out / lbl / "seed_0" / "summary.json").stat().st_mtime == t for lbl, t in before.items())
    assert (out / "c" / "seed_0" / "summary.json").exists()


def test_dry_run_lists_rows_without_running(tmp_path: Path) -> None:
    out = tmp_path / "out"
    args = write_table(tmp_path / "conf", "three", ROWS)
    proc = run_cli_here([*args, "table.dry_run=true", f"hydra.run.dir={out}"])  # composes, starts nothing
    assert proc.returncode == 0
    assert proc.stdout.count("cli.py ") == 3 and "optim=adamw" in proc.stdout
    assert not (out / "a").exists()


#: tables of rows of runs; one that declares `claims:` projects papers' figures instead (tests/test_papers_time.py)
TABLES = sorted(p.stem for p in (Path(__file__).resolve().parent.parent / "recipes" / "tables").glob("*.yaml")
                if "\nclaims:" not in p.read_text())


#: tables that compare every registered method, each from its task's recipe folder
EVERY_METHOD = {"comm_cpu", "head_to_head_cpu", "comm_mnist1d_cpu", "comm_lm_cpu", "head_to_head_mnist1d_cpu",
                "head_to_head_lm_cpu"}


@contextmanager
def shipped_table(name: str, overrides: Sequence[str] = ()) -> Iterator[Any]:
    """The shipped table `name` (with `overrides` of its options) as cli.py loads it, inside Hydra's
    context over conf/, so that its rows can be composed (`compose_row`) in the block."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import cli  # registers the table schema
    from tables.config import load_table
    from tests.support.harness import CONF

    assert cli.register_schemas
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        yield load_table(compose(config_name="config", overrides=[f"table={name}", *overrides]).table)


@pytest.mark.parametrize("name", TABLES)
def test_every_shipped_table_composes_row_by_row(name: str, tmp_path: Path) -> None:
    """What `table.dry_run=true` does, in-process: every row's config composes and validates. A table
    that compares every method (EVERY_METHOD) has a row for each registered plugin, and each row's
    recipe trains the table's task (each row composed once for both: 3-17 s a table). A row under a
    second variant is its first variant's row with the variant's overrides in front, which no row
    overrides itself (`same_row_under_another_variant`): one row per further variant is composed, not
    every row again (45 s less of the 160 s of Hydra composition this test took, CI's 30 minutes)."""
    from dist_algos import list_algorithms
    from tables.runner import compose_row, describe_run
    from tables.config import row_args, row_dir

    assert EVERY_METHOD <= set(TABLES), f"not shipped: {sorted(EVERY_METHOD - set(TABLES))}"
    algos = set()
    with shipped_table(name) as table:
        composed_once: set[str] = set()  # the further variants composed on one row
        for row in table.rows:
            variant = same_row_under_another_variant(table, row)
            if variant in composed_once:
                continue
            if variant is not None:
                composed_once.add(variant)
            args = row_args(table, row, table.seeds[0], row_dir(tmp_path, row, table.seeds[0]))
            rc = compose_row(args)
            assert " on " in describe_run(rc), row.label
            assert row.paper.get("source") is not None or not row.paper, f"{row.label}: a paper number without its source"
            if name in EVERY_METHOD:
                assert_row_trains_the_task(table, row, rc)
                algos.add(rc.algo.name)
    if name in EVERY_METHOD:
        assert algos == set(list_algorithms())


def same_row_under_another_variant(table: Any, row: Any) -> str | None:
    """The variant of `row` when it is a row of the table's first variant under another one: its
    overrides are that row's with the other variant's in front (load_table), and none of its own sets
    a key of any variant (else composing the variant on one row would not stand for the others).
    None for a row of the first variant, a table without variants, or a row the first lacks."""
    if not table.variants:
        return None
    first, (base, _, variant) = next(iter(table.variants)), row.label.rpartition("@")
    keys = {o.lstrip("+").split("=")[0] for extra in table.variants.values() for o in extra}
    own = row.overrides[len(table.variants[variant]):]
    assert row.overrides[:len(table.variants[variant])] == table.variants[variant], row.label
    assert not keys & {o.lstrip("+").split("=")[0] for o in own}, f"{row.label} overrides its variant's keys"
    twin = next((r for r in table.rows if r.label == f"{base}@{first}"), None)
    if variant == first or twin is None:
        return None
    assert twin.overrides[len(table.variants[first]):] == own, (row.label, twin.label)
    assert replace(twin, label=row.label, overrides=row.overrides, baseline=row.baseline) == row, row.label
    return variant


def test_the_lm_control_row_trains_with_the_optimiser_of_the_rows_it_controls(tmp_path: Path) -> None:
    """head_to_head_lm_cpu's allreduce_sgd splits a momentum-SGD row's gap to allreduce into the
    algorithm's and the optimiser's only while the two rows share the optimiser: its section as
    composed, and the grid it is tuned over. A recipe that set its own lr or weight decay, or a row
    given another grid, would make the control compare two things at once again."""
    from tables.runner import compose_row
    from tables.config import row_args, row_dir, row_grid
    from engine.train.optim import lr_factor_fn

    STEPS_PER_EPOCH = 100  # only epoch-based schedule fields read it; the same for both rows
    with shipped_table("head_to_head_lm_cpu") as table:
        rows = {row.label: row for row in table.rows}  # one per row and variant: label@variant
        controlled = [a for a, b in table.comparisons if b == "allreduce_sgd"]
        assert sorted(controlled) == ["asgd", "dgc", "dgs", "gradient_dropping"]

        def optimiser(label: str) -> tuple[dict[str, Any], dict[str, list[Any]], str]:
            """The row's optimiser section as composed with the learning rate of every step of its
            schedule (what the schedule does, not its unused fields: a cosine has no milestones),
            its grid, and its algorithm."""
            row, seed = rows[label], table.seeds[0]
            rc = compose_row(row_args(table, row, seed, row_dir(tmp_path, row, seed)))
            factor = lr_factor_fn(rc.sched, rc.train.max_steps, STEPS_PER_EPOCH, rc.optim.lr)
            lrs = [rc.optim.lr * factor(step) for step in range(rc.train.max_steps)]
            return {**vars(rc.optim), "lr by step": lrs}, row_grid(table, row), rc.algo.name

        variants = sorted({label.split("@")[1] for label in rows if label.startswith("allreduce_sgd@")})
        assert variants == ["iid", "roles"]
        for variant in variants:
            control, control_grid, control_algo = optimiser(f"allreduce_sgd@{variant}")
            assert control_algo == "allreduce" and control["name"] == "sgd" and control["momentum"] > 0, control
            for name in controlled:
                section, grid, algo = optimiser(f"{name}@{variant}")
                assert algo == name
                differs = sorted(k for k in control if section[k] != control[k])
                assert not differs, f"{name}@{variant}: its optimiser differs from its control's in {differs}"
                assert grid == control_grid, f"{name}@{variant}: tuned over {grid}, its control over {control_grid}"


def test_per_row_baselines_time_to_target_and_speedup_plot(tmp_path: Path) -> None:
    """Rows compared with their own baseline (the same bandwidth), wall-clock to a target accuracy
    from the evaluations, and the speed-up plot against the rows' x: from written results, no runs."""
    from tables.config import RowConfig, TableConfig, row_dir
    from tables.plots import draw_table_plots
    from tables.render import NOT_REACHED, gather, render_markdown

    rows = [RowConfig(label=f"{algo}_{bw:g}", baseline=f"slow_{bw:g}", x=bw, series=algo)
            for bw in (100.0, 1000.0) for algo in ("slow", "fast")]
    table = TableConfig(name="t", rows=rows, target_acc=0.9, target_metric="test_acc", columns=["test_acc", "updates_per_s", "time_to_target_s"],
                        ratios=["updates_per_s"], plots=["speedup:updates_per_s", "wall"], x_label="Mbit/s")
    rate = {"slow_100": 10.0, "fast_100": 80.0, "slow_1000": 50.0, "fast_1000": 100.0}
    for row in rows:
        run = row_dir(tmp_path, row, 0)
        run.root.mkdir(parents=True)
        run.summary.write_text(json.dumps({"test_acc": 0.95, "updates_per_s": rate[row.label]}))
        reached = 0.95 if row.label != "slow_1000" else 0.5  # slow_1000 never reaches 0.9
        run.metrics.write_text("".join(json.dumps(r) + "\n" for r in [
            {"kind": "run", "step": 0, "network": {"bandwidth_mbit": row.x}},
            {"kind": "eval", "step": 5, "wall_s": 2.0, "test_acc": 0.5},
            {"kind": "eval", "step": 10, "wall_s": 4.0, "test_acc": reached}]))
    records = {r["label"]: r for r in gather(table, tmp_path, {})}
    assert records["fast_100"]["updates_per_s_vs_base"] == pytest.approx(8.0)
    assert records["fast_1000"]["updates_per_s_vs_base"] == pytest.approx(2.0)
    assert records["fast_100"]["time_to_target_s"] == 4.0 and records["slow_1000"]["time_to_target_s"] == NOT_REACHED
    markdown = render_markdown(table, list(records.values()))
    assert "| fast_100 | 0.9500 | 80 | 4.0 s | slow_100 | 8x |" in markdown, markdown
    made = draw_table_plots(table, list(records.values()), tmp_path)
    assert [p.name for p in made] == ["speedup_updates_per_s.png", "accuracy_wall.png"]


def test_interval_figure_colours_what_is_resolved_and_clips_bars_to_what_accuracy_can_take(tmp_path: Path) -> None:
    """The many-row figure: one panel per variant, rows resolved from the baseline in red (worse)
    or green (better), the rest grey; three seeds' t intervals run past 1 and below 0, which no
    accuracy can, so the bars stop there."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tables.config import TableConfig
    from tables.plot_levels import clipped_error, levels_figure as _intervals_figure

    assert clipped_error(0.98, 0.05) == pytest.approx((0.05, 0.02))
    assert clipped_error(0.03, 0.05) == pytest.approx((0.03, 0.05))
    assert clipped_error(0.5, None) == (0.0, 0.0)

    def rec(label: str, acc: float, diff: float, resolved: bool) -> dict:
        base = "a@" + label.partition("@")[2]
        return {"label": label, "baseline": base, "test_acc": acc, "test_acc_ci95": 0.05,
                "diff": diff, "diff_resolved": resolved}

    records = [rec("a@iid", 0.98, 0, False), rec("b@iid", 0.90, -0.08, True), rec("c@iid", 0.97, -0.01, False),
               rec("a@skew", 0.95, 0, False), rec("b@skew", 0.99, 0.04, True)]
    fig = _intervals_figure(plt, TableConfig(name="t", rows=[], seeds=[1, 2, 3]), records)
    colours = [[matplotlib.colors.to_hex(c.lines[0].get_color()) for c in ax.containers] for ax in fig.axes]
    names = [[t.get_text() for t in ax.get_yticklabels()] for ax in fig.axes]
    red, green, grey = (matplotlib.colors.to_hex(c) for c in ("tab:red", "tab:green", "tab:gray"))
    assert names == [["b", "c", "a"], ["a", "b"]]  # sorted by accuracy, within each variant
    assert colours == [[red, grey, "#000000"], ["#000000", green]]
    bars = fig.axes[0].containers[0].lines[2][0].get_segments()[0]  # row b: 0.90 +- 0.05
    assert [round(x, 6) for x in (bars[0][0], bars[1][0])] == [0.85, 0.95]
    top = fig.axes[1].containers[1].lines[2][0].get_segments()[0]  # row b@skew: 0.99 + 0.05, cut at 1
    assert round(top[1][0], 6) == 1.0
    plt.close(fig)


def assert_row_trains_the_task(table: Any, row: Any, rc: Any) -> None:
    """comm_cpu, head_to_head_cpu and their task forms compare every method: each registered
    plugin's row comes from its task's recipe, recipes/<folder>/<algo>.yaml (a missing one fails
    load_table with a line naming the file), and every row's recipe must train the table's task."""
    from tables.config import row_grid

    want = table.row_constraints or {"model": "small_cnn", "data": "digits", "epochs": 30, "global_batch": 128,
                                     "nproc": 4}
    fix = (f"{row.label}: its recipe recipes/{row.recipe}.yaml must train {want} "
           f"(msgd: 1 process at batch 128; parameter servers: rank 0 serves)")
    assert (rc.model["name"], rc.data.name) == (want["model"], want["data"]), fix
    # a run's length: its epochs, or its steps (a language model's recipes count steps)
    assert (rc.train.max_steps if "max_steps" in want else rc.train.epochs) == want.get(
        "max_steps", want.get("epochs")), fix
    assert rc.launch.nproc == (1 if rc.algo.name == "msgd" else want["nproc"]), fix
    assert rc.train.batch_size * rc.launch.nproc == want["global_batch"], fix  # 4 x 32, or msgd's 1 x 128
    # a tuned row's grid is around its recipe's own learning rate (AdamW at 3e-3 tuned over
    # 0.03-0.3 was compared at the wrong scale: head_to_head_cpu's first tuning runs)
    lrs = row_grid(table, row).get("optim.lr")
    assert lrs is None or min(lrs) <= rc.optim.lr <= max(lrs), (
        f"{row.label}: its grid {lrs} does not contain its recipe's optim.lr={rc.optim.lr}; give the row "
        "its own tune: {optim.lr: [...]} around it")


def test_pareto_front_keeps_the_rows_no_other_beats_on_both() -> None:
    from tables.plot_levels import pareto_front

    points = [(10.0, 0.99), (1.0, 0.95), (5.0, 0.99), (0.0, 0.90), (5.0, 0.97), (20.0, 0.995), (30.0, 0.99)]
    assert pareto_front(points) == [3, 1, 2, 5]  # by increasing cost; (10, 0.99) ties (5, 0.99) at more cost
    assert pareto_front([]) == []


def test_head_to_head_quick_form_runs_end_to_end(cli_env: dict, tmp_path: Path) -> None:
    """`table=head_to_head_cpu table.quick=true`, cut to fit CI's 30 minutes (165 s of it before):
    two of its three rows (allreduce and DGC, whose parameter server counts only its workers'
    samples) on both partitions, 4 workers at batch 32 (the same global batch as the table's 8 at
    16), one seed, no tuning, every row ended by the same sample budget (2,000 here, 6,000 in the
    quick form). A rerun that skips finished rows is tested with the small table above."""
    out = tmp_path / "quick"
    args = ["table=head_to_head_cpu", "table.quick=true", "table.quick_rows=[allreduce,dgc]", "table.allow_dirty=true",
            "table.quick_overrides=['train.epochs=2','train.budget_samples=2000','launch.nproc=4','launch.launcher=fork','train.batch_size=32']", f"hydra.run.dir={out}"]
    proc = run_cli(args, cli_env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = read_csv(out / "table.csv")
    assert sorted(rows) == sorted(f"{a}@{v}" for a in ("allreduce", "dgc") for v in ("iid", "dir0.1"))
    for label in rows:
        (seed_dir,) = (out / label).glob("seed_*")  # the quick form reports the first of table.seeds only
        summary = json.loads((seed_dir / "summary.json").read_text())
        assert summary["stop_reason"] == "budget_samples" and summary["budget"]["samples"] == 2000, label
        per_step = summary["spent"]["samples"] / summary["steps"]
        assert 2000 <= summary["spent"]["samples"] < 2000 + per_step, label  # the first step past the budget
        assert "val_acc" in summary and not (out / label / "tune").exists(), label
    assert rows["dgc@dir0.1"]["baseline"] == "allreduce@dir0.1"
    assert all((out / f"{plot}.png").is_file() for plot in ("intervals", "pareto", "accuracy"))
    jobs = [json.loads(line) for line in (out / "jobs.jsonl").read_text().splitlines()]
    assert len(jobs) == 4 and all(len(j["load_before"]) == 3 and j["status"] == "done" for j in jobs), jobs


def test_a_long_table_says_how_long_it_has_left(tmp_path: Path, monkeypatch: Any, capsys: Any) -> None:
    """Three jobs, the first already complete: after each run the runner prints the runs left in
    the phase and the time they should take (a table here runs for a day)."""
    from core.provenance import CodeVersion
    from core.rundir import RunDir
    from tables import runner

    clean = CodeVersion("a" * 40, False, ())
    monkeypatch.setattr(runner, "code_version", lambda ignore=(): clean)
    runs = [RunDir(tmp_path / f"job{i}") for i in range(3)]
    runs[0].root.mkdir(parents=True)
    runs[0].summary.write_text("{}")
    seconds = iter([600.0, 1200.0])

    def run_row(args: list[str], run_dir: Any, timeout: Any, *_: Any) -> tuple[str, float]:
        run_dir.root.mkdir(parents=True)
        run_dir.summary.write_text("{}")
        return "done", next(seconds)

    monkeypatch.setattr(runner, "run_row", run_row)
    status = runner._run_jobs(SimpleNamespace(row_timeout_s=None), [(f"job{i}", [], r) for i, r in enumerate(runs)], "tune")
    assert status == {"job0": "done", "job1": "done", "job2": "done"}
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("already complete")
    assert lines[2].endswith("done in 600 s; 1 run left in this phase (tune), about 10 min by the runs like them so far")
    assert lines[4].endswith("done in 1200 s")  # nothing left: no estimate


def test_time_left_estimates_each_run_from_the_made_runs_most_like_it(tmp_path: Path) -> None:
    """A workers table's runs differ twentyfold in length with the worker count: each remaining run
    is estimated from the same label, else the same row under another variant, else the same worker
    count, else every made run; a run paused and resumed counts its pieces together, a failed or
    stopped job is no estimate. (The plain mean of the made runs would say 5 x 625 s.)"""
    from tables.jobs import read_jobs
    from tables.time_left import estimate_seconds, made_runs, time_left_text

    lines = [("a.w4@iid seed 0", "done", 100.0), ("a.w64@iid seed 0", "stopped", 300.0),
             ("a.w64@iid seed 0", "done", 600.0), ("a.w64@iid seed 1", "done", 1100.0),
             ("b.w64@iid seed 0", "done", 400.0), ("b.w64@iid seed 1", "failed", 5.0)]
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text("".join(json.dumps({"phase": "rows", "job": j, "status": st, "seconds": sec, "ended": 1.0e9})
                            + "\n" for j, st, sec in lines) + "{cut by a kill\n")
    made = made_runs(read_jobs(jobs)[0])
    assert made == {"a.w4@iid seed 0": 100.0, "a.w64@iid seed 0": 900.0, "a.w64@iid seed 1": 1100.0,
                    "b.w64@iid seed 0": 400.0}
    remaining = ["a.w64@iid seed 2",          # its own label: (900 + 1100) / 2
                 "a.w64@dir0.1 seed 0",       # its row under IID: 1000
                 "c.w64@iid seed 0",          # the runs at 64 workers: (900 + 1100 + 400) / 3
                 "c.w4@iid optim.lr=0.1 seed 0",  # a tuning run at 4 workers: 100
                 "d@iid seed 0"]              # nothing like it: all four made runs, 625
    assert estimate_seconds(remaining, made) == pytest.approx(1000 + 1000 + 800 + 100 + 625)
    assert estimate_seconds(remaining, {}) is None
    assert time_left_text(remaining, made, "rows") == "; 5 runs left in this phase (rows), about 59 min by the runs like them so far"
    assert time_left_text([], made, "rows") == ""
