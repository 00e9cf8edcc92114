"""The evidence a table gives (issue 34), from written result files: intervals that never claim more
than the test set resolves, Holm's correction checked by hand, the power a table's own spread gives,
per-seed results from which every interval is recomputed, honest pairing, the skew interaction and
declared comparisons, a headline metric that is not accuracy, and the differences figure."""

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


# --- intervals that cannot lie ------------------------------------------------------------------

def test_a_row_with_no_spread_over_seeds_still_gets_the_interval_its_test_set_allows() -> None:
    """Every seed at 0.99 (s = 0): the cell's half-width is z SE of the Agresti-Coull share on 360
    examples, not 0; a row one image below its baseline on every seed is not resolved (it was:
    asgd@iid, [-0.0028, -0.0028]); 6 images on every seed are, as the exact sign test says."""
    from tables.stats import cell_half_width, difference, half_width

    assert half_width([0.99, 0.99, 0.99]) == 0.0
    p = (N_TEST * 0.99 + 2) / (N_TEST + 4)
    assert cell_half_width([0.99, 0.99, 0.99], N_TEST) == pytest.approx(1.959964 * math.sqrt(p * (1 - p) / 364), rel=1e-6)
    assert cell_half_width([1.0, 1.0, 1.0], N_TEST) > 0.005  # also at 100%: never width 0
    base = {1: 0.99, 2: 0.99, 3: 0.99}
    one = difference({s: v - images(1) for s, v in base.items()}, base, n_examples=N_TEST)
    assert one.low < one.mean < one.high and not one.resolved and one.high - one.low > 0.01
    assert not difference({s: v - images(5) for s, v in base.items()}, base, n_examples=N_TEST).resolved
    assert difference({s: v - images(6) for s, v in base.items()}, base, n_examples=N_TEST).resolved
    # the floor never narrows: with spread, the interval is at least the seeds' t interval
    spread = difference({1: 0.95, 2: 0.96, 3: 0.99}, {1: 0.90, 2: 0.92, 3: 0.97}, n_examples=N_TEST)
    bare = difference({1: 0.95, 2: 0.96, 3: 0.99}, {1: 0.90, 2: 0.92, 3: 0.97})
    assert spread.high - spread.low > bare.high - bare.low
    # without a floor the p-value is the paired t-test's
    assert bare.p_value == pytest.approx(st.ttest_rel([0.95, 0.96, 0.99], [0.90, 0.92, 0.97]).pvalue, rel=1e-6)


def test_holm_adjusts_a_family_as_computed_by_hand() -> None:
    """p = 0.01, 0.04, 0.03, 0.005 (m = 4): sorted 0.005, 0.01, 0.03, 0.04 -> 4 x 0.005 = 0.02,
    3 x 0.01 = 0.03, 2 x 0.03 = 0.06, max(0.06, 1 x 0.04) = 0.06. At alpha 0.05 the first two are
    resolved, Holm stops at the third; the levels of the intervals drawn are 0.05/4, 0.05/3, then
    0.05/2 for the two it stops at."""
    from tables.stats import holm, holm_levels

    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm_levels([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.05 / 3, 0.05 / 2, 0.05 / 2, 0.05 / 4])
    assert holm([0.2]) == [0.2] and holm([]) == []


