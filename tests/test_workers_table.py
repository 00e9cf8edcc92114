"""The number of workers as an axis of a table (`table.workers`, docs/workers.md): the rows it
expands to (labels, launch.nproc with a server's extra rank, the batch rule, baselines per
count, forked ranks), its one-line refusals, the batch rule in table.md, the figure against
workers, and a small table run end to end on forked ranks and resumed."""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from core.errors import UserError
from tests.support.cli_runs import run_cli
from tests.test_tables import read_csv, shipped_table


def load(name: str, overrides: Sequence[str] = ()) -> Any:
    """The shipped table as cli.py loads it (its rows are read here, not composed)."""
    with shipped_table(name, overrides) as table:
        return table


def override(row, key: str) -> str:
    """The last value a row's overrides give `key` (the one Hydra keeps)."""
    return [o.split("=", 1)[1] for o in row.overrides if o.startswith(f"{key}=")][-1]


def test_workers_cpu_expands_every_method_at_every_count_and_partition() -> None:
    table = load("workers_cpu")
    methods = ["allreduce", "local_sgd_h4", "local_sgd_qsr", "diloco", "wagma", "dpsgd", "sgp", "adpsgd", "lsgd",
               "easgd", "dgs", "asgd"]
    counts = [4, 8, 16, 32, 64]
    assert [r.label for r in table.rows] == [f"{m}.w{n}@{v}" for v in ("iid", "dir0.1") for m in methods for n in counts]
    for row in table.rows:
        name, n = row.label.split("@")[0].rsplit(".w", 1)
        server = 1 if name in ("dgs", "asgd") else 0  # a parameter server's rank besides its workers
        assert int(override(row, "launch.nproc")) == int(n) + server, row.label
        assert override(row, "train.global_batch_size") == "512", row.label  # the batch rule: constant global batch
        assert row.baseline == f"allreduce.w{n}@{row.label.split('@')[1]}", row.label
        assert (row.x, row.series) == (float(n), name)
    assert "launch.launcher=fork" in table.overrides and "train.epochs=12" in table.overrides  # equal samples
    assert len(table.seeds) >= 3 and table.interaction_from == "iid" and "workers" in table.plots

    quick = load("workers_cpu", ["table.quick=true"])
    assert [r.label for r in quick.rows] == [f"{m}.w{n}@{v}" for v in ("iid", "dir0.1")
                                             for m in ("allreduce", "local_sgd_h4") for n in (4, 16)]
    assert quick.seeds == [0] and "train.epochs=2" in quick.overrides


def test_a_parameter_servers_rate_follows_the_batch_of_a_push_and_an_averages_the_global_batch(tmp_path: Path) -> None:
    """At a constant global batch a parameter server's push shrinks with the workers and is applied
    on its own, so its rows scale the rate by the push's batch (0.02 at 4 workers, 16 times less at
    64); allreduce, one averaged update per step, keeps its rate at every count. Planned from the
    table's own row arguments, as cli.py would."""
    from core.rundir import RunDir
    from engine.plan import build_plan
    from tables.config import row_args
    from tests.support.harness import compose

    table = load("workers_cpu")
    rows = {r.label: r for r in table.rows}

    def planned_lr(label: str) -> tuple[float, int]:
        run = RunDir(tmp_path / label)
        args = [a for a in row_args(table, rows[label], 0, run) if not a.startswith("hydra.")]
        world = int(override(rows[label], "launch.nproc"))
        plan = build_plan(compose(args), run, world, world)
        return plan.hyper.peak_lr, plan.batch.per_rank

    assert planned_lr("dgs.w4@iid") == (pytest.approx(0.02), 128)
    assert planned_lr("dgs.w64@iid") == (pytest.approx(0.02 / 16), 8)
    assert planned_lr("asgd.w16@dir0.1") == (pytest.approx(0.02 / 4), 32)
    allreduce_lr = planned_lr("allreduce.w4@iid")[0]
    assert planned_lr("allreduce.w64@iid") == (allreduce_lr, 8)


@pytest.mark.parametrize("workers, words", [
    ("{counts: [4, 6], batch: global_constant, global_batch: 512}", ["workers.global_batch=512", "6 workers"]),
    ("{counts: [4, 8], batch: global_constant}", ["workers.batch=global_constant needs workers.global_batch"]),
    ("{counts: [4, 8], quick_counts: [16]}", ["workers.quick_counts=[16]", "workers.counts=[4, 8]"]),
    ("{counts: [4, 4]}", ["workers.counts=[4, 4]", "distinct"]),
    ("{counts: [4, 8], global_batch: 64}", ["workers.global_batch=64", "global_constant only"]),
])
def test_bad_workers_settings_are_one_line(workers: str, words: list[str]) -> None:
    from tables.config import RowConfig, TableConfig, WorkersAxis, expand_rows
    from omegaconf import OmegaConf

    from core.schema import typed_section

    axis = typed_section(WorkersAxis, OmegaConf.create(workers), "table.workers")
    with pytest.raises(UserError) as err:
        expand_rows(TableConfig(name="t", rows=[RowConfig(label="a")], workers=axis))
    assert all(w in str(err.value) for w in words) and "\n" not in str(err.value), str(err.value)


