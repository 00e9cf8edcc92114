"""The runner trains what the data's task says (core/task/), not only image classification:

- every recipe of the task sets (each recipes/cpu_<task>/ with a `_task.yaml`, `recipe_sets()`:
  every registered plugin and every method built from one) trains a step on its task through the
  real trainer, shrunk by the set's own `_shrink.yaml`;
- selection follows the task's direction through the real evaluator and checkpointer: where lower
  loss and higher accuracy disagree, classification keeps the accurate evaluation and the language
  model the one with the lower loss (and `checkpoint.best_metric` picks either way);
- a `checkpoint.best_metric` that is not a validation metric of the run's task is one line, exit 2;
- a language-model run reports the task's metrics: summary.json (`test_bpc`, `best_val_loss`, the
  evaluation sets' sizes), metrics.jsonl, the summary screen and curves.png.
"""
from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from core.errors import UserError
from core.spec import ImageSpec, TextSpec
from core.task import task_for
from tables.config import RECIPES, recipe_sets
from tests.support.cli_runs import run_cli_here
from tests.support.harness import rank_config, run_ranks

SHRINK_FILE = "_shrink.yaml"  # in recipes/cpu_<task>/: what makes a step of the set's task cheap
#: the sets shipped before sets declared their own shrink: their task, data and metrics are pinned below
SHIPPED_SETS = ("cpu_mnist1d", "cpu_lm")


def overrides_of(node: dict[str, Any], prefix: str = "") -> list[str]:
    """A YAML mapping's leaves as dotted command-line overrides (`model: {layers: 1}` -> `model.layers=1`)."""
    found = []
    for key, value in node.items():
        if isinstance(value, dict):
            found += overrides_of(value, f"{prefix}{key}.")
        elif isinstance(value, (bool, int, float, str)) or value is None:
            found.append(f"{prefix}{key}={yaml.safe_dump(value, default_flow_style=True).splitlines()[0]}")
        else:
            raise AssertionError(f"{prefix}{key}: {SHRINK_FILE} holds scalars only (got {value!r})")
    return found


def shrink_of(folder: str) -> list[str]:
    """The overrides recipes/<folder>/_shrink.yaml declares (its values; its defaults only make it
    compose on its own). A set without one fails with the line that says what to add."""
    path = RECIPES / folder / SHRINK_FILE
    assert path.is_file(), (f"recipes/{folder}/ has no {SHRINK_FILE}: add one (`# @package _global_`, "
                            f"`defaults: [/recipe/{folder}/_task]`, then the values that make a step of its task "
                            "cheap, e.g. a small data set and model)")
    node = yaml.safe_load(path.read_text()) or {}
    return overrides_of({k: v for k, v in node.items() if k != "defaults"})


#: what makes a step of each task set cheap, as each set declares it (a small MNIST-1D, a one-layer
#: GPT on short windows)
SHRINK = {folder: shrink_of(folder) for folder in recipe_sets() if folder != "cpu"}
COMMON = ["train.max_steps=1", "resume=null", "checkpoint.every_steps=null", "checkpoint.every_epochs=null"]


def configs_by_world() -> dict[int, dict[str, Any]]:
    """Every recipe of the task sets, composed once with its shrink (`rank_config`, handed to every
    rank) and grouped by its ranks (one `run_ranks` call per group, so each rank renders the corpus
    and generates MNIST-1D once)."""
    groups: dict[int, dict[str, Any]] = defaultdict(dict)
    for folder in SHRINK:
        for path in sorted((RECIPES / folder).glob("[!_]*.yaml")):
            recipe = f"{folder}/{path.stem}"
            config = rank_config([f"recipe={recipe}", *SHRINK[folder], *COMMON])
            groups[config.launch.nproc][recipe] = config
    return groups


def one_step_each(rank: int, world: int, configs: dict[str, Any], tmp: str) -> dict[str, Any]:
    """Each recipe's step on this rank, from its config as the test composed it (`rank_config`)."""
    from tests.support.harness import train_in_rank

    out = {}
    for recipe, config in configs.items():
        run_dir = f"{tmp}/{recipe.replace('/', '_')}"
        summary = train_in_rank(rank, world, config, run_dir)
        ckpt = torch.load(Path(run_dir) / "checkpoints" / "step_00000001" / f"rank_{rank}.pt", weights_only=True)
        model = ckpt["model"]
        out[recipe] = {"summary": summary, "params": {k: v for k, v in model.items() if v.is_floating_point()}}
    return out


