"""The evidence a table gives (issue 34), from written result files unless said otherwise: provenance
(commit, dirty tree, mixed commits), the table store carried between machines, gathers, the run
folder's claim and the production record."""

import calendar
import csv
import json
import math
import os
import statistics
import subprocess
from pathlib import Path
from typing import Any, Optional

import pytest
from omegaconf import OmegaConf
from scipy import stats as st

from core.errors import UserError
from tests.support.table_files import (N_TEST, images, read_csv, reported, run_summary, table_node, write_run,
                                      write_tuning_run)


# --- provenance -----------------------------------------------------------------------------------

def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def test_the_code_version_probe_sees_commits_edits_and_untracked_files(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from core.provenance import OUTPUT_FOLDERS_ENV, code_version

    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.py").write_text("x = 1\n")
    _git(repo, "add", "a.py")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    clean = code_version(repo)
    assert clean.commit == _git(repo, "rev-parse", "HEAD").strip() and clean.dirty is False
    (repo / "a.py").write_text("x = 2\n")
    assert code_version(repo).dirty and code_version(repo).changed == ("a.py",)
    _git(repo, "checkout", "-q", "a.py")
    (repo / "out" / "row").mkdir(parents=True)
    (repo / "out" / "row" / "summary.json").write_text("{}")  # a table's own folder inside the checkout
    assert code_version(repo).dirty and not code_version(repo, ignore=[repo / "out"]).dirty
    # a table's runs are told its folders (run folder, store) through the environment: a run then
    # records the dirty flag its table's jobs.jsonl does, not one raised by the table's own output
    monkeypatch.setenv(OUTPUT_FOLDERS_ENV, os.pathsep.join([str(tmp_path / "elsewhere"), str(repo / "out")]))
    assert not code_version(repo).dirty
    (repo / "b.py").write_text("y = 1\n")
    assert code_version(repo).changed == ("b.py",)
    monkeypatch.delenv(OUTPUT_FOLDERS_ENV)
    assert code_version(tmp_path / "not_a_repo") .commit is None


def test_a_dirty_tree_refuses_a_table_in_one_line(tmp_path: Path, monkeypatch: Any) -> None:
    """A run still to make on a tree with uncommitted changes: one line naming the override, and
    nothing started; with table.allow_dirty=true the table goes on and table.md says so."""
    from core.provenance import CodeVersion
    from tables import runner
    from tables import provenance

    dirty = CodeVersion("b" * 40, True, ("engine/x.py", "recipes/new.yaml"))
    monkeypatch.setattr(provenance, "code_version", lambda ignore=(): dirty)
    monkeypatch.setattr(runner, "code_version", lambda ignore=(): dirty)
    started = []
    monkeypatch.setattr(runner, "run_row", lambda *a, **k: started.append(a) or ("failed", 0.0))
    reported(tmp_path, "base", [0.9, 0.91, 0.92])  # row b has no runs yet
    with pytest.raises(UserError) as err:
        runner.run_table(table_node([{"label": "base"}, {"label": "b"}]), tmp_path)
    line = str(err.value)
    assert "\n" not in line and "table.allow_dirty=true" in line and "engine/x.py" in line
    assert not started and not (tmp_path / "b").exists()
    reported(tmp_path, "b", [0.9, 0.91, 0.93])
    assert runner.run_table(table_node([{"label": "base"}, {"label": "b"}], allow_dirty=True), tmp_path) == 0
    assert "on a DIRTY tree (table.allow_dirty=true" in (tmp_path / "table.md").read_text()


def test_runs_made_at_other_commits_are_kept_and_flagged(tmp_path: Path, monkeypatch: Any, capsys: Any) -> None:
    from core.provenance import CodeVersion
    from tables import runner
    from tables import provenance

    head = CodeVersion("c" * 40, False)
    monkeypatch.setattr(provenance, "code_version", lambda ignore=(): head)
    monkeypatch.setattr(runner, "code_version", lambda ignore=(): head)
    reported(tmp_path, "base", [0.9, 0.91, 0.92], commit="c" * 40)
    reported(tmp_path, "b", [0.9, 0.91, 0.93], commit="d" * 40)
    assert runner.run_table(table_node([{"label": "base"}, {"label": "b"}]), tmp_path) == 0
    printed = capsys.readouterr().out
    assert "3 finished runs were made at other commits than ccccccc (ddddddd: 3)" in printed
    markdown = (tmp_path / "table.md").read_text()
    assert "Reported runs were made at 2 commits (a mix, flagged):" in markdown
    assert "- ddddddd: 3 runs (b)" in markdown and "- ccccccc: 3 runs (base)" in markdown
    assert {r["commit"] for r in read_csv(tmp_path / "runs.csv") if r["row"] == "b"} == {"d" * 40}


def test_a_table_store_carries_finished_runs_to_a_fresh_run_folder(tmp_path: Path, monkeypatch: Any,
                                                                   capsys: Any) -> None:
    """table.store: each run that finishes is carried there (its record, never its checkpoints) with
    its jobs.jsonl line; a fresh run folder starting from the store runs only what the store lacks,
    and gathers the same table as the first folder; the store is left out of the dirty-tree check."""
    from core.provenance import CodeVersion
    from tables import runner
    from tables import provenance

    ignored: list[list[Path]] = []
    clean = CodeVersion("e" * 40, False)
    monkeypatch.setattr(provenance, "code_version", lambda ignore=(): ignored.append(list(ignore)) or clean)
    monkeypatch.setattr(runner, "code_version", lambda ignore=(): clean)
    made: list[str] = []
    accs = {"base": [0.9, 0.91, 0.92], "b": [0.88, 0.9, 0.9]}

    def run_row(args: list[str], run_dir: Any, timeout: Any, *_: Any) -> tuple[str, float]:
        label, seed = run_dir.root.parent.name, int(run_dir.root.name.removeprefix("seed_"))
        made.append(f"{label} {seed}")
        write_run(run_dir, run_summary(accs[label][seed - 1], commit="e" * 40), [{"step": 10, "test_acc": 0.5}])
        (run_dir.root / "checkpoints").mkdir()
        (run_dir.root / "checkpoints" / "rank_0.pt").write_bytes(b"x" * 100)
        return "done", 1.0

    monkeypatch.setattr(runner, "run_row", run_row)
    store = tmp_path / "store"
    table = table_node([{"label": "base"}, {"label": "b"}], store=str(store))
    assert runner.run_table(table, tmp_path / "one") == 0
    assert len(made) == 6 and [tmp_path / "one", store] in ignored
    assert sorted(p.parent.name + "/" + p.name for p in store.glob("*/seed_*")) == \
        sorted(f"{r}/seed_{s}" for r in accs for s in (1, 2, 3))
    assert not list(store.glob("**/checkpoints")) and (store / "b" / "seed_2" / "metrics.jsonl.xz").is_file()
    assert len((store / "jobs.jsonl").read_text().splitlines()) == 6

    # a fresh folder: everything is put back, nothing runs, the same table comes out
    made.clear()
    assert runner.run_table(table, tmp_path / "two") == 0
    assert made == [] and "6 finished runs put back from table.store" in capsys.readouterr().out
    def gathered(folder: str) -> list[dict[str, str]]:
        return [{k: v for k, v in r.items() if k != "log"} for r in read_csv(tmp_path / folder / "table.csv")]
    assert gathered("two") == gathered("one") and len(gathered("one")) == 2
    assert "ran 6 jobs (6 made a run)" in (tmp_path / "two" / "table.md").read_text()

    # a run the store lacks is made, once; both jobs.jsonl hold every job once
    import shutil
    shutil.rmtree(store / "b" / "seed_3")
    assert runner.run_table(table, tmp_path / "three") == 0
    assert made == ["b 3"] and (store / "b" / "seed_3" / "summary.json").is_file()
    lines = (store / "jobs.jsonl").read_text().splitlines()
    assert len(lines) == 7 == len(set(lines)) and (tmp_path / "three" / "jobs.jsonl").read_text().splitlines() == lines

    # a run finished in the folder but never carried (its runner paused between the run's end and
    # the copy) is carried at the next start, not made again
    shutil.rmtree(store / "b" / "seed_2")
    assert runner.run_table(table, tmp_path / "three") == 0
    assert made == ["b 3"] and (store / "b" / "seed_2" / "summary.json").is_file()
    assert "b seed 2: already complete (carried into table.store now" in capsys.readouterr().out

    # the store belongs to this table in this form: another table, or the quick form, is refused
    for other in (table_node([{"label": "base"}], name="t2", store=str(store)),
                  table_node([{"label": "base"}], store=str(store), quick=True)):
        with pytest.raises(UserError) as err:
            runner.run_table(other, tmp_path / "four")
        assert "\n" not in str(err.value) and "give this table a store of its own" in str(err.value)
    assert made == ["b 3"]


def test_gather_only_shows_the_rows_made_so_far_and_runs_nothing(tmp_path: Path, monkeypatch: Any) -> None:
    """table.gather_only=true on a table in progress: nothing runs (even on a dirty tree), the rows
    with every seed are gathered and compared among themselves, the others are listed as started or
    not, and table.md says it is partial."""
    from core.provenance import CodeVersion
    from tables import runner
    from tables import provenance
    from tables.config import RowConfig, row_dir

    dirty = CodeVersion("f" * 40, True, ("engine/x.py",))
    monkeypatch.setattr(provenance, "code_version", lambda ignore=(): dirty)
    monkeypatch.setattr(runner, "code_version", lambda ignore=(): dirty)
    monkeypatch.setattr(runner, "run_row", lambda *a, **k: pytest.fail("gather_only ran a job"))
    reported(tmp_path, "base", [0.9, 0.91, 0.92])
    reported(tmp_path, "b", [0.88, 0.9, 0.9])
    write_run(row_dir(tmp_path, RowConfig(label="c"), 1), run_summary(0.5))
    rows = [{"label": "base"}, {"label": "b"}, {"label": "c"}, {"label": "d"}]
    assert runner.run_table(table_node(rows, gather_only=True), tmp_path) == 0
    assert [r["label"] for r in read_csv(tmp_path / "table.csv")] == ["base", "b"]
    markdown = (tmp_path / "table.md").read_text()
    assert markdown.startswith("# Partial: ") and "7 of 12 reported runs made; 2 of 4 rows" in markdown
    assert "Rows with some seeds made (not shown): c (1 of 3)." in markdown
    assert "Rows not yet started (1): d." in markdown and not (tmp_path / "d").exists()

    # once every run is made, gathering gives the finished table: every row, not called partial
    reported(tmp_path, "c", [0.5, 0.5, 0.51])
    reported(tmp_path, "d", [0.7, 0.72, 0.7])
    assert runner.run_table(table_node(rows, gather_only=True), tmp_path) == 0
    assert [r["label"] for r in read_csv(tmp_path / "table.csv")] == ["base", "b", "c", "d"]
    markdown = (tmp_path / "table.md").read_text()
    assert not markdown.startswith("# Partial") and "reported runs made;" not in markdown


def test_a_partial_gather_shows_every_finished_grid_and_leaves_the_store_as_it_was(tmp_path: Path,
                                                                                  monkeypatch: Any) -> None:
    """While a table is produced, table.gather_only shows the tuning of each row whose grid is
    complete (its choice is final) though none of its reported runs is made yet, names the grids
    still running, and writes nothing into the store it reads."""
    from core.provenance import CodeVersion
    from tables import runner
    from tables import provenance
    from tables.tuning import tune_dir

    clean = CodeVersion("e" * 40, False)
    monkeypatch.setattr(provenance, "code_version", lambda ignore=(): clean)
    monkeypatch.setattr(runner, "code_version", lambda ignore=(): clean)
    monkeypatch.setattr(runner, "run_row", lambda *a, **k: pytest.fail("gather_only ran a job"))
    store = tmp_path / "store"
    for lr, acc in ((0.03, 0.90), (0.1, 0.95), (0.3, 0.60)):
        for seed, shift in ((0, 0.0), (100, 0.01)):
            write_run(tune_dir(store, "a", (("optim.lr", lr),), seed), run_summary(acc + shift, val_loss=1 - acc))
    write_run(tune_dir(store, "b", (("optim.lr", 0.03),), 0), run_summary(0.9, val_loss=0.1))
    (store / "jobs.jsonl").write_text(json.dumps({"job": "a optim.lr_0.03 seed 0", "ended": 1.0}) + "\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "jobs.jsonl").write_text(json.dumps({"job": "b optim.lr_0.1 seed 0", "ended": 2.0}) + "\n")
    before = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}
    grid = {"optim.lr": [0.03, 0.1, 0.3]}
    table = table_node([{"label": "a", "tune": grid}, {"label": "b", "tune": grid}], baseline="a", tune_seeds=[0, 100],
                   store=str(store), gather_only=True)
    assert runner.run_table(table, out) == 0
    markdown = (out / "table.md").read_text()
    assert "the grids of 1 of 2 tuned rows are complete and shown under Tuning" in markdown
    assert "Grids still running (not shown): b (1 of 6 runs)." in markdown
    tuning = markdown.split("## Tuning", 1)[1]
    assert "| a | optim.lr_0.1 | 0.9550 | 2/2 | **yes** |" in tuning and "| b |" not in tuning
    assert {p: p.read_bytes() for p in store.rglob("*") if p.is_file()} == before  # the gather wrote nothing there
    assert len((out / "jobs.jsonl").read_text().splitlines()) == 2  # the run folder got the store's job line


def test_a_run_folder_of_another_table_is_refused_before_anything_is_written(tmp_path: Path,
                                                                           monkeypatch: Any) -> None:
    """A table's run folder belongs to one table in one form, as its store does (runs are read by
    label and seed alone): a folder claimed by another table, or one from before the claim whose
    jobs.jsonl names rows this table lacks (a gather into a reused folder once merged another
    table's jobs into this one's store), is refused in one line, with nothing written to it or the
    store; a folder of the table's own is claimed."""
    from core.provenance import CodeVersion
    from tables import runner
    from tables import provenance

    clean = CodeVersion("e" * 40, False)
    monkeypatch.setattr(provenance, "code_version", lambda ignore=(): clean)
    monkeypatch.setattr(runner, "code_version", lambda ignore=(): clean)
    monkeypatch.setattr(runner, "run_row", lambda *a, **k: pytest.fail("a refused table ran a job"))
    store = tmp_path / "store"
    claimed = tmp_path / "claimed"
    claimed.mkdir()
    (claimed / "table.json").write_text(json.dumps({"table": "other", "quick": False}))
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "jobs.jsonl").write_text(json.dumps({"job": "allreduce.w4@iid seed 0", "status": "done", "seconds": 1.0, "ended": 1.0}) + "\n")
    for folder, says in ((claimed, "holds the runs of {'table': 'other'"), (legacy, "(allreduce.w4@iid)")):
        listed = sorted(os.listdir(folder))
        for gather in (False, True):
            with pytest.raises(UserError) as err:
                runner.run_table(table_node([{"label": "base"}], store=str(store), gather_only=gather), folder)
            assert "\n" not in str(err.value) and says in str(err.value)
            assert "give this table a run folder of its own" in str(err.value)
            assert sorted(os.listdir(folder)) == listed and not store.exists()
    own = tmp_path / "own"
    own.mkdir()
    (own / "jobs.jsonl").write_text(json.dumps({"job": "base seed 1", "status": "done", "seconds": 1.0, "ended": 1.0}) + "\n")
    assert runner.run_table(table_node([{"label": "base"}], gather_only=True), own) == 0
    assert json.loads((own / "table.json").read_text()) == {"table": "t", "quick": False}
    with pytest.raises(UserError):  # and the quick form of the same table is another form
        runner.run_table(table_node([{"label": "base"}], gather_only=True, quick=True), own)


