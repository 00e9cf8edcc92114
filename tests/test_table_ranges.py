"""Intervals that stay in the metric's range (issue 88): a row with a diverged seed gets a cell
interval inside [0, 1] and a difference inside [-1, 1], is marked unstable with its seeds in table.md,
table.csv and the figures; a stable row near 1.0 is cut at 1 and not marked; no verdict moves."""

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.table_files import read_csv, reported, table_node


def _ten_seeds(out: Path, label: str, accs: list[float], **kw: Any) -> None:
    from tables.config import RowConfig, row_dir
    from tests.support.table_files import run_summary, write_run

    for seed, acc in enumerate(accs, 1):
        write_run(row_dir(out, RowConfig(label=label), seed), run_summary(acc, **kw))


BASE = [0.981, 0.982, 0.980, 0.983, 0.981, 0.982, 0.980, 0.981, 0.983, 0.982]
# MNIST-1D's ef_signsgd@dir0.1: nine seeds near 0.97 and one collapsed to chance (0.8827 +/- 0.1977)
COLLAPSED = [0.968, 0.971, 0.964, 0.968, 0.974, 0.963, 0.975, 0.974, 0.974, 0.097]


def test_a_row_with_a_collapsed_seed_stays_in_range_and_is_marked_unstable(tmp_path: Path) -> None:
    from tables.runner import run_table

    _ten_seeds(tmp_path, "base", BASE)
    _ten_seeds(tmp_path, "ef", COLLAPSED)
    node = table_node([{"label": "base"}, {"label": "ef"}], seeds=list(range(1, 11)), plots=["levels", "intervals"])
    assert run_table(node, tmp_path) == 0
    rows = {r["label"]: r for r in read_csv(tmp_path / "table.csv")}
    ef = rows["ef"]
    mean, h = float(ef["test_acc"]), float(ef["test_acc_ci95"])
    assert mean + h > 1  # the t interval as computed reaches past 1 ...
    assert float(ef["test_acc_low"]) == pytest.approx(mean - h) and float(ef["test_acc_high"]) == 1.0  # ... cut there
    assert "unstable" in ef and "seed 10: 0.097" in ef["unstable"] and not rows["base"]["unstable"]
    for low, high in (("diff_low", "diff_high"), ("diff_low_holm", "diff_high_holm")):
        assert -1.0 <= float(ef[low]) < float(ef["diff"]) < float(ef[high]) <= 1.0
    markdown = (tmp_path / "table.md").read_text()
    assert f"| ef | {mean:.4f} [{mean - h:.4f}, 1.0000] **unstable** |" in markdown
    assert "- ef: **unstable**: the seeds' t interval over 10 seeds" in markdown


def test_cutting_moves_no_verdict_and_a_stable_row_near_one_is_not_unstable(tmp_path: Path) -> None:
    """Three seeds at 0.9972 on 360 test images: the test set's floor takes the interval past 1, so it
    is cut at 1, but its seeds agree: not unstable. A wide difference's Holm interval, [-6.15,
    +5.47] on workers_cpu's dgs.w8@dir0.1, is cut at [-1, 1] and stays unresolved; the p-values
    are those of the interval before the cut."""
    from tables.stats import difference

    from tables.runner import run_table

    reported(tmp_path, "base", [0.9972, 0.9972, 0.9972])
    reported(tmp_path, "dgs", [0.824, 0.584, 0.455])
    assert run_table(table_node([{"label": "base"}, {"label": "dgs"}]), tmp_path) == 0
    rows = {r["label"]: r for r in read_csv(tmp_path / "table.csv")}
    assert float(rows["base"]["test_acc_high"]) == 1.0 and not rows["base"]["unstable"]
    assert rows["dgs"]["unstable"]  # 0.6210 +/- 0.4643 over 3 seeds
    seeds, base = {1: 0.824, 2: 0.584, 3: 0.455}, {1: 0.9972, 2: 0.9972, 3: 0.9972}
    cut = difference(seeds, base, n_examples=360, bounds=(-1.0, 1.0))
    bare = difference(seeds, base, n_examples=360)
    strict = 1 - 0.05 / 165  # workers_cpu's Holm step: its interval reached -6.15
    assert cut.leaves_range(strict) and cut.interval(strict)[0] == -1.0 and bare.interval(strict)[0] < -1.5
    assert cut.interval(strict)[1] == 1.0 < bare.interval(strict)[1] and not cut.resolved
    assert cut.p_value == bare.p_value == pytest.approx(float(rows["dgs"]["diff_p"]))
    assert -1.0 <= float(rows["dgs"]["diff_low"]) and rows["dgs"]["diff_resolved"] == "False"


def test_unstable_rows_are_drawn_hollow_and_named_in_the_figures(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tables.config import TableConfig
    from tables.plot_levels import differences_figure, levels_figure

    records = [{"label": "a", "baseline": "a", "test_acc": 0.98, "test_acc_ci95": 0.01, "diff": None, "unstable": ""},
               {"label": "b", "baseline": "a", "test_acc": 0.62, "test_acc_ci95": 0.46, "diff": -0.36,
                "diff_low": -1.0, "diff_high": 0.3, "diff_resolved": False, "diff_method": "paired",
                "unstable": "the seeds' t interval ..."},
               {"label": "c", "baseline": "a", "test_acc": 0.97, "test_acc_ci95": 0.01, "diff": -0.01,
                "diff_low": -0.02, "diff_high": 0.0, "diff_resolved": False, "diff_method": "paired", "unstable": ""}]
    table = TableConfig(name="t", rows=[], seeds=[1, 2, 3])
    for figure in (levels_figure, differences_figure):
        fig = figure(plt, table, records)
        ax = fig.axes[0]
        labels = [t.get_text() for t in ax.get_yticklabels()]
        assert "b (unstable)" in labels and "c" in labels
        faces = {lab: c.lines[0].get_markerfacecolor() for lab, c in zip(labels, ax.containers)}
        assert faces["b (unstable)"] == "white" and faces["c"] != "white"
        bar = ax.containers[labels.index("b (unstable)")].lines[2][0].get_segments()[0]
        assert max(p[0] for p in bar) <= 1.0  # the interval drawn inside the range
        plt.close(fig)
    assert json.dumps(records)  # (the records stay plain data)
