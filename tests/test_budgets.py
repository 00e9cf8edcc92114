"""Budgets (`train.budget_samples`, `train.budget_bytes`, `train.budget_wall_s`): every rank ends
at the same step, the end is checkpointed and recorded in summary.json, and resuming a run whose
budget is spent continues to nothing with one clear message (exit 0: the run is complete)."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from engine.checkpoint import files as ckpt
from tests.support.harness import run_ranks

BASE = ["train.max_steps=40", "model.width=8", "train.batch_size=32", "checkpoint.every_epochs=null",
        "train.eval_every_epochs=null"]


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _train(overrides: list[str], run_dir: str) -> dict[str, Any]:
    """One segment of a run on this rank: the step it ended at, its summary, its warnings."""
    from engine.rank.trainer import Trainer
    from tests.support.harness import plan_in_rank

    lines = _Lines()
    logging.getLogger("syncopt").addHandler(lines)
    try:
        plan, ctx = plan_in_rank(BASE + overrides, run_dir)
        trainer = Trainer(plan, ctx)
        summary = trainer.run()
    finally:
        logging.getLogger("syncopt").removeHandler(lines)
    return {"step": trainer.state.step, "summary": summary, "warnings": lines.lines,
            "record": trainer.state.budget_stop}


def budget_runs(rank: int, world: int, tmp: str) -> dict[str, Any]:
    """The samples budget first (it also measures the bytes of one step), then bytes and wall,
    each run once and resumed once with the same settings."""
    import torch.distributed as dist

    out: dict[str, Any] = {}
    out["samples"] = _train(["train.budget_samples=100"], f"{tmp}/samples")
    out["samples_again"] = _train(["train.budget_samples=100"], f"{tmp}/samples")
    box = [out["samples"]["summary"]]
    dist.broadcast_object_list(box, src=0)
    per_step = box[0]["comm_bytes"] // box[0]["steps"]  # allreduce: the same bytes every step
    budget = int(2.5 * per_step)
    out["per_step"] = per_step
    out["bytes"] = _train([f"train.budget_bytes={budget}", "train.preempt_check_every=1"], f"{tmp}/bytes")
    out["bytes_again"] = _train([f"train.budget_bytes={budget}", "train.preempt_check_every=1"], f"{tmp}/bytes")
    out["wall"] = _train(["train.budget_wall_s=0.001", "train.preempt_check_every=4"], f"{tmp}/wall")
    out["wall_again"] = _train(["train.budget_wall_s=0.001", "train.preempt_check_every=4"], f"{tmp}/wall")
    dist.barrier()
    out["checkpoints"] = {name: [(m.step, m.extra.get("reason"), sorted(m.files))
                                 for m in ckpt.complete_checkpoints(Path(tmp) / name)]
                          for name in ("samples", "bytes", "wall")} if rank == 0 else None
    dist.barrier()
    # a raised budget trains on from the spent one
    out["raised"] = _train(["train.budget_samples=300"], f"{tmp}/samples")
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_ranks(budget_runs, 2, str(tmp_path_factory.mktemp("budgets")), timeout=300)


@pytest.mark.parametrize("name,step,reason", [("samples", 2, "budget_samples"), ("bytes", 3, "budget_bytes"),
                                              ("wall", 4, "budget_wall_s")])
def test_each_budget_stops_every_rank_at_the_same_step_checkpointed(results: list[dict[str, Any]], name: str,
                                                                     step: int, reason: str) -> None:
    # samples: 2 ranks x 32 = 64 per step, 100 spent at step 2; bytes: 2.5 steps' worth, agreed every
    # step, spent at step 3; wall: 1 ms is spent at once, agreed at the first agreement step (4)
    assert [r[name]["step"] for r in results] == [step, step]
    assert results[0][name]["record"] == results[1][name]["record"]  # what a resume decides on: one record
    summary = results[0][name]["summary"]
    assert results[1][name]["summary"] is None
    assert summary["steps"] == step and summary["stop_reason"] == reason and summary["budget_step"] == step
    assert summary["spent"]["samples"] == step * 64
    assert summary["spent"]["bytes"] == summary["comm_bytes"] == step * results[0]["per_step"]
    limit = {"samples": 100, "bytes": int(2.5 * results[0]["per_step"]), "wall": 0.001}[name]
    assert summary["budget"][{"samples": "samples", "bytes": "bytes", "wall": "wall_s"}[name]] == limit
    newest = results[0]["checkpoints"][name][0]
    assert newest[0] == step and newest[1] == "final"
    assert newest[2] == ["rank_0.pt", "rank_1.pt"]


@pytest.mark.parametrize("name,budget", [("samples", "budget_samples"), ("bytes", "budget_bytes"),
                                         ("wall", "budget_wall_s")])
def test_resuming_a_spent_budget_continues_to_nothing(results: list[dict[str, Any]], name: str, budget: str) -> None:
    first, again = results[0][name], results[0][f"{name}_again"]
    assert [r[f"{name}_again"]["step"] for r in results] == [first["step"]] * 2
    assert again["summary"]["steps"] == first["step"] and again["summary"]["resumed_from"] == first["step"]
    assert again["summary"]["stop_reason"] == f"budget_{budget.split('_', 1)[1]}"
    [line] = [w for w in again["warnings"] if "nothing to continue" in w]
    assert f"train.{budget}=" in line and f"spent at step {first['step']}" in line and "Raise" in line
    assert not any("nothing to continue" in w for w in results[1][f"{name}_again"]["warnings"])  # said once


def test_a_raised_budget_trains_on(results: list[dict[str, Any]]) -> None:
    raised = results[0]["raised"]
    assert raised["step"] == 5  # ceil(300 / 64)
    assert raised["summary"]["resumed_from"] == 2 and raised["summary"]["spent"]["samples"] == 320
    assert raised["summary"]["stop_reason"] == "budget_samples"


def test_budget_off_records_a_run_to_its_steps() -> None:
    from engine.train.stop import Budget, StopAgreement

    stop = StopAgreement(None, 10, 100, Budget(), samples_per_step=64)
    try:
        assert all(stop.budget_spent(s, 10**12, 10**6) is None for s in range(1, 101))
        assert stop.summary(None, {"samples": 1})["stop_reason"] == "steps"
        assert not stop.still_spent(None)
    finally:
        stop.close()
