"""A table's store in its two forms (tables/store.py, tables/sealed.py, tables/seal.py) and the run
files a reader reads back (issue 85: run records out of the code's way; issue 87: files read back
cannot crash a reader). The seal gives back every record exactly or changes nothing; a gather reads
the same table from the loose and the sealed form; a production goes on from a sealed store; each
kind of corrupt file ends in one line naming it. Every store here is a few files the test writes."""

import json
import lzma
import os
from pathlib import Path
from typing import Any, Callable

import pytest

from core.errors import UserError
from tests.support.table_files import read_csv, run_summary, table_node, write_run, write_tuning_run

IDENTITY = {"table": "t", "quick": False}
#: records a run's metrics.jsonl may hold that a careless encoding would change: a null, an integer
#: where the key's other values are floats, -0.0, NaN, infinity, an integer beyond 64 bits, text,
#: lists and objects, and keys in another order than the other records'
ODD_RECORDS: list[dict[str, Any]] = [
    {"kind": "train", "step": 10, "loss": 2.3, "lr": 0.1, "acc": 0.5, "samples_per_s": 91.65197621064114},
    {"kind": "train", "step": 20, "loss": None, "lr": 1e-05, "acc": 1, "flag": True},
    {"kind": "eval", "step": 20, "wall_s": 1.5, "test_acc": 0.25, "val_acc": -0.0, "val_loss": float("nan"),
     "comm_bytes_total": 2 ** 62},
    {"kind": "restart", "step": 20, "recover_s_each": [0.5, 1], "job_wall_s": None, "big": 2 ** 70,
     "note": "réseau ✓", "nested": {"a": [1, {"b": None}]}},
    {"step": 30, "kind": "train", "loss": float("inf"), "lr": 0.1, "acc": 0.75},
]


