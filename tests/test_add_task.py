"""Adding a task is new files only, as docs/tasks.md and docs/architecture.md promise.

The test writes a toy task the way its author would, three new files in a copy of the repository
(its tracked and unignored files as they are now, without docs/ and tests/): the task
(`core/task/toy_binary.py`: one logit per input, binary cross-entropy, a Brier score that selects,
lower better), a data set of a new kind that brings its spec (`data/sets/toy_features.py`: feature
vectors, a `DataSpec` subclass naming the task) and a model for that kind
(`models/toy_logit.py`, asking for the spec's `features` by name). Nothing of the project is
edited; the registries find the files. cli.py then trains two steps in one process
(`launch.launcher=none launch.nproc=1`) in the copy, not in the repository itself, where every
cli.py and rank other tests start meanwhile would find the toy and lose it half-way (the reason
tests/test_plugin_example.py copies too).

It checks that the runner used the task's own loss (the first step's logged loss is ln 2: binary
cross-entropy of the model's zero logit, where the classification task's loss would fail on one
logit per input), its metrics (`test_brier` in summary.json and metrics.jsonl) and its selection
(`best_metric` is `val_brier`, the lowest evaluation of it chosen). The rest are one-process
checks of the registry's pieces: recipe sets read from the tree, metric directions agreeing across
tasks, one line for a task or spec field that is not there.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from core.errors import UserError
from core.registry import Registry
from core.spec import ImageSpec
from core.task import LOSS, METRIC_DIRECTIONS, MetricDirections, Metric, Task, task_for, task_names
from tables.config import TASK_FILE, recipe_sets

REPO = Path(__file__).resolve().parent.parent

TOY_TASK = '''"""toy_binary: binary classification by one logit per input; selects on the Brier score."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from core.task import register_task
from core.task.base import ACC, LOSS, Metric, Task

BRIER = Metric("brier", False, "Brier score: mean squared error of the predicted probability")


@register_task("toy_binary")
class ToyBinary(Task):
    metrics = (LOSS, ACC, BRIER)
    selection_metric = "val_brier"
    sums_size = 4  # summed cross-entropy, right predictions, summed squared error, samples
    shown = ("acc", "brier")
    plotted = ("loss", "brier")

    def loss(self, output: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(output.float(), target.float())

    def hits(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (output > 0) == target.bool()

    def count(self, target: torch.Tensor) -> int:
        return len(target)

    def batch_sums(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logit, y = output.float(), target.float()
        return torch.tensor([F.binary_cross_entropy_with_logits(logit, y, reduction="sum").item(),
                             self.hits(logit, target).sum().item(), ((torch.sigmoid(logit) - y) ** 2).sum().item(),
                             len(target)], dtype=torch.float64)

    def finish(self, sums: torch.Tensor, prefix: str) -> dict[str, float]:
        n = max(sums[3].item(), 1.0)
        return {f"{prefix}_loss": sums[0].item() / n, f"{prefix}_acc": sums[1].item() / n,
                f"{prefix}_brier": sums[2].item() / n}
'''

TOY_DATA = '''"""toy_features: 4-feature vectors labelled by which side of a fixed plane they lie, generated."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Optional

import torch

from core.spec import DataSpec
from data.config import DataConfig, Pipeline
from data.samples.tensors import TensorSamples
from data.sets import register_dataset
from data.sets.base import DataSet

SIZES = {"train": 192, "val": 64}


@dataclass(frozen=True)
class FeatureSpec(DataSpec):
    """Feature vectors N x F; the model returns one logit each."""

    features: int
    kind: ClassVar[str] = "feature vectors"
    task: str = field(default="toy_binary", kw_only=True)

    def example_input(self, batch: int) -> torch.Tensor:
        return torch.randn(batch, self.features)

    def output_shape(self, batch: int) -> tuple[int, ...]:
        return (batch,)

    def describe(self) -> str:
        return f"{self.size()} feature vectors"

    def size(self) -> str:
        return f"{self.features}-feature"


class ToyFeatures(DataSet):
    name = "toy_features"
    num_classes = 2  # (labels 0 and 1: the validation carve-out is stratified by them)
    form = TensorSamples
    needs_root = False
    pipelines = (Pipeline.torchvision,)
    config = {"augment": False, "eval_batch_size": 32}

    def spec(self, cfg: DataConfig) -> DataSpec:
        return FeatureSpec(features=4)

    def num_train_samples(self, cfg: DataConfig) -> Optional[int]:
        return SIZES["train"]

    def check_on_disk(self, cfg: DataConfig) -> None:
        """Nothing to check: the set is generated."""

    def samples(self, cfg: DataConfig, split: str) -> TensorSamples:
        x = torch.randn(SIZES[split], 4, generator=torch.Generator().manual_seed(len(split)))
        y = (x @ torch.tensor([1.0, -2.0, 0.5, 1.5]) > 0).long()
        return TensorSamples(x.contiguous(), y)


register_dataset(ToyFeatures())
'''

TOY_MODEL = '''"""toy_logit: one logit per feature vector, starting at zero (every first prediction is 1/2)."""
from __future__ import annotations

import torch.nn as nn

from models import register_model


@register_model("toy_logit")
def toy_logit(features: int) -> nn.Module:
    linear = nn.Linear(features, 1)
    nn.init.zeros_(linear.weight)
    nn.init.zeros_(linear.bias)
    return nn.Sequential(linear, nn.Flatten(0))
'''

TOY_FILES = {"core/task/toy_binary.py": TOY_TASK, "data/sets/toy_features.py": TOY_DATA,
             "models/toy_logit.py": TOY_MODEL}


def repository_copy(dest: Path) -> Path:
    """The repository's tracked and unignored files as they are now (edits included, links kept as
    links), without docs/ and tests/, which a run reads none of."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for rel in listed:
        source, target = REPO / rel, dest / rel
        if not rel or rel.startswith(("docs/", "tests/")) or not (source.is_file() or source.is_symlink()):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            os.symlink(os.readlink(source), target)
        else:
            shutil.copy2(source, target)
    return dest


@pytest.mark.timeout(120)
def test_a_task_added_as_new_files_trains_on_its_own_loss_metric_and_selection(tmp_path: Path,
                                                                               cli_env: dict) -> None:
    tree = repository_copy(tmp_path / "repo")
    for rel, code in TOY_FILES.items():
        assert not (tree / rel).exists(), f"the repository already holds {rel}"
        (tree / rel).write_text(code)
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "cli.py", "data=toy_features", "model=toy_logit", "launch.launcher=none",
                           "launch.nproc=1", "train.batch_size=16", "train.max_steps=3", "train.eval_every_steps=1",
                           "train.log_every_steps=1", "train.progress=false", "optim.lr=0.5",
                           f"hydra.run.dir={run}"], cwd=tree, env=cli_env, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]

    summary = json.loads((run / "summary.json").read_text())
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r.get("kind") == "train"]
    evals = [r for r in records if r.get("kind") == "eval"]
    assert summary["task"] == "toy_binary" and summary["data"] == "toy_features" and summary["steps"] == 3
    # the step differentiated the task's loss: binary cross-entropy of a zero logit is ln 2 for any batch
    assert train[0]["step"] == 1 and train[0]["loss"] == pytest.approx(math.log(2), rel=1e-6)
    assert [r["step"] for r in evals] == [1, 2, 3]
    for r in evals:
        assert {"val_loss", "val_acc", "val_brier", "test_loss", "test_acc", "test_brier"} <= set(r)
        assert 0 <= r["test_brier"] <= 1 and "test_top5" not in r
    assert summary["best_metric"] == "val_brier"  # the task's selection metric, lower better
    best = min(evals, key=lambda r: (r["val_brier"], r["step"]))
    assert summary["best_val_brier"] == best["val_brier"] and summary["best_step"] == best["step"]
    assert summary["test_brier_at_best"] == best["test_brier"] and "test_brier" in summary
    assert json.loads((run / "checkpoints" / "best.json").read_text())["metric"] == "val_brier"


