"""Floors that count what was tested (issue 88): an accuracy is a share of the units its task
scores, which summary.json records from the task (a language model's characters, not its windows);
runs from before derive them from their data split; a loss's cell is floored by the set's standard
error each run records; and the tasks record both."""

import math
import statistics
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import stats as st

from tests.support.table_files import read_csv, run_summary, table_node, write_run


def _hand_cell(values: list[float], n: int) -> float:
    p = (n * statistics.fmean(values) + 2) / (n + 4)
    seed = st.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return math.hypot(seed, st.norm.ppf(0.975) * math.sqrt(p * (1 - p) / (n + 4)))


def _rows(out: Path, accs: dict[str, list[float]], **summary: object) -> None:
    from tables.config import RowConfig, row_dir

    for label, values in accs.items():
        for seed, acc in enumerate(values, 1):
            write_run(row_dir(out, RowConfig(label=label), seed), {**run_summary(acc), **summary})


ACCS = {"base": [0.46, 0.47, 0.465], "row": [0.44, 0.45, 0.447]}


def test_a_toy_task_scoring_four_units_an_example_is_floored_by_its_units(tmp_path: Path) -> None:
    """A task whose every example scores 4 units (test_units = 4 x test_samples): the floor is the
    share's on 1,440 units, not on 360 examples; runs.csv says both."""
    from tables.runner import run_table

    _rows(tmp_path, ACCS, test_samples=360, test_units=1440)
    assert run_table(table_node([{"label": "base"}, {"label": "row"}]), tmp_path) == 0
    rows = {r["label"]: r for r in read_csv(tmp_path / "table.csv")}
    assert float(rows["row"]["test_acc_ci95"]) == pytest.approx(_hand_cell(ACCS["row"], 1440), rel=1e-9)
    assert float(rows["row"]["test_acc_ci95"]) < _hand_cell(ACCS["row"], 360)
    runs = read_csv(tmp_path / "runs.csv")
    assert {r["test_samples"] for r in runs} == {"360"} and {r["test_units"] for r in runs} == {"1440"}
    assert "one test set of 1,440 examples" in (tmp_path / "table.md").read_text()


def test_a_language_models_old_runs_count_characters_from_their_split(tmp_path: Path) -> None:
    """Runs made before the record: 512 windows of 64 characters are 32,768 units (the LM table's
    allreduce@iid read +/-0.0431 on 512 where its seed part is +/-0.0023)."""
    from tables.runner import run_table

    split = {"partition": "iid", "val_samples": 512, "context_length": 64}
    _rows(tmp_path, ACCS, test_samples=512, data_split=split, task="language_model")
    assert run_table(table_node([{"label": "base"}, {"label": "row"}]), tmp_path) == 0
    rows = {r["label"]: r for r in read_csv(tmp_path / "table.csv")}
    for metric, n in (("test_acc", 512 * 64), ("val_acc", 512 * 64)):
        assert float(rows["row"][f"{metric}_ci95"]) == pytest.approx(_hand_cell(ACCS["row"], n), rel=1e-9)
    assert "one test set of 32,768 characters" in (tmp_path / "table.md").read_text()


def test_a_loss_cell_is_floored_by_the_set_error_its_runs_record(tmp_path: Path) -> None:
    """test_loss_se recorded by every seed: h = sqrt(h_seed^2 + (1.96 mean SE)^2); a row where one
    seed lacks it keeps the seeds' interval alone; table.md states the formula."""
    from tables.config import RowConfig, row_dir
    from tables.runner import run_table

    losses = {"base": [1.76, 1.75, 1.77], "row": [1.80, 1.81, 1.79]}
    ses = [0.010, 0.012, 0.011]
    for label, values in losses.items():
        for seed, (loss, se) in enumerate(zip(values, ses), 1):
            write_run(row_dir(tmp_path, RowConfig(label=label), seed), {"test_loss": loss, "test_loss_se": se,
                                                                       "val_loss": loss})
    node = table_node([{"label": "base"}, {"label": "row"}], columns=["test_loss"], compare_metric="test_loss",
                      select_metric="val_loss")
    assert run_table(node, tmp_path) == 0
    rows = {r["label"]: r for r in read_csv(tmp_path / "table.csv")}
    seed_part = st.t.ppf(0.975, 2) * statistics.stdev(losses["row"]) / math.sqrt(3)
    want = math.hypot(seed_part, st.norm.ppf(0.975) * statistics.fmean(ses))
    assert float(rows["row"]["test_loss_ci95"]) == pytest.approx(want, rel=1e-9)
    assert "SE_set the mean over the seeds of the standard error of the mean loss" in (tmp_path / "table.md").read_text()


def test_the_tasks_record_what_their_metrics_count() -> None:
    """The language model scores every position of every window (characters) and gives the loss's
    standard error over windows; classification counts samples and per-sample losses; the evaluator
    records both beside the metrics."""
    from core.spec import ImageSpec, TextSpec
    from core.task import task_for
    from engine.train.evaluation import evaluate_scored

    gen = torch.Generator().manual_seed(0)
    logits, target = torch.randn(5, 7, 11, generator=gen), torch.randint(0, 11, (5, 7), generator=gen)
    lm = task_for(TextSpec(11, 7))
    batches = [(logits[:2], target[:2]), (logits[2:], target[2:])]
    got = evaluate_scored(torch.nn.Identity(), batches, lambda m, x: m(x), torch.device("cpu"), lm, prefix="test")
    windows = F.cross_entropy(logits.reshape(-1, 11), target.reshape(-1), reduction="none").reshape(5, 7).mean(1)
    assert got["test_units"] == 35 and lm.unit == "character"
    assert got["test_loss_se"] == pytest.approx(float(np.std(windows.numpy(), ddof=1) / math.sqrt(5)), rel=1e-5)
    assert got["test_loss"] == pytest.approx(float(windows.mean()), rel=1e-5)
    clf = task_for(ImageSpec(1, 8, 3))
    x, y = torch.randn(6, 3, generator=gen), torch.randint(0, 3, (6,), generator=gen)
    per = F.cross_entropy(x, y, reduction="none")
    out = clf.scored(clf.batch_sums(x, y), "val")
    assert out["val_units"] == 6 and out["val_loss_se"] == pytest.approx(float(per.std() / math.sqrt(6)), rel=1e-5)