def jsonl(records: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def loose_store(store: Path) -> dict[str, bytes]:
    """A loose store of four runs, each lacking something another has; returns its files' bytes."""
    store.mkdir(parents=True)
    (store / "store.json").write_text(json.dumps(IDENTITY) + "\n")
    (store / "jobs.jsonl").write_text(json.dumps({"job": "a seed 0", "status": "done", "seconds": 1.0, "ended": 1.0}) + "\n")
    full = store / "a" / "seed_0"
    (full / ".hydra").mkdir(parents=True)
    (full / "summary.json").write_text(json.dumps({"test_acc": 0.25, "algo": "sgp", "note": "é"}, indent=2))
    (full / "config.yaml").write_text("algo:\n  name: sgp\n# no newline at the end")
    (full / ".hydra" / "overrides.yaml").write_text("- optim.lr=0.1\n- seed=0\n")
    (full / "metrics.jsonl").write_text(jsonl(ODD_RECORDS))
    tuned = store / "a" / "tune" / "optim.lr_0.1" / "seed_0"
    tuned.mkdir(parents=True)
    (tuned / "summary.json").write_text("{}")
    (tuned / "metrics.jsonl").write_text("")  # a metrics file with no record
    bare = store / "b" / "seed_1"
    bare.mkdir(parents=True)
    (bare / "summary.json").write_text('{"test_acc": 0.5}')  # no metrics, config or overrides
    packed = store / "c" / "seed_0"
    packed.mkdir(parents=True)
    (packed / "summary.json").write_text('{"test_acc": 0.75}')
    (packed / "metrics.jsonl.xz").write_bytes(lzma.compress(jsonl(ODD_RECORDS[:2]).encode()))  # production's form
    return files(store)


def files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_seal_gives_back_every_record_exactly_and_only_then_removes_the_loose_files(tmp_path: Path) -> None:
    from tables.run_records import parse_metrics_lines
    from tables.seal import main, same, seal
    from tables.store import restore, store_records

    store = tmp_path / "store"
    before = loose_store(store)
    assert "checked, nothing changed" in seal(store, check_only=True) and files(store) == before
    assert main([str(store)]) == 0
    left = files(store)
    assert sorted(left) == ["jobs.jsonl", "metrics.parquet", "runs.parquet", "store.json"]
    assert left["jobs.jsonl"] == before["jobs.jsonl"] and left["store.json"] == before["store.json"]
    assert "sealed already (4 runs)" in seal(store) and files(store) == left  # nothing loose: nothing rewritten

    records = store_records(store, IDENTITY)
    assert records.runs() == ["a/seed_0", "a/tune/optim.lr_0.1/seed_0", "b/seed_1", "c/seed_0"]
    for rel in records.runs():
        for name in ("summary.json", "config.yaml", ".hydra/overrides.yaml"):
            original = before.get(f"{rel}/{name}")
            assert (records.text(rel, name) or "").encode() == (original or b"") and \
                (records.text(rel, name) is None) == (original is None), (rel, name)
    assert same(records.metrics("a/seed_0"), list(parse_metrics_lines(jsonl(ODD_RECORDS).splitlines(), "x")))
    assert records.metrics("a/seed_0", "eval")[0]["val_acc"] == 0.0 and str(records.metrics("a/seed_0")[2]["val_acc"]) == "-0.0"
    assert type(records.metrics("a/seed_0")[1]["acc"]) is int and records.metrics("a/seed_0")[3]["big"] == 2 ** 70
    assert records.metrics("a/tune/optim.lr_0.1/seed_0") == [] and records.metrics("b/seed_1") is None
    assert records.first_train_loss("a/seed_0") == 2.3 and records.first_train_loss("b/seed_1") is None

    # a restore writes back the run folders as the runs wrote them (an xz metrics file as plain text)
    out = tmp_path / "out"
    assert restore(store, out, IDENTITY) == 4
    expected = {k: v for k, v in before.items() if "/" in k}
    expected["c/seed_0/metrics.jsonl"] = lzma.decompress(expected.pop("c/seed_0/metrics.jsonl.xz"))
    assert {k: v for k, v in files(out).items() if "/" in k} == expected


def test_a_seal_that_would_not_give_back_a_record_changes_nothing(tmp_path: Path, monkeypatch: Any) -> None:
    """A float kept at less than its full precision is caught by the check, before any loose file goes."""
    import pyarrow as pa

    from tables import sealed
    from tables.seal import seal

    store = tmp_path / "store"
    before = loose_store(store)
    exact = sealed.metrics_table

    def rounded(runs: Any) -> Any:
        table = exact(runs)
        i = table.column_names.index("samples_per_s")
        return table.set_column(i, "samples_per_s", table.column(i).cast(pa.float32()).cast(pa.float64()))

    monkeypatch.setattr(sealed, "metrics_table", rounded)
    with pytest.raises(UserError) as err:
        seal(store)
    assert "\n" not in str(err.value) and "do not give back a/seed_0: its metrics records" in str(err.value)
    assert files(store) == before  # no sealed file, no temporary one, every loose file kept


def tuned_table(store: Path, **extra: Any) -> Any:
    """A small table with a tuned row, a target (time and bytes to it read from the eval curves) and
    the accuracy figure (the curves of every seed)."""
    grid = {"optim.lr": [0.1, 0.3]}
    return table_node([{"label": "base"}, {"label": "r", "tune": grid}], tune_seeds=[0, 100], store=str(store),
                      target_acc=0.85, plots=["accuracy"], columns=["test_acc", "val_acc", "time_to_target_s"],
                      **extra)


def made_store(store: Path) -> None:
    """A loose store holding every run of `tuned_table`: lr 0.3 diverged (its validation loss above
    its first training loss), lr 0.1 learned."""
    from tables.config import RowConfig, row_dir

    for label, accs in (("base", [0.9, 0.91, 0.92]), ("r", [0.84, 0.9, 0.93])):
        for seed, acc in zip([1, 2, 3], accs):
            write_run(row_dir(store, RowConfig(label=label), seed), run_summary(acc),
                      [{"step": 5, "test_acc": acc - 0.1, "val_acc": acc - 0.1, "comm_bytes_total": 5e5, "wall_s": 5.0 + seed},
                       {"step": 10, "test_acc": acc, "val_acc": acc, "comm_bytes_total": 1e6, "wall_s": 10.0 + seed}])
    for seed in (0, 100):
        write_tuning_run(store, 0.1, seed, val_acc=0.9, val_loss=0.3)
        write_tuning_run(store, 0.3, seed, val_acc=0.9, val_loss=2.5)
    (store / "store.json").write_text(json.dumps(IDENTITY))
    (store / "jobs.jsonl").write_text(json.dumps({"job": "base seed 1", "status": "done", "seconds": 2.0,
                                                  "ended": 1.7e9}) + "\n")


def clean_tree(monkeypatch: Any) -> None:
    from core.provenance import CodeVersion
    from tables import provenance, runner

    clean = CodeVersion("e" * 40, False)
    monkeypatch.setattr(provenance, "code_version", lambda ignore=(): clean)
    monkeypatch.setattr(runner, "code_version", lambda ignore=(): clean)


def test_a_gather_reads_the_same_table_from_the_loose_and_the_sealed_store(tmp_path: Path, monkeypatch: Any) -> None:
    """table.gather_only on the loose store, then on the same store sealed: the same table.md,
    table.csv (its log column aside: it names the gathering folder), runs.csv and figure, the tuning
    choice made on the same divergence rule; neither gather copies a run or writes to the store."""
    from tables import runner
    from tables.seal import seal

    clean_tree(monkeypatch)
    monkeypatch.setattr(runner, "run_row", lambda *a, **k: pytest.fail("a gather ran a job"))
    store = tmp_path / "store"
    made_store(store)
    gathered = {}
    for form in ("loose", "sealed"):
        if form == "sealed":
            seal(store)
        before = files(store)
        out = tmp_path / form
        assert runner.run_table(tuned_table(store, gather_only=True), out) == 0
        assert files(store) == before and not list(out.glob("*/seed_*")) and not list(out.glob("*/tune"))
        gathered[form] = {"table.csv": [{k: v for k, v in r.items() if k != "log"} for r in read_csv(out / "table.csv")],
                          **{name: (out / name).read_bytes() for name in ("table.md", "runs.csv", "accuracy.png")}}
    assert gathered["sealed"] == gathered["loose"]
    table = {r["label"]: r for r in gathered["loose"]["table.csv"]}
    assert table["r"]["tuned"] == "optim.lr_0.1" and "diverged" in gathered["loose"]["table.md"].decode()
    assert float(table["base"]["time_to_target_s"]) == 12.0  # read from the eval curves (11, 12, 13 s)
    assert table["r"]["time_to_target_s"] == "not reached"  # r's seed 1 ended at 0.84


def test_a_production_goes_on_from_a_sealed_store_and_a_second_seal_takes_its_new_runs(tmp_path: Path,
                                                                                      monkeypatch: Any) -> None:
    """A sealed store's runs are put back into a fresh run folder as the runner wrote them; the runs
    still to make are made and carried loose beside the sealed files (metrics xz-compressed); the
    store reads as one; sealing it again takes the new runs in."""
    from tables import runner
    from tables.seal import seal
    from tables.store import store_records

    clean_tree(monkeypatch)
    store = tmp_path / "store"
    made_store(store)
    for rel in ("r/seed_2", "r/seed_3"):
        for path in sorted((store / rel).rglob("*"), reverse=True):
            path.unlink()
        (store / rel).rmdir()
    seal(store)
    made: list[str] = []

    def run_row(args: list[str], run_dir: Any, *_: Any) -> tuple[str, float]:
        made.append(run_dir.root.relative_to(tmp_path / "out").as_posix())
        write_run(run_dir, run_summary(0.9, commit="e" * 40), [{"step": 10, "test_acc": 0.9, "wall_s": 3.0}])
        return "done", 1.0

    monkeypatch.setattr(runner, "run_row", run_row)
    assert runner.run_table(tuned_table(store), tmp_path / "out") == 0
    assert made == ["r/seed_2", "r/seed_3"]
    assert (tmp_path / "out" / "base" / "seed_1" / "metrics.jsonl").read_text().startswith('{"kind": "eval"')
    assert (store / "runs.parquet").is_file() and (store / "r" / "seed_2" / "metrics.jsonl.xz").is_file()
    assert not (store / "r" / "seed_2" / "metrics.jsonl").exists()
    assert len(store_records(store, IDENTITY).runs()) == 10  # 6 reported, 4 tuning
    assert "sealed 10 runs (2 loose)" in seal(store)
    assert sorted(files(store)) == ["jobs.jsonl", "metrics.parquet", "runs.parquet", "store.json"]
    assert store_records(store, IDENTITY).metrics("r/seed_3") == [{"kind": "eval", "step": 10, "test_acc": 0.9,
                                                                  "wall_s": 3.0}]


# --- files read back that cannot crash a reader (issue 87) ---------------------------------------------

def cut(path: Path, size: int = 40) -> None:
    path.write_bytes(path.read_bytes()[:size])


def foreign_parquet(path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"x": [1, 2]}), path)


