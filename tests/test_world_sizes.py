"""Every plugin's pre-launch checks at world sizes from 4 to 128: the sizes its method can run at
are accepted, the others refused in one line naming the size, before anything is launched
(the steps cli.py takes: composition, `engine.plan.preflight`, the plugin's `validate`).

Each algorithm runs with its CPU recipe's settings (recipes/cpu/<algo>.yaml: WAGMA's and LSGD's
groups of 2, SGP's 2 peers, one parameter server, ...) on MNIST-1D's 60,000 training samples at 8
samples per worker, so that 128 workers still have a batch each. The rule each method imposes
on the world is stated here, from its paper's construction, not read from the plugin:
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from core.errors import UserError
from dist_algos import list_algorithms
from tests.support.harness import CONF

SIZES = [4, 5, 6, 7, 8, 12, 16, 24, 31, 32, 48, 63, 64, 96, 100, 127, 128]


def power_of_two(n: int) -> bool:
    return n & (n - 1) == 0


RULES: dict[str, tuple[Callable[[int], bool], str]] = {
    # recursive-doubling groups of G = 2 over the world: the world a power of two (paper: 8 of 64)
    "wagma": (power_of_two, "a power-of-two number of workers"),
    # even (active) ranks pair with odd (passive) ones: the bipartite matching needs an even world
    "adpsgd": (lambda n: n % 2 == 0, "an even number of workers"),
    # groups of algo.group_size=2 consecutive ranks must tile the world
    "lsgd": (lambda n: n % 2 == 0, "algo.group_size=2 must divide"),
    # the single-node baseline: one process only
    "msgd": (lambda n: n == 1, "launch.nproc=1"),
}
ANY = (lambda n: True, "")  # every other method runs at any world of 2 or more (one server + workers for a PS)


def preflight_at(name: str, sizes: list[int], tmp_path: Path) -> dict[int, str]:
    """Compose `recipe=cpu/<name>` on MNIST-1D once, then run cli.py's preflight at each size;
    size -> "" (accepted) or the refusal's line."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from core.rundir import RunDir
    from engine.config import register_schemas
    from engine.plan import preflight

    register_schemas()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        raw = compose(config_name="config", overrides=[
            f"recipe=cpu/{name}", "data=mnist1d", "model=mnist1d_cnn", "data.num_samples=80000",
            "data.test_fraction=0.125", "data.val_fraction=null", "data.val_count=10000", "train.batch_size=8",
            "dist.device=cpu", "launch.launcher=fork"])
    found = {}
    for n in sizes:
        cfg = OmegaConf.merge(raw, {"launch": {"nproc": n}})
        try:
            preflight(cfg, RunDir(tmp_path / f"run_{n}"))
            found[n] = ""
        except UserError as err:
            found[n] = str(err)
    return found


@pytest.mark.parametrize("name", list_algorithms())
def test_pre_launch_checks_accept_the_valid_world_sizes_and_refuse_the_others(name: str, tmp_path: Path,
                                                                               capsys: pytest.CaptureFixture) -> None:
    valid, words = RULES.get(name, ANY)
    for n, refusal in preflight_at(name, SIZES, tmp_path).items():
        if valid(n):
            assert not refusal, f"algo={name} at {n} workers was refused: {refusal}"
        else:
            assert refusal, f"algo={name} at {n} workers was accepted; the method needs {words}"
            assert "\n" not in refusal and str(n) in refusal and words in refusal, refusal
