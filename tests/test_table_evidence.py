"""The evidence a table gives (issue 34), from written result files unless said otherwise: intervals
that never claim more than the test set resolves, Holm's correction checked by hand, the power a
table's own spread gives, tuning that is not decided by a coin toss, provenance (commit, dirty tree,
mixed commits), per-seed results from which every interval is recomputed, honest pairing, the skew
interaction and declared comparisons, a headline metric that is not accuracy, and the differences
figure."""
from __future__ import annotations

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

N_TEST = 360  # digits' test set


def _write_run(run: Any, summary: dict[str, Any], evals: list[dict[str, Any]] = ()) -> None:
    run.root.mkdir(parents=True, exist_ok=True)
    run.summary.write_text(json.dumps(summary))
    run.metrics.write_text("".join(json.dumps({"kind": "eval", **e}) + "\n" for e in evals))


def _summary(acc: float, ranks: int = 8, partition: str = "iid", commit: str = "a" * 40, **extra: Any) -> dict[str, Any]:
    split = {"partition": partition, "val_samples": 144, **({"dirichlet_alpha": 0.1} if partition != "iid" else {})}
    return {"test_acc": acc, "val_acc": acc, "test_loss": 1 - acc, "comm_bytes": 1e6, "steps": 10,
            "train_ranks": ranks, "test_samples": N_TEST, "data_split": split, "commit": commit, "dirty": False,
            **extra}


def _reported(out: Path, label: str, accs: list[float], **kw: Any) -> None:
    from tables.config import RowConfig, row_dir

    for seed, acc in zip([1, 2, 3], accs):
        _write_run(row_dir(out, RowConfig(label=label), seed), _summary(acc, **kw),
                   [{"step": 5, "test_acc": acc - 0.1, "comm_bytes_total": 5e5},
                    {"step": 10, "test_acc": acc, "comm_bytes_total": 1e6}])


def _table(rows: list[dict[str, Any]], **extra: Any) -> Any:
    return OmegaConf.create({"name": "t", "baseline": "base", "seeds": [1, 2, 3], "plots": [], "paper_metrics": [],
                             "columns": ["test_acc", "val_acc"], "ratios": [], "rows": rows, **extra})


def _csv(path: Path) -> list[dict[str, str]]:
    with open(path) as fh:
        return list(csv.DictReader(fh))


def _images(k: int) -> float:
    return k / N_TEST


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
    one = difference({s: v - _images(1) for s, v in base.items()}, base, n_examples=N_TEST)
    assert one.low < one.mean < one.high and not one.resolved and one.high - one.low > 0.01
    assert not difference({s: v - _images(5) for s, v in base.items()}, base, n_examples=N_TEST).resolved
    assert difference({s: v - _images(6) for s, v in base.items()}, base, n_examples=N_TEST).resolved
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
    _reported(tmp_path, "base", base, test_samples=None)
    for label, accs in rows.items():
        _reported(tmp_path, label, accs, test_samples=None)
    for run in tmp_path.rglob("summary.json"):  # no set size: no floor, plain paired t
        summary = json.loads(run.read_text())
        summary.pop("test_samples")
        run.write_text(json.dumps(summary))
    table = _table([{"label": "base"}, *({"label": r} for r in rows)])
    assert run_table(table, tmp_path) == 0
    by_label = {r["label"]: r for r in _csv(tmp_path / "table.csv")}
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
        _reported(tmp_path, label, accs)
    bad = next(p for p in tmp_path.rglob("summary.json") if "blown" in str(p) and "seed_2" in str(p))
    summary = json.loads(bad.read_text())
    summary["test_loss"] = float("nan")
    bad.write_text(json.dumps(summary))  # json writes NaN, as the trainer's summary does
    rows = [{"label": "base"}, {"label": "blown"}, {"label": "fine"}]
    table = _table(rows, columns=["test_acc", "test_loss"], compare_metric="test_loss")
    assert run_table(table, tmp_path) == 0
    by_label = {r["label"]: r for r in _csv(tmp_path / "table.csv")}
    assert by_label["blown"]["test_loss"] == "diverged" and by_label["blown"]["diff"] == ""
    assert "not finite on seed 2 (diverged)" in by_label["blown"]["note"]
    assert float(by_label["fine"]["test_loss"]) == pytest.approx(1 - statistics.fmean([0.95, 0.97, 1.0]))
    assert by_label["fine"]["diff"] != "" and by_label["fine"]["diff_p"] != ""
    assert "diverged" in (tmp_path / "table.md").read_text()
    blown = [r for r in _csv(tmp_path / "runs.csv") if r["row"] == "blown" and r["seed"] == "2"]
    assert len(blown) == 1 and math.isnan(float(blown[0]["test_loss"]))


