"""Label-skewed partitions of the training part (`data.split`, `data.sampler.ShardPlan`).

Tolerances, stated: `classes_per_worker=m` gives every rank exactly m labels; on digits over 8
ranks Dirichlet alpha=0.1 gives a mean total-variation skew above 0.5 and alpha=1000 one below
0.05 (an IID shard of one epoch already differs by about 0.08 from sampling noise), and a
smaller alpha is more skewed. Every rank's own computation (separate processes) gives the same
pools and orders; pools are disjoint, cover the training part and never touch validation; ranks
take equal steps; epochs reshuffle within a pool; a resumed epoch reads the same order.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from data.config import DataConfig, Partition
from data.sampler import ShardPlan, epoch_shards
from data.sets.digits import load_digits_split
from data.split import label_skew, train_split
from tests.support.harness import run_ranks

RANKS, BATCH = 8, 16


def digits_labels() -> np.ndarray:
    return load_digits_split(0.2, 0)[1].numpy()


def split(partition: str, seed: int = 1, **kw: Any) -> Any:
    return train_split(digits_labels(), DataConfig(partition=Partition(partition), **kw), seed, RANKS, BATCH)


@pytest.mark.parametrize("m", [1, 2, 3])
def test_classes_partition_gives_each_rank_exactly_m_labels(m: int) -> None:
    labels = digits_labels()
    s = split("classes", classes_per_worker=m)
    assert all(len(set(labels[p].tolist())) == m for p in s.plan.pools)
    assert s.record["classes_per_worker"] == m and s.record["partition"] == "classes"


@pytest.mark.parametrize("partition,kw", [("classes", {"classes_per_worker": 2}),
                                          ("dirichlet", {"dirichlet_alpha": 0.1})])
def test_pools_are_disjoint_cover_the_training_part_and_avoid_validation(partition: str, kw: dict) -> None:
    s = split(partition, **kw)
    flat = np.concatenate(s.plan.pools)
    assert len(flat) == len(set(flat.tolist())), "pools overlap"
    assert not set(flat.tolist()) & set(s.val.tolist()), "a rank trains on validation samples"
    assert sorted(flat.tolist() + s.val.tolist()) == list(range(len(digits_labels())))
    assert s.record["worker_samples"] == [len(p) for p in s.plan.pools]


def test_dirichlet_skew_follows_alpha() -> None:
    skew = {a: split("dirichlet", dirichlet_alpha=a).record["label_skew_tv"] for a in (0.1, 1.0, 1000.0)}
    assert skew[0.1] > 0.5, skew
    assert skew[1000.0] < 0.05, skew
    assert skew[0.1] > skew[1.0] > skew[1000.0], skew
    assert split("iid").record["label_skew_tv"] == 0.0


def test_label_skew_is_total_variation() -> None:
    labels = np.array([0, 0, 1, 1])
    idx = np.arange(4)
    assert label_skew(labels, [np.array([0, 1]), np.array([2, 3])], idx) == pytest.approx(0.5)
    assert label_skew(labels, [np.array([0, 2]), np.array([1, 3])], idx) == pytest.approx(0.0)


def test_equal_steps_reshuffle_and_resume() -> None:
    s = split("dirichlet", dirichlet_alpha=0.1)
    plan = s.plan
    orders = [plan.orders(e) for e in (0, 1)]
    assert orders[0].shape == (RANKS, plan.per_shard) and plan.per_shard == s.record["train_samples"] // RANKS
    for k, pool in enumerate(plan.pools):
        assert set(orders[0][k].tolist()) <= set(pool.tolist())
        # a pool at least an epoch long reads distinct samples; a smaller one wraps around
        if len(pool) >= plan.per_shard:
            assert len(set(orders[0][k].tolist())) == plan.per_shard
        else:
            assert set(orders[0][k].tolist()) == set(pool.tolist())
        assert not torch.equal(orders[0][k], orders[1][k]), "no reshuffle across epochs"
        assert torch.equal(plan.order(1, k), orders[1][k]), "order(epoch, shard) differs from orders(epoch)"


def test_iid_over_the_whole_file_is_todays_sharding() -> None:
    """With validation off and IID, the orders are exactly the old `epoch_shards` (a default job's
    result unchanged to the last digit rests on it)."""
    s = train_split(digits_labels(), DataConfig(val_fraction=0), 3, 4, 32)
    assert len(s.val) == 0 and s.plan.train_idx is None
    for epoch in (0, 5):
        assert torch.equal(s.plan.orders(epoch), epoch_shards(len(digits_labels()), 3, epoch, 4))
    assert torch.equal(ShardPlan(100, 2, 3).order(1, 2), epoch_shards(100, 2, 1, 3)[2])


def _rank_view(rank: int, world: int, partition: str) -> dict[str, Any]:
    """What one rank computes of the split on its own."""
    cfg = DataConfig(partition=Partition(partition), dirichlet_alpha=0.3, classes_per_worker=2)
    s = train_split(digits_labels(), cfg, 11, RANKS, BATCH)
    return {"val": s.val.tolist(), "pools": [p.tolist() for p in s.plan.pools or []],
            "orders": s.plan.orders(2).tolist(), "mine": s.plan.order(2, rank).tolist(), "record": s.record}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("partition", ["dirichlet", "classes"])
def test_every_rank_computes_the_same_split(partition: str) -> None:
    views = run_ranks(_rank_view, 2, partition, timeout=240)
    for key in ("val", "pools", "orders", "record"):
        assert views[0][key] == views[1][key], f"ranks disagree on {key}"
    assert views[0]["mine"] == views[0]["orders"][0] and views[1]["mine"] == views[1]["orders"][1]


def test_impossible_partitions_are_one_line() -> None:
    from core.errors import UserError

    with pytest.raises(UserError, match=r"data.classes_per_worker=11 .* use at most 10"):
        split("classes", classes_per_worker=11)
    with pytest.raises(UserError, match=r"data.dirichlet_alpha=1e-05 left a training rank"):
        train_split(digits_labels(), DataConfig(partition=Partition.dirichlet, dirichlet_alpha=1e-5), 1, RANKS, 150)


def _partitioned_resume(rank: int, world: int, tmp: str) -> dict[str, Any]:
    from tests.test_resume_registry import algo_overrides, resume_scenario

    over = algo_overrides("asgd") + ["data.partition=dirichlet", "data.dirichlet_alpha=0.1"]
    return {"diffs": resume_scenario(rank, world, over, tmp)}


@pytest.mark.timeout(400)
def test_parameter_server_trains_a_partition_over_its_workers_and_resumes_exactly(tmp_path: Path) -> None:
    """asgd: rank 0 serves, ranks 1 and 2 train; the partition is over those two only, and a run
    stopped mid-epoch and resumed equals the uninterrupted one bit for bit."""
    results = run_ranks(_partitioned_resume, 3, str(tmp_path), timeout=380)
    for rank, res in enumerate(results):
        assert not res["diffs"], f"rank {rank}: resumed run differs at {res['diffs'][:5]}"
    split = json.loads((tmp_path / "full" / "summary.json").read_text())["data_split"]
    assert split["partition"] == "dirichlet" and len(split["worker_samples"]) == 2
    assert split["label_skew_tv"] > 0.3, split