def test_a_table_with_k_comparisons_applies_holm_and_its_drawn_intervals_agree(tmp_path: Path) -> None:
    """Three rows against one baseline (no test-set size recorded: the raw p-values are paired
    t-tests): table.csv's raw p are scipy's, its Holm p are the hand computation from them, and
    each Holm-level interval excludes 0 exactly when the row is resolved after correction, though
    two rows are resolved before it."""
    from tables.runner import run_table

    base = [0.90, 0.92, 0.97]
    rows = {"big": [0.95, 0.97, 1.03], "mid": [0.925, 0.95, 0.985], "none": [0.91, 0.91, 0.98]}  # p 0.004, 0.034, 0.67
    reported(tmp_path, "base", base, test_samples=None)
    for label, accs in rows.items():
        reported(tmp_path, label, accs, test_samples=None)
    for run in tmp_path.rglob("summary.json"):  # no set size: no floor, plain paired t
        summary = json.loads(run.read_text())
        summary.pop("test_samples")
        run.write_text(json.dumps(summary))
    table = table_node([{"label": "base"}, *({"label": r} for r in rows)])
    assert run_table(table, tmp_path) == 0
    by_label = {r["label"]: r for r in read_csv(tmp_path / "table.csv")}
    raw = {label: st.ttest_rel(accs, base).pvalue for label, accs in rows.items()}
    order = sorted(raw, key=raw.get)
    hand, running = {}, 0.0
    for rank, label in enumerate(order):
        running = max(running, min(1.0, (3 - rank) * raw[label]))
        hand[label] = running
    for label in rows:
        rec = by_label[label]
        assert float(rec["diff_p"]) == pytest.approx(raw[label], rel=1e-6)
        assert float(rec["diff_p_holm"]) == pytest.approx(hand[label], rel=1e-6)
        resolved = rec["diff_resolved"] == "True"
        assert resolved == (hand[label] < 0.05)
        low, high = float(rec["diff_low_holm"]), float(rec["diff_high_holm"])
        assert resolved == (low > 0 or high < 0), label
    assert by_label["mid"]["diff_resolved_raw"] == "True" and by_label["mid"]["diff_resolved"] == "False"
    assert by_label["big"]["diff_resolved"] == "True"
    markdown = (tmp_path / "table.md").read_text()
    assert "Holm" in markdown and "| mid - base | baseline | paired |" in markdown


def test_a_diverged_seed_is_shown_and_keeps_its_row_out_of_the_loss_comparisons(tmp_path: Path) -> None:
    """A reported run whose loss became NaN (ef_signsgd@dir0.1 and lowrank@dir0.1 seed 10 on
    MNIST-1D did, at 0.9): the gather does not crash (it did, in statistics.stdev), the loss cell
    says "diverged" rather than averaging the survivors, and on a loss headline that row is compared
    with nothing and says why, while the other rows keep their comparisons; runs.csv keeps the NaN."""
    from tables.runner import run_table

    for label, accs in {"base": [0.90, 0.92, 0.97], "blown": [0.91, 0.93, 0.96], "fine": [0.95, 0.97, 1.0]}.items():
        reported(tmp_path, label, accs)
    bad = next(p for p in tmp_path.rglob("summary.json") if "blown" in str(p) and "seed_2" in str(p))
    summary = json.loads(bad.read_text())
    summary["test_loss"] = float("nan")
    bad.write_text(json.dumps(summary))  # json writes NaN, as the trainer's summary does
    rows = [{"label": "base"}, {"label": "blown"}, {"label": "fine"}]
    table = table_node(rows, columns=["test_acc", "test_loss"], compare_metric="test_loss")
    assert run_table(table, tmp_path) == 0
    by_label = {r["label"]: r for r in read_csv(tmp_path / "table.csv")}
    assert by_label["blown"]["test_loss"] == "diverged" and by_label["blown"]["diff"] == ""
    assert "not finite on seed 2 (diverged)" in by_label["blown"]["note"]
    assert float(by_label["fine"]["test_loss"]) == pytest.approx(1 - statistics.fmean([0.95, 0.97, 1.0]))
    assert by_label["fine"]["diff"] != "" and by_label["fine"]["diff_p"] != ""
    assert "diverged" in (tmp_path / "table.md").read_text()
    blown = [r for r in read_csv(tmp_path / "runs.csv") if r["row"] == "blown" and r["seed"] == "2"]
    assert len(blown) == 1 and math.isnan(float(blown[0]["test_loss"]))


# --- per-seed results -----------------------------------------------------------------------------

def _hand_cell(values: list[float], n: int | None) -> float:
    h = st.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    if n:
        p = (n * statistics.fmean(values) + 2) / (n + 4)
        h = math.hypot(h, st.norm.ppf(0.975) * math.sqrt(p * (1 - p) / (n + 4)))
    return h


def _hand_diff(a: dict[int, float], b: dict[int, float], paired: bool, n: int) -> tuple[float, float, float]:
    """(mean, low, high) of a - b, from the formulas in docs/tables.md, independently of stats.py."""
    if paired:
        d = [a[s] - b[s] for s in sorted(a)]
        mean, se, df = statistics.fmean(d), statistics.stdev(d) / math.sqrt(len(d)), len(d) - 1
    else:
        va, vb = statistics.variance(a.values()) / len(a), statistics.variance(b.values()) / len(b)
        mean = statistics.fmean(a.values()) - statistics.fmean(b.values())
        se = math.sqrt(va + vb)
        df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    q = (n * abs(mean) + 2) / (n + 4)
    h = math.hypot(st.t.ppf(0.975, df) * se, st.norm.ppf(0.975) * math.sqrt(q * (1 - q) / (n + 4)))
    return mean, mean - h, mean + h