def test_the_smallest_resolvable_difference_comes_from_the_tables_own_spread() -> None:
    """Without a floor: (t(0.975, k-1) + t(0.8, k-1)) sd / sqrt(k). With one: the d that solves
    d^2 = A^2 + ((z(0.975) + z(0.8)) SE(d))^2; on 360 test images no difference below about 10
    images is resolved with 80% power however many seeds run."""
    from tables.stats import difference_se_floor, min_detectable, seeds_for

    sd = 0.004
    assert min_detectable(sd, 3) == pytest.approx((st.t.ppf(0.975, 2) + st.t.ppf(0.8, 2)) * sd / math.sqrt(3))
    d = min_detectable(sd, 3, N_TEST)
    a = (st.t.ppf(0.975, 2) + st.t.ppf(0.8, 2)) * sd / math.sqrt(3)
    b = (st.norm.ppf(0.975) + st.norm.ppf(0.8)) * difference_se_floor(d, N_TEST)
    assert d == pytest.approx(math.hypot(a, b), rel=1e-6) and d > a
    assert min_detectable(0.0, 1000, N_TEST) * N_TEST > 9
    assert seeds_for(0.01, sd, N_TEST) is None  # digits' test set cannot resolve 0.01 at 80% power
    k = seeds_for(0.01, 0.01, 10_000)  # a test set of 10,000 can, with enough seeds
    assert k is not None and min_detectable(0.01, k, 10_000) <= 0.01 < min_detectable(0.01, k - 1, 10_000)


# --- tuning that is not a coin toss --------------------------------------------------------------

def test_a_tie_at_a_grids_edge_extends_the_grid(tmp_path: Path) -> None:
    """lr 0.03 and 0.1 tie for the best at the low end of [0.03, 0.1, 0.3]: the grid grows below
    0.03 (it grew only past a strict winner, and a tie at an edge was not even flagged)."""
    from tables.tuning import choose, extend_grid, tune_dir

    grid = {"optim.lr": [0.03, 0.1, 0.3]}
    for lr, v in ((0.03, 0.95), (0.1, 0.95), (0.3, 0.5)):
        _write_run(tune_dir(tmp_path, "r", (("optim.lr", lr),), 0), {"val_acc": v})
    assert choose(tmp_path, "r", grid, [0], "val_acc").at_edge
    assert extend_grid(tmp_path, "r", grid, [0], "val_acc", 2) == ({"optim.lr": [0.009, 0.03, 0.1, 0.3]}, 1)


def test_settings_within_the_validation_sets_resolution_get_a_second_seed_then_the_tie_rule(tmp_path: Path) -> None:
    """On 144 validation images, lr 0.1 beats lr 0.03 by 2 images on seed 0: within noise, so the
    grid runs again on the tie seed (4: neither reported nor tuned); still within noise there, the
    lower validation loss decides (0.03), and table.md flags the row."""
    from tables.config import load_table
    from tables.runner import chosen, tuning_jobs
    from tables.tuning import tune_dir

    grid = {"optim.lr": [0.03, 0.1, 0.3]}
    val = {0.03: (140, 0.10), 0.1: (142, 0.20), 0.3: (100, 0.90)}  # correct images of 144, val_loss
    for lr, (correct, loss) in val.items():
        _write_run(tune_dir(tmp_path, "r", (("optim.lr", lr),), 0),
                   {"val_acc": correct / 144, "val_loss": loss, "data_split": {"val_samples": 144}})
    table = load_table(_table([{"label": "r", "tune": grid}], baseline="r", tune_seeds=[0]))
    jobs = {name for name, _, _ in tuning_jobs(table, tmp_path)}
    assert {f"r optim.lr_{lr} seed 4" for lr in grid["optim.lr"]} <= jobs, jobs
    for lr, (correct, loss) in val.items():
        _write_run(tune_dir(tmp_path, "r", (("optim.lr", lr),), 4),
                   {"val_acc": (correct + 1) / 144, "val_loss": loss, "data_split": {"val_samples": 144}})
    result = chosen(table, tmp_path)["r"]
    assert result.seeds == [0, 4] and result.within_noise
    assert set(result.contenders) == {(("optim.lr", 0.03),), (("optim.lr", 0.1),)}
    assert result.winner == (("optim.lr", 0.03),) and result.rule == "val_loss"
    from tables.render import _tuning_lines

    text = "\n".join(_tuning_lines(table, {"r": result}, []))
    assert "Chosen within noise" in text and "r (2 contenders on 2 seeds, decided by val_loss)" in text
    assert "decided by the best mean val_loss, then the best mean val_acc, then grid order" in text
    # a clear winner (30 images apart) needs no second seed
    clear = tmp_path / "clear"
    for lr, correct in ((0.03, 100), (0.1, 140), (0.3, 90)):
        _write_run(tune_dir(clear, "r", (("optim.lr", lr),), 0),
                   {"val_acc": correct / 144, "val_loss": 0.1, "data_split": {"val_samples": 144}})
    assert all("seed 4" not in name for name, _, _ in tuning_jobs(table, clear))
    assert not chosen(table, clear)["r"].within_noise