def other_tables_file(path: Path) -> None:
    """The same file of a store sealed for another table."""
    from tables.seal import seal

    other = path.parent.parent / "other"
    made_store(other)
    (other / "store.json").write_text(json.dumps({"table": "t2", "quick": False}))
    seal(other)
    path.write_bytes((other / path.name).read_bytes())


def retyped_runs(path: Path) -> None:
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    i = table.column_names.index("summary.json")
    pq.write_table(table.set_column(i, "summary.json", table.column(i).cast("large_string")).replace_schema_metadata(
        table.schema.metadata), path)


def edit_json(path: Path, change: Callable[[Any], Any]) -> None:
    path.write_text(json.dumps(change(json.loads(path.read_text()))))


def cut_second_line(path: Path) -> None:
    text = path.read_text()
    path.write_text(text[:text.index("\n") + 20])


def xz_cut(run: Path) -> None:
    """The run's metrics as a loose store keeps them (xz), the compressed file cut short."""
    (run / "metrics.jsonl.xz").write_bytes(lzma.compress((run / "metrics.jsonl").read_bytes())[:30])
    (run / "metrics.jsonl").unlink()


def edit_line(path: Path, line: int, text: str) -> None:
    lines = path.read_text().splitlines()
    lines[line] = text
    path.write_text("\n".join(lines) + "\n")


