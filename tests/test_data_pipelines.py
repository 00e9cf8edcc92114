"""The three data pipelines (torchvision, FFCV, DALI) on generated data sets whose images say
which sample they are (tests/support/datagen.py).

Per pipeline, on a CIFAR-format set and a JPEG ImageFolder: each epoch the training ranks'
shards are disjoint and cover the set; labels match the images; the order is the same for the
same seed and changes across epochs; a stream resumed mid-epoch yields exactly the batches the
uninterrupted one read; the evaluation shards cover the test set once; CIFAR's augmentation is
a padded crop (+ flip) of the sample. On digits (stored normalised) and on un-augmented CIFAR,
every pipeline yields the torchvision pipeline's batches.

Then the real trainer with each of FFCV and DALI: digits trains to the torchvision run's model
bit for bit, a CIFAR run with augmentation stopped mid-epoch and resumed equals the
uninterrupted run bit for bit (the registry's resume scenario), and the ImageFolder set trains.

FFCV and DALI run in child processes (`tests.support.harness.run_ranks`) under timeouts: their loader
threads must not live in the pytest process, where a later fork (FFCV's writer, DataLoader
workers) could hang next to them.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from data import DATASETS
from data.pipelines import installed
from tests.support.datagen import (cifar_label, imagefolder_label, read_identity, sample_image, write_cifar,
                           write_imagefolder)
from tests.support.harness import REPO, compose, run_ranks

PIPELINES = ("torchvision", "ffcv", "dali")
OPTIONAL_PIPELINES = ("ffcv", "dali")  # what setup_env.sh installs beside torchvision


def needs(pipeline: str) -> pytest.MarkDecorator:
    """Skip where the pipeline's package is missing: a machine setup_env.sh cannot fully equip (the
    GPU machine has no registry to build FFCV from). The repository's .venv is held to having
    both by test_setup_installs_every_pipeline."""
    return pytest.mark.skipif(not installed(pipeline), reason=f"data.pipeline={pipeline}: its package is not "
                              "installed in this interpreter")


ALL = [pytest.param(p, marks=needs(p)) for p in PIPELINES]
OPTIONAL = [pytest.param(p, marks=needs(p)) for p in OPTIONAL_PIPELINES]
SHARDS, BATCH = 2, 8
CIFAR_TRAIN, CIFAR_TEST = 96, 24  # 6 batches per shard: the shards cover the set exactly
FOLDER_CLASSES, FOLDER_TRAIN, FOLDER_VAL = 3, 48, 12  # 3 batches per shard
CHILD_TIMEOUT = 240
# one xdist worker runs this module (conftest.py's XDIST_GROUPS): its data sets (`data_root`) and
# each pipeline's report (`_report`) are built once per worker


def data_overrides(name: str, pipeline: str, root: str) -> list[str]:
    extra = {"imagenet": ["data.image_size=32", f"data.num_classes={FOLDER_CLASSES}", "data.eval_resize=36"]}
    workers = 0 if pipeline == "torchvision" else 1  # torchvision's workers: slow to start in a test rank
    # validation off: these tests read the whole training file as training shards
    return [f"data={name}", f"data.pipeline={pipeline}", f"paths.data_root={root}", f"data.num_workers={workers}",
            "data.val_fraction=0", *extra.get(name, [])]


def data_config(name: str, pipeline: str, root: str, *more: str) -> Any:
    return compose(data_overrides(name, pipeline, root) + list(more), "/tmp/unused").data


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    from data.prepare import prepare

    root = tmp_path_factory.mktemp("data")
    write_cifar(root / "cifar10", "cifar10", CIFAR_TRAIN, CIFAR_TEST)
    write_imagefolder(root / "imagenet", FOLDER_CLASSES, FOLDER_TRAIN, FOLDER_VAL, sizes=(40, 72))
    cfgs = [data_config(name, "ffcv", str(root)) for name in ("digits", "cifar10", "imagenet") if installed("ffcv")]
    cfgs += [data_config(name, "dali", str(root)) for name in ("digits", "cifar10") if installed("dali")]
    prepare(cfgs, workers=1, timeout=CHILD_TIMEOUT)
    if not installed("dali"):
        return str(root)
    # the documented command, as a user runs it: it refuses to overwrite (one line, exit code 2)
    cmd = [sys.executable, "-m", "data.prepare", "data.pipeline=dali", f"paths.data_root={root}"]
    again = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=CHILD_TIMEOUT)
    assert again.returncode == 2, again.stderr
    assert again.stderr.strip().endswith("exists; pass force=true to overwrite it"), again.stderr
    return str(root)


# ---- stream-level checks, computed in a child process per pipeline ---------------------------
def _collect(batches: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    xs, ys = [], []
    for x, y in batches:
        xs.append(x.clone())
        ys.append(y.clone())
    return xs, ys


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(p, q) for p, q in zip(a, b))


def _is_padded_crop(x: torch.Tensor, identity: int, mean: Any, std: Any) -> bool:
    """Is this normalised 3x32x32 image a 32x32 window of the zero-padded (4 px) sample,
    possibly mirrored, as torchvision's RandomCrop(32, padding=4) + flip make?"""
    m, s = np.array(mean)[:, None, None], np.array(std)[:, None, None]
    pixels = np.round((x.double().numpy() * s + m) * 255).astype(np.int64).transpose(1, 2, 0)
    padded = np.pad(sample_image(identity, 32, 32).astype(np.int64), ((4, 4), (4, 4), (0, 0)))
    windows = [padded[t:t + 32, c:c + 32] for t in range(9) for c in range(9)]
    return any(np.array_equal(pixels, w) or np.array_equal(pixels, w[:, ::-1]) for w in windows)