def _write_tuning_run(out: Path, lr: float, seed: int, val_acc: float, val_loss: float,
                      first_loss: float = 2.30) -> None:
    """A tuning run of lr on seed whose first logged training loss is `first_loss`."""
    from tables.tuning import tune_dir

    run = tune_dir(out, "r", (("optim.lr", lr),), seed)
    _write_run(run, {"val_acc": val_acc, "val_loss": val_loss, "data_split": {"val_samples": 6000}})
    run.metrics.write_text(json.dumps({"kind": "train", "step": 10, "loss": first_loss}) + "\n"
                           + json.dumps({"kind": "eval", "step": 100, "val_loss": val_loss}) + "\n")


def test_a_contender_a_grid_step_below_a_diverged_rate_is_set_aside(tmp_path: Path) -> None:
    """The MNIST-1D trial's allreduce on two tuning seeds: 0.1 and 0.3 within noise, 0.3 ahead on
    validation loss by 0.0002, 0.9 collapsed to the untrained loss on both. The margin chooses 0.1
    and table.md says why; without it (no stability keys) validation loss chooses 0.3."""
    from tables.config import load_table
    from tables.render import _tuning_lines
    from tables.tuning import TunePolicy, choose

    grid = {"optim.lr": [0.03, 0.1, 0.3, 0.9]}
    val = {0.03: ((0.9545, 0.1368), (0.9475, 0.1663)), 0.1: ((0.9817, 0.0573), (0.9790, 0.0709)),
           0.3: ((0.9805, 0.0581), (0.9775, 0.0696)), 0.9: ((0.0998, 2.3026), (0.1002, 2.3026))}
    for lr, by_seed in val.items():
        for seed, (acc, loss) in zip((0, 100), by_seed):
            _write_tuning_run(tmp_path, lr, seed, acc, loss, first_loss=2.3022)
    tuned = choose(tmp_path, "r", grid, [0, 100], "val_acc")
    assert set(tuned.contenders) == {(("optim.lr", 0.1),), (("optim.lr", 0.3),)}
    assert tuned.diverged == {(("optim.lr", 0.9),): [0, 100]}
    assert tuned.set_aside == [(("optim.lr", 0.3),)]
    assert tuned.winner == (("optim.lr", 0.1),) and tuned.rule == "stability margin"
    plain = choose(tmp_path, "r", grid, [0, 100], "val_acc", TunePolicy(stability_keys=()))
    assert plain.winner == (("optim.lr", 0.3),) and plain.rule == "val_loss" and not plain.set_aside
    table = load_table(_table([{"label": "r", "tune": grid}], baseline="r", tune_seeds=[0, 100]))
    from tables.runner import chosen

    assert chosen(table, tmp_path)["r"].winner == (("optim.lr", 0.1),)  # the table's own policy
    off = load_table(_table([{"label": "r", "tune": grid}], baseline="r", tune_seeds=[0, 100],
                            tune_stability_keys=[]))
    assert chosen(off, tmp_path)["r"].winner == (("optim.lr", 0.3),)
    text = "\n".join(_tuning_lines(table, {"r": tuned}, []))
    assert "| r | optim.lr_0.3 | 0.9790 | 2/2 |  | 0.0638 | set aside |" in text
    assert "Set aside by the stability margin" in text and "r (optim.lr_0.3)" in text
    assert "r optim.lr_0.9 (seeds 0, 100)" in text
    from tables.render import gather

    rec = next(r for r in gather(table, tmp_path / "none", {}, {"r": tuned}) if r["label"] == "r")
    assert (rec["tuned"], rec["tuned_rule"], rec["tuned_set_aside"]) == (
        "optim.lr_0.1", "stability margin", "optim.lr_0.3")


