"""The validation split (`data.split`), in every pipeline, and selection on it.

Sizes are exact and stratified; the split depends on `data.split_seed` only (one validation
set for every run seed). Per pipeline (torchvision, device, FFCV, DALI; FFCV and DALI skip only
where their package is absent), on a CIFAR-format set whose images say which sample they are
(tests/support/datagen.py): validation, every rank's training shard and test are disjoint, validation is
read whole and once over the evaluating ranks with its labels, a skewed partition reaches the
pipeline, and a stream resumed mid-epoch reads the uninterrupted epoch's batches. Selection:
`checkpoint.best_metric=test_*` is refused before launch in one line; a run's best checkpoint,
best_* and test_acc_at_best come from the validation curve; with validation off nothing is
selected (and the default job's test result is today's: compared against a run with the
pre-validation sharding, `data.sampler.epoch_shards`, in tests/test_partition.py and by the
report's figures).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from core.errors import UserError
from data import DATASETS
from data.config import DataConfig
from data.pipelines import installed
from data.split import train_split, validation_indices
from tests.support.datagen import cifar_label, read_identity, write_cifar
from tests.support.cli_runs import run_cli_here
from tests.support.harness import compose, run_ranks

N_TRAIN, N_TEST, SHARDS, BATCH = 96, 24, 2, 4
VAL = ["data.val_fraction=0.25"]  # 24 of the 96
CHILD_TIMEOUT = 300


def labels_of(n: int, classes: int = 10) -> np.ndarray:
    return np.array([cifar_label(i, classes) for i in range(n)])


# ---- sizes and determinism ---------------------------------------------------------------------
def test_sizes_are_exact_and_stratified() -> None:
    from data.sets.digits import load_digits_split

    digits = load_digits_split(0.2, 0)[1].numpy()
    val = validation_indices(digits, DataConfig())  # digits' default: 10 % of its training part
    assert len(val) == round(0.1 * len(digits)) == 144
    whole, part = np.bincount(digits, minlength=10), np.bincount(digits[val], minlength=10)
    assert np.all(np.abs(part - 0.1 * whole) <= 1), (part, whole)
    cifar = labels_of(50_000)
    assert len(validation_indices(cifar, DataConfig())) == 5000  # CIFAR's default: 5,000 of the 50,000
    assert np.all(np.bincount(cifar[validation_indices(cifar, DataConfig())]) == 500)
    assert len(validation_indices(cifar, DataConfig(val_fraction=None, val_count=777))) == 777
    per_class = validation_indices(cifar, DataConfig(val_fraction=None, val_per_class=10))
    assert np.all(np.bincount(cifar[per_class]) == 10)
    assert DATASETS.get("imagenet").config["val_per_class"] == 10


def test_split_depends_on_split_seed_only() -> None:
    labels = labels_of(400)
    a = train_split(labels, DataConfig(), seed=1, num_shards=2, batch_size=8)
    b = train_split(labels, DataConfig(), seed=2, num_shards=2, batch_size=8)
    c = train_split(labels, DataConfig(split_seed=1), seed=1, num_shards=2, batch_size=8)
    assert np.array_equal(a.val, b.val) and not np.array_equal(a.val, c.val)
    assert a.record["val_samples"] == 40 and a.record["train_samples"] == 360


def test_zero_turns_validation_off_and_two_sizes_are_refused() -> None:
    assert len(validation_indices(labels_of(100), DataConfig(val_fraction=0))) == 0
    assert len(validation_indices(labels_of(100), DataConfig(val_fraction=0.2, val_count=0))) == 0
    with pytest.raises(UserError, match=r"^data.val_fraction=0.1 and data.val_count=5 both size"):
        compose(["data.val_count=5"])
    with pytest.raises(UserError, match=r"data.val_fraction=0.99 leaves no training samples"):
        validation_indices(labels_of(10), DataConfig(val_fraction=0.99))


# ---- selection ----------------------------------------------------------------------------------
@pytest.mark.parametrize("metric", ["test_acc", "test_top5"])
def test_best_metric_refuses_test_in_one_line(metric: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SYNCOPT_DATA", "/nonexistent")  # refused before any data set is read
    proc = run_cli_here([f"checkpoint.best_metric={metric}", f"hydra.run.dir={tmp_path / 'run'}"])
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"checkpoint.best_metric={metric}" in lines[0] and f"val_{metric[5:]}" in lines[0], lines[0]


def _two_runs(rank: int, world: int, tmp: str) -> Any:
    from tests.support.harness import train_in_rank

    base = ["train.max_steps=12", "train.eval_every_steps=3", "model.width=8", "resume=null", "train.batch_size=16"]
    on = train_in_rank(rank, world, base, f"{tmp}/on")
    off = train_in_rank(rank, world, base + ["data.val_fraction=0"], f"{tmp}/off")
    return on, off


@pytest.mark.timeout(300)
def test_selection_reads_validation_and_test_never_stands_in(tmp_path: Path) -> None:
    on, off = run_ranks(_two_runs, 2, str(tmp_path), timeout=280)[0]
    evals = [json.loads(ln) for ln in (tmp_path / "on" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in evals if r.get("kind") == "eval"]
    assert all({"val_acc", "val_loss", "test_acc", "test_loss", "wall_s", "comm_bytes_total"} <= set(r) for r in evals)
    first_best = max(evals, key=lambda r: (r["val_acc"], -r["step"]))  # the first evaluation at the max
    assert on["best_val_acc"] == first_best["val_acc"] and on["best_step"] == first_best["step"]
    assert on["test_acc_at_best"] == first_best["test_acc"], "test at the best is not the test of that evaluation"
    best = json.loads((tmp_path / "on" / "checkpoints" / "best.json").read_text())
    assert best == {"step": first_best["step"], "metric": "val_acc", "value": first_best["val_acc"]}
    assert on["data_split"]["val_samples"] == 144 and on["data_split"]["partition"] == "iid"
    assert off["best_val_acc"] is None and off["test_acc_at_best"] is None and off["best_step"] is None
    assert "val_acc" not in off and not (tmp_path / "off" / "checkpoints" / "best.json").exists()


# ---- every pipeline ----------------------------------------------------------------------------
def _ids(batches: Any, mean: Any, std: Any) -> tuple[list[int], list[int]]:
    ids, labels = [], []
    for x, y in batches:
        ids += read_identity(x, mean, std)
        labels += y.tolist()
    return ids, labels


def _collect(batches: Any) -> list[torch.Tensor]:
    return [x.clone() for x, _ in batches]


def pipeline_report(rank: int, world: int, pipeline: str, root: str) -> dict[str, Any]:
    from data import DataRequest, build_streams

    cifar = DATASETS.get("cifar10")
    out: dict[str, Any] = {}
    for partition in ("iid", "classes"):
        cfg = compose(["data=cifar10", f"data.pipeline={pipeline}", f"paths.data_root={root}",
                       f"data.num_workers={0 if pipeline in ('torchvision', 'device') else 1}",
                       f"data.partition={partition}", *VAL]).data
        rep: dict[str, Any] = {"train": [], "val": [], "labels_ok": True}
        streams = [build_streams(cfg, DataRequest(BATCH, 10, seed=5, shard=r, num_shards=SHARDS, eval_shard=r,
                                                  eval_num_shards=SHARDS)) for r in range(SHARDS)]
        for s in streams:
            per_epoch = []
            for epoch in (0, 1):
                ids, labels = _ids(s.train.batches(epoch), cifar.mean, cifar.std)
                rep["labels_ok"] &= labels == [cifar_label(i, 10) for i in ids]
                per_epoch.append(ids)
            rep["train"].append(per_epoch)
            ids, labels = _ids(s.val.batches(), cifar.mean, cifar.std)
            rep["labels_ok"] &= labels == [cifar_label(i, 10) for i in ids]
            rep["val"].append(ids)
        rep["test"] = [i for s in streams for i in _ids(s.test.batches(), cifar.mean, cifar.std)[0]]
        first = streams[0].train
        whole = _collect(first.batches(1))
        start = first.steps_per_epoch // 2
        resumed = _collect(first.batches(1, start))
        rep["resume_ok"] = len(resumed) == len(whole) - start > 0 and all(
            torch.equal(a, b) for a, b in zip(resumed, whole[start:]))
        rep["record"] = streams[0].split
        out[partition] = rep
    return out


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("data")
    write_cifar(root / "cifar10", "cifar10", N_TRAIN, N_TEST)
    return str(root)


def _prepared(pipeline: str, root: str) -> None:
    from data.prepare import prepare

    marker = Path(root) / f".prepared_{pipeline}"
    if not marker.exists():
        prepare([compose(["data=cifar10", f"data.pipeline={pipeline}", f"paths.data_root={root}"]).data],
                workers=1, timeout=CHILD_TIMEOUT)
        marker.touch()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("pipeline", ["torchvision", "device", "ffcv", "dali"])
def test_validation_train_and_test_are_disjoint_and_resume_is_exact(pipeline: str, data_root: str) -> None:
    if not installed(pipeline):
        pytest.skip(f"data.pipeline={pipeline}: its package is not installed")
    if pipeline in ("ffcv", "dali"):
        _prepared(pipeline, data_root)
    report = run_ranks(pipeline_report, 1, pipeline, data_root, timeout=CHILD_TIMEOUT)[0]
    tests = set(range(N_TRAIN, N_TRAIN + N_TEST))
    vals = None
    for partition, rep in report.items():
        val = [i for ids in rep["val"] for i in ids]
        assert len(val) == len(set(val)) == 24, f"{pipeline} {partition}: validation not read whole and once"
        assert vals is None or sorted(val) == vals, "the partition moved the validation set"
        vals = sorted(val)
        assert sorted(rep["test"]) == sorted(tests)
        for epoch in (0, 1):
            shards = [set(rep["train"][r][epoch]) for r in range(SHARDS)]
            assert not shards[0] & shards[1], f"{pipeline} {partition} epoch {epoch}: shards overlap"
            for shard in shards:
                assert not shard & set(val), f"{pipeline} {partition}: a rank trains on validation samples"
                assert not shard & tests and shard <= set(range(N_TRAIN))
        assert not set(val) & tests
        assert rep["labels_ok"], f"{pipeline} {partition}: a label does not match its image"
        assert rep["resume_ok"], f"{pipeline} {partition}: a resumed epoch reads other batches"
        assert rep["record"]["val_samples"] == 24 and rep["record"]["partition"] == partition
    iid = report["iid"]
    for r in range(SHARDS):
        assert sorted(iid["train"][r][0]) != sorted(iid["train"][r][1]), "iid shards did not reshuffle"
    for r in range(SHARDS):  # classes_per_worker=2 (default): each rank's data holds exactly 2 labels
        assert len({cifar_label(i, 10) for i in report["classes"]["train"][r][0]}) == 2
