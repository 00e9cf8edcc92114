"""`table.compare_with`: one task's verdicts set beside another's (tables/cross_task.py)."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest
from scipy.stats import kendalltau

from core.errors import UserError
from tables.cross_task import Verdict, across_lines, agreement, kendall_tau_b, read_verdicts
from tables.measure import Better


def compose_table(overrides: list[str]):
    """The table config `cli.py <overrides>` would load, validated."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    import cli  # registers the table schema
    from tables.config import load_table
    from tests.support.harness import CONF

    assert cli.register_schemas
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return load_table(compose(config_name="config", overrides=overrides).table)


def _record(label: str, diff: float, low: float, high: float, resolved: bool, holm: bool = True) -> dict:
    lo, hi = ("diff_low_holm", "diff_high_holm") if holm else ("diff_low", "diff_high")
    return {"label": label, "series": label.split("@")[0], "status": "ok", "diff": diff, lo: low, hi: high,
            "diff_resolved": resolved}


def test_a_lower_is_better_difference_is_turned_so_that_positive_is_better() -> None:
    # the language model's test loss: a row 0.05 nats below allreduce is better than it
    verdicts, corrected = read_verdicts([_record("dgc@iid", -0.05, -0.08, -0.02, True),
                                         {"label": "allreduce@iid", "status": "ok", "diff": ""}], Better.lower)
    assert corrected
    assert verdicts == {("dgc", "iid"): Verdict(0.05, 0.02, 0.08, True)}  # the baseline has no difference
    same, _ = read_verdicts([_record("dgc@iid", 0.01, -0.01, 0.03, False)], Better.higher)
    assert same == {("dgc", "iid"): Verdict(0.01, -0.01, 0.03, False)}


def test_a_record_made_before_holms_columns_is_read_by_its_uncorrected_interval() -> None:
    verdicts, corrected = read_verdicts([_record("sgp@iid", -0.003, -0.006, 0.0, False, holm=False)], Better.higher)
    assert not corrected and verdicts[("sgp", "iid")] == Verdict(-0.003, -0.006, 0.0, False)


@pytest.mark.parametrize("here,there,expected", [
    ((0.02, True), (0.1, True), "agree"),
    ((-0.02, True), (-0.1, True), "agree"),
    ((0.02, True), (-0.1, True), "**disagree**"),
    ((0.02, True), (0.1, False), "resolved here only"),
    ((0.02, False), (-0.1, True), "resolved there only"),
    ((0.02, False), (-0.1, False), "neither resolved"),
])
def test_verdicts(here: tuple, there: tuple, expected: str) -> None:
    assert agreement(Verdict(here[0], 0, 0, here[1]), Verdict(there[0], 0, 0, there[1])) == expected


@pytest.mark.parametrize("xs,ys,by_hand", [
    ([1, 2, 3, 4], [1, 3, 2, 4], 4 / 6),                   # 5 concordant, 1 discordant
    ([1, 1, 2], [1, 2, 3], 2 / 6 ** 0.5),                   # a tie in x: tau-b's denominator sqrt(2 * 3)
    ([3, 1, 4, 1, 5, 9, 2], [2, 7, 1, 8, 2, 8, 1], None),   # ties in both: against scipy
])
def test_kendall_tau_b(xs: list, ys: list, by_hand: float | None) -> None:
    got = kendall_tau_b(xs, ys)
    assert got == pytest.approx(kendalltau(xs, ys).statistic)
    if by_hand is not None:
        assert got == pytest.approx(by_hand)
    assert kendall_tau_b([1.0], [2.0]) is None and kendall_tau_b([1, 1], [2, 3]) is None


