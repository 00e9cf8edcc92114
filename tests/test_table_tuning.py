"""The evidence a table gives (issue 34), from written result files: tuning that is not decided by a
coin toss (grid edges, ties within the validation set's resolution, divergence, the margin)."""

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


# --- tuning that is not a coin toss --------------------------------------------------------------

def test_a_tie_at_a_grids_edge_extends_the_grid(tmp_path: Path) -> None:
    """lr 0.03 and 0.1 tie for the best at the low end of [0.03, 0.1, 0.3]: the grid grows below
    0.03 (it grew only past a strict winner, and a tie at an edge was not even flagged)."""
    from tables.tuning import choose, extend_grid, tune_dir

    grid = {"optim.lr": [0.03, 0.1, 0.3]}
    for lr, v in ((0.03, 0.95), (0.1, 0.95), (0.3, 0.5)):
        write_run(tune_dir(tmp_path, "r", (("optim.lr", lr),), 0), {"val_acc": v})
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
        write_run(tune_dir(tmp_path, "r", (("optim.lr", lr),), 0),
                   {"val_acc": correct / 144, "val_loss": loss, "data_split": {"val_samples": 144}})
    table = load_table(table_node([{"label": "r", "tune": grid}], baseline="r", tune_seeds=[0]))
    jobs = {name for name, _, _ in tuning_jobs(table, tmp_path)}
    assert {f"r optim.lr_{lr} seed 4" for lr in grid["optim.lr"]} <= jobs, jobs
    for lr, (correct, loss) in val.items():
        write_run(tune_dir(tmp_path, "r", (("optim.lr", lr),), 4),
                   {"val_acc": (correct + 1) / 144, "val_loss": loss, "data_split": {"val_samples": 144}})
    result = chosen(table, tmp_path)["r"]
    assert result.seeds == [0, 4] and result.within_noise
    assert set(result.contenders) == {(("optim.lr", 0.03),), (("optim.lr", 0.1),)}
    assert result.winner == (("optim.lr", 0.03),) and result.rule == "val_loss"
    from tables.render_tuning import tuning_lines

    text = "\n".join(tuning_lines(table, {"r": result}, []))
    assert "Chosen within noise" in text and "r (2 contenders on 2 seeds, decided by val_loss)" in text
    assert "decided by the best mean val_loss, then the best mean val_acc, then grid order" in text
    # a clear winner (30 images apart) needs no second seed
    clear = tmp_path / "clear"
    for lr, correct in ((0.03, 100), (0.1, 140), (0.3, 90)):
        write_run(tune_dir(clear, "r", (("optim.lr", lr),), 0),
                   {"val_acc": correct / 144, "val_loss": 0.1, "data_split": {"val_samples": 144}})
    assert all("seed 4" not in name for name, _, _ in tuning_jobs(table, clear))
    assert not chosen(table, clear)["r"].within_noise