def test_runs_csv_reproduces_every_interval_of_table_csv(tmp_path: Path) -> None:
    """Every cell interval and every difference interval of table.csv, recomputed from runs.csv
    alone with the stated formulas (a paired row, an unpaired parameter-server row, a row with no
    spread, two variants)."""
    from tables.runner import run_table

    accs = {"base": [0.9861, 0.9889, 0.9917], "ps": [0.9833, 0.9861, 0.9917], "flat": [0.9833] * 3,
            "wide": [0.95, 0.97, 0.99]}
    for v, shift in (("iid", 0.0), ("skew", -0.02)):
        for label, values_ in accs.items():
            reported(tmp_path, f"{label}@{v}", [a + shift for a in values_], ranks=7 if label == "ps" else 8,
                      partition="iid" if v == "iid" else "dirichlet")
    table = table_node([{"label": label} for label in accs], variants={"iid": ["x=1"], "skew": ["x=2"]})
    assert run_table(table, tmp_path) == 0
    runs = read_csv(tmp_path / "runs.csv")
    assert len(runs) == 4 * 2 * 3 and {"row", "variant", "seed", "commit", "test_acc", "val_acc"} <= set(runs[0])
    per: dict[str, dict[int, dict[str, str]]] = {}
    for line in runs:
        per.setdefault(line["label"], {})[int(line["seed"])] = line
    for rec in read_csv(tmp_path / "table.csv"):
        mine = per[rec["label"]]
        for metric in ("test_acc", "val_acc"):
            values_ = [float(mine[s][metric]) for s in sorted(mine)]
            n = int(mine[1]["test_samples" if metric.startswith("test") else "val_samples"])
            assert float(rec[f"{metric}_ci95"]) == pytest.approx(_hand_cell(values_, n), rel=1e-9), (rec["label"], metric)
        if rec["label"] == rec["baseline"]:
            continue
        base = per[rec["baseline"]]
        paired = all(mine[s]["train_ranks"] == base[s]["train_ranks"] for s in mine)
        a = {s: float(mine[s]["test_acc"]) for s in mine}
        b = {s: float(base[s]["test_acc"]) for s in base}
        mean, low, high = _hand_diff(a, b, paired, int(mine[1]["test_samples"]))
        assert rec["diff_method"] == ("paired" if paired else "welch")
        assert [float(rec[k]) for k in ("diff", "diff_low", "diff_high")] == pytest.approx([mean, low, high], rel=1e-9)


# --- honest pairing, interaction, declared comparisons ----------------------------------------------

def test_rows_that_do_not_share_a_partition_are_compared_unpaired_and_say_why(tmp_path: Path) -> None:
    """A parameter-server row (7 training ranks of 8) and msgd (1 process) are compared with
    Welch's interval and one line each says why; msgd under a skewed variant is marked in one line
    as no skewed result and kept out of the skew interaction."""
    from tables.runner import run_table

    for v, part in (("iid", "iid"), ("skew", "dirichlet")):
        reported(tmp_path, f"base@{v}", [0.98, 0.985, 0.99], partition=part)
        reported(tmp_path, f"same@{v}", [0.97, 0.98, 0.985], partition=part)
        reported(tmp_path, f"ps@{v}", [0.97, 0.98, 0.985], ranks=7, partition=part)
        reported(tmp_path, f"msgd@{v}", [0.97, 0.98, 0.985], ranks=1, partition=part)
    table = table_node([{"label": r} for r in ("base", "same", "ps", "msgd")],
                   variants={"iid": ["x=1"], "skew": ["x=2"]}, interaction_from="iid")
    assert run_table(table, tmp_path) == 0
    rows = {r["label"]: r for r in read_csv(tmp_path / "table.csv")}
    assert rows["same@iid"]["diff_method"] == "paired" and rows["ps@iid"]["diff_method"] == "welch"
    assert rows["msgd@iid"]["diff_method"] == "welch"
    markdown = (tmp_path / "table.md").read_text()
    assert "- ps@iid: unpaired (Welch): 7 training ranks against base@iid's 8: a seed draws another partition" in markdown
    one = [line for line in markdown.splitlines() if line.startswith("- msgd@skew: one training rank")]
    assert len(one) == 1 and "not a skewed result" in one[0]
    interactions = [line for line in markdown.splitlines() if line.startswith("| ") and "(skew - iid)" in line]
    assert any(line.startswith("| same: (skew - iid)") for line in interactions)
    assert not any("msgd" in line for line in interactions) and any("ps:" in line and "welch" in line
                                                                     for line in interactions)