def initial_params(config: Any) -> dict[str, torch.Tensor]:
    """The model a run of `config` starts from (seeded as the trainer seeds it)."""
    from engine.train.rng import seed_everything
    from models import build_model
    from data import data_spec

    seed_everything(config.seed)
    model = build_model(config.model, data_spec(config.data))
    return {k: v for k, v in model.state_dict().items() if v.is_floating_point()}


@pytest.mark.timeout(900)
def test_every_plugin_trains_a_step_on_each_new_task(tmp_path: Path) -> None:
    from data import data_spec
    from dist_algos import list_algorithms

    assert set(SHIPPED_SETS) <= set(SHRINK), f"the shipped task sets are gone: {sorted(SHRINK)}"
    trained = set()
    for world, configs in configs_by_world().items():
        ranks = run_ranks(one_step_each, world, configs, str(tmp_path / f"w{world}"), timeout=600)
        for recipe, config in configs.items():
            summaries = [r[recipe]["summary"] for r in ranks if r[recipe]["summary"] is not None]
            assert len(summaries) == 1, f"{recipe}: one reporting rank"
            s = summaries[0]
            task = task_for(data_spec(config.data))  # every set: the task its data names, its metrics
            assert s["steps"] == 1 and s["task"] == task.name and s["data"] == config.data.name, recipe
            assert all(f"test_{m.name}" in s for m in task.metrics), f"{recipe}: {sorted(s)}"
            assert s["best_metric"] == task.selection_metric, recipe
            if recipe.split("/")[0] in SHIPPED_SETS:
                lm = recipe.startswith("cpu_lm/")
                assert s["steps"] == 1 and s["task"] == ("language_model" if lm else "classification"), recipe
                assert s["data"] == ("shakespeare_char" if lm else "mnist1d"), recipe
                metric = "test_bpc" if lm else "test_acc"
                assert math.isfinite(s["test_loss"]) and metric in s, f"{recipe}: {sorted(s)}"
                assert s["best_metric"] == ("val_loss" if lm else "val_acc"), recipe
            assert math.isfinite(s["test_loss"]), recipe
            start = initial_params(config)
            moved = [any(not torch.equal(r[recipe]["params"][k], start[k]) for k in start) for r in ranks]
            assert any(moved), f"{recipe}: no rank's model moved in its step"
            trained.add((recipe.split("/")[0], s["algo"]))
    for folder in SHRINK:
        missing = set(list_algorithms()) - {algo for f, algo in trained if f == folder}
        assert not missing, f"recipes/{folder}/ trains no step of {sorted(missing)}"


# ---- selection in the task's direction ------------------------------------------------------------
class Scripted(torch.nn.Module):
    """Returns `outputs[phase]` whatever the input: an evaluation's logits, set by the test."""

    def __init__(self, outputs: list[torch.Tensor]) -> None:
        super().__init__()
        self.outputs, self.phase = outputs, 0
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.outputs[self.phase]


class Stream:
    def __init__(self, y: torch.Tensor) -> None:
        self.y, self.num_samples = y, len(y)

    def batches(self) -> Any:
        yield torch.zeros(len(self.y)), self.y


class NoComm:
    def as_metrics(self) -> dict[str, int]:
        return {"comm_bytes": 0}


class Plugin:
    comm = NoComm()

    def eval_model(self, model: torch.nn.Module) -> torch.nn.Module:
        return model


def disagreeing_evaluations(language_model: bool) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Two evaluations of two samples of class 0 (three classes): the first has both right with
    small margins (accuracy 1, loss 1.03); the second one right by far and one wrong (accuracy
    0.5, loss 0.57). A language model's are the same as one-token windows."""
    first = torch.tensor([[0.1, 0.0, 0.0], [0.1, 0.0, 0.0]])
    second = torch.tensor([[5.0, 0.0, 0.0], [0.0, 0.1, 0.0]])
    y = torch.tensor([0, 0])
    if language_model:
        return [first[:, None, :], second[:, None, :]], y[:, None]
    return [first, second], y