def test_the_margin_never_overrides_a_winner_validation_resolves(tmp_path: Path) -> None:
    """0.3 beats 0.1 by 300 of 6,000 validation signals on both seeds: resolved, so 0.9's
    divergence does not move the choice (the margin decides only among contenders); and a
    contender that diverged on one of its own seeds is set aside even when its mean is in noise."""
    from tables.tuning import choose

    grid = {"optim.lr": [0.1, 0.3, 0.9]}
    for seed in (0, 1):
        _write_tuning_run(tmp_path, 0.1, seed, 0.93 + seed * 0.001, 0.2)
        _write_tuning_run(tmp_path, 0.3, seed, 0.98 + seed * 0.002, 0.07)
        _write_tuning_run(tmp_path, 0.9, seed, 0.10, float("nan"))
    tuned = choose(tmp_path, "r", grid, [0, 1], "val_acc")
    assert tuned.winner == (("optim.lr", 0.3),) and tuned.rule == "best mean" and not tuned.within_noise
    assert tuned.diverged == {(("optim.lr", 0.9),): [0, 1]}
    # 0.3 collapses on seed 1 only: with two seeds its mean stays within noise of 0.1's
    _write_tuning_run(tmp_path, 0.3, 1, 0.10, 2.31)
    tuned = choose(tmp_path, "r", grid, [0, 1], "val_acc")
    assert tuned.within_noise and tuned.set_aside == [(("optim.lr", 0.3),)]
    assert tuned.winner == (("optim.lr", 0.1),) and tuned.rule == "stability margin"


def test_a_loss_tuned_on_one_seed_has_contenders_within_its_stated_resolution(tmp_path: Path) -> None:
    """The LM table's case: validation loss on one seed has neither a floor nor a spread, so
    without a stated resolution 0.003 nats decide as surely as 0.3. With tune_resolution 0.0125
    the two rates 0.003 apart are contenders: the grid runs again on the tie seed, and table.md
    says what made them contenders."""
    from tables.runner import chosen, tuning_jobs
    from tables.config import load_table
    from tables.render import _tuning_lines
    from tables.tuning import tune_dir

    grid = {"optim.lr": [3e-4, 1e-3, 3e-3]}
    loss = {3e-4: 1.95, 1e-3: 1.903, 3e-3: 1.900}
    for lr, v in loss.items():
        _write_run(tune_dir(tmp_path, "r", (("optim.lr", lr),), 0), {"val_loss": v})
    rows = [{"label": "r", "tune": grid}]
    common = dict(baseline="r", tune_seeds=[0], tune_tie_seeds=[100], select_metric="val_loss",
                  compare_metric="test_loss")
    plain = load_table(_table(rows, **common))
    assert not chosen(plain, tmp_path)["r"].within_noise
    assert all("seed 100" not in name for name, _, _ in tuning_jobs(plain, tmp_path))
    stated = load_table(_table(rows, tune_resolution=0.0125, **common))
    assert {f"r optim.lr_{lr} seed 100" for lr in grid["optim.lr"]} <= {n for n, _, _ in tuning_jobs(stated, tmp_path)}
    for lr, v in loss.items():
        _write_run(tune_dir(tmp_path, "r", (("optim.lr", lr),), 100), {"val_loss": v + 0.001})
    result = chosen(stated, tmp_path)["r"]
    assert result.seeds == [0, 100] and result.within_noise
    assert set(result.contenders) == {(("optim.lr", 1e-3),), (("optim.lr", 3e-3),)}
    text = "\n".join(_tuning_lines(stated, {"r": result}, []))
    assert "or whose mean is within table.tune_resolution = 0.0125 of the best," in text
    # selected and tie-broken by one loss: the rule names it once, and no accuracy is claimed
    assert "decided by the best mean val_loss, then grid order" in text and "No test result chose" in text


