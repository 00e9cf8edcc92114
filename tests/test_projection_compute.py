"""The compute half of the model: the tail of a synchronous step (the slowest of N draws) against a
direct simulation, the imbalance injector's schedule regenerated exactly, device profiles, and the
band from the compute tail (projection/compute.py, projection/engine.py)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from core.errors import UserError
from dist_algos.comm.pattern import CommOp, OpKind
from engine.train.imbalance import ImbalanceConfig, ImbalanceInjector
from projection.cluster import load_preset
from projection.compute import (ComputeProfile, device_profile, expected_max, imbalance_delays, profile_from_steps,
                                quantile_of_max)
from projection.engine import project
from projection.network import Network
from projection.workload import Workload

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("n", [1, 8, 64, 1024])
def test_expected_max_of_n_draws_against_a_direct_simulation(n: int) -> None:
    rng = np.random.default_rng(n)
    samples = rng.lognormal(np.log(0.1), 0.3, size=50)
    direct = rng.choice(samples, size=(4000, n)).max(axis=1)
    assert expected_max(samples, n) == pytest.approx(direct.mean(), rel=0.01)
    assert quantile_of_max(samples, n, 0.5) == pytest.approx(np.quantile(direct, 0.5), rel=0.02)
    assert quantile_of_max(samples, n, 0.95) == pytest.approx(np.quantile(direct, 0.95), rel=0.02)


def test_the_tail_grows_with_the_workers() -> None:
    samples = np.array([1.0, 1.0, 1.0, 2.0])  # one step in four is slow
    assert expected_max(samples, 1) == pytest.approx(1.25)
    assert expected_max(samples, 2) == pytest.approx(1 + 1 - 0.75 ** 2)
    assert expected_max(samples, 1024) == pytest.approx(2.0)


def test_a_projected_synchronous_step_waits_for_the_slowest_of_its_workers() -> None:
    """A world all-reduce of one byte at 1,024 workers: the step is E[max of 1,024 draws] (its
    communication is microseconds), far above the median of the profile."""
    rng = np.random.default_rng(0)
    samples = rng.lognormal(np.log(0.1), 0.2, size=300)
    profile = ComputeProfile(np.column_stack([samples, np.zeros_like(samples)]), "test")
    world = 1024
    work = Workload(world, 200, tuple(range(world)),
                    lambda r, s: (CommOp(OpKind.ALLREDUCE, "world", world, 4, 0),) if s < 200 else (), "test")
    result = project(work, Network(load_preset("ib400_8gpu"), world), profile, replicates=1)
    assert result.step_s == pytest.approx(expected_max(samples, world), rel=0.02)
    assert result.step_s > 1.5 * np.median(samples)


def test_the_band_comes_from_resampling_the_tail() -> None:
    """Few samples with one outlier: the bootstrap replicates disagree on the max of 64 draws, so
    the band is wide; a profile of one figure has no tail and no band."""
    samples = np.array([0.1] * 9 + [0.3])
    profile = profile_from_steps(samples, np.zeros(10), "test")
    world = 64
    work = Workload(world, 50, tuple(range(world)),
                    lambda r, s: (CommOp(OpKind.ALLREDUCE, "world", world, 4, 0),) if s < 50 else (), "test")
    net = Network(load_preset("eth25"), world)
    wide = project(work, net, profile, replicates=16, seed=1)
    assert wide.wall_band[0] < wide.wall_band[1]
    flat = project(work, net, ComputeProfile(np.array([[0.1, 0.0]]), "one figure", measured_tail=False))
    assert flat.wall_band[0] == flat.wall_band[1] == flat.wall_s


def test_imbalance_is_regenerated_as_the_injector_draws_it() -> None:
    """The delays regenerated for a rank are those its injector sleeps in a run, step by step,
    with the factor-of-median delays waiting for the injector's calibration steps."""
    cfg = ImbalanceConfig(factor=2.0, prob=0.3, seed=7, ranks=[1, 5])
    delays = imbalance_delays(cfg, [0, 1, 5], 40, median_s=0.05)
    assert delays is not None and not delays[0].any()  # rank 0 is not delayed
    for row, rank in ((1, 1), (2, 5)):
        injector = ImbalanceInjector(cfg, rank)
        slept = []
        for step in range(40):
            injector.observe(0.05)
            slept.append(injector.delay_for(step))
        np.testing.assert_allclose(delays[row], slept)
        assert delays[row, :ImbalanceInjector.calibration_steps - 1].sum() == 0
        assert delays[row].sum() > 0
    assert imbalance_delays(ImbalanceConfig(), [0], 5, 0.1) is None


def test_device_profiles_name_their_source(tmp_path: Path) -> None:
    shipped = device_profile(REPO / "conf" / "cluster" / "device" / "h200_resnet50_b256.yaml")
    assert shipped.median_s == pytest.approx(256 / 4314, rel=1e-3)
    assert not shipped.measured_tail and shipped.notes
    bare = tmp_path / "bare.yaml"
    bare.write_text("step_s: 0.1\n")
    with pytest.raises(UserError, match="bare.yaml is not a device profile"):
        device_profile(bare)
    unsourced = tmp_path / "unsourced.yaml"
    unsourced.write_text("step_s: {value: 0.1, source: ''}\n")
    with pytest.raises(UserError, match="needs a positive value and a source"):
        device_profile(unsourced)
    with pytest.raises(UserError, match="no such file"):
        device_profile(tmp_path / "missing.yaml")