def _write_other(results: Path, configs: Path, name: str, rows: list[dict], metric: str) -> None:
    (results / name).mkdir(parents=True)
    keys = sorted({k for r in rows for k in r})
    with open(results / name / "table.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
    configs.mkdir(exist_ok=True)
    (configs / f"{name}.yaml").write_text(f"compare_metric: {metric}\n")


def test_the_section_counts_each_verdict_and_lists_the_rows_that_say_something(tmp_path: Path) -> None:
    results, configs = tmp_path / "results", tmp_path / "conf"
    # the other task measures a loss (lower is better): its raw differences have the opposite sign
    _write_other(results, configs, "lm", [
        _record("dgc@iid", -0.05, -0.08, -0.02, True),     # better there
        _record("sgp@iid", 0.04, 0.01, 0.07, True),        # worse there
        _record("qsgd@iid", 0.01, -0.02, 0.04, False),
        _record("lsgd@roles", 0.30, 0.20, 0.40, True),
    ], "test_loss")
    here = {("dgc", "iid"): Verdict(0.02, 0.01, 0.03, True),      # agree: better in both
            ("sgp", "iid"): Verdict(0.03, 0.01, 0.05, True),      # disagree
            ("qsgd", "iid"): Verdict(-0.01, -0.02, 0.0, False),   # neither
            ("easgd", "iid"): Verdict(-0.5, -0.6, -0.4, True),    # not in the other table
            ("lsgd", "dir0.1"): Verdict(-0.4, -0.5, -0.3, True)}  # agree: worse in both
    text = "\n".join(across_lines("test_acc", here, {"lm": {"iid": "iid", "dir0.1": "roles"}, "absent": {"iid": "iid"}},
                                  results, configs))
    assert "| iid | iid | 3 | 1 | 1 | 0 | 0 | 1 | -0.33 |" in text  # tau-b of (0.02, 0.03, -0.01) vs (0.05, -0.04, -0.01)
    assert "| dir0.1 | roles | 1 | 1 | 0 | 0 | 0 | 0 | - |" in text
    assert "| sgp | iid | iid | +0.0300 [+0.0100, +0.0500] | -0.0400 [-0.0700, -0.0100] | **disagree** |" in text
    assert "| dgc | iid | iid |" in text and "| qsgd |" not in text and "easgd" not in text
    assert "**absent**: not produced yet" in text
    # a partial table with no finished row says so instead of a table of zeros
    assert across_lines("test_acc", {}, {"lm": {"iid": "iid"}}, results, configs)[-2] == (
        "No row of this table has a difference from its baseline yet.")


def test_compare_with_must_name_a_table_and_this_tables_variants() -> None:
    table = compose_table(["table=head_to_head_mnist1d_cpu"])
    assert table.compare_with  # the head-to-heads set themselves beside the other tasks
    with pytest.raises(UserError, match="compare_with.head_to_head_cpu maps roles, which is not a variant"):
        compose_table(["table=head_to_head_mnist1d_cpu", "+table.compare_with.head_to_head_cpu.roles=iid"])
    with pytest.raises(UserError, match="compare_with names nowhere, which is not a table"):
        compose_table(["table=head_to_head_mnist1d_cpu", "+table.compare_with.nowhere={iid: iid}"])


def test_a_gathered_table_sets_its_rows_beside_the_other_tasks(tmp_path: Path) -> None:
    """Through the table runner: the section is computed from the gathered records, here against
    digits' produced head-to-head as re-read under the protocol (docs/results/head_to_head_cpu/
    table_reread.csv, where DiLoCo's -0.0093 on IID is not resolved across its 54 comparisons; its
    uncorrected interval in table.csv excludes 0)."""
    import json

    from omegaconf import OmegaConf

    from tables.runner import run_table
    from tables.config import RowConfig, row_dir

    accs = {"allreduce@iid": [0.95, 0.96, 0.97], "diloco@iid": [0.90, 0.905, 0.92]}  # diloco 0.05 worse, resolved
    for label, values in accs.items():
        for seed, acc in enumerate(values):
            run = row_dir(tmp_path, RowConfig(label=label), seed)
            run.root.mkdir(parents=True)
            run.summary.write_text(json.dumps({"test_acc": acc, "val_acc": acc, "steps": 10}))
            run.metrics.write_text("")
    table = OmegaConf.create({"name": "t", "baseline": "allreduce", "seeds": [0, 1, 2], "plots": [], "paper_metrics": [],
                              "columns": ["test_acc"], "ratios": [], "rows": [{"label": "allreduce"}, {"label": "diloco"}],
                              "variants": {"iid": ["data.partition=iid"]},
                              "compare_with": {"head_to_head_cpu": {"iid": "iid"}}})
    assert run_table(table, tmp_path) == 0
    markdown = (tmp_path / "table.md").read_text()
    assert "### Against head_to_head_cpu (test_acc) (its comparisons re-read under the protocol" in markdown
    assert "| iid | iid | 1 | 0 | 0 | 1 | 0 | 0 | - |" in markdown, markdown
    assert ("| diloco | iid | iid | -0.0517 [-0.0588, -0.0445] | -0.0093 [-0.0461, +0.0276] | resolved here only |"
            in markdown)


def test_an_older_tables_reading_under_the_protocol_is_preferred(tmp_path: Path) -> None:
    from tables.cross_task import read_other

    results, configs = tmp_path / "results", tmp_path / "conf"
    _write_other(results, configs, "old", [_record("sgp@iid", -0.01, -0.015, -0.005, True, holm=False)], "test_acc")
    assert read_other("old", results, configs).verdicts[("sgp", "iid")].resolved  # uncorrected: resolved
    with open(results / "old" / "table_reread.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(_record("x@iid", 0, 0, 0, False)))
        writer.writeheader()
        writer.writerow(_record("sgp@iid", -0.01, -0.03, 0.01, False))
    other = read_other("old", results, configs)
    assert other.source == "table_reread.csv" and other.corrected
    assert other.verdicts[("sgp", "iid")] == Verdict(-0.01, -0.03, 0.01, False)