def select_through_the_evaluator(rank: int, world: int, language_model: bool, best_metric: Any,
                                 tmp: str) -> dict[str, Any]:
    from types import SimpleNamespace

    from core.distenv import init_distributed
    from core.rundir import RunDir
    from engine.train.checkpointer import CheckpointConfig, Checkpointer, selection_metric
    from engine.train.evaluation import Evaluator
    from engine.train.train_state import TrainState

    task = task_for(TextSpec(3, 1) if language_model else ImageSpec(1, 8, 3))
    cfg = CheckpointConfig(every_epochs=None, best_metric=best_metric)
    metric = selection_metric(cfg, task, "test")
    outputs, y = disagreeing_evaluations(language_model)
    model = Scripted(outputs)
    ctx = init_distributed("gloo", device="cpu")  # (run_ranks has initialised it: this is its context)
    train_cfg = SimpleNamespace(eval_every_steps=1, eval_every_epochs=None)
    evaluator = Evaluator(train_cfg, metric, 10, Plugin(), model, ctx, True, Stream(y), lambda m, x: m(x), task,
                          quiesce=False, val_stream=Stream(y))
    state = TrainState()
    checkpointer = Checkpointer(cfg, RunDir(Path(tmp)), ctx, "allreduce", {}, lambda: {"model": model.state_dict()},
                                10, metric)
    results = []
    for phase, step in ((0, 3), (1, 6)):
        model.phase, state.step = phase, step
        result, improved = evaluator.run(state)
        checkpointer.after_step(state, False, improved)
        results.append(result)
    best = json.loads((Path(tmp) / "checkpoints" / "best.json").read_text())
    return {"metric": metric, "results": results, "best": best, "state_best": state.best,
            "best_step": state.best_step, "test_at_best": state.test_at_best}


@pytest.mark.parametrize("language_model, best_metric, chosen", [
    (False, None, 3),  # classification's default, val_acc: the accurate evaluation
    (True, None, 6),  # the language model's default, val_loss: the lower loss
    (False, "val_loss", 6),  # any validation metric of the task, in its own direction
    (True, "val_acc", 3),
    (True, "val_bpc", 6),
])
def test_selection_follows_the_task_direction(language_model: bool, best_metric: Any, chosen: int,
                                              tmp_path: Path) -> None:
    (got,) = run_ranks(select_through_the_evaluator, 1, language_model, best_metric, str(tmp_path))
    first, second = got["results"]
    assert first["val_acc"] == 1.0 and second["val_acc"] == 0.5
    assert second["val_loss"] < first["val_loss"], "the scripted evaluations must disagree"
    metric = got["metric"]
    assert metric == best_metric or (best_metric is None and metric == ("val_loss" if language_model else "val_acc"))
    picked = first if chosen == 3 else second
    assert got["best_step"] == chosen and got["state_best"] == picked[metric]
    assert got["best"] == {"step": chosen, "metric": metric, "value": picked[metric]}
    assert got["test_at_best"] == {k: v for k, v in picked.items() if k.startswith("test_")}
    if language_model:
        assert set(first) >= {"val_ppl", "val_bpc", "test_ppl", "test_bpc"}


