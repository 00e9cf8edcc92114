"""core.task: the classification task gives exactly the evaluator's numbers; the language model's
loss, perplexity, bits per character and next-character accuracy against hand computations; the
metric directions, and selection by the task's own rule where loss and accuracy disagree."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from core.spec import ImageSpec, SignalSpec, TextSpec
from core.task import base_name, task_for
from core.task.classification import Classification
from core.task.language_model import LanguageModel
from engine.train.evaluation import evaluate


def evaluation_before_tasks(batches, num_classes: int, prefix: str) -> dict[str, float]:
    """The evaluator's arithmetic before it asked the task (engine/train/evaluation.py up to issue
    33's wiring), kept here as the record that classification's numbers did not move."""
    sums = torch.zeros(4, dtype=torch.float64)  # loss, top1, top5, count
    for x, y in batches:
        logits = x.float()
        sums[0] += F.cross_entropy(logits, y, reduction="sum").item()
        hits = logits.topk(min(5, num_classes), dim=1).indices.eq(y[:, None])
        sums[1] += hits[:, 0].sum().item()
        sums[2] += hits.any(dim=1).sum().item()
        sums[3] += len(y)
    count = max(sums[3].item(), 1.0)
    out = {f"{prefix}_loss": sums[0].item() / count, f"{prefix}_acc": sums[1].item() / count}
    if num_classes > 5:
        out[f"{prefix}_top5"] = sums[2].item() / count
    return out


@pytest.mark.parametrize("classes", [3, 10])
def test_classification_is_exactly_todays_evaluation(classes: int) -> None:
    gen = torch.Generator().manual_seed(classes)
    batches = [(torch.randn(n, classes, generator=gen) * 3, torch.randint(0, classes, (n,), generator=gen))
               for n in (7, 16, 1, 9)]
    want = evaluation_before_tasks(batches, classes, prefix="val")
    task = task_for(ImageSpec(1, 8, classes))
    sums = task.zero_sums()
    for logits, y in batches:
        sums += task.batch_sums(logits, y)
    assert task.finish(sums, "val") == want  # every float to the last bit
    # and the evaluator the trainer runs, which now sums the task's batch sums
    got = evaluate(torch.nn.Identity(), batches, lambda m, x: m(x), torch.device("cpu"), task, prefix="val")
    assert got == want
    assert set(want) == ({"val_loss", "val_acc", "val_top5"} if classes > 5 else {"val_loss", "val_acc"})


def test_classification_by_hand() -> None:
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, 3.0]])
    target = torch.tensor([0, 1])
    task = Classification(3)
    ce = [-(2 - math.log(math.exp(2) + 2)), -(1 - math.log(1 + math.e + math.exp(3)))]
    assert task.loss(logits, target).item() == pytest.approx(sum(ce) / 2, rel=1e-6)
    assert task.correct(logits, target).item() == 1 and task.count(target) == 2
    out = task.finish(task.batch_sums(logits, target), "test")
    assert out["test_acc"] == 0.5 and out["test_loss"] == pytest.approx(sum(ce) / 2, rel=1e-6)
    smooth = torch.nn.CrossEntropyLoss(label_smoothing=0.1)(logits, target)
    assert torch.equal(task.loss(logits, target, label_smoothing=0.1), smooth)  # the step's criterion
    assert task_for(SignalSpec(1, 40, 10)).name == "classification"


def test_language_model_by_hand() -> None:
    # two windows of two positions over a vocabulary of 3
    logits = torch.tensor([[[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]],
                           [[0.0, 2.0, 0.0], [0.0, 0.0, 0.0]]])
    target = torch.tensor([[2, 0], [1, 1]])
    nll = [math.log(3), -(1 - math.log(math.e + 2)), -(2 - math.log(math.exp(2) + 2)), math.log(3)]
    loss = sum(nll) / 4
    task = task_for(TextSpec(3, 2))
    assert isinstance(task, LanguageModel) and task.selection_metric == "val_loss"
    assert task.loss(logits, target).item() == pytest.approx(loss, rel=1e-6)
    assert task.count(target) == 4
    # argmax (a tie picks id 0): window 0 predicts 0, 0 (targets 2, 0); window 1 predicts 1, 0 (targets 1, 1)
    assert task.correct(logits, target).item() == 2
    sums = task.zero_sums() + task.batch_sums(logits[:1], target[:1]) + task.batch_sums(logits[1:], target[1:])
    out = task.finish(sums, "val")
    assert out["val_loss"] == pytest.approx(loss, rel=1e-6)
    assert out["val_ppl"] == pytest.approx(math.exp(loss), rel=1e-6)
    assert out["val_bpc"] == pytest.approx(loss / math.log(2), rel=1e-6)
    assert out["val_acc"] == 0.5
    assert list(out) == ["val_loss", "val_ppl", "val_bpc", "val_acc"]


def test_directions_and_selection_follow_the_task() -> None:
    clf, lm = task_for(ImageSpec(1, 8, 10)), task_for(TextSpec(75, 256))
    assert clf.selection_metric == "val_acc" and lm.selection_metric == "val_loss"
    assert clf.higher_is_better("val_acc") and not clf.higher_is_better("test_loss")
    assert clf.higher_is_better("test_top5_at_best") and not lm.higher_is_better("best_val_ppl")
    assert not lm.higher_is_better("val_bpc") and lm.higher_is_better("test_acc")
    assert base_name("test_acc_at_best") == "acc" and base_name("best_val_loss") == "loss"
    with pytest.raises(KeyError, match="val_ppl is not a metric of the classification task"):
        clf.higher_is_better("val_ppl")
    # an evaluation where lower loss and higher accuracy disagree: each task picks by its own rule
    records = [{"step": 100, "val_loss": 1.30, "val_acc": 0.62},
               {"step": 200, "val_loss": 1.10, "val_acc": 0.60},
               {"step": 300, "val_loss": 1.10, "val_acc": 0.61}]
    assert clf.select(records) == 0  # the highest accuracy
    assert lm.select(records) == 1  # the lowest loss, first reached (a tie does not move it)
    assert lm.select(records, "val_acc") == 0
    assert lm.select([{"step": 1}]) is None
    assert lm.better("val_loss", 1.0, None) and not lm.better("val_loss", 1.0, 1.0)


def test_the_summary_screen_shows_a_new_tasks_own_metrics(tmp_path, capsys) -> None:
    """A task added as new files (no accuracy, no loss of the classification kind) gets its own
    metrics on the summary screen, not a KeyError at the end of every run."""
    from engine.report.summary import print_summary

    summary = {"task": "toy_binary", "algo": "allreduce", "data": "toy", "test_brier": 0.125, "val_brier": 0.25,
               "best_metric": "val_brier", "best_val_brier": 0.25, "best_step": 3, "test_brier_at_best": 0.125,
               "steps": 3, "epochs": 1.0, "world_size": 1, "train_ranks": 1, "global_batch": 4, "peak_lr": 0.1,
               "samples_per_s": 10.0, "data_wait_frac": 0.0, "syncs": 0, "comm_bytes": 0, "comm_s": 0.0, "wall_s": 1.0}
    print_summary(summary, tmp_path)
    out = capsys.readouterr().out
    assert "test brier" in out and "0.1250" in out and "validation 0.2500" in out
    assert "best validation brier" in out and "0.2500 at step 3" in out