#: (case, sealed first?, what is done to the store, the file the one line names, what it says)
CORRUPT = [
    ("summary cut to 40 bytes", False, lambda s: cut(s / "base" / "seed_2" / "summary.json"),
     "base/seed_2/summary.json", "not valid JSON"),
    ("summary a list", False, lambda s: (s / "base" / "seed_1" / "summary.json").write_text("[1, 2]"),
     "base/seed_1/summary.json", "holds a JSON list"),
    ("summary metric edited to text", False, lambda s: edit_json(s / "r" / "seed_3" / "summary.json",
                                                                 lambda d: {**d, "test_acc": "high"}),
     "r/seed_3/summary.json", 'test_acc is "high", not a number'),
    ("tuning summary metric edited to a list", False, lambda s: edit_json(
        s / "r" / "tune" / "optim.lr_0.3" / "seed_0" / "summary.json", lambda d: {**d, "val_acc": [0.9]}),
     "r/tune/optim.lr_0.3/seed_0/summary.json", "val_acc is [0.9], not a number"),
    ("metrics line cut", False, lambda s: cut_second_line(s / "base" / "seed_3" / "metrics.jsonl"),
     "base/seed_3/metrics.jsonl", "not valid JSON at line 2"),
    ("metrics line not an object", False, lambda s: edit_line(s / "base" / "seed_1" / "metrics.jsonl", 0, "[5]"),
     "base/seed_1/metrics.jsonl", "line 1 holds a JSON list"),
    ("eval value edited to text", False, lambda s: edit_line(s / "r" / "seed_1" / "metrics.jsonl", 1,
                                                             '{"kind": "eval", "step": 10, "test_acc": "0.9"}'),
     "r/seed_1/metrics.jsonl", "line 2: test_acc is"),
    ("xz metrics cut", False, lambda s: xz_cut(s / "base" / "seed_2"), "base/seed_2/metrics.jsonl.xz",
     "not a complete xz file"),
    ("jobs.jsonl not text", False, lambda s: (s / "jobs.jsonl").write_bytes(b"\x89PNG\x00\xff"),
     "jobs.jsonl", "not UTF-8 text"),
    ("store.json edited", False, lambda s: (s / "store.json").write_text("{table: t}"), "store.json", "not valid JSON"),
    ("sealed metrics cut", True, lambda s: cut(s / "metrics.parquet", 1000), "metrics.parquet",
     "not a readable Parquet file"),
    ("another program's parquet", True, lambda s: foreign_parquet(s / "runs.parquet"), "runs.parquet",
     "not a sealed table store file"),
    ("another table's sealed file", True, lambda s: other_tables_file(s / "metrics.parquet"), "metrics.parquet",
     "holds the runs of {'table': 't2'"),
    ("a column of another type", True, lambda s: retyped_runs(s / "runs.parquet"), "runs.parquet",
     "column 'summary.json' is large_string"),
]