def test_the_production_section_counts_sittings_tries_and_runs_made_elsewhere(tmp_path: Path) -> None:
    """table.md's Production section from a jobs.jsonl written as the table runner writes it: a
    second sitting after a pause longer than the gap, a failed run made by a later try, a line cut
    by a killed process, and runs gathered that the table's command did not make."""
    from tables.jobs import SITTING_GAP_S, production_lines, sittings, read_jobs

    t0 = float(calendar.timegm((2026, 11, 18, 9, 45, 0)))  # UTC

    def job(name: str, status: str, seconds: float, ended: float, load: float) -> str:
        return json.dumps({"phase": "rows", "job": name, "status": status, "seconds": seconds,
                           "load_before": [load, 0, 0], "load_after": [load + 1, 0, 0], "ended": ended})

    first = [job("a seed 0", "done", 60, t0 + 60, 2.0), job("a seed 1", "failed", 30, t0 + 95, 4.0)]
    later = t0 + 95 + SITTING_GAP_S + 1 + 100  # the next run starts just over the gap after the last ended
    second = [job("a seed 1", "done", 100, later, 8.0), job("b seed 0", "done", 50, later + 52, 10.0)]
    path = tmp_path / "jobs.jsonl"
    path.write_text("\n".join(first + second) + '\n{"job": "b seed 1", "status": "do')

    records, unreadable = read_jobs(path)
    assert len(records) == 4 and unreadable == 1
    assert [(n, round(b - a)) for a, b, n in sittings(records)] == [(2, 95), (2, 152)]
    text = "\n".join(production_lines(path, finished_runs=5))
    assert "ran 4 jobs (3 made a run; 1 ended without one (failed), 1 of them made by a later try)" in text
    assert "4 min of runs" in text and "in 2 sittings" in text
    assert "from 2026-11-18 09:45 to 2026-11-18 09:59 UTC" in text
    assert "1 line of jobs.jsonl could not be read" in text
    assert "2 of the 5 runs gathered have no line there" in text
    assert "median 6.5, from 2.0 to 11.0" in text
    assert "- 2026-11-18 09:45 to 09:46: 2 runs (2 min)" in text
    assert production_lines(tmp_path / "missing.jsonl") == []
