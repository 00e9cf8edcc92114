"""Adding a data set is one file and (at most) one config, as docs/architecture.md promises.

The test writes a new data set, `stripes` (horizontal or vertical stripes, 12x12 RGB, stored as
one .npz), as a single module outside the repository, and a recipe that picks it; nothing of the
project is edited. In a fresh process (so the pytest process's registry stays as shipped) it
imports the module, which registers itself, and checks what a user would see: `data=stripes`
composes with the object's defaults and the recipe's values, the model is sized from its facts,
a pipeline it does not declare is refused in one line, a missing file is one line naming it, and
the torchvision pipeline reads its samples in order, sharded; then two ranks train on it.
"""
from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.support.harness import run_ranks

SIDE, N_TRAIN, N_VAL = 12, 256, 64

STRIPES_MODULE = '''"""stripes: 12x12 RGB images of horizontal (class 0) or vertical (class 1) stripes.

Lies in <data.root>/stripes.npz (train_images, train_labels, val_images, val_labels).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from core.errors import UserError
from data.config import DataConfig, Pipeline
from data.samples.arrays import ArraySamples
from data.sets import register_dataset
from data.sets.base import DataSet, Transform


class Stripes(DataSet):
    name = "stripes"
    in_channels, image_size, num_classes = 3, 12, 2
    form = ArraySamples
    mean, std = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
    pipelines = (Pipeline.torchvision,)
    config = {"root": "${paths.data_root}/stripes", "eval_batch_size": 16}

    def file(self, cfg: DataConfig) -> Path:
        return Path(cfg.root) / "stripes.npz"

    def check_on_disk(self, cfg: DataConfig) -> None:
        if not self.file(cfg).is_file():
            raise UserError(f"data.root={cfg.root}: no stripes data at {self.file(cfg)}; "
                            "write it with tests/test_add_dataset.py's write_stripes")

    def samples(self, cfg: DataConfig, split: str) -> ArraySamples:
        self.check_on_disk(cfg)
        with np.load(self.file(cfg)) as arrays:
            return ArraySamples(arrays[f"{split}_images"], arrays[f"{split}_labels"])

    def torchvision_transforms(self, cfg: DataConfig) -> tuple[Transform, Transform]:
        from torchvision import transforms as T

        plain = T.Compose([T.ToTensor(), T.Normalize(self.mean, self.std)])
        if not cfg.augment:
            return plain, plain
        return T.Compose([T.ToPILImage(), T.RandomVerticalFlip(), plain]), plain


register_dataset(Stripes())
'''

STRIPES_RECIPE = """# @package _global_
# the stripes set with the small CNN, briefly
defaults:
  - override /data: stripes
  - override /model: small_cnn
data:
  augment: false
model:
  width: 8
train:
  batch_size: 16
  epochs: 4
"""