def test_a_contender_a_grid_step_below_a_diverged_rate_is_set_aside(tmp_path: Path) -> None:
    """The MNIST-1D trial's allreduce on two tuning seeds: 0.1 and 0.3 within noise, 0.3 ahead on
    validation loss by 0.0002, 0.9 collapsed to the untrained loss on both. The margin chooses 0.1
    and table.md says why; without it (no stability keys) validation loss chooses 0.3."""
    from tables.config import load_table
    from tables.render_tuning import tuning_lines
    from tables.tuning import TunePolicy, choose

    grid = {"optim.lr": [0.03, 0.1, 0.3, 0.9]}
    val = {0.03: ((0.9545, 0.1368), (0.9475, 0.1663)), 0.1: ((0.9817, 0.0573), (0.9790, 0.0709)),
           0.3: ((0.9805, 0.0581), (0.9775, 0.0696)), 0.9: ((0.0998, 2.3026), (0.1002, 2.3026))}
    for lr, by_seed in val.items():
        for seed, (acc, loss) in zip((0, 100), by_seed):
            write_tuning_run(tmp_path, lr, seed, acc, loss, first_loss=2.3022)
    tuned = choose(tmp_path, "r", grid, [0, 100], "val_acc")
    assert set(tuned.contenders) == {(("optim.lr", 0.1),), (("optim.lr", 0.3),)}
    assert tuned.diverged == {(("optim.lr", 0.9),): [0, 100]}
    assert tuned.set_aside == [(("optim.lr", 0.3),)]
    assert tuned.winner == (("optim.lr", 0.1),) and tuned.rule == "stability margin"
    plain = choose(tmp_path, "r", grid, [0, 100], "val_acc", TunePolicy(stability_keys=()))
    assert plain.winner == (("optim.lr", 0.3),) and plain.rule == "val_loss" and not plain.set_aside
    table = load_table(table_node([{"label": "r", "tune": grid}], baseline="r", tune_seeds=[0, 100]))
    from tables.runner import chosen

    assert chosen(table, tmp_path)["r"].winner == (("optim.lr", 0.1),)  # the table's own policy
    off = load_table(table_node([{"label": "r", "tune": grid}], baseline="r", tune_seeds=[0, 100],
                            tune_stability_keys=[]))
    assert chosen(off, tmp_path)["r"].winner == (("optim.lr", 0.3),)
    text = "\n".join(tuning_lines(table, {"r": tuned}, []))
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
        write_tuning_run(tmp_path, 0.1, seed, 0.93 + seed * 0.001, 0.2)
        write_tuning_run(tmp_path, 0.3, seed, 0.98 + seed * 0.002, 0.07)
        write_tuning_run(tmp_path, 0.9, seed, 0.10, float("nan"))
    tuned = choose(tmp_path, "r", grid, [0, 1], "val_acc")
    assert tuned.winner == (("optim.lr", 0.3),) and tuned.rule == "best mean" and not tuned.within_noise
    assert tuned.diverged == {(("optim.lr", 0.9),): [0, 1]}
    # 0.3 collapses on seed 1 only: with two seeds its mean stays within noise of 0.1's
    write_tuning_run(tmp_path, 0.3, 1, 0.10, 2.31)
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
    from tables.render_tuning import tuning_lines
    from tables.tuning import tune_dir

    grid = {"optim.lr": [3e-4, 1e-3, 3e-3]}
    loss = {3e-4: 1.95, 1e-3: 1.903, 3e-3: 1.900}
    for lr, v in loss.items():
        write_run(tune_dir(tmp_path, "r", (("optim.lr", lr),), 0), {"val_loss": v})
    rows = [{"label": "r", "tune": grid}]
    common = dict(baseline="r", tune_seeds=[0], tune_tie_seeds=[100], select_metric="val_loss",
                  compare_metric="test_loss")
    plain = load_table(table_node(rows, **common))
    assert not chosen(plain, tmp_path)["r"].within_noise
    assert all("seed 100" not in name for name, _, _ in tuning_jobs(plain, tmp_path))
    stated = load_table(table_node(rows, tune_resolution=0.0125, **common))
    assert {f"r optim.lr_{lr} seed 100" for lr in grid["optim.lr"]} <= {n for n, _, _ in tuning_jobs(stated, tmp_path)}
    for lr, v in loss.items():
        write_run(tune_dir(tmp_path, "r", (("optim.lr", lr),), 100), {"val_loss": v + 0.001})
    result = chosen(stated, tmp_path)["r"]
    assert result.seeds == [0, 100] and result.within_noise
    assert set(result.contenders) == {(("optim.lr", 1e-3),), (("optim.lr", 3e-3),)}
    text = "\n".join(tuning_lines(stated, {"r": result}, []))
    assert "or whose mean is within table.tune_resolution = 0.0125 of the best," in text
    # selected and tie-broken by one loss: the rule names it once, and no accuracy is claimed
    assert "decided by the best mean val_loss, then grid order" in text and "No test result chose" in text


def test_a_run_has_diverged_when_it_ends_no_better_than_it_began(tmp_path: Path) -> None:
    from tables.tuning import diverged, tune_dir

    def run(val_loss: float, first: Optional[float]) -> Any:
        r = tune_dir(tmp_path, f"d{val_loss}{first}", (("optim.lr", 0.1),), 0)
        write_run(r, {"val_loss": val_loss})
        if first is not None:
            r.metrics.write_text(json.dumps({"kind": "train", "step": 10, "loss": first}) + "\n")
        return r

    assert diverged(run(2.3026, 2.3022))  # collapsed to a constant output
    assert diverged(run(float("inf"), 2.3)) and diverged(run(float("nan"), None))
    assert not diverged(run(0.06, 2.3))  # learned
    assert not diverged(run(2.5, None))  # no first loss recorded: unknown, not a divergence
    assert not diverged(tune_dir(tmp_path, "missing", (("optim.lr", 0.1),), 0))