def test_a_run_has_diverged_when_it_ends_no_better_than_it_began(tmp_path: Path) -> None:
    from tables.tuning import diverged, tune_dir

    def run(val_loss: float, first: Optional[float]) -> Any:
        r = tune_dir(tmp_path, f"d{val_loss}{first}", (("optim.lr", 0.1),), 0)
        _write_run(r, {"val_loss": val_loss})
        if first is not None:
            r.metrics.write_text(json.dumps({"kind": "train", "step": 10, "loss": first}) + "\n")
        return r

    assert diverged(run(2.3026, 2.3022))  # collapsed to a constant output
    assert diverged(run(float("inf"), 2.3)) and diverged(run(float("nan"), None))
    assert not diverged(run(0.06, 2.3))  # learned
    assert not diverged(run(2.5, None))  # no first loss recorded: unknown, not a divergence
    assert not diverged(tune_dir(tmp_path, "missing", (("optim.lr", 0.1),), 0))


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
    _reported(tmp_path, "base", [0.9, 0.91, 0.92])  # row b has no runs yet
    with pytest.raises(UserError) as err:
        runner.run_table(_table([{"label": "base"}, {"label": "b"}]), tmp_path)
    line = str(err.value)
    assert "\n" not in line and "table.allow_dirty=true" in line and "engine/x.py" in line
    assert not started and not (tmp_path / "b").exists()
    _reported(tmp_path, "b", [0.9, 0.91, 0.93])
    assert runner.run_table(_table([{"label": "base"}, {"label": "b"}], allow_dirty=True), tmp_path) == 0
    assert "on a DIRTY tree (table.allow_dirty=true" in (tmp_path / "table.md").read_text()