def write_stripes(root: Path, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    arrays = {}
    for split, n in (("train", N_TRAIN), ("val", N_VAL)):
        labels = rng.integers(0, 2, n)
        period = rng.integers(2, 5, n)
        line = (np.arange(SIDE)[None, :] // period[:, None]) % 2 * 160 + 40  # n x SIDE
        images = np.where(labels[:, None, None] == 0, line[:, :, None], line[:, None, :])  # n x SIDE x SIDE
        noise = rng.integers(0, 30, (n, SIDE, SIDE, 3))
        arrays[f"{split}_images"] = (images[..., None] + noise).astype(np.uint8)
        arrays[f"{split}_labels"] = labels.astype(np.int64)
    root.mkdir(parents=True, exist_ok=True)
    np.savez(root / "stripes.npz", **arrays)


def import_file(path: Path) -> Any:
    """Import a module from a file outside the repository, once per process."""
    name = f"_added_{path.stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[name] = module
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    return sys.modules[name]


def one_line_error(fn: Any, *args: Any) -> str:
    from core.errors import UserError

    try:
        fn(*args)
    except UserError as err:
        assert "\n" not in str(err)
        return str(err)
    raise AssertionError("no UserError")


def add_and_use(rank: int, world: int, folder: str) -> dict[str, Any]:
    """In a launched-like rank: register the file's data set, then what a user would do."""
    import data
    from data import DataRequest, build_data, check_data_on_disk, data_spec
    from tests.support.harness import compose, train_in_rank

    import_file(Path(folder) / "stripes.py")
    data.register_configs()  # the runner's one call happened before the new file was imported
    # validation off: the shards checked below are the whole training file's
    overrides = [f"hydra.searchpath=[file://{folder}/conf]", "recipe=stripes", f"paths.data_root={folder}/data",
                 "data.val_fraction=0"]
    cfg = compose(overrides).data
    out: dict[str, Any] = {"names": data.DATASETS.names(), "cfg": (cfg.name, cfg.root, cfg.eval_batch_size, cfg.augment),
                           "spec": data_spec(cfg)}
    out["ffcv_refused"] = one_line_error(compose, overrides + ["data.pipeline=ffcv"])
    out["missing"] = one_line_error(check_data_on_disk, compose(overrides + [f"data.root={folder}/nowhere"]).data)
    check_data_on_disk(cfg)
    train, evals = build_data(cfg, DataRequest(16, 16, seed=1, shard=rank, num_shards=world, eval_shard=rank,
                                               eval_num_shards=world))
    out["train"] = [(x.clone(), y.clone()) for x, y in train.batches(0)]
    out["eval"] = [(x.clone(), y.clone()) for x, y in evals.batches()]
    out["steps_per_epoch"] = train.steps_per_epoch
    out["summary"] = train_in_rank(rank, world, overrides, f"{folder}/run")
    return out


@pytest.mark.timeout(600)
def test_a_data_set_added_as_one_file_and_one_config(tmp_path: Path) -> None:
    from data.sampler import eval_slice, shard_indices

    (tmp_path / "conf" / "recipe").mkdir(parents=True)
    (tmp_path / "stripes.py").write_text(STRIPES_MODULE)
    (tmp_path / "conf" / "recipe" / "stripes.yaml").write_text(STRIPES_RECIPE)
    write_stripes(tmp_path / "data" / "stripes")
    results = run_ranks(add_and_use, 2, str(tmp_path), timeout=480)

    first = results[0]
    assert {"stripes", "digits", "cifar10", "imagenet"} <= set(first["names"])
    assert first["cfg"] == ("stripes", f"{tmp_path}/data/stripes", 16, False)  # object, paths, recipe
    assert (first["spec"].in_channels, first["spec"].image_size, first["spec"].num_classes) == (3, 12, 2)
    assert "data.pipeline=ffcv cannot read data.name=stripes" in first["ffcv_refused"]
    assert f"{tmp_path}/nowhere/stripes.npz" in first["missing"]

    with np.load(tmp_path / "data" / "stripes" / "stripes.npz") as arrays:
        images, labels = arrays["train_images"], arrays["train_labels"]
        val_labels = arrays["val_labels"]
    for rank, res in enumerate(results):
        assert res["steps_per_epoch"] == N_TRAIN // 2 // 16
        idx = shard_indices(N_TRAIN, 1, 0, rank, 2)
        got_y = torch.cat([y for _, y in res["train"]])
        assert torch.equal(got_y, torch.from_numpy(labels[idx.numpy()]))
        want_x = (torch.from_numpy(images[idx.numpy()]).permute(0, 3, 1, 2).float() / 255 - 0.5) / 0.25
        assert torch.allclose(torch.cat([x for x, _ in res["train"]]), want_x, atol=1e-6)
        part = eval_slice(N_VAL, rank, 2)
        assert torch.cat([y for _, y in res["eval"]]).tolist() == val_labels[part.start:part.stop].tolist()

    summary = first["summary"]
    assert summary["data"] == "stripes" and summary["pipeline"] == "torchvision"
    assert math.isfinite(summary["test_loss"]) and summary["test_acc"] > 0.9, summary
