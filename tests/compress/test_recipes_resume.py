"""Exact resume of every composed configuration of issue 22: each recipe in recipes/compress/
(enumerated, so a new recipe is covered by adding it) through the registry-wide resume scenario
(tests/test_resume_registry.py: train N steps; train k, stop, resume to N; every rank's final
checkpoint equal bit for bit), on 2 ranks (3 for the streaming DiLoCo recipe, whose fragments
need a world where the mean is not exact in binary) with the test's small model."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.harness import compose, run_ranks
from tests.test_resume_registry import EVAL_EVERY, STEPS, STOP, resume_configs, resume_scenario

RECIPES = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "recipes" / "compress").glob("cpu_*.yaml"))


def overrides(recipe: str) -> list[str]:
    return [f"recipe=compress/{recipe}", f"train.max_steps={STEPS}", f"train.eval_every_steps={EVAL_EVERY}",
            "train.eval_every_epochs=null", "train.log_every_steps=5", "model.width=8", "checkpoint.every_epochs=1"]


def stop_of(recipe: str) -> int:
    """The registry's stop, or 3 steps past the first outer step where the recipe's outer period
    (DiLoCo's H = 22, one fragment's share of it when streaming) is longer: the resumed state then
    holds outer momentum and feedback that one outer step has written, not only their zeros."""
    algo = compose([f"recipe=compress/{recipe}"]).algo
    period = getattr(algo, "inner_steps", 0) // getattr(algo, "fragments", 1)
    return period + 3 if period >= STOP else STOP


def test_every_recipe_is_listed() -> None:
    assert {"cpu_qsgd", "cpu_terngrad", "cpu_signsgd_mv", "cpu_ef_signsgd", "cpu_ef21", "cpu_randomk", "cpu_demo",
            "cpu_sparseloco", "cpu_streaming_diloco", "cpu_sparseloco_local_qsr"} <= set(RECIPES)


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_resumes_bit_exact(recipe: str, tmp_path: Path) -> None:
    world = 3 if "streaming" in recipe else 2
    stop = stop_of(recipe)
    diffs = run_ranks(resume_scenario, world, resume_configs(overrides(recipe), stop), str(tmp_path), STEPS, stop,
                      timeout=400)
    for rank, d in enumerate(diffs):
        assert not d, f"{recipe} rank {rank}: resumed state differs at {d[:10]}"


#: composed configurations that are no recipe: the bucket-overlapped exchange (several buckets)
EXTRA = {"compressed_overlap": ["algo=compressed", "algo.overlap=true", "algo.bucket_mb=0.01",
                                "algo.first_bucket_mb=0.002", "algo.compress=[topk:0.05]", "algo.feedback=ef"]}


@pytest.mark.parametrize("name", sorted(EXTRA))
def test_composed_config_resumes_bit_exact(name: str, tmp_path: Path) -> None:
    args = EXTRA[name] + [f"train.max_steps={STEPS}", f"train.eval_every_steps={EVAL_EVERY}", "train.log_every_steps=5",
                          "model.width=8", "checkpoint.every_epochs=1"]
    diffs = run_ranks(resume_scenario, 2, resume_configs(args), str(tmp_path), timeout=400)
    for rank, d in enumerate(diffs):
        assert not d, f"{name} rank {rank}: resumed state differs at {d[:10]}"