def test_batch_rule_in_table_md_and_the_figure_against_workers(tmp_path: Path) -> None:
    """From written results: table.md states the batch rule; the figure's series are the methods,
    their points the counts with the mean and interval over seeds, one panel row per variant."""
    from tables.config import RowConfig, TableConfig, WorkersAxis, expand_rows, row_dir
    from tables.plot_levels import workers_series
    from tables.plots import draw_table_plots
    from tables.render import gather, render_markdown

    table = expand_rows(TableConfig(name="t", baseline="a", seeds=[0, 1], plots=["workers"],
                                    rows=[RowConfig(label="a"), RowConfig(label="b")],
                                    workers=WorkersAxis(counts=[2, 8]), variants={"iid": [], "skew": []},
                                    columns=["test_acc", "comm_bytes"], test_examples=1000))
    acc = {"a": 0.9, "b": 0.8}
    for row in table.rows:
        name, n = row.label.split("@")[0].rsplit(".w", 1)
        for seed in table.seeds:
            run = row_dir(tmp_path, row, seed)
            run.root.mkdir(parents=True)
            drop = 0.05 * int(n) / 8 if name == "b" and row.label.endswith("skew") else 0.0
            run.summary.write_text(json.dumps({"test_acc": acc[name] - drop + 0.01 * seed, "test_samples": 1000,
                                               "comm_bytes": 1e6 * int(n) * (1 + seed)}))
    records = gather(table, tmp_path, {})
    markdown = render_markdown(table, records)
    assert "Workers axis: every row at 2, 8 training workers" in markdown
    assert "each worker keeps its recipe's batch (train.batch_size)" in markdown
    skew = workers_series(records, "test_acc", "skew")
    assert set(skew) == {"a", "b"} and [p[0] for p in skew["b"]] == [2.0, 8.0]
    assert skew["b"][1][1] == pytest.approx(0.8 - 0.05 + 0.005) and skew["b"][1][2] > 0  # mean, interval
    assert workers_series(records, "test_acc", "iid")["b"][1][1] == pytest.approx(0.805)
    assert workers_series(records, "comm_bytes", "iid")["a"][0][1] == pytest.approx(3e6)
    made = draw_table_plots(table, records, tmp_path)
    assert [p.name for p in made] == ["workers.png"] and made[0].stat().st_size > 10_000


def test_twelve_rows_each_get_their_own_look_in_the_figures() -> None:
    """workers_cpu has 12 methods: past matplotlib's 10-colour default cycle two would share a
    colour (asgd drawn as local SGD); every row gets its own colour and line, stable by order."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from tables.plots import row_styles

    names = [f"m{i}" for i in range(45)]
    styles = row_styles(plt, names)
    looks = {(tuple(s["color"]), s["fmt"]) for s in styles.values()}
    assert len(looks) == 45
    assert len({tuple(styles[n]["color"]) for n in names[:12]}) == 12
    assert row_styles(plt, names[:3])["m2"] == styles["m2"]


def test_a_workers_table_runs_on_forked_ranks_and_resumes(cli_env: dict, tmp_path: Path) -> None:
    conf = tmp_path / "conf" / "table"
    conf.mkdir(parents=True)
    (conf / "w.yaml").write_text(
        "# @package table\ndefaults: [_schema, _self_]\nname: w\nbaseline: a\nallow_dirty: true\nfork: true\n"
        "workers: {counts: [2, 4], batch: global_constant, global_batch: 64}\nplots: [workers]\n"
        "overrides: [train.max_steps=6, train.eval_every_epochs=null, checkpoint.every_epochs=null]\n"
        "rows:\n  - {label: a, overrides: [algo=local_sgd]}\n")
    args = ["table=w", f"hydra.searchpath=[file://{tmp_path / 'conf'}]", f"hydra.run.dir={tmp_path / 'out'}"]
    proc = run_cli(args, cli_env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = read_csv(tmp_path / "out" / "table.csv")
    assert list(rows) == ["a.w2", "a.w4"]
    for label in rows:
        summary = json.loads((tmp_path / "out" / label / "seed_0" / "summary.json").read_text())
        assert summary["world_size"] == int(label[-1]) and summary["global_batch"] == 64 and summary["steps"] == 6
        overrides = (tmp_path / "out" / label / "seed_0" / ".hydra" / "overrides.yaml").read_text()
        assert "launch.launcher=fork" in overrides
    assert (tmp_path / "out" / "workers.png").is_file()
    (tmp_path / "out" / "a.w4" / "seed_0" / "summary.json").unlink()  # a row lost: only it runs again
    again = run_cli(args, cli_env)
    assert again.returncode == 0 and again.stdout.count("already complete") == 1, again.stdout[-2000:]
    assert (tmp_path / "out" / "a.w4" / "seed_0" / "summary.json").exists()