def test_a_metric_of_another_task_is_refused_before_launch_in_one_line(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from engine.train.checkpointer import CheckpointConfig, selection_metric

    lm, clf = task_for(TextSpec(75, 64)), task_for(ImageSpec(1, 8, 10))
    assert selection_metric(CheckpointConfig(), lm, "shakespeare_char") == "val_loss"
    assert selection_metric(CheckpointConfig(), clf, "digits") == "val_acc"
    assert selection_metric(CheckpointConfig(best_metric="val_ppl"), lm, "shakespeare_char") == "val_ppl"
    with pytest.raises(UserError, match=r"^checkpoint.best_metric=val_bpc is not a validation metric of data=digits "
                                        r"\(a classification task\); use one of val_loss, val_acc, val_top5$"):
        selection_metric(CheckpointConfig(best_metric="val_bpc"), clf, "digits")
    monkeypatch.setenv("SYNCOPT_DATA", "/nonexistent")  # refused before any data set is read
    proc = run_cli_here(["recipe=lm/shakespeare_cpu", "checkpoint.best_metric=val_top5",
                         f"hydra.run.dir={tmp_path / 'run'}"])
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert "checkpoint.best_metric=val_top5" in lines[0] and "val_loss, val_ppl, val_bpc, val_acc" in lines[0]


# ---- a language-model run's record --------------------------------------------------------------------
LM_RUN = ["recipe=lm/shakespeare_cpu", "model.layers=1", "model.width=16", "model.heads=2", "data.context_length=16",
          "data.eval_windows=24", "train.max_steps=12", "train.eval_every_steps=4", "sched.warmup_steps=2",
          "train.log_every_steps=2", "resume=null", "checkpoint.every_steps=null"]


def lm_run(rank: int, world: int, tmp: str) -> Any:
    from tests.support.harness import train_in_rank

    return train_in_rank(rank, world, LM_RUN, tmp)


@pytest.mark.timeout(300)
def test_a_language_model_run_reports_the_task_metrics(tmp_path: Path) -> None:
    summary = next(s for s in run_ranks(lm_run, 2, str(tmp_path), timeout=280, plots=True) if s is not None)
    records = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r.get("kind") == "eval"]
    assert [r["step"] for r in evals] == [4, 8, 12]
    for r in evals:
        for prefix in ("val", "test"):
            assert r[f"{prefix}_ppl"] == pytest.approx(math.exp(r[f"{prefix}_loss"]))
            assert r[f"{prefix}_bpc"] == pytest.approx(r[f"{prefix}_loss"] / math.log(2))
            assert 0 <= r[f"{prefix}_acc"] <= 1
    best = min(evals, key=lambda r: (r["val_loss"], r["step"]))  # the lowest loss, first reached
    assert summary["best_metric"] == "val_loss" and summary["best_val_loss"] == best["val_loss"]
    assert summary["best_step"] == best["step"] and summary["test_bpc_at_best"] == best["test_bpc"]
    assert "best_val_acc" not in summary and summary["task"] == "language_model"
    assert summary["test_samples"] == 24 and summary["val_samples"] == 24  # windows: the tables' floor
    assert summary["tokens_per_s"] == pytest.approx(summary["samples_per_s"] * 16)
    train = [r for r in records if r.get("kind") == "train"]
    assert train and all(0 <= r["acc"] <= 1 for r in train)  # right next characters over tokens, not windows
    assert (tmp_path / "curves.png").stat().st_size > 0
    best_file = json.loads((tmp_path / "checkpoints" / "best.json").read_text())
    assert best_file == {"step": best["step"], "metric": "val_loss", "value": best["val_loss"]}


def test_the_summary_screen_speaks_the_task(tmp_path: Path, capsys: Any) -> None:
    from engine.report.summary import print_summary

    base = {"algo": "allreduce", "steps": 10, "epochs": 0.1, "world_size": 4, "train_ranks": 4, "global_batch": 12,
            "peak_lr": 1e-3, "samples_per_s": 80.0, "data_wait_frac": 0.01, "syncs": 10, "comm_bytes": 1e6,
            "comm_s": 0.1, "wall_s": 5.0}
    lm = {**base, "data": "shakespeare_char", "task": "language_model", "test_loss": 1.5, "test_bpc": 2.164,
          "test_ppl": 4.48, "test_acc": 0.55, "val_loss": 1.45, "best_metric": "val_loss", "best_val_loss": 1.44,
          "best_step": 8, "test_loss_at_best": 1.49, "tokens_per_s": 5120.0}
    print_summary(lm, tmp_path)
    out = capsys.readouterr().out
    assert "1.5000 nats per character" in out and "bits per character" in out and "2.1640" in out
    assert "best validation loss" in out and "1.4400 at step 8 (test there 1.4900)" in out
    assert "5120 tokens/s" in out and "windows/s" in out and "accuracy" not in out.replace("next-character accuracy", "")
    clf = {**base, "data": "digits", "test_acc": 0.99, "test_loss": 0.05, "best_metric": "val_acc",
           "best_val_acc": 0.98, "best_step": 5, "test_acc_at_best": 0.99}
    print_summary(clf, tmp_path)
    out = capsys.readouterr().out
    assert "test accuracy" in out and "best validation accuracy" in out and "0.9800 at step 5 (test there 0.9900)" in out