def _image_set_report(pipeline: str, root: str, name: str) -> dict[str, Any]:
    from data import DataRequest, build_data

    cfg = data_config(name, pipeline, root)
    mean, std = DATASETS.get(name).mean, DATASETS.get(name).std
    label_of = (lambda i: cifar_label(i, 10)) if name == "cifar10" else (lambda i: imagefolder_label(i, FOLDER_CLASSES))
    streams = [build_data(cfg, DataRequest(BATCH, 10, seed=5, shard=r, num_shards=SHARDS, eval_shard=r,
                                           eval_num_shards=SHARDS)) for r in range(SHARDS)]
    out: dict[str, Any] = {"ids": [], "labels_ok": True}
    read: dict[int, list[torch.Tensor]] = {}
    by_id: list[dict[int, torch.Tensor]] = []
    for epoch in (0, 1):
        ids_per_shard, seen = [], {}
        for r, (train, _) in enumerate(streams):
            xs, ys = _collect(train.batches(epoch))
            ids = [i for x in xs for i in read_identity(x, mean, std)]
            out["labels_ok"] &= [label_of(i) for i in ids] == torch.cat(ys).tolist()
            ids_per_shard.append(ids)
            seen.update(zip(ids, (img for x in xs for img in x)))
            if r == 0:
                read[epoch] = xs
        out["ids"].append(ids_per_shard)
        by_id.append(seen)
    first = streams[0][0]
    out["again_equal"] = _same(_collect(first.batches(1))[0], read[1])
    start = first.steps_per_epoch // 2
    resumed = _collect(first.batches(1, start))[0]
    out["resume_equal"] = _same(resumed, read[1][start:])
    out["resume_len"] = (len(resumed), len(read[1]) - start)
    common = set(by_id[0]) & set(by_id[1])
    out["varied"] = sum(not torch.equal(by_id[0][i], by_id[1][i]) for i in common) / max(len(common), 1)
    if name == "cifar10":
        out["crops_ok"] = all(_is_padded_crop(img, i, mean, std) for i, img in by_id[0].items())
        plain = data_config(name, pipeline, root, "data.augment=false")
        train, _ = build_data(plain, DataRequest(BATCH, 10, seed=5, shard=0, num_shards=SHARDS, eval_shard=0,
                                                 eval_num_shards=1))
        out["plain"] = _collect(train.batches(0))[0]
        out.update(_eval_report(streams, mean, std, label_of))
    return out


def _eval_report(streams: list, mean: Any, std: Any, label_of: Any) -> dict[str, Any]:
    """(CIFAR only: the ImageFolder's evaluation path runs in the trainer test.)"""
    out: dict[str, Any] = {"eval_ids": [], "eval_labels_ok": True}
    for _, evals in streams:
        xs, ys = _collect(evals.batches())
        ids = [i for x in xs for i in read_identity(x, mean, std)]
        out["eval_labels_ok"] &= [label_of(i) for i in ids] == (torch.cat(ys).tolist() if ys else [])
        out["eval_ids"].append(ids)
    return out


def _digits_report(pipeline: str, root: str) -> dict[str, Any]:
    from data import DataRequest, build_data

    train, evals = build_data(data_config("digits", pipeline, root),
                              DataRequest(32, 100, seed=5, shard=1, num_shards=SHARDS, eval_shard=0, eval_num_shards=1))
    return {"epoch1": _collect(train.batches(1)), "resumed": _collect(train.batches(1, 3)),
            "eval": _collect(evals.batches())}


