"""`table.split_seeds=per_seed` (issue 34): every seed evaluated on validation and test data of its
own, where the data set can redraw them (MNIST-1D's generator, the corpus's held-out blocks,
digits' test split), two rows at one seed on the same data (still paired), and one line where it
cannot be done."""
from __future__ import annotations

import csv
import json
from pathlib import Path

from tests.support.cli_runs import error_line, run_cli, run_cli_here
from tests.test_tables import write_table

PER_SEED = "seeds: [1, 2]\nsplit_seeds: per_seed\n"


MNIST1D = ("  - {label: a, overrides: [data=mnist1d, model=mnist1d_cnn, data.num_samples=1000]}\n"
           "  - {label: b, overrides: [data=mnist1d, model=mnist1d_cnn, data.num_samples=1000, optim.lr=0.05]}\n")


def test_each_seed_draws_its_own_data_and_rows_at_one_seed_share_it(cli_env: dict, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_cli([*write_table(tmp_path / "conf", "seeded", MNIST1D, PER_SEED), f"hydra.run.dir={out}"], cli_env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for label in ("a", "b"):
        for seed in (1, 2):
            # what the data set generated with and split by, as the run recorded it
            split = json.loads((out / label / f"seed_{seed}" / "summary.json").read_text())["data_split"]
            assert split["generated"]["generator_seed"] == seed and split["split_seed"] == seed, split
    with open(out / "runs.csv") as fh:
        runs = list(csv.DictReader(fh))
    assert {(r["label"], r["seed"], r["split_seed"], r["generator_seed"]) for r in runs} == \
        {(lbl, s, s, s) for lbl in ("a", "b") for s in ("1", "2")}
    with open(out / "table.csv") as fh:
        b = next(r for r in csv.DictReader(fh) if r["label"] == "b")
    assert b["diff_method"] == "paired", b
    assert "Each seed has validation and test data of its own" in (out / "table.md").read_text()


def test_a_fixed_test_set_is_refused_in_one_line(tmp_path: Path) -> None:
    rows = ("  - {label: a, overrides: [data=cifar10, model=resnet20, data.root=/nowhere]}\n")
    proc = run_cli_here([*write_table(tmp_path / "conf", "seeded", rows, PER_SEED), "table.dry_run=true",
                         f"hydra.run.dir={tmp_path / 'out'}"])
    line = error_line(proc)
    assert proc.returncode == 2 and "row a trains on data=cifar10, whose test set is fixed" in line, line
    assert "table.split_seeds=per_table" in line and "mnist1d" in line, line


def test_a_row_that_sets_a_seeded_option_itself_is_refused(tmp_path: Path) -> None:
    rows = "  - {label: a, overrides: [data.split_seed=7]}\n"
    proc = run_cli_here([*write_table(tmp_path / "conf", "seeded", rows, PER_SEED), "table.dry_run=true",
                         f"hydra.run.dir={tmp_path / 'out'}"])
    line = error_line(proc)
    assert proc.returncode == 2 and "row a sets data.split_seed=7" in line, line


def test_rows_evaluated_on_other_data_at_one_seed_are_not_paired() -> None:
    from tables.compare import pairing

    def run(split_seed: int) -> dict:
        return {"train_ranks": 8, "data_split": {"partition": "iid", "split_seed": split_seed, "generated":
                                                  {"generator_seed": split_seed}}}

    assert pairing({"a": {1: run(1)}, "b": {1: run(1)}}, "a", "b") == ""
    why = pairing({"a": {1: run(1)}, "b": {1: run(0)}}, "a", "b")
    assert why.startswith("other data at seed 1"), why


def test_a_run_made_for_one_shared_test_set_is_not_reused_by_a_per_seed_table(tmp_path: Path) -> None:
    run = tmp_path / "out" / "a" / "seed_2"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"test_acc": 0.5, "data_split": {"split_seed": 0}}))
    proc = run_cli_here([*write_table(tmp_path / "conf", "seeded", MNIST1D, PER_SEED), "table.dry_run=true",
                         f"hydra.run.dir={tmp_path / 'out'}"])
    line = error_line(proc)
    assert proc.returncode == 2 and f"{run} was evaluated with data.split_seed=0, not its seed 2" in line, line
