"""Honest throughput: training time read at window edges with the device synchronised there
only, evaluation and checkpoints excluded; the share of it spent waiting for data; MFU from the
model's FLOPs (counted on the meta device) and a GPU's peak."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from core.spec import ImageSpec
from engine.report.utilisation import peak_flops, utilisation
from engine.train.clock import TrainClock
from engine.train.train_state import TrainState
from models.flops import train_flops_per_sample
from tests.support.harness import run_ranks, train_in_rank


@pytest.mark.parametrize("name,precision,expected", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989e12), ("NVIDIA H100 PCIe", "bf16", 756e12),
    ("NVIDIA H100 80GB HBM3", "fp32", 495e12), ("NVIDIA A100-SXM4-80GB", "fp16", 312e12),
    ("NVIDIA A10", "bf16", 125e12), ("NVIDIA L40S", "bf16", 362e12), ("NVIDIA L4", "bf16", 121e12),
    ("NVIDIA GeForce GTX 1080", "fp32", None), (None, "fp32", None),
])
def test_peak_table(name: str, precision: str, expected: float) -> None:
    assert peak_flops(name, precision) == expected


def test_utilisation() -> None:
    assert utilisation(1000.0, 0, 1e9, 1e12) == {"samples_per_s_per_gpu": None, "mfu": None}  # the CPU
    assert utilisation(1000.0, 2, 1e9, 1e12) == {"samples_per_s_per_gpu": 500.0, "mfu": 0.5}
    assert utilisation(1000.0, 1, None, 1e12)["mfu"] is None


def test_training_flops_are_about_three_forwards() -> None:
    """ResNet-20 at 32 px: 41 M multiply-adds forward (He et al.), so about 0.24 GFLOP to train."""
    flops = train_flops_per_sample({"name": "resnet20"}, ImageSpec(3, 32, 10))
    assert 2.5 * 2 * 40.5e6 < flops < 3.1 * 2 * 41.5e6


def test_clock_synchronises_at_window_edges_only(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    syncs: list[float] = []
    monkeypatch.setattr("engine.train.clock.time.perf_counter", lambda: now[0])
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: syncs.append(now[0]))
    state = TrainState()
    clock = TrainClock(torch.device("cuda", 0), state, log_every=5)
    clock.resume()
    for step in range(1, 11):
        now[0] += 1.0  # a step
        clock.waited(0.25)
        clock.after_step(step, 10)
        if step == 7:  # an evaluation of 100 s
            clock.pause()
            now[0] += 100.0
            clock.resume()
    clock.pause()
    assert state.train_seconds == 10.0 and state.data_wait_seconds == 2.5
    assert syncs == [5.0, 7.0, 110.0, 110.0]  # log steps 5 and 10, the pause before the evaluation, the end


def test_warm_up_windows_are_apart_from_steady_state_throughput(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each segment's first log window (cuDNN autotuning, compilation, the loader's first fill) is
    warm-up: a slow first step must not lower the steady-state throughput the summary reports."""
    now = [0.0]
    monkeypatch.setattr("engine.train.clock.time.perf_counter", lambda: now[0])
    state = TrainState()

    def segment(first: int, last: int, first_step_s: float) -> None:
        clock = TrainClock(torch.device("cpu"), state, log_every=5)
        clock.resume()
        for step in range(first, last + 1):
            now[0] += first_step_s if step == first else 1.0
            clock.waited(0.5 if step == first else 0.1)
            state.samples_seen += 8
            clock.after_step(step, last)
        clock.pause()

    segment(1, 10, first_step_s=10.0)
    assert state.warmup == {"seconds": 14.0, "samples": 40, "wait_seconds": pytest.approx(0.9)}
    assert state.steady() == (5.0, 40, pytest.approx(0.5))  # 8 images/s, 10% waiting
    segment(11, 20, first_step_s=6.0)  # a resumed segment warms up again
    assert state.warmup["seconds"] == 24.0 and state.warmup["samples"] == 80
    assert state.steady()[:2] == (10.0, 80)
    short = TrainState(train_seconds=3.0, samples_seen=24, data_wait_seconds=1.0)
    short.warmup.update(seconds=3.0, samples=24, wait_seconds=1.0)  # one window only: all of it
    assert short.steady() == (3.0, 24, 1.0)


def test_run_records_data_wait_and_utilisation(tmp_path: Path) -> None:
    overrides = ["train.max_steps=12", "train.log_every_steps=4", "train.eval_every_steps=6", "model.width=8",
                 "launch.nproc=1"]
    summary = run_ranks(train_in_rank, 1, overrides, str(tmp_path), timeout=120)[0]
    for key in ("samples_per_s", "train_s", "warmup_s", "wall_s", "data_wait_frac", "samples_per_s_per_gpu", "mfu"):
        assert key in summary, key
    assert 0 < summary["warmup_s"] < summary["train_s"] < summary["wall_s"] and 0 <= summary["data_wait_frac"] < 1
    assert summary["samples_per_s_per_gpu"] is None and summary["mfu"] is None  # the CPU: no peak
    lines = [json.loads(ln) for ln in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in lines if r["kind"] == "train"]
    assert [r["step"] for r in train] == [4, 8, 12]
    assert all(0 <= r["data_wait_frac"] < 1 and r["samples_per_s"] > 0 for r in train)
