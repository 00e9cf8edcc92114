"""Every LSGD recipe composes and validates, paper scale on its 4 nodes x 4 workers and CPU scale
on its 4 ranks as 2 groups of 2."""
from __future__ import annotations

from pathlib import Path

import pytest

from dist_algos import get_algorithm
from engine.train.optim import hyper_params
from tests.support.harness import REPO, compose

RECIPES = sorted(p.stem for p in (REPO / "recipes" / "lsgd").glob("*.yaml") if not p.stem.endswith("_common"))


def test_the_issue_recipes_exist() -> None:
    for name in ("cpu_lsgd", "cpu_easgd", "cpu_allreduce", "cifar10_resnet20_lsgd_p4", "cifar10_resnet20_lsgd_p16",
                 "cifar10_resnet20_lsgd_p64", "cifar10_resnet20_easgd", "imagenet_resnet50_lsgd",
                 "imagenet_resnet50_easgd"):
        assert name in RECIPES


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_composes_and_validates(name: str, tmp_path: Path) -> None:
    cfg = compose([f"recipe=lsgd/{name}"], tmp_path)
    nodes = 1 if name.startswith("cpu_") else 4
    assert cfg.launch.nproc == 4
    get_algorithm(cfg.algo.name).validate(cfg.algo, nodes * cfg.launch.nproc, cfg.launch.nproc,
                                          hyper_params(cfg.optim, cfg.optim.lr, cfg.train.grad_clip))
    if name.startswith("cpu_"):
        assert cfg.data.name == "digits"
        if cfg.algo.name == "lsgd":
            assert cfg.algo.group_size == 2
    else:
        assert (cfg.optim.lr, cfg.optim.momentum, cfg.optim.nesterov, cfg.optim.weight_decay) == (0.1, 0.9, True, 1e-4)
        assert cfg.train.batch_size == 128
        if cfg.algo.name == "lsgd":
            assert cfg.algo.local_period * 4 == cfg.algo.global_period
            assert cfg.algo.loss_window == (64 if cfg.data.name == "imagenet" else 10)
        if cfg.algo.name == "easgd":
            assert cfg.algo.moving_rate == 0.43