def test_recipe_sets_are_the_folders_with_a_task_file(tmp_path: Path) -> None:
    for folder, files in {"cpu": ["allreduce.yaml"], "cpu_toy": [TASK_FILE, "allreduce.yaml"],
                          "cpu_half": ["allreduce.yaml"], "lm": [TASK_FILE], "cpu_lm": [TASK_FILE]}.items():
        for name in files:
            (tmp_path / folder).mkdir(exist_ok=True)
            (tmp_path / folder / name).write_text("# @package _global_\n")
    assert recipe_sets(tmp_path) == ("cpu", "cpu_lm", "cpu_toy")  # not cpu_half (no task), not lm (not cpu_*)
    assert {"cpu", "cpu_mnist1d", "cpu_lm"} <= set(recipe_sets())  # the shipped sets, read from recipes/


class Scripted(Task):
    """A task with nothing to compute, for the registry's checks (never trained)."""

    metrics = (LOSS,)
    selection_metric = "val_loss"
    sums_size = 1
    shown = plotted = ("loss",)

    def __init__(self, width: int) -> None:
        self.width = width

    def loss(self, output: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
        return output.sum()

    def hits(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return output > 0

    def count(self, target: torch.Tensor) -> int:
        return len(target)

    def batch_sums(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return torch.zeros(1, dtype=torch.float64)

    def finish(self, sums: torch.Tensor, prefix: str) -> dict[str, float]:
        return {f"{prefix}_loss": 0.0}


def test_metric_directions_agree_across_tasks_or_name_both() -> None:
    assert {"classification", "language_model"} <= set(task_names())
    assert METRIC_DIRECTIONS["acc"] and not METRIC_DIRECTIONS["bpc"] and not METRIC_DIRECTIONS["loss"]
    assert METRIC_DIRECTIONS.get("top5") is True and "ppl" in METRIC_DIRECTIONS

    class Agrees(Scripted):
        metrics = (LOSS, Metric("score", True, "a score"))

    class Disagrees(Scripted):
        metrics = (LOSS, Metric("score", False, "the same name, the other way"))

    registry: Registry[type[Task]] = Registry("task", "spec.task")
    registry.register_named("agrees")(Agrees)
    assert dict(MetricDirections(registry)) == {"loss": False, "score": True}
    registry.register_named("disagrees")(Disagrees)
    with pytest.raises(ValueError, match="metric 'score' is better lower in the disagrees task but not in the "
                                         "agrees task"):
        dict(MetricDirections(registry))


def test_a_task_or_spec_field_that_is_not_there_is_one_line() -> None:
    with pytest.raises(UserError, match=r"^spec.task='nowhere' is not a known task; choose one of .*classification"):
        task_for(ImageSpec(1, 8, 3, task="nowhere"))
    Scripted.name = "scripted"
    with pytest.raises(UserError, match=r"^the scripted task needs the width of its input, which the data's "
                                        r"1x8x8 images \(3 classes\) do not have"):
        Scripted.for_spec(ImageSpec(1, 8, 3))
    assert task_for(ImageSpec(1, 8, 3)).num_classes == 3  # the constructor's parameter, filled by name

    class Defaulted(Scripted):
        def __init__(self, width: int = 7, num_classes: int = 0) -> None:
            super().__init__(width)
            self.num_classes = num_classes

    made = Defaulted.for_spec(ImageSpec(1, 8, 3))  # a field the spec lacks keeps its default; one it has, fills
    assert (made.width, made.num_classes) == (7, 3)