def test_a_one_process_row_can_be_kept_out_of_a_skewed_variant() -> None:
    from tables.config import load_table

    table = load_table(table_node([{"label": "base"}, {"label": "msgd", "variants": ["iid"]}],
                              variants={"iid": ["x=1"], "skew": ["x=2"]}))
    assert [r.label for r in table.rows] == ["base@iid", "msgd@iid", "base@skew"]
    with pytest.raises(UserError, match="row msgd has variants \\['dir'\\], which are not the table's"):
        load_table(table_node([{"label": "base"}, {"label": "msgd", "variants": ["dir"]}],
                          variants={"iid": ["x=1"], "skew": ["x=2"]}))


def test_the_skew_interaction_and_a_declared_comparison_match_a_hand_computation(tmp_path: Path) -> None:
    """Interaction of `local`: per seed (local@skew - local@iid) - (base@skew - base@iid), its mean
    and paired t interval with the floor of the two differences it is made of; a declared
    [combo, local] is one comparison per variant; the family holds all of them."""
    from tables.compare import build_family
    from tables.config import headline, load_table
    from tables.runs import read_runs

    acc = {"base@iid": [0.99, 0.985, 0.99], "base@skew": [0.98, 0.97, 0.985],
           "local@iid": [0.985, 0.98, 0.99], "local@skew": [0.80, 0.70, 0.90],
           "combo@iid": [0.985, 0.985, 0.99], "combo@skew": [0.97, 0.96, 0.975]}
    for label, values_ in acc.items():
        reported(tmp_path, label, values_, partition="iid" if label.endswith("iid") else "dirichlet")
    table = load_table(table_node([{"label": r} for r in ("base", "local", "combo")],
                              variants={"iid": ["x=1"], "skew": ["x=2"]}, interaction_from="iid",
                              comparisons=[["combo", "local"]]))
    family = build_family(table, read_runs(table, tmp_path), headline(table))
    inter = next(c for c in family.comparisons if c.kind == "interaction" and c.a == "local@skew")
    per_seed = [(acc["local@skew"][i] - acc["local@iid"][i]) - (acc["base@skew"][i] - acc["base@iid"][i])
                for i in range(3)]
    mean = statistics.fmean(per_seed)
    d_skew = statistics.fmean(acc["local@skew"]) - statistics.fmean(acc["base@skew"])
    d_iid = statistics.fmean(acc["local@iid"]) - statistics.fmean(acc["base@iid"])
    se_set = math.hypot(*(math.sqrt(q * (1 - q) / (N_TEST + 4)) for q in
                          ((N_TEST * abs(d) + 2) / (N_TEST + 4) for d in (d_skew, d_iid))))
    h = math.hypot(st.t.ppf(0.975, 2) * statistics.stdev(per_seed) / math.sqrt(3), st.norm.ppf(0.975) * se_set)
    assert inter.diff.method == "paired" and inter.diff.mean == pytest.approx(mean)
    assert (inter.diff.low, inter.diff.high) == pytest.approx((mean - h, mean + h))
    assert inter.parts == pytest.approx((statistics.fmean(acc["local@skew"]) - statistics.fmean(acc["local@iid"]),
                                         statistics.fmean(acc["base@skew"]) - statistics.fmean(acc["base@iid"])))
    declared = [c.name for c in family.comparisons if c.kind == "declared"]
    assert declared == ["combo@iid - local@iid", "combo@skew - local@skew"]
    # 4 rows against their baseline, 2 interactions, 2 declared: one family of 8
    assert family.size == 8 and all(c.p_holm is not None for c in family.comparisons)
    with pytest.raises(UserError, match="comparisons names nope, which is not a row label"):
        load_table(table_node([{"label": "base"}], comparisons=[["base", "nope"]]))
    with pytest.raises(UserError, match="interaction_from=dir is not a variant"):
        load_table(table_node([{"label": "base"}], variants={"iid": ["x=1"]}, interaction_from="dir"))


# --- a headline that is not accuracy ----------------------------------------------------------------

