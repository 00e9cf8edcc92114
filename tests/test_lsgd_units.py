"""LSGD's and EASGD's single-process parts: the running-mean window, the leader choice, the
groups, validation of user settings, and the summary merge."""
from __future__ import annotations

import math

import pytest
import torch

from dist_algos.base import HyperParams
from dist_algos.easgd import EASGD, EASGDConfig, elastic_update_
from dist_algos.schedules.leader import RunningLoss, choose_leader, pull_towards_
from dist_algos.lsgd import LSGD, LSGDConfig, local_leader_active, partition, resolve_group_size
from core.distenv import DistContext
from core.errors import UserError


def context(world: int, rank: int = 0, local_size: int = 2) -> DistContext:
    return DistContext(rank, world, rank % local_size, local_size, rank // local_size, world // local_size,
                       torch.device("cpu"), "gloo", 60.0)


def test_running_mean_covers_the_last_window_losses() -> None:
    window = RunningLoss(3, torch.device("cpu"))
    assert math.isinf(window.mean().item())  # nothing seen yet: never the leader
    window.add(torch.tensor(4.0))
    assert window.mean().item() == 4.0  # mean of what was seen, not of zeros
    window.add(torch.tensor(2.0))
    assert window.mean().item() == 3.0
    for loss in (9.0, 1.0, 5.0):
        window.add(torch.tensor(loss))
    assert window.mean().item() == pytest.approx((9.0 + 1.0 + 5.0) / 3)  # 4.0 and 2.0 have left
    restored = RunningLoss(3, torch.device("cpu"))
    restored.load_state_dict(window.state_dict())
    restored.add(torch.tensor(3.0))
    window.add(torch.tensor(3.0))
    assert restored.mean().item() == window.mean().item() == pytest.approx((1.0 + 5.0 + 3.0) / 3)
    with pytest.raises(ValueError):
        RunningLoss(4, torch.device("cpu")).load_state_dict(window.state_dict())


def test_leader_is_the_lowest_running_mean_over_fixed_losses() -> None:
    """Four workers, window 2: the leader follows the running mean, not the last loss."""
    losses = {0: [0.9, 0.1], 1: [0.3, 0.4], 2: [0.5, 0.5], 3: [0.2, 0.6]}
    windows = {r: RunningLoss(2, torch.device("cpu")) for r in losses}
    for r, seq in losses.items():
        for loss in seq:
            windows[r].add(torch.tensor(loss, dtype=torch.float64))
    pairs = [(r, windows[r].mean().item()) for r in losses]
    assert choose_leader(pairs) == 1  # means 0.5, 0.35, 0.5, 0.4; rank 0 has the lowest last loss
    assert choose_leader(p for p in pairs if p[0] in (2, 3)) == 3  # the group's own leader
    assert choose_leader([(2, 0.5), (0, 0.5), (3, 0.7)]) == 0  # ties: the lowest rank
    assert choose_leader([(0, math.nan), (1, 2.0), (2, math.inf)]) == 1  # a diverged worker never leads
    with pytest.raises(ValueError):
        choose_leader([])


def test_pull_mixes_in_place() -> None:
    x, t = [torch.tensor([1.0, 3.0])], [torch.tensor([5.0, -1.0])]
    pull_towards_(x, t, 0.25)
    assert torch.equal(x[0], torch.tensor([2.0, 2.0]))
    params, center, mean = [torch.tensor([4.0])], [torch.tensor([0.0])], [torch.tensor([2.0])]
    elastic_update_(params, center, mean, moving_rate=0.5, num_workers=2)
    assert params[0].item() == 3.0 and center[0].item() == 1.0  # 4 - 0.25 * 4; 0 + 0.5 * 2


def test_groups_are_consecutive_ranks_and_local_leaders_need_several() -> None:
    assert partition(8, 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert local_leader_active(4, 2)
    assert not local_leader_active(4, 4)  # one group: its leader is the global leader
    assert not local_leader_active(4, 1)  # groups of one: every worker leads itself


@pytest.mark.parametrize("overrides, world, local_size, fragment", [
    ({"group_size": 3}, 4, 2, "algo.group_size=3"),
    ({}, 6, 4, "algo.group_size=4"),  # the default (ranks per node) must divide the world too
    ({"local_period": 3, "global_period": 16}, 4, 2, "algo.global_period=16"),
    ({"local_pull": 1.5}, 4, 2, "algo.local_pull=1.5"),
    ({"loss_window": 0}, 4, 2, "algo.loss_window=0"),
    ({"eval_model": "center"}, 4, 2, "algo.eval_model='center'"),
    ({"bn_batches": -1}, 4, 2, "algo.bn_batches=-1"),
])
def test_lsgd_rejects_settings_that_cannot_work(overrides: dict, world: int, local_size: int, fragment: str) -> None:
    with pytest.raises(UserError, match=fragment.replace("[", r"\[")):
        LSGD.validate(LSGDConfig(**overrides), world, local_size, HyperParams())


def test_lsgd_accepts_a_period_that_only_matters_with_groups() -> None:
    # one group spanning the job has no local leader, so a local period that does not divide the
    # global one is harmless there; validate() raises UserError if it rejects either set-up
    lone = LSGDConfig(local_period=3, global_period=16, group_size=4)
    assert not local_leader_active(4, resolve_group_size(lone, 4))
    LSGD.validate(lone, 4, 4, HyperParams())
    paper = LSGDConfig()  # the paper's 4 nodes x 4 workers: groups of the ranks per node
    assert resolve_group_size(paper, 4) == 4 and local_leader_active(16, 4)
    LSGD.validate(paper, 16, 4, HyperParams())


@pytest.mark.parametrize("overrides, fragment", [
    ({"moving_rate": 0.0}, "algo.moving_rate=0.0"),
    ({"sync_period": 0}, "algo.sync_period=0"),
    ({"eval_model": "leader"}, "algo.eval_model='leader'"),
])
def test_easgd_rejects_settings_that_cannot_work(overrides: dict, fragment: str) -> None:
    with pytest.raises(UserError, match=fragment):
        EASGD.validate(EASGDConfig(**overrides), 4, 4, HyperParams())


def test_local_evaluation_runs_on_rank_zero_only() -> None:
    assert LSGD(LSGDConfig(eval_model="local"), context(4)).eval_ranks() == [0]
    assert LSGD(LSGDConfig(eval_model="leader"), context(4)).eval_ranks() == [0, 1, 2, 3]
    assert EASGD(EASGDConfig(eval_model="local"), context(4)).eval_ranks() == [0]


def test_merge_summaries_counts_leaders_per_rank() -> None:
    per_rank = [{"rank": r, "led_global": g, "led_local": lo, "global_refreshes": 3, "local_refreshes": 12,
                 "groups": [[0, 1], [2, 3]], "global_history": [[16, 2], [32, 2], [48, 1]]}
                for r, g, lo in [(2, 2, 7), (0, 0, 5), (3, 0, 5), (1, 1, 7)]]  # any arrival order
    merged = LSGD.merge_summaries(per_rank)
    assert merged["global_leader_counts"] == [0, 1, 2, 0]
    assert merged["local_leader_counts"] == [5, 7, 7, 5]
    assert merged["global_leader_history"] == [[16, 2], [32, 2], [48, 1]]
    assert LSGD.merge_summaries([{}, {}]) == {}
