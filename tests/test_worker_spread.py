"""`python -m engine.worker_spread`: each worker's score, their mean's and their consensus
distance from a run's checkpoint (engine/report/spread.py). The mean it scores must be the model
the plugins' `average` evaluation scores, and its distances must be the hand-computed ones."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from core.errors import UserError
from engine.worker_spread import spread_of_run
from engine.report.spread import distances_from, mean_state, measure_spread
from tests.support.cli_runs import REPO, run_cli


def test_the_mean_of_states_averages_floats_and_keeps_counters() -> None:
    a = {"w": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}
    b = {"w": torch.tensor([3.0, 6.0]), "n": torch.tensor(7)}
    mean = mean_state([a, b])
    assert torch.equal(mean["w"], torch.tensor([2.0, 4.0])) and mean["w"].dtype == torch.float32
    assert int(mean["n"]) == 3  # an integer buffer (BatchNorm's counter) is the first state's
    assert distances_from([a, b], mean, ["w"]) == pytest.approx([math.sqrt(5), math.sqrt(5)])


def test_consensus_distance_and_scores_of_three_workers() -> None:
    """Xi = sqrt(1/n sum ||x_i - mean||^2) over the training ranks only; a serving rank is scored
    but neither enters the mean nor the distance."""
    def linear(w: float) -> dict[str, torch.Tensor]:
        return {"weight": torch.full((1, 2), w), "bias": torch.zeros(1)}

    states = {0: linear(0.0), 1: linear(1.0), 2: linear(5.0), 3: linear(100.0)}  # rank 3 serves
    spread = measure_spread(7, states, [0, 1, 2], lambda: nn.Linear(2, 1),
                            lambda m: {"test_w": m.weight[0, 0].item()})
    assert spread.mean == {"test_w": 2.0}
    assert [spread.per_rank[r]["test_w"] for r in range(4)] == [0.0, 1.0, 5.0, 100.0]
    # each worker's distance from the mean (2, 2): |w - 2| x sqrt(2)
    assert [spread.distance[r] for r in (0, 1, 2)] == pytest.approx([2 * math.sqrt(2), math.sqrt(2), 3 * math.sqrt(2)])
    assert spread.consensus_distance == pytest.approx(math.sqrt((8 + 2 + 18) / 3))
    assert spread.mean_norm == pytest.approx(2 * math.sqrt(2))
    assert spread.relative(2) == pytest.approx(1.5)
    assert not spread.bn_averaged and not spread.notes
    same = measure_spread(7, {0: linear(1.0), 1: linear(1.0)}, [0, 1], lambda: nn.Linear(2, 1), lambda m: {})
    assert same.consensus_distance == 0 and "identical weights at step 7" in same.notes[0]
    with pytest.raises(ValueError, match=r"\[4\]"):
        measure_spread(7, states, [0, 4], lambda: nn.Linear(2, 1), lambda m: {})


def test_a_runs_mean_scores_as_its_average_evaluation(cli_env: dict, tmp_path: Path) -> None:
    """EASGD on MNIST-1D (a model without BatchNorm), 4 forked ranks, evaluating the workers' mean
    (algo.eval_model=average): the command's mean scores what the run reported, on validation
    and test, and its four workers have drifted apart (tau = 3, so the last steps were local)."""
    run = tmp_path / "easgd"
    args = ["data=mnist1d", "model=mnist1d_cnn", "algo=easgd", "algo.sync_period=3", "algo.eval_model=average",
            "launch.launcher=fork", "launch.nproc=4", "train.max_steps=14", "train.eval_every_epochs=null",
            "checkpoint.every_epochs=null", "train.progress=false", "dist.device=cpu", f"hydra.run.dir={run}"]
    proc = run_cli(args, cli_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())

    spread, headline = spread_of_run(run)
    assert headline == "acc" and spread.step == summary["steps"] == 14
    assert spread.train_ranks == [0, 1, 2, 3] and sorted(spread.per_rank) == [0, 1, 2, 3]
    for key in ("val_acc", "test_acc"):
        assert spread.mean[key] == summary[key], key
    for key in ("val_loss", "test_loss"):
        assert spread.mean[key] == pytest.approx(summary[key], rel=1e-5), key
    assert all(spread.distance[r] > 0 for r in spread.train_ranks)  # two local steps since the elastic one

    with pytest.raises(UserError, match=r"^step=3: .* has checkpoints at steps 14; give one of them"):
        spread_of_run(run, step=3)

    # the command: the table printed, the record written, the run's own files untouched
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    cmd = subprocess.run([sys.executable, "-m", "engine.worker_spread", f"run={run}"], capture_output=True,
                         text=True, env=cli_env, cwd=REPO, timeout=300)
    assert cmd.returncode == 0, cmd.stderr[-3000:]
    assert "consensus distance" in cmd.stdout and "test_acc" in cmd.stdout
    record = json.loads((run / "spread" / "step_00000014.json").read_text())
    assert record["mean"]["test_acc"] == summary["test_acc"]
    assert record["consensus_distance"] == pytest.approx(spread.consensus_distance)
    after = sorted(p.relative_to(run) for p in run.rglob("*") if p.parts[len(run.parts)] != "spread")
    assert after == before


def test_a_folder_that_is_no_run_is_refused_in_one_line(cli_env: dict, tmp_path: Path) -> None:
    cmd = subprocess.run([sys.executable, "-m", "engine.worker_spread", f"run={tmp_path}"],
                         capture_output=True, text=True, env=cli_env, cwd=REPO, timeout=300)
    assert cmd.returncode == 2
    assert cmd.stderr.strip() == (f"worker_spread: error: run={tmp_path} has no config.yaml: "
                                  "give the directory of a syncopt run")
