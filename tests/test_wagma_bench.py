"""bench/imbalance.py's bookkeeping: the replayed delay schedule is the injector's, and the
ideal bound is computed per tau-block as the issue defines it."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import imbalance as bench  # noqa: E402

from engine.train.imbalance import ImbalanceConfig  # noqa: E402
from engine.train.imbalance import ImbalanceInjector  # noqa: E402


def test_ideal_ratio_by_hand() -> None:
    # two ranks, c = 1, tau = 2: each is delayed once per block, at different steps
    delays = [[1.0, 0.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0]]
    # synchronous: every step waits for a delayed rank: 4 x 2 = 8; ideal: per block max(3, 3) = 3
    assert bench.ideal_ratio(delays, 1.0, 2) == pytest.approx(8 / 6)
    # the same delays on one rank only: nothing to gain
    assert bench.ideal_ratio([[1.0, 1.0, 0.0, 0.0], [0.0] * 4], 1.0, 2) == pytest.approx(1.0)


def test_replay_is_the_injectors_schedule(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr("engine.train.imbalance.time.sleep", slept.append)
    cfg = ImbalanceConfig(delay_ms=7.0, prob=0.2, seed=5)
    replayed = bench.replay(3, 50, cfg, 0.01)
    for rank in range(3):
        injector = ImbalanceInjector(cfg, rank)
        got = [injector.inject(step, 0.01) for step in range(50)]
        assert got == replayed[rank]
    assert 0 < sum(d > 0 for d in replayed[0]) < 50


def test_long_run_bounds_match_the_issue() -> None:
    cfg, _ = bench.settings(4, 0.01)["A"]
    assert bench.ideal_ratio(bench.replay(4, 2000, cfg, 0.01), 0.01, 10) == pytest.approx(1.44, abs=0.03)
    assert bench.ideal_ratio(bench.replay(8, 2000, cfg, 0.01), 0.01, 10) == pytest.approx(1.69, abs=0.03)