def test_runs_made_at_other_commits_are_kept_and_flagged(tmp_path: Path, monkeypatch: Any, capsys: Any) -> None:
    from core.provenance import CodeVersion
    from tables import runner
    from tables import provenance

    head = CodeVersion("c" * 40, False)
    monkeypatch.setattr(provenance, "code_version", lambda ignore=(): head)
    monkeypatch.setattr(runner, "code_version", lambda ignore=(): head)
    _reported(tmp_path, "base", [0.9, 0.91, 0.92], commit="c" * 40)
    _reported(tmp_path, "b", [0.9, 0.91, 0.93], commit="d" * 40)
    assert runner.run_table(_table([{"label": "base"}, {"label": "b"}]), tmp_path) == 0
    printed = capsys.readouterr().out
    assert "3 finished runs were made at other commits than ccccccc (ddddddd: 3)" in printed
    markdown = (tmp_path / "table.md").read_text()
    assert "Reported runs were made at 2 commits (a mix, flagged):" in markdown
    assert "- ddddddd: 3 runs (b)" in markdown and "- ccccccc: 3 runs (base)" in markdown
    assert {r["commit"] for r in _csv(tmp_path / "runs.csv") if r["row"] == "b"} == {"d" * 40}


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
        _write_run(run_dir, _summary(accs[label][seed - 1], commit="e" * 40), [{"step": 10, "test_acc": 0.5}])
        (run_dir.root / "checkpoints").mkdir()
        (run_dir.root / "checkpoints" / "rank_0.pt").write_bytes(b"x" * 100)
        return "done", 1.0

    monkeypatch.setattr(runner, "run_row", run_row)
    store = tmp_path / "store"
    table = _table([{"label": "base"}, {"label": "b"}], store=str(store))
    assert runner.run_table(table, tmp_path / "one") == 0
    assert len(made) == 6 and [tmp_path / "one", store] in ignored
    assert sorted(p.parent.name + "/" + p.name for p in store.glob("*/seed_*")) == \
        sorted(f"{r}/seed_{s}" for r in accs for s in (1, 2, 3))
    assert not list(store.glob("**/checkpoints")) and (store / "b" / "seed_2" / "metrics.jsonl").is_file()
    assert len((store / "jobs.jsonl").read_text().splitlines()) == 6

    # a fresh folder: everything is put back, nothing runs, the same table comes out
    made.clear()
    assert runner.run_table(table, tmp_path / "two") == 0
    assert made == [] and "6 finished runs put back from table.store" in capsys.readouterr().out
    def gathered(folder: str) -> list[dict[str, str]]:
        return [{k: v for k, v in r.items() if k != "log"} for r in _csv(tmp_path / folder / "table.csv")]
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
    for other in (_table([{"label": "base"}], name="t2", store=str(store)),
                  _table([{"label": "base"}], store=str(store), quick=True)):
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
    _reported(tmp_path, "base", [0.9, 0.91, 0.92])
    _reported(tmp_path, "b", [0.88, 0.9, 0.9])
    _write_run(row_dir(tmp_path, RowConfig(label="c"), 1), _summary(0.5))
    rows = [{"label": "base"}, {"label": "b"}, {"label": "c"}, {"label": "d"}]
    assert runner.run_table(_table(rows, gather_only=True), tmp_path) == 0
    assert [r["label"] for r in _csv(tmp_path / "table.csv")] == ["base", "b"]
    markdown = (tmp_path / "table.md").read_text()
    assert markdown.startswith("# Partial: ") and "7 of 12 reported runs made; 2 of 4 rows" in markdown
    assert "Rows with some seeds made (not shown): c (1 of 3)." in markdown
    assert "Rows not yet started (1): d." in markdown and not (tmp_path / "d").exists()

    # once every run is made, gathering gives the finished table: every row, not called partial
    _reported(tmp_path, "c", [0.5, 0.5, 0.51])
    _reported(tmp_path, "d", [0.7, 0.72, 0.7])
    assert runner.run_table(_table(rows, gather_only=True), tmp_path) == 0
    assert [r["label"] for r in _csv(tmp_path / "table.csv")] == ["base", "b", "c", "d"]
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
            _write_run(tune_dir(store, "a", (("optim.lr", lr),), seed), _summary(acc + shift, val_loss=1 - acc))
    _write_run(tune_dir(store, "b", (("optim.lr", 0.03),), 0), _summary(0.9, val_loss=0.1))
    (store / "jobs.jsonl").write_text(json.dumps({"job": "a optim.lr_0.03 seed 0", "ended": 1.0}) + "\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "jobs.jsonl").write_text(json.dumps({"job": "b optim.lr_0.1 seed 0", "ended": 2.0}) + "\n")
    before = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}
    grid = {"optim.lr": [0.03, 0.1, 0.3]}
    table = _table([{"label": "a", "tune": grid}, {"label": "b", "tune": grid}], baseline="a", tune_seeds=[0, 100],
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
                runner.run_table(_table([{"label": "base"}], store=str(store), gather_only=gather), folder)
            assert "\n" not in str(err.value) and says in str(err.value)
            assert "give this table a run folder of its own" in str(err.value)
            assert sorted(os.listdir(folder)) == listed and not store.exists()
    own = tmp_path / "own"
    own.mkdir()
    (own / "jobs.jsonl").write_text(json.dumps({"job": "base seed 1", "status": "done", "seconds": 1.0, "ended": 1.0}) + "\n")
    assert runner.run_table(_table([{"label": "base"}], gather_only=True), own) == 0
    assert json.loads((own / "table.json").read_text()) == {"table": "t", "quick": False}
    with pytest.raises(UserError):  # and the quick form of the same table is another form
        runner.run_table(_table([{"label": "base"}], gather_only=True, quick=True), own)


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
            _reported(tmp_path, f"{label}@{v}", [a + shift for a in values_], ranks=7 if label == "ps" else 8,
                      partition="iid" if v == "iid" else "dirichlet")
    table = _table([{"label": label} for label in accs], variants={"iid": ["x=1"], "skew": ["x=2"]})
    assert run_table(table, tmp_path) == 0
    runs = _csv(tmp_path / "runs.csv")
    assert len(runs) == 4 * 2 * 3 and {"row", "variant", "seed", "commit", "test_acc", "val_acc"} <= set(runs[0])
    per: dict[str, dict[int, dict[str, str]]] = {}
    for line in runs:
        per.setdefault(line["label"], {})[int(line["seed"])] = line
    for rec in _csv(tmp_path / "table.csv"):
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
        _reported(tmp_path, f"base@{v}", [0.98, 0.985, 0.99], partition=part)
        _reported(tmp_path, f"same@{v}", [0.97, 0.98, 0.985], partition=part)
        _reported(tmp_path, f"ps@{v}", [0.97, 0.98, 0.985], ranks=7, partition=part)
        _reported(tmp_path, f"msgd@{v}", [0.97, 0.98, 0.985], ranks=1, partition=part)
    table = _table([{"label": r} for r in ("base", "same", "ps", "msgd")],
                   variants={"iid": ["x=1"], "skew": ["x=2"]}, interaction_from="iid")
    assert run_table(table, tmp_path) == 0
    rows = {r["label"]: r for r in _csv(tmp_path / "table.csv")}
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

    table = load_table(_table([{"label": "base"}, {"label": "msgd", "variants": ["iid"]}],
                              variants={"iid": ["x=1"], "skew": ["x=2"]}))
    assert [r.label for r in table.rows] == ["base@iid", "msgd@iid", "base@skew"]
    with pytest.raises(UserError, match="row msgd has variants \\['dir'\\], which are not the table's"):
        load_table(_table([{"label": "base"}, {"label": "msgd", "variants": ["dir"]}],
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
        _reported(tmp_path, label, values_, partition="iid" if label.endswith("iid") else "dirichlet")
    table = load_table(_table([{"label": r} for r in ("base", "local", "combo")],
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
        load_table(_table([{"label": "base"}], comparisons=[["base", "nope"]]))
    with pytest.raises(UserError, match="interaction_from=dir is not a variant"):
        load_table(_table([{"label": "base"}], variants={"iid": ["x=1"]}, interaction_from="dir"))


# --- a headline that is not accuracy ----------------------------------------------------------------

def test_a_lower_is_better_headline_selects_compares_and_colours_the_right_way(tmp_path: Path) -> None:
    """A language model's table: bits_per_char on test, val_loss on validation, lower better. The
    tuning picks the smallest validation loss, a row with lower bits is "better" (green), and
    there is no accuracy floor (the table says intervals are over seeds only)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tables.config import RowConfig, load_table, row_dir
    from tables.plots import _differences_figure
    from tables.runner import chosen, run_table
    from tables.tuning import tune_dir

    grid = {"optim.lr": [1e-3, 3e-3, 1e-2]}
    for lr, loss in ((1e-3, 1.40), (3e-3, 1.20), (1e-2, 1.30)):
        _write_run(tune_dir(tmp_path, "lm", (("optim.lr", lr),), 0), {"val_loss": loss})
    bpc = {"base": [2.00, 2.02, 2.01], "lm": [1.90, 1.91, 1.915]}
    for label, values_ in bpc.items():
        for seed, v in zip([1, 2, 3], values_):
            _write_run(row_dir(tmp_path, RowConfig(label=label), seed),
                       {"bits_per_char": v, "test_loss": v * 0.693, "val_loss": v * 0.69, "optim": {}})
    node = _table([{"label": "base"}, {"label": "lm", "tune": grid}], compare_metric="bits_per_char",
                  select_metric="val_loss", tie_metric="val_loss", tune_seeds=[0], tune_tie_seeds=[],
                  columns=["bits_per_char", "test_loss"], plots=["intervals", "pareto", "accuracy"])
    table = load_table(node)
    assert chosen(table, tmp_path)["lm"].winner == (("optim.lr", 3e-3),)
    for seed in (1, 2, 3):  # the reported runs were made with the chosen setting
        hydra = row_dir(tmp_path, RowConfig(label="lm"), seed).root / ".hydra"
        hydra.mkdir()
        hydra.joinpath("overrides.yaml").write_text("- optim.lr=0.003\n")
    assert run_table(node, tmp_path) == 0
    rec = {r["label"]: r for r in _csv(tmp_path / "table.csv")}["lm"]
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
        load_table(_table([{"label": "base"}], compare_metric="throughput"))
    assert load_table(_table([{"label": "base"}], compare_metric="throughput", better="higher"))
    with pytest.raises(UserError, match="target_metric=test_acc would time its target on the test set"):
        load_table(_table([{"label": "base"}], target_metric="test_acc"))


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
    from tables.plots import _differences_figure

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
    from tables.plots import _pareto_figure

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


def _write_grid(out: Path, val: dict[float, tuple[tuple[float, float], ...]]) -> None:
    for lr, by_seed in val.items():
        for seed, (acc, loss) in zip((0, 100), by_seed):
            _write_tuning_run(out, lr, seed, acc, loss)


def test_the_margin_gives_up_the_best_only_for_a_setting_within_its_cost(tmp_path: Path) -> None:
    """Validation figures of head_to_head_mnist1d_cpu at 339 tuning runs. local_sgd@dir0.1: 0.3
    diverged on seed 0 only, so 0.1 (best, 0.938) is a step below a divergence; 0.03 (0.774, 16
    points lower on both seeds) is a contender by the one-degree-of-freedom interval, and the margin
    chose it. ef_signsgd@iid: 2.7 diverged, 0.9 (0.973) is set aside, and the settings kept are 2
    points lower or more. In both the best stays, by the validation set's floor and by a cost of
    0.01. terngrad@iid: 0.1 and 0.03 are 0.0015 apart (9 of 6,000 signals) and 0.3 diverged on
    seed 100: a cost of 0.01 lets the margin give 0.1 up for 0.03, the floor (about 4 signals) does
    not. lsgd@dir0.1: every rate diverged; the margin has nothing safer to offer, so the best mean
    (0.1, 0.205) stays, not the largest rate (2.7, at chance) that the margin alone kept."""
    from tables.tuning import TunePolicy, choose

    nan = float("nan")
    local = tmp_path / "local_sgd"
    _write_grid(local, {0.009: ((0.384, 1.6194), (0.4888, 1.1706)), 0.03: ((0.7652, 0.6455), (0.7823, 0.5528)),
                        0.1: ((0.9423, 0.1698), (0.9327, 0.188)), 0.3: ((0.1003, 2.3495), (0.896, 0.2953))})
    sign = tmp_path / "ef_signsgd"
    _write_grid(sign, {0.03: ((0.5197, 1.1962), (0.513, 1.1983)), 0.1: ((0.8472, 0.4226), (0.8167, 0.5018)),
                       0.3: ((0.9545, 0.1398), (0.9522, 0.1483)), 0.9: ((0.9743, 0.0817), (0.9712, 0.0905)),
                       2.7: ((0.9415, 0.1747), (0.1005, nan))})
    tern = tmp_path / "terngrad"
    _write_grid(tern, {0.009: ((0.8305, 0.4629), (0.8027, 0.5281)), 0.03: ((0.961, 0.1166), (0.9537, 0.1381)),
                       0.1: ((0.9515, 0.1518), (0.9662, 0.1006)), 0.3: ((0.8112, 0.538), (0.1002, 2.3027))})
    lsgd = tmp_path / "lsgd"  # every rate diverged (validation loss above the first training loss)
    _write_grid(lsgd, {0.03: ((0.2955, 6.2351), (0.1128, 23.8439)), 0.1: ((0.2987, 4.9875), (0.1122, 15.4342)),
                       0.3: ((0.0997, 5.3096), (0.1248, 9.9549)), 0.9: ((0.0997, 5.3305), (0.1003, 5.8315)),
                       2.7: ((0.1003, 5.3339), (0.1003, 5.8417))})
    lr = lambda v: (("optim.lr", v),)  # noqa: E731
    tuned = choose(lsgd, "r", {"optim.lr": [0.03, 0.1, 0.3, 0.9, 2.7]}, [0, 100], "val_acc")
    assert len(tuned.diverged) == 5 and tuned.winner == lr(0.1) and lr(2.7) in tuned.set_aside, tuned
    for policy in (TunePolicy(), TunePolicy(margin_cost=0.01)):
        tuned = choose(local, "r", {"optim.lr": [0.009, 0.03, 0.1, 0.3]}, [0, 100], "val_acc", policy)
        assert lr(0.03) in tuned.contenders and tuned.diverged == {lr(0.3): [0]}, tuned
        assert tuned.winner == lr(0.1) and tuned.set_aside == [lr(0.3)] and tuned.rule == "val_loss", tuned
        tuned = choose(sign, "r", {"optim.lr": [0.03, 0.1, 0.3, 0.9, 2.7]}, [0, 100], "val_acc", policy)
        assert tuned.winner == lr(0.9) and lr(0.9) not in tuned.set_aside and tuned.diverged == {lr(2.7): [100]}
    tuned = choose(tern, "r", {"optim.lr": [0.009, 0.03, 0.1, 0.3]}, [0, 100], "val_acc", TunePolicy(margin_cost=0.01))
    assert tuned.winner == lr(0.03) and lr(0.1) in tuned.set_aside and tuned.rule == "stability margin", tuned
    tuned = choose(tern, "r", {"optim.lr": [0.009, 0.03, 0.1, 0.3]}, [0, 100], "val_acc")
    assert tuned.winner == lr(0.1) and lr(0.1) not in tuned.set_aside, tuned
    from tables.runner import chosen
    from tables.config import load_table
    from tables.render import _tuning_lines

    rows = [{"label": "r", "tune": {"optim.lr": [0.03, 0.1, 0.3]}}]  # 0.009: the table's own extension
    table = load_table(_table(rows, baseline="r", tune_seeds=[0, 100], tune_extend=1, tune_margin_cost=0.01))
    found = chosen(table, tern)
    assert found["r"].winner == lr(0.03)  # the table's cost reaches the rule
    assert "the best mean only for a setting the margin keeps within table.tune_margin_cost = 0.01 of it" in (
        "\n".join(_tuning_lines(table, found, [])))
    assert chosen(load_table(_table(rows, baseline="r", tune_seeds=[0, 100], tune_extend=1)), tern)["r"].winner == lr(0.1)