def _epoch_boundary_report(pipeline: str, root: str) -> dict[str, Any]:
    """Pipelines (DALI) or compilations (FFCV) that three epochs of digits cost once the stream is
    built, and whether DALI's batches are those of its per-epoch pipelines (its earlier way)."""
    from data import DataRequest, build_data

    train, _ = build_data(data_config("digits", pipeline, root),
                          DataRequest(32, 100, seed=5, shard=1, num_shards=SHARDS, eval_shard=0, eval_num_shards=1))
    if pipeline == "dali":
        from data.pipelines.dali import DALITrainStream

        per_epoch = DALITrainStream(train.builder, train.files.tolist(), train.labels.tolist(), 32, 5, 1, SHARDS)
        read = [_collect(train.batches(e)) for e in range(3)] + [_collect(train.batches(1, 3))]
        ref = [_collect(per_epoch.batches(e)) for e in range(3)] + [_collect(per_epoch.batches(1, 3))]
        same = all(_same(a[0], b[0]) and _same(a[1], b[1]) for a, b in zip(read, ref))
        return {"builds": train.builds, "same": same}
    from ffcv.loader import Loader

    compiled = []
    original = Loader.generate_code
    Loader.generate_code = lambda self: (compiled.append(1), original(self))[1]
    try:
        for epoch in range(3):
            _collect(train.batches(epoch))
    finally:
        Loader.generate_code = original
    return {"builds": len(compiled), "same": True}


CROP_SHAPES = ((300, 400), (10, 400))  # (height, width): a photograph, and one too thin for any try


def _ffcv_crop_windows(n: int = 4000) -> dict[tuple[int, int], np.ndarray]:
    """FFCV's seeded RandomResizedCrop windows (top, left, h, w) for n sample keys."""
    from data.ffcv_augment import mix64, torchvision_rrc_window

    scale, log_ratio = np.array([0.08, 1.0]), np.log(np.array([3 / 4, 4 / 3]))
    return {(h, w): np.array([torchvision_rrc_window(np.uint64(mix64(np.uint64(k))), h, w, scale, log_ratio)
                              for k in range(n)]) for h, w in CROP_SHAPES}


def pipeline_report(rank: int, world: int, pipeline: str, root: str) -> dict[str, Any]:
    out = {"cifar10": _image_set_report(pipeline, root, "cifar10"),
           "imagenet": _image_set_report(pipeline, root, "imagenet"),
           "digits": _digits_report(pipeline, root)}
    if pipeline == "ffcv":
        out["crop_windows"] = _ffcv_crop_windows()
    if pipeline in ("ffcv", "dali"):
        out["epochs"] = _epoch_boundary_report(pipeline, root)
    return out


@lru_cache(maxsize=None)
def _report(pipeline: str, root: str) -> dict[str, Any]:
    return run_ranks(pipeline_report, 1, pipeline, root, timeout=CHILD_TIMEOUT)[0]


@pytest.fixture(params=ALL)
def report(request: pytest.FixtureRequest, data_root: str) -> tuple[str, dict[str, Any]]:
    return request.param, _report(request.param, data_root)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name,n_train", [("cifar10", CIFAR_TRAIN), ("imagenet", FOLDER_TRAIN)])
def test_shards_are_disjoint_cover_the_set_and_reshuffle(report: tuple[str, dict], name: str, n_train: int) -> None:
    pipeline, rep = report[0], report[1][name]
    for epoch, shards in enumerate(rep["ids"]):
        flat = [i for ids in shards for i in ids]
        assert sorted(flat) == list(range(n_train)), f"{pipeline} {name} epoch {epoch}: shards overlap or miss samples"
        assert all(len(ids) == len(shards[0]) for ids in shards)
    assert all(a != b for a, b in zip(rep["ids"][0], rep["ids"][1])), "the order did not change across epochs"
    assert rep["labels_ok"], f"{pipeline} {name}: a label does not match its image"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", ["cifar10", "imagenet"])
def test_order_is_deterministic_and_resume_is_exact(report: tuple[str, dict], name: str) -> None:
    pipeline, rep = report[0], report[1][name]
    assert rep["again_equal"], f"{pipeline} {name}: the same epoch read twice differs"
    assert rep["resume_len"][0] == rep["resume_len"][1] > 0
    assert rep["resume_equal"], f"{pipeline} {name}: batches(epoch, start) differ from the uninterrupted epoch"
    # augmentation draws anew each epoch (else the exactness above would be cheap)
    assert rep["varied"] > 0.5, f"{pipeline} {name}: only {rep['varied']:.0%} of samples changed across epochs"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("pipeline", OPTIONAL)
