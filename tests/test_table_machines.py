"""The machine in a table's files (issue 88): runs.csv's `machine` column (`unknown` for a run made
before the record), a paired comparison across machine types flagged in table.md, refused in one
line with table.mixed_machines=refuse; and no path of the gathering machine in a published file."""

from pathlib import Path

import pytest

from core.errors import UserError
from tests.support.table_files import read_csv, reported, table_node

AVX512 = {"cpu": "AMD EPYC 9R14", "cpu_flags": ["avx2", "avx512f"], "cores": 2, "gpu": None, "torch": "2.14.1",
          "type": "aaaaaaaaaaaa"}
AVX2 = {**AVX512, "cpu": "AMD EPYC 7R13", "cpu_flags": ["avx2"], "type": "bbbbbbbbbbbb"}


def _three(out: Path) -> None:
    reported(out, "base", [0.90, 0.92, 0.97], machine=AVX512)
    reported(out, "same", [0.91, 0.93, 0.96], machine=AVX512)
    reported(out, "other", [0.91, 0.93, 0.96], machine=AVX2)
    reported(out, "old", [0.91, 0.93, 0.96])  # made before the record


def test_runs_csv_names_each_runs_machine_and_a_pair_across_types_is_flagged(tmp_path: Path) -> None:
    from tables.runner import run_table

    _three(tmp_path)
    node = table_node([{"label": r} for r in ("base", "same", "other", "old")])
    assert run_table(node, tmp_path) == 0
    machines = {(r["label"], r["seed"]): r["machine"] for r in read_csv(tmp_path / "runs.csv")}
    assert machines[("other", "1")] == "bbbbbbbbbbbb" and machines[("old", "2")] == "unknown"
    rows = {r["label"]: r for r in read_csv(tmp_path / "table.csv")}
    assert "ran on different machine types" in rows["other"]["note"] and rows["other"]["diff_method"] == "paired"
    assert "machine types" not in rows["same"]["note"] and "machine types" not in rows["old"]["note"]
    markdown = (tmp_path / "table.md").read_text()
    assert "## Machines" in markdown and "- bbbbbbbbbbbb: 3 runs: AMD EPYC 7R13 (AVX2)" in markdown
    assert "- aaaaaaaaaaaa: 6 runs: AMD EPYC 9R14 (AVX-512)" in markdown
    assert "- seeds 1, 2, 3 of other and base ran on different machine types" in markdown
    assert "3 runs carry no machine record" in markdown


def test_mixed_machines_refuse_ends_the_gather_in_one_line(tmp_path: Path) -> None:
    from tables.runner import run_table

    _three(tmp_path)
    node = table_node([{"label": r} for r in ("base", "same", "other")], mixed_machines="refuse")
    with pytest.raises(UserError, match="seeds 1, 2, 3 of other and base ran on different machine types .*"
                                        "table.mixed_machines=refuse refuses") as err:
        run_table(node, tmp_path)
    assert "\n" not in str(err.value) and not (tmp_path / "table.md").exists()
    ok = table_node([{"label": r} for r in ("base", "same", "old")], mixed_machines="refuse")
    assert run_table(ok, tmp_path) == 0  # an unknown machine is never taken for a mismatch
    with pytest.raises(UserError, match="mixed_machines"):
        run_table(table_node([{"label": "base"}], mixed_machines="sometimes"), tmp_path)


def test_no_published_file_names_the_gathering_machines_folders(tmp_path: Path) -> None:
    """table.csv's `log` is the run's log relative to the table's folder (it named a /tmp folder of
    the machine that gathered it, so no re-gather reproduced the file); a failed row's table.md line
    says the same."""
    from tables.config import load_table
    from tables.render import collect, render_markdown
    from tables.runner import run_table

    reported(tmp_path, "base", [0.90, 0.92, 0.97])
    reported(tmp_path, "half", [0.91, 0.93, 0.95])
    node = table_node([{"label": "base"}, {"label": "half"}], gather_only=True)
    assert run_table(node, tmp_path) == 0
    for name in ("table.csv", "table.md", "runs.csv"):
        assert str(tmp_path) not in (tmp_path / name).read_text(), name
    rows = {r["label"]: r["log"] for r in read_csv(tmp_path / "table.csv")}
    assert rows == {"base": "base/seed_1/run.log", "half": "half/seed_1/run.log"}
    table = load_table(node)
    (tmp_path / "half" / "seed_2" / "summary.json").unlink()  # as a run that failed
    gathered = collect(table, tmp_path, {("half", 2): "failed"})
    failed = next(r for r in gathered.records if r["label"] == "half")
    assert failed["log"] == "half/seed_2/run.log"
    assert "(log: half/seed_2/run.log)" in render_markdown(table, gathered.records, family=gathered.family)


def test_tuning_runs_on_two_machine_types_are_listed_with_the_rows_whose_grid_spans_both() -> None:
    """A production that moved machines between sittings: table.md says where the tuning runs ran
    and which rows compared their settings across types; a table tuned on one type says nothing."""
    from tables.machines import machine_lines

    def on(machine: dict) -> dict:
        return {"machine": machine}

    tuning = {"a@iid": {0: on(AVX512), 1: on(AVX512)}, "b@iid": {0: on(AVX512), 1: on(AVX2), 2: on(AVX2)}}
    lines = machine_lines({}, [], tuning)
    assert lines[0] == "## Machines"
    assert "- aaaaaaaaaaaa: 3 tuning runs: AMD EPYC 9R14 (AVX-512), 2 cores, torch 2.14.1" in lines
    assert "- bbbbbbbbbbbb: 2 tuning runs: AMD EPYC 7R13 (AVX2), 2 cores, torch 2.14.1" in lines
    assert any(line.startswith("Rows whose tuning grid ran on more than one type (1; ") and line.endswith(": b@iid.")
               for line in lines)
    assert machine_lines({}, [], {"a@iid": {0: on(AVX512), 1: on(AVX512)}}) == []
    with_reported = machine_lines({"a@iid": {1: on(AVX2)}}, [], tuning)
    assert "- bbbbbbbbbbbb: 1 run: AMD EPYC 7R13 (AVX2), 2 cores, torch 2.14.1" in with_reported
    assert "The tuning runs ran on more than one machine type:" in with_reported
