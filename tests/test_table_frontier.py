"""A frontier table (issue 89): rows grouped into methods by their labels, each point's bytes per
worker, each method's best setting chosen on validation (never test) with the settings validation
cannot tell apart named beside it, and the files a gather writes (frontier.csv, frontier.png, the
table.md section)."""

from pathlib import Path

import pytest

from tables.frontier import method_and_setting
from tests.support.table_files import read_csv, run_summary, table_node, write_run


def _rows(out: Path, label: str, test: list[float], val: list[float], sent: float, ranks: int = 8) -> None:
    from tables.config import RowConfig, row_dir

    for seed, t, v in zip([1, 2, 3], test, val):
        write_run(row_dir(out, RowConfig(label=label), seed),
                  run_summary(t, ranks=ranks, val_acc=v, comm_bytes=sent, data_split={"partition": "iid", "val_samples": 6000}),
                  [{"step": 10, "test_acc": t, "comm_bytes_total": sent}])


def test_labels_name_their_method_and_setting() -> None:
    assert method_and_setting("local_sgd.h8@iid") == ("local_sgd", "h8")
    assert method_and_setting("dgs.d0.01@dir0.1") == ("dgs", "d0.01")
    assert method_and_setting("allreduce@iid") == ("allreduce", "")


def test_each_method_s_best_setting_is_chosen_on_validation_and_its_points_are_per_worker(tmp_path: Path) -> None:
    """local SGD's H = 8 is best on validation by a wide margin, H = 32 best on test: H = 8 is chosen
    (a choice on test would pick 32); H = 2 sits within the validation set's noise of H = 8 and is
    named beside it, H = 32 is not; H = 64, best on its two finite seeds, diverged on the third and
    is no candidate. Bytes per worker are the run's (all ranks') bytes over its 8
    training ranks. The section, frontier.csv and frontier.png are written for a table plotting
    `frontier`, and nothing of it for one that does not."""
    from tables.runner import run_table

    _rows(tmp_path, "base", [0.90, 0.91, 0.92], [0.90, 0.91, 0.92], 8e8)
    _rows(tmp_path, "local_sgd.h2", [0.90, 0.905, 0.91], [0.9515, 0.9505, 0.9495], 4e8)
    _rows(tmp_path, "local_sgd.h8", [0.90, 0.905, 0.91], [0.952, 0.951, 0.950], 1e8)
    _rows(tmp_path, "local_sgd.h32", [0.97, 0.975, 0.98], [0.80, 0.81, 0.82], 2.5e7)
    _rows(tmp_path, "local_sgd.h64", [0.5, 0.5, 0.5], [0.99, 0.99, float("nan")], 1e7)  # a diverged seed
    _rows(tmp_path, "dgs.d0.01", [0.85, 0.86, 0.87], [0.85, 0.86, 0.87], 3.2e7, ranks=4)
    rows = [{"label": label} for label in ("base", "local_sgd.h2", "local_sgd.h8", "local_sgd.h32", "local_sgd.h64",
                                           "dgs.d0.01")]
    assert run_table(table_node(rows, plots=["frontier"], columns=["test_acc", "val_acc", "comm_bytes"]), tmp_path) == 0
    points = {r["label"]: r for r in read_csv(tmp_path / "frontier.csv")}
    assert float(points["local_sgd.h8"]["bytes_per_worker"]) == pytest.approx(1e8 / 8)
    assert float(points["dgs.d0.01"]["bytes_per_worker"]) == pytest.approx(3.2e7 / 4)
    best = {label for label, p in points.items() if p["best_on_validation"] == "True"}
    assert best == {"base", "local_sgd.h8", "dgs.d0.01"}
    order = [r["setting"] for r in read_csv(tmp_path / "frontier.csv") if r["method"] == "local_sgd"]
    assert order == ["h64", "h32", "h8", "h2"]  # a curve by increasing bytes per worker
    markdown = (tmp_path / "table.md").read_text()
    line = next(line for line in markdown.splitlines() if line.startswith("| local_sgd |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[2:4] == ["4", "h8"] and cells[-1] == "h2" and cells[-2] == "12.50"
    assert (tmp_path / "frontier.png").stat().st_size > 0

    plain = tmp_path / "plain"
    for label in ("base", "local_sgd.h8"):
        _rows(plain, label, [0.9, 0.91, 0.92], [0.9, 0.91, 0.92], 1e8)
    assert run_table(table_node([{"label": "base"}, {"label": "local_sgd.h8"}]), plain) == 0
    assert not (plain / "frontier.csv").exists() and "## Each method's knob" not in (plain / "table.md").read_text()


def test_the_baseline_is_drawn_as_a_band_once_variants_have_made_it_per_row() -> None:
    """With variants the table's baseline moves onto its rows (`allreduce@iid`); the figure still
    finds it and draws its interval as a band and its mean as a dashed black line (it drew it as
    one more coloured method)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tables.config import RowConfig, TableConfig
    from tables.frontier import Point
    from tables.plot_frontier import frontier_figure

    table = TableConfig(name="t", seeds=[1, 2, 3], baseline=None,
                        rows=[RowConfig(label="allreduce@iid", baseline="allreduce@iid"),
                              RowConfig(label="local_sgd.h5@iid", baseline="allreduce@iid")])
    base = Point("allreduce@iid", "allreduce", "", "iid", 5e8, 0.6, 0.55, 0.65, {1: 0.6}, False,
                 baseline=True)  # (as `points` marks it from its record: label == its baseline)
    local = Point("local_sgd.h5@iid", "local_sgd", "h5", "iid", 1e8, 0.7, 0.65, 0.75, {1: 0.7}, False)
    fig = frontier_figure(plt, table, [base, local], [])
    ax = fig.axes[0]
    dashed = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert [matplotlib.colors.to_hex(line.get_color()) for line in dashed] == ["#000000"]
    assert dashed[0].get_ydata()[0] == 0.6 and len(ax.patches) == 1  # the band: one span
    plt.close(fig)