def test_one_pipeline_across_epochs(pipeline: str, data_root: str) -> None:
    """No rebuild (DALI) or recompilation (FFCV) at epoch boundaries or a resume; DALI's batches
    on digits unchanged from its per-epoch pipelines."""
    rep = _report(pipeline, data_root)["epochs"]
    assert rep["builds"] == (1 if pipeline == "dali" else 0), rep
    assert rep["same"], f"{pipeline}: batches differ from the per-epoch pipelines'"


@pytest.mark.timeout(600)
def test_cifar_augmentation_is_a_padded_crop_and_flip(report: tuple[str, dict]) -> None:
    assert report[1]["cifar10"]["crops_ok"], f"{report[0]}: an image is not a padded crop of its sample"


@pytest.mark.timeout(600)
@needs("ffcv")
def test_ffcv_random_resized_crop_follows_torchvision(data_root: str) -> None:
    """The seeded crop draws windows as torchvision's RandomResizedCrop.get_params does: inside
    the image, with the same area and aspect statistics, and the same centre-crop fallback."""
    from torchvision.transforms import RandomResizedCrop

    windows = _report("ffcv", data_root)["crop_windows"]
    torch.manual_seed(0)
    for (h, w), got in windows.items():
        want = np.array([RandomResizedCrop.get_params(torch.empty(1, h, w), (0.08, 1.0), (3 / 4, 4 / 3))
                         for _ in range(len(got))])
        top, left, ch, cw = got.T
        assert (top >= 0).all() and (left >= 0).all() and (top + ch <= h).all() and (left + cw <= w).all()
        for stat in (lambda a: a[:, 2] * a[:, 3] / (h * w), lambda a: np.log(a[:, 3] / a[:, 2])):
            assert abs(stat(got).mean() - stat(want).mean()) < 0.03, (h, w)
        if h == 10:  # no try fits: torchvision's centre-crop fallback, every time
            assert (want == want[0]).all() and (got == want[0]).all(), (got[:3], want[0])


