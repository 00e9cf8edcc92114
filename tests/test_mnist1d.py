"""MNIST-1D: the generator equals the `mnist1d` package's `make_dataset` to the last bit (and leaves
numpy's global generator alone), the data set's sizes, shapes and labels, the validation split and
the skewed partitions on it, both pipelines, the paper's four models at their published sizes, and
a one-rank run that learns."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from core.errors import UserError
from core.spec import SignalSpec
from data import DataRequest, build_streams, data_spec, num_train_samples, split_identity
from data.mnist1d_generator import Procedure, interp_rows, make
from data.split import train_split
from models import build_model, check_buildable
from tests.support.harness import compose, run_ranks


def paper_package(num_samples: int, seed: int) -> dict:
    mnist1d = pytest.importorskip("mnist1d.data")
    args = mnist1d.get_dataset_args()
    args.num_samples, args.seed = num_samples, seed
    return mnist1d.make_dataset(args)


@pytest.mark.parametrize("num_samples,seed", [(5000, 42), (1230, 7)])
def test_generator_equals_the_package_bit_for_bit(num_samples: int, seed: int) -> None:
    ref = paper_package(num_samples, seed)
    x, y = make(Procedure(num_samples=num_samples, seed=seed))
    split = int(len(y) * 0.8)  # the package's own split (train_split 0.8)
    assert x.dtype == ref["x"].dtype == np.float64
    assert np.array_equal(x[:split], ref["x"]) and np.array_equal(x[split:], ref["x_test"])
    assert np.array_equal(y[:split], ref["y"]) and np.array_equal(y[split:], ref["y_test"])


def test_interpolation_is_numpys_on_every_row() -> None:
    rng = np.random.default_rng(0)
    for length, n_out in ((48, 72), (72, 40), (5, 9), (9, 9)):
        y = rng.normal(size=(6, length))
        y[:, 3] = 0.0
        want = np.stack([np.interp(np.linspace(0, 1, n_out), np.linspace(0, 1, length), row) for row in y])
        assert np.array_equal(interp_rows(y, n_out), want)


def test_generator_leaves_numpys_global_generator_alone() -> None:
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    make(Procedure(num_samples=100, seed=42))
    assert np.array_equal(np.random.get_state()[1], before)


def mnist1d_cfg(*overrides: str):
    return compose(["data=mnist1d", "model=mnist1d_cnn", *overrides]).data


def test_the_papers_set_and_a_larger_one() -> None:
    cfg = mnist1d_cfg()
    assert (cfg.num_samples, cfg.generator_seed, cfg.test_fraction) == (5000, 42, 0.2)
    assert data_spec(cfg) == SignalSpec(1, 40, 10)
    from data.sets.mnist1d import MNIST1D

    train, test = MNIST1D.samples(cfg, "train"), MNIST1D.samples(cfg, "val")
    assert (tuple(train.x.shape), tuple(test.x.shape)) == ((4000, 1, 40), (1000, 1, 40))
    assert train.x.dtype == torch.float32 and train.y.dtype == torch.int64
    both = torch.cat([train.y, test.y])
    assert torch.equal(torch.bincount(both), torch.full((10,), 500))  # 500 of each digit
    whole = torch.cat([train.x, test.x])
    assert abs(whole.double().mean().item()) < 1e-6 and abs(whole.double().std().item() - 1) < 1e-3  # standardised
    assert num_train_samples(cfg) == 4000 - 400  # less the default 10 % validation
    big = mnist1d_cfg("data.num_samples=70000", "data.test_fraction=0.142857142857")
    assert num_train_samples(big) == 60000 - 6000 and MNIST1D.samples(big, "val").y.shape == (10000,)
    assert split_identity(big)["set"] == {"num_samples": 70000, "generator_seed": 42, "test_fraction": 0.142857142857}


@pytest.mark.parametrize("override,fragment", [
    ("data.num_samples=5005", "data.num_samples=5005"),
    ("data.pipeline=ffcv", "data.pipeline=ffcv cannot read data.name=mnist1d"),
    ("data.image_size=8", "data.image_size"),
])
def test_mistakes_are_one_line(override: str, fragment: str) -> None:
    with pytest.raises(UserError) as err:
        mnist1d_cfg(override)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_a_model_for_other_inputs_is_refused_before_launch(tmp_path: Path) -> None:
    from core.rundir import RunDir
    from engine.plan import preflight
    from tests.support.harness import CONF
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        raw = hydra_compose(config_name="config", overrides=["data=mnist1d", "model=small_cnn", "dist.device=cpu"])
    with pytest.raises(UserError) as err:
        preflight(raw, RunDir(tmp_path))
    message = str(err.value)
    assert "model=small_cnn needs the image_size of its input" in message and "mnist1d_cnn" in message
    assert "\n" not in message


def test_set_options_are_refused_elsewhere() -> None:
    with pytest.raises(UserError, match="data.num_samples=100 is not an option of data.name=digits"):
        compose(["data.num_samples=100"])


def test_validation_and_skewed_partitions_on_its_labels() -> None:
    from data.sets.mnist1d import MNIST1D

    labels = MNIST1D.samples(mnist1d_cfg(), "train").label_array()
    split = train_split(labels, mnist1d_cfg(), seed=0, num_shards=4, batch_size=32)
    assert split.record["val_samples"] == 400 and split.record["train_samples"] == 3600
    assert np.all(np.abs(np.bincount(labels[split.val], minlength=10) - 40) <= 1)  # stratified
    skewed = train_split(labels, mnist1d_cfg("data.partition=dirichlet", "data.dirichlet_alpha=0.1"), 0, 4, 32)
    pools = skewed.plan.pools
    assert sum(len(p) for p in pools) == 3600 and not set(np.concatenate(pools)) & set(split.val)
    assert skewed.record["label_skew_tv"] > 0.3
    classes = train_split(labels, mnist1d_cfg("data.partition=classes", "data.classes_per_worker=2"), 0, 4, 32)
    assert all(len(np.unique(labels[p])) == 2 for p in classes.plan.pools)


def test_both_pipelines_read_the_same_batches() -> None:
    request = DataRequest(batch_size=50, eval_batch_size=300, seed=3, shard=1, num_shards=2, eval_shard=0,
                          eval_num_shards=2)
    got = {}
    for pipeline in ("torchvision", "device"):
        streams = build_streams(mnist1d_cfg(f"data.pipeline={pipeline}"), request)
        got[pipeline] = ([b for b in streams.train.batches(1, start=2)], list(streams.test.batches()),
                         list(streams.val.batches()), streams.split)
    for a, b in zip(got["torchvision"][:3], got["device"][:3]):
        assert len(a) == len(b) > 0
        for (xa, ya), (xb, yb) in zip(a, b):
            assert xa.shape[1:] == (1, 40) and torch.equal(xa, xb) and torch.equal(ya, yb)
    assert got["device"][3]["generated"]["num_samples"] == 5000
    assert sum(len(y) for _, y in got["device"][1]) == 500  # half of the 1,000 test samples


def test_the_papers_models_at_their_sizes() -> None:
    spec = SignalSpec(1, 40, 10)
    sizes = {"mnist1d_linear": 410, "mnist1d_mlp": 15210, "mnist1d_cnn": 5210, "mnist1d_gru": 5134}
    for name, size in sizes.items():
        model = build_model({"name": name}, spec)
        assert sum(p.numel() for p in model.parameters()) == size, name
        assert model(torch.randn(3, 1, 40)).shape == (3, 10)
        check_buildable({"name": name}, spec)
    wide = build_model({"name": "mnist1d_cnn", "channels": 8}, SignalSpec(2, 64, 4))
    assert wide(torch.randn(2, 2, 64)).shape == (2, 4)


def one_rank(rank: int, world: int, run_dir: str) -> dict:
    from tests.support.harness import train_in_rank

    return train_in_rank(rank, world, ["recipe=mnist1d/cnn", "train.max_steps=150", "train.eval_every_steps=150",
                                       "data.pipeline=device"], run_dir)


@pytest.mark.timeout(300)
def test_one_rank_learns(tmp_path: Path) -> None:
    summary = run_ranks(one_rank, 1, str(tmp_path / "run"), timeout=240)[0]
    assert summary["data"] == "mnist1d" and summary["steps"] == 150
    assert math.isfinite(summary["test_loss"]) and summary["test_acc"] > 0.4, summary  # chance: 0.1
    assert summary["data_split"]["generated"]["num_samples"] == 5000