def test_a_lower_is_better_headline_selects_compares_and_colours_the_right_way(tmp_path: Path) -> None:
    """A language model's table: bits_per_char on test, val_loss on validation, lower better. The
    tuning picks the smallest validation loss, a row with lower bits is "better" (green), and
    there is no accuracy floor (the table says intervals are over seeds only)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tables.config import RowConfig, load_table, row_dir
    from tables.plot_levels import differences_figure as _differences_figure
    from tables.runner import chosen, run_table
    from tables.tuning import tune_dir

    grid = {"optim.lr": [1e-3, 3e-3, 1e-2]}
    for lr, loss in ((1e-3, 1.40), (3e-3, 1.20), (1e-2, 1.30)):
        write_run(tune_dir(tmp_path, "lm", (("optim.lr", lr),), 0), {"val_loss": loss})
    bpc = {"base": [2.00, 2.02, 2.01], "lm": [1.90, 1.91, 1.915]}
    for label, values_ in bpc.items():
        for seed, v in zip([1, 2, 3], values_):
            write_run(row_dir(tmp_path, RowConfig(label=label), seed),
                       {"bits_per_char": v, "test_loss": v * 0.693, "val_loss": v * 0.69, "optim": {}})
    node = table_node([{"label": "base"}, {"label": "lm", "tune": grid}], compare_metric="bits_per_char",
                  select_metric="val_loss", tie_metric="val_loss", tune_seeds=[0], tune_tie_seeds=[],
                  columns=["bits_per_char", "test_loss"], plots=["intervals", "pareto", "accuracy"])
    table = load_table(node)
    assert chosen(table, tmp_path)["lm"].winner == (("optim.lr", 3e-3),)
    for seed in (1, 2, 3):  # the reported runs were made with the chosen setting
        hydra = row_dir(tmp_path, RowConfig(label="lm"), seed).root / ".hydra"
        hydra.mkdir()
        hydra.joinpath("overrides.yaml").write_text("- optim.lr=0.003\n")
    assert run_table(node, tmp_path) == 0
    rec = {r["label"]: r for r in read_csv(tmp_path / "table.csv")}["lm"]
    assert float(rec["diff"]) < 0 and rec["diff_resolved"] == "True"
    markdown = (tmp_path / "table.md").read_text()
    assert "No test-set floor: bits_per_char is not a proportion" in markdown
    records = [{"label": "lm", "baseline": "base", "diff": -0.1, "diff_low": -0.12, "diff_high": -0.08,
                "diff_resolved": True, "diff_method": "paired"}]
    fig = _differences_figure(plt, table, records)
    colour = matplotlib.colors.to_hex(fig.axes[0].containers[0].lines[0].get_color())
    assert colour == matplotlib.colors.to_hex("tab:green")
    plt.close(fig)
    with pytest.raises(UserError, match="compare_metric=throughput says nothing of which way is better; set "
                                        "table.better=higher or table.better=lower"):
        load_table(table_node([{"label": "base"}], compare_metric="throughput"))
    assert load_table(table_node([{"label": "base"}], compare_metric="throughput", better="higher"))
    with pytest.raises(UserError, match="target_metric=test_acc would time its target on the test set"):
        load_table(table_node([{"label": "base"}], target_metric="test_acc"))


def test_the_intervals_figure_draws_differences_on_their_own_scale(tmp_path: Path) -> None:
    """Each row's difference from the baseline, sorted best on top, bars at the Holm-corrected
    interval, coloured by the corrected verdict, Welch rows marked; an axis scaled to the
    differences (not accuracy's 0-1); where a row lies orders of magnitude further out than the
    median row (MNIST-1D under skew: 15 rows within 0.06, 11 out to 0.87), the axis is linear to
    the median row's reach and logarithmic beyond, every interval drawn in full."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tables.config import TableConfig
    from tables.plot_levels import differences_figure as _differences_figure

    def rec(label: str, diff: float, half: float, resolved: bool, method: str = "paired") -> dict[str, Any]:
        return {"label": label, "baseline": "a@" + label.partition("@")[2], "diff": diff, "diff_low": diff - half / 2,
                "diff_high": diff + half / 2, "diff_low_holm": diff - half, "diff_high_holm": diff + half,
                "diff_level": 0.01, "diff_resolved": resolved, "diff_method": method}

    records = [{"label": "a@iid", "baseline": "a@iid", "diff": None}, rec("b@iid", -0.0093, 0.004, True),
               rec("c@iid", 0.001, 0.006, False, "welch"), rec("d@iid", 0.004, 0.003, True),
               rec("b@skew", -0.60, 0.2, True), rec("c@skew", 0.003, 0.02, False), rec("d@skew", -0.01, 0.02, False),
               rec("e@skew", 0.002, 0.02, False), rec("f@skew", -0.005, 0.015, False)]
    fig = _differences_figure(plt, TableConfig(name="t", rows=[], seeds=[1, 2, 3]), records)
    iid, skew = fig.axes
    assert [t.get_text() for t in iid.get_yticklabels()] == ["b", "c (Welch)", "d"]  # worst at the bottom
    colours = [matplotlib.colors.to_hex(c.lines[0].get_color()) for c in iid.containers]
    assert colours == [matplotlib.colors.to_hex(c) for c in ("tab:red", "tab:gray", "tab:green")]
    bar = iid.containers[0].lines[2][0].get_segments()[0]
    assert [round(p[0], 6) for p in bar] == [round(-0.0093 - 0.004, 6), round(-0.0093 + 0.004, 6)]  # the Holm interval
    low, high = iid.get_xlim()
    assert -0.03 < low < -0.0133 and 0.007 < high < 0.03  # scaled to the differences, not 0-1
    assert iid.get_xscale() == "linear"  # no row far out: one linear axis
    assert skew.get_xscale() == "symlog"  # b@skew reaches 0.8, the median row 0.023
    assert skew.xaxis.get_transform().linthresh == pytest.approx(0.023)
    b_bar = skew.containers[0].lines[2][0].get_segments()[0]  # b@skew, worst, at the bottom
    assert [round(p[0], 6) for p in b_bar] == [-0.8, -0.4]  # drawn in full, not clipped
    low, high = skew.get_xlim()
    assert -2.0 < low < -0.8 and 0.03 <= high < 0.2  # every row inside, the margin a fraction of a decade
    assert not skew.texts
    plt.close(fig)
    # one seed: no interval; a row far out still gets the split axis, its point where it lies
    single = [{"label": lab, "baseline": "a", "diff": d} for lab, d in
              [("a", None), ("b", -0.117), ("c", 0.003), ("d", -0.003), ("e", 0.0028), ("f", 0.0056),
               ("g", -0.0028), ("h", -0.0056), ("i", 0.0028)]]
    fig = _differences_figure(plt, TableConfig(name="t", rows=[], seeds=[0]), single)
    assert fig.axes[0].get_xscale() == "symlog" and fig.axes[0].get_xlim()[0] < -0.117
    plt.close(fig)


def test_the_pareto_figure_lists_every_row_legibly_however_many(tmp_path: Path) -> None:
    """pareto.png lists its rows beside the axes, one line each: at 55 rows (MNIST-1D's table) the
    lines neither overprint one another nor run off the figure, and the row numbers at the points
    stay inside the axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tables.config import TableConfig
    from tables.plot_levels import pareto_figure as _pareto_figure

    # as in MNIST-1D's table: 27 methods on two partitions, the same bytes on both, 10 MB to 1.1 GB,
    # IID near the top, the skewed rows anywhere from 0.3 up
    records = [{"label": f"method_with_a_long_name_{n // 2}@{'iid' if n % 2 == 0 else 'dir0.1'}",
                "test_acc": 0.98 - 0.001 * (n % 7) if n % 2 == 0 else 0.3 + 0.025 * (n % 28),
                "comm_bytes": 1e7 * 110 ** ((n // 2) / 27)} for n in range(55)]
    fig = _pareto_figure(plt, TableConfig(name="t", rows=[], seeds=[1, 2, 3]), records)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    figure_box = fig.bbox
    lines = sorted((t.get_window_extent(renderer) for t in fig.texts), key=lambda b: -b.y0)
    assert len(lines) == 55
    for upper, lower in zip(lines, lines[1:]):
        assert lower.y1 <= upper.y0 + 0.5  # no two lines overprint
    assert all(figure_box.x0 <= b.x0 and b.x1 <= figure_box.x1 and figure_box.y0 <= b.y0 and b.y1 <= figure_box.y1
               for b in lines)
    axes_box = fig.axes[0].get_window_extent(renderer)
    numbers = [t.get_window_extent(renderer) for t in fig.axes[0].texts]
    assert len(numbers) == 55 and all(axes_box.y0 <= b.y0 and b.y1 <= axes_box.y1 for b in numbers)
    plt.close(fig)