@pytest.mark.timeout(600)
def test_eval_shards_cover_the_test_set_once(report: tuple[str, dict]) -> None:
    rep = report[1]["cifar10"]
    flat = [i for ids in rep["eval_ids"] for i in ids]
    assert sorted(flat) == list(range(CIFAR_TRAIN, CIFAR_TRAIN + CIFAR_TEST)), f"{report[0]}: {rep['eval_ids']}"
    assert rep["eval_labels_ok"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("pipeline", OPTIONAL)
def test_same_samples_as_torchvision(pipeline: str, data_root: str) -> None:
    """digits: the same tensors bit for bit; un-augmented CIFAR: the same images in the same
    order (FFCV normalises as torchvision does; DALI to float rounding)."""
    mine, ref = _report(pipeline, data_root), _report("torchvision", data_root)
    for part in ("epoch1", "resumed", "eval"):
        for got, want in zip(mine["digits"][part], ref["digits"][part]):
            assert _same(got, want), f"{pipeline} digits {part} differs from torchvision"
    got, want = mine["cifar10"]["plain"], ref["cifar10"]["plain"]
    assert len(got) == len(want)
    for a, b in zip(got, want):
        if pipeline == "ffcv":
            assert torch.equal(a, b)
        else:
            assert torch.allclose(a, b, atol=1e-5, rtol=0)


# ---- the torchvision loaders and torch's global RNG -------------------------------------------
@pytest.mark.parametrize("workers", [0, 1])
def test_torchvision_loaders_leave_the_global_rng_alone(tmp_path: Path, workers: int) -> None:
    """Starting a DataLoader iterator draws its workers' base seed; from the loader's own
    generator (seeded by seed and epoch), not torch's global RNG, which belongs to training and
    which a resumed run, starting mid-epoch, must find as the uninterrupted run left it. The
    batches depend on (seed, epoch) alone."""
    from data import DataRequest, build_data

    write_cifar(tmp_path / "cifar10", "cifar10", 32, 8)
    cfg = data_config("cifar10", "torchvision", str(tmp_path), f"data.num_workers={workers}")
    train, evals = build_data(cfg, DataRequest(4, 4, seed=3, shard=0, num_shards=2, eval_shard=0, eval_num_shards=1))
    reads = []
    for global_seed in (11, 12):
        torch.manual_seed(global_seed)
        before = torch.get_rng_state()
        read = [x for epoch in (0, 1) for x, _ in train.batches(epoch)] + [x for x, _ in train.batches(1, 2)]
        read += [x for x, _ in evals.batches()]
        assert torch.equal(torch.get_rng_state(), before), "iterating the loaders drew from torch's global RNG"
        reads.append(read)
    assert _same(reads[0], reads[1]), "batches depend on the global RNG"


# ---- the trainer with each pipeline ----------------------------------------------------------
def train_and_resume(rank: int, world: int, pipeline: str, root: str, tmp: str) -> dict[str, Any]:
    from tests.support.harness import train_in_rank
    from tests.test_resume_registry import algo_overrides, diff, resume_scenario

    final = f"checkpoints/step_{8:08d}/rank_{rank}.pt"
    digits = ["train.max_steps=8", "model.width=8", "train.eval_every_steps=4", "resume=null"]
    for p in ("torchvision", pipeline):
        train_in_rank(rank, world, data_overrides("digits", p, root) + digits, f"{tmp}/digits_{p}")
    same_as_torchvision = diff(torch.load(Path(tmp, "digits_torchvision", final), weights_only=True),
                               torch.load(Path(tmp, f"digits_{pipeline}", final), weights_only=True))
    cifar = data_overrides("cifar10", pipeline, root) + ["train.batch_size=4", "data.eval_batch_size=12"]
    resumed_differs = resume_scenario(rank, world, algo_overrides("allreduce") + cifar, f"{tmp}/cifar")
    folder = data_overrides("imagenet", pipeline, root) + ["train.batch_size=4", "train.max_steps=6",
                                                           "model.width=8", "resume=null"]
    summary = train_in_rank(rank, world, folder, f"{tmp}/imagefolder")
    return {"digits_diff": same_as_torchvision, "resume_diff": resumed_differs, "folder": summary}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("pipeline", OPTIONAL)
def test_trainer_runs_and_resumes_bit_exactly(pipeline: str, data_root: str, tmp_path: Path) -> None:
    results = run_ranks(train_and_resume, 2, pipeline, data_root, str(tmp_path), timeout=720)
    for rank, res in enumerate(results):
        assert not res["digits_diff"], f"{pipeline} rank {rank}: digits run differs from torchvision's at {res['digits_diff'][:5]}"
        assert not res["resume_diff"], f"{pipeline} rank {rank}: resumed CIFAR run differs at {res['resume_diff'][:5]}"
    summary = results[0]["folder"]
    assert summary["steps"] == 6 and summary["pipeline"] == pipeline and math.isfinite(summary["test_loss"])


# ---- what a user sees when something is missing ----------------------------------------------
def test_missing_prepared_files_name_the_command(tmp_path: Path) -> None:
    from data import check_data_on_disk
    from core.errors import UserError

    write_cifar(tmp_path / "cifar10", "cifar10", 8, 4)
    for pipeline, missing in (("ffcv", "ffcv/train.beton"), ("dali", "dali/train")):
        if not installed(pipeline):  # (its missing package is what is named first)
            continue
        with pytest.raises(UserError) as err:
            check_data_on_disk(data_config("cifar10", pipeline, str(tmp_path)))
        msg = str(err.value)
        assert "\n" not in msg and missing in msg
        assert f"python -m data.prepare data=cifar10 data.pipeline={pipeline}" in msg
    check_data_on_disk(data_config("cifar10", "torchvision", str(tmp_path)))  # reads the set itself


@needs("dali")
def test_prepared_digits_of_another_split_are_refused(data_root: str) -> None:
    from data import check_data_on_disk
    from core.errors import UserError

    check_data_on_disk(data_config("digits", "dali", data_root))
    with pytest.raises(UserError, match="force=true"):
        check_data_on_disk(data_config("digits", "dali", data_root, "data.test_fraction=0.3"))


def test_setup_installs_every_pipeline() -> None:
    """scripts/setup_env.sh installs FFCV and DALI into the repository's .venv: where it could not,
    CI fails here rather than skipping their tests."""
    if Path(sys.prefix).resolve() != (REPO / ".venv").resolve():
        pytest.skip(f"not the repository's .venv ({sys.prefix})")
    assert all(installed(p) for p in OPTIONAL_PIPELINES), {p: installed(p) for p in OPTIONAL_PIPELINES}


@pytest.mark.parametrize("pipeline,package", [("ffcv", "ffcv"), ("dali", "nvidia")])
def test_missing_package_is_one_line(monkeypatch: pytest.MonkeyPatch, pipeline: str, package: str) -> None:
    import importlib.util

    from core.errors import UserError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == package else real(n, *a))
    with pytest.raises(UserError, match=f"data.pipeline={pipeline} needs .* scripts/setup_env.sh"):
        data_config("digits", pipeline, os.fspath(REPO))
