"""Exact resume of every composed configuration of issue 22: each recipe in recipes/compress/
(enumerated, so a new recipe is covered by adding it) through the registry-wide resume scenario
(tests/test_resume_registry.py: train N steps; train k, stop, resume to N; every rank's final
checkpoint equal bit for bit), on 2 ranks (3 for the streaming DiLoCo recipe, whose fragments
need a world where the mean is not exact in binary) with the test's small model."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.harness import run_ranks
from tests.test_resume_registry import STEPS, resume_scenario

RECIPES = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "recipes" / "compress").glob("cpu_*.yaml"))


def overrides(recipe: str) -> list[str]:
    return [f"recipe=compress/{recipe}", f"train.max_steps={STEPS}", "train.eval_every_steps=20",
            "train.eval_every_epochs=null", "train.log_every_steps=5", "model.width=8", "checkpoint.every_epochs=1"]


def test_every_recipe_is_listed() -> None:
    assert {"cpu_qsgd", "cpu_terngrad", "cpu_signsgd_mv", "cpu_ef_signsgd", "cpu_ef21", "cpu_randomk", "cpu_demo",
            "cpu_sparseloco", "cpu_streaming_diloco", "cpu_sparseloco_local_qsr"} <= set(RECIPES)


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_resumes_bit_exact(recipe: str, tmp_path: Path) -> None:
    world = 3 if "streaming" in recipe else 2
    diffs = run_ranks(resume_scenario, world, overrides(recipe), str(tmp_path), timeout=400)
    for rank, d in enumerate(diffs):
        assert not d, f"{recipe} rank {rank}: resumed state differs at {d[:10]}"


#: composed configurations that are no recipe: the bucket-overlapped exchange (several buckets)
EXTRA = {"compressed_overlap": ["algo=compressed", "algo.overlap=true", "algo.bucket_mb=0.01",
                                "algo.first_bucket_mb=0.002", "algo.compress=[topk:0.05]", "algo.feedback=ef"]}


@pytest.mark.parametrize("name", sorted(EXTRA))
def test_composed_config_resumes_bit_exact(name: str, tmp_path: Path) -> None:
    args = EXTRA[name] + [f"train.max_steps={STEPS}", "train.eval_every_steps=20", "train.log_every_steps=5",
                          "model.width=8", "checkpoint.every_epochs=1"]
    diffs = run_ranks(resume_scenario, 2, args, str(tmp_path), timeout=400)
    for rank, d in enumerate(diffs):
        assert not d, f"{name} rank {rank}: resumed state differs at {d[:10]}"
