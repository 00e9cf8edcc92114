"""How the model computes: `train.channels_last` and `train.compile` change kernels and wrappers,
never the tensors the optimizer, the plugins and the checkpoints see (engine/train/compute.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn as nn

from engine.train.compute import plain_state_dict, prepare_model, wants_channels_last
from tests.support.harness import run_ranks, train_in_rank
from tests.test_resume_registry import diff

STEPS, STOP = 12, 5
BASE = ["algo=local_sgd", "algo.period=2", f"train.max_steps={STEPS}", "train.eval_every_steps=6",
        "train.log_every_steps=3", "model.width=4", "checkpoint.every_epochs=1", "launch.nproc=2"]


@pytest.mark.parametrize("setting,is_cuda,conv,expected", [
    ("auto", True, True, True), ("auto", False, True, False), ("auto", True, False, False),
    (True, False, True, True), (False, True, True, False),
])
def test_channels_last_decision(setting: Any, is_cuda: bool, conv: bool, expected: bool) -> None:
    assert wants_channels_last(setting, is_cuda, conv) is expected


def test_prepare_keeps_the_parameters_and_strips_no_values() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 30 * 30, 2))
    before = [p for p in model.parameters()]
    values = [p.detach().clone() for p in before]
    compute = prepare_model(model, True, True, "eager", is_cuda=False)
    assert [p for p in model.parameters()] == before  # the same Parameter objects
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert all(torch.equal(p, v) for p, v in zip(model.parameters(), values))
    assert compute.train_module is not model and not any("_orig_mod" in k for k in model.state_dict())
    wrapped = compute.train_module.state_dict()
    assert set(plain_state_dict(wrapped)) == set(model.state_dict())
    assert compute.layout(torch.zeros(2, 3, 32, 32)).is_contiguous(memory_format=torch.channels_last)


def _final(tmp: str, rank: int) -> dict[str, Any]:
    return torch.load(Path(tmp) / f"checkpoints/step_{STEPS:08d}/rank_{rank}.pt", weights_only=True)


def _resume(rank: int, world: int, first: list[str], second: list[str], tmp: str) -> list[str]:
    """Straight with `second`'s settings against stopped with `first`'s and resumed with `second`'s."""
    train_in_rank(rank, world, BASE + second + ["resume=null"], f"{tmp}/full")
    train_in_rank(rank, world, BASE + first + ["resume=null", f"train.stop_after={STOP}"], f"{tmp}/split")
    train_in_rank(rank, world, BASE + second + ["resume=auto"], f"{tmp}/split")
    a, b = _final(f"{tmp}/full", rank), _final(f"{tmp}/split", rank)
    assert not any("_orig_mod" in k for k in b["model"]), "a checkpoint carries torch.compile's prefix"
    return diff(a, b)


def test_channels_last_trains_and_resumes_bit_exactly(tmp_path: Path) -> None:
    on = ["train.channels_last=true"]
    for rank, d in enumerate(run_ranks(_resume, 2, on, on, str(tmp_path), timeout=240)):
        assert not d, f"rank {rank}: {d[:5]}"


def test_compile_resumes_without_it_and_vice_versa(tmp_path: Path) -> None:
    """torch.compile with the eager backend runs the traced graph's own ops, so with and without
    it the runs agree bit for bit, whichever half of a run had it."""
    on, off = ["train.compile=true", "train.compile_backend=eager"], []
    for first, second, name in ((on, off, "a"), (off, on, "b")):
        for rank, d in enumerate(run_ranks(_resume, 2, first, second, str(tmp_path / name), timeout=240)):
            assert not d, f"{name} rank {rank}: {d[:5]}"


def _plugin_sees(rank: int, world: int, tmp: str) -> list[bool]:
    from tests.support.harness import plan_in_rank
    from engine.rank.trainer import Trainer

    plan, ctx = plan_in_rank(BASE + ["train.compile=true", "train.compile_backend=eager", "resume=null"], tmp)
    trainer = Trainer(plan, ctx)
    trainer.run()
    return [trainer.algo.model is trainer.model, isinstance(trainer.local.compute.train_module, nn.Module)
            and trainer.local.compute.train_module is not trainer.model]


def test_plugins_see_the_plain_module(tmp_path: Path) -> None:
    assert run_ranks(_plugin_sees, 2, str(tmp_path), timeout=240) == [[True, True]] * 2


@pytest.mark.slow
def test_inductor_compiles_and_trains_on_this_cpu(tmp_path: Path) -> None:
    """The real compiler (a C++ toolchain; about 30 s per rank here): losses as without it."""
    def losses(out: Path) -> list[float]:
        import json

        return [json.loads(ln)["loss"] for ln in (out / "metrics.jsonl").read_text().splitlines()
                if json.loads(ln)["kind"] == "train"]

    run_ranks(train_in_rank, 1, BASE[:-1] + ["train.compile=true", "launch.nproc=1"], str(tmp_path / "c"), timeout=600)
    run_ranks(train_in_rank, 1, BASE[:-1] + ["launch.nproc=1"], str(tmp_path / "p"), timeout=240)
    assert losses(tmp_path / "c") == pytest.approx(losses(tmp_path / "p"), rel=1e-3)