def _write_grid(out: Path, val: dict[float, tuple[tuple[float, float], ...]]) -> None:
    for lr, by_seed in val.items():
        for seed, (acc, loss) in zip((0, 100), by_seed):
            write_tuning_run(out, lr, seed, acc, loss)


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
    from tables.render_tuning import tuning_lines

    rows = [{"label": "r", "tune": {"optim.lr": [0.03, 0.1, 0.3]}}]  # 0.009: the table's own extension
    table = load_table(table_node(rows, baseline="r", tune_seeds=[0, 100], tune_extend=1, tune_margin_cost=0.01))
    found = chosen(table, tern)
    assert found["r"].winner == lr(0.03)  # the table's cost reaches the rule
    assert "the best mean only for a setting the margin keeps within table.tune_margin_cost = 0.01 of it" in (
        "\n".join(tuning_lines(table, found, [])))
    assert chosen(load_table(table_node(rows, baseline="r", tune_seeds=[0, 100], tune_extend=1)), tern)["r"].winner == lr(0.1)


def test_every_tuning_seed_the_store_holds_counts_and_a_gather_flags_runs_of_a_superseded_choice(tmp_path: Path) -> None:
    """head_to_head_lm_cpu's diloco@roles: tie seed 100 ran for lr 0.0003-0.009 while two settings
    were within noise on seed 0; once 0.009 won on seed 0 alone the rule read seed 0 only, though
    over both seeds 0.003 beats it (issue 88). Every seed the runs hold counts; the extension's point
    without seed 100 has no mean; and a gather whose reported runs were made at the old choice says
    so in table.md and table.csv instead of showing them as the new choice's."""
    from tables.config import RowConfig, load_table, row_dir
    from tables.render import collect
    from tables.runner import chosen, tuning_jobs
    from tables.tuning import tune_dir

    grid = {"optim.lr": [0.0003, 0.001, 0.003]}
    loss = {0.0003: (2.1868, 2.1778), 0.001: (2.0283, 2.0105), 0.003: (2.0252, 2.0128), 0.009: (2.0082, 2.0702)}
    for lr, (first, tie) in loss.items():
        write_run(tune_dir(tmp_path, "r", (("optim.lr", lr),), 0), {"val_loss": first})
        write_run(tune_dir(tmp_path, "r", (("optim.lr", lr),), 100), {"val_loss": tie})
    write_run(tune_dir(tmp_path, "r", (("optim.lr", 0.027),), 0), {"val_loss": 2.2583})  # seed 0 only
    node = table_node([{"label": "r", "tune": grid}], baseline="r", tune_seeds=[0], tune_tie_seeds=[100],
                      tune_extend=2, tune_resolution=0.0125, select_metric="val_loss", compare_metric="test_loss",
                      columns=["test_loss"])
    table = load_table(node)
    result = chosen(table, tmp_path)["r"]
    assert result.seeds == [0, 100] and result.winner == (("optim.lr", 0.003),)
    assert [s[0][1] for s, _, _ in result.results] == [0.0003, 0.001, 0.003, 0.009]  # 0.003 won: no 0.027
    # where 0.009 wins over both seeds, the grid goes on to 0.027, which lacks seed 100: no mean until made
    write_run(tune_dir(tmp_path, "r", (("optim.lr", 0.009),), 100), {"val_loss": 1.99})
    again = chosen(table, tmp_path)["r"]
    assert again.winner == (("optim.lr", 0.009),) and dict((s[0][1], m) for s, m, _ in again.results)[0.027] is None
    assert "r optim.lr_0.027 seed 100" in {name for name, _, _ in tuning_jobs(table, tmp_path)}  # the table makes it
    write_run(tune_dir(tmp_path, "r", (("optim.lr", 0.009),), 100), {"val_loss": 2.0702})
    for seed in table.seeds:  # the reported runs, made when 0.009 was the choice
        run = row_dir(tmp_path, RowConfig(label="r"), seed)
        write_run(run, {"test_loss": 2.05, "val_loss": 2.01})
        (run.root / ".hydra").mkdir()
        (run.root / ".hydra" / "overrides.yaml").write_text("- optim.lr=0.009\n")
    rec = collect(table, tmp_path, {}, chosen(table, tmp_path)).records[0]
    assert rec["tuned"] == "optim.lr_0.003" and rec["tuned_stale"] == "seed 1 seed 2 seed 3"
    assert "made with another setting than the one chosen now, optim.lr_0.003" in rec["note"]