@pytest.mark.parametrize("case,sealed,corrupt,names,says", CORRUPT, ids=[c[0] for c in CORRUPT])
def test_a_corrupt_file_ends_a_gather_in_one_line_naming_it(tmp_path: Path, monkeypatch: Any, case: str, sealed: bool,
                                                            corrupt: Callable[[Path], None], names: str, says: str) -> None:
    from tables import runner
    from tables.seal import seal

    clean_tree(monkeypatch)
    monkeypatch.setattr(runner, "run_row", lambda *a, **k: pytest.fail("a gather ran a job"))
    store = tmp_path / "store"
    made_store(store)
    if sealed:
        seal(store)
    corrupt(store)
    with pytest.raises(UserError) as err:
        runner.run_table(tuned_table(store, gather_only=True), tmp_path / "out")
    line = str(err.value)
    assert "\n" not in line and str(store / names) in line and says in line, line


def test_a_corrupt_file_ends_a_restore_in_one_line_naming_it(tmp_path: Path) -> None:
    """What only a production reads (a run's overrides, its config as text) is checked when a store
    is put back; jobs.jsonl lines no clock could write are counted, not fatal."""
    from tables.jobs import read_jobs
    from tables.store import restore

    store = tmp_path / "store"
    loose_store(store)
    (store / "a" / "seed_0" / ".hydra" / "overrides.yaml").write_text("- optim.lr=0.1\n  bad: [\n")
    with pytest.raises(UserError) as err:
        restore(store, tmp_path / "out", IDENTITY)
    assert "\n" not in str(err.value) and "a/seed_0/.hydra/overrides.yaml: not valid YAML" in str(err.value)
    (store / "a" / "seed_0" / ".hydra" / "overrides.yaml").write_text("- optim.lr=0.1\n")
    (store / "a" / "seed_0" / "config.yaml").write_bytes(b"algo: \xff\n")
    with pytest.raises(UserError) as err:
        restore(store, tmp_path / "out", IDENTITY)
    assert "a/seed_0/config.yaml: not UTF-8 text" in str(err.value)
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('5\n{"job": "a seed 0", "status": "done", "seconds": 1, "ended": 1e300}\n[[[\n'
                    '{"job": "a seed 1", "status": "done", "seconds": 1, "ended": 1.7e9}\n')
    found, unreadable = read_jobs(jobs)
    assert [j.job for j in found] == ["a seed 1"] and unreadable == 3


def test_the_issue_87_store_with_a_summary_cut_to_40_bytes_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """`cli.py table=... table.store=<a store with one summary.json cut to 40 bytes>
    table.gather_only=true`: one line naming the file, exit code 2, no traceback (it was a 67-line
    JSONDecodeError that named no file)."""
    from tests.support.cli_runs import error_line, run_cli_here

    from core.rundir import RunDir

    store = tmp_path / "store"
    run = store / "sgd" / "seed_0"
    write_run(RunDir(run), run_summary(0.9))
    cut(run / "summary.json")
    (store / "store.json").write_text(json.dumps({"table": "smoke", "quick": False}))
    proc = run_cli_here(["table=smoke", f"table.store={store}", "table.gather_only=true",
                         f"hydra.run.dir={tmp_path / 'out'}"])
    assert proc.returncode == 2
    line = error_line(proc)
    assert f"{run / 'summary.json'}: not valid JSON" in line and "git checkout" in line
    assert sorted(os.listdir(store)) == ["sgd", "store.json"]  # nothing written to the store
