"""The training file's two parts, validation and training, and the training part's partition
over the training ranks: pure functions of the labels and the config, so every rank computes the
same split with no communication (as `data.sampler` computes the same epoch order).

Validation (`validation_indices`): stratified by class, drawn with `data.split_seed`, so the
validation set is one set for every run seed and method (what selection compares must not move
under it). Sizes: `data.val_fraction` of the training file, `data.val_count` samples, or
`data.val_per_class` per class; 0 in any of them turns selection off. Each class gives its share
of the total by largest remainder, so a count is met exactly.

Partition (`partition_pools`): IID leaves the training part whole (each epoch's permutation is
strided over the ranks, `ShardPlan`); `dirichlet` splits every class over the ranks in
proportions drawn from Dirichlet(alpha) (the label-skew scheme of Yurochkin et al. 2019 used by
Lin et al. 2020; Hsu et al. 2019 draw per worker instead), redrawn (seeded) until every rank has
at least a batch; `classes` gives rank k the classes perm[(k * m + j) mod C], j < m, so each rank
holds exactly m labels and the classes are spread evenly, and each class's samples are dealt out
equally to the ranks that hold it. The partition is drawn from the run's seed (a seed's interval
then includes the partition's draw); it is fixed for the whole run.

The skew of a partition (`label_skew`) is the mean total-variation distance between each rank's
label distribution and the training part's: 1 - 1/C when every rank holds one of C balanced
classes. IID records 0: each epoch every rank draws from the whole training part, so its
sampling distribution is the global one (one epoch's shard differs from it by sampling noise).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from core.errors import UserError
from data.config import DataConfig, Partition
from data.sampler import ShardPlan

#: redraws of a Dirichlet partition before giving up on every rank getting a batch
DIRICHLET_TRIES = 100
_PARTITION_STREAM = 0x5EED_1D  # keeps the partition's generator apart from the epochs'


def validation_rule(cfg: DataConfig) -> Optional[tuple[str, float]]:
    """(key, value) of the one validation size that is set and non-zero; None: validation off.
    Two non-zero sizes are ambiguous: a one-line `UserError` says which to clear."""
    sizes = {"val_fraction": cfg.val_fraction, "val_count": cfg.val_count, "val_per_class": cfg.val_per_class}
    if any(v == 0 for v in sizes.values()):
        return None
    chosen = [(k, v) for k, v in sizes.items() if v is not None]
    if len(chosen) > 1:
        names = " and ".join(f"data.{k}={v}" for k, v in chosen)
        keep = chosen[-1][0]
        raise UserError(f"{names} both size the validation split; keep one (e.g. data.{chosen[0][0]}=null "
                        f"to use data.{keep}), or set either to 0 to turn validation off")
    return chosen[0] if chosen else None


def split_identity(cfg: DataConfig) -> dict[str, Any]:
    """The settings that decide which samples train and validate: a resumed run must share them."""
    rule = validation_rule(cfg)
    return {"val": list(rule) if rule else None, "split_seed": cfg.split_seed, "partition": str(cfg.partition),
            **_partition_params(cfg)}


def _partition_params(cfg: DataConfig) -> dict[str, Any]:
    """The setting of the configured partition scheme (none for IID)."""
    if cfg.partition == Partition.dirichlet:
        return {"dirichlet_alpha": cfg.dirichlet_alpha}
    if cfg.partition == Partition.classes:
        return {"classes_per_worker": cfg.classes_per_worker}
    return {}


def _largest_remainder(total: int, counts: np.ndarray) -> np.ndarray:
    """`total` split over classes in proportion to `counts`, summing exactly to `total`."""
    want = total * counts / counts.sum()
    take = np.floor(want).astype(np.int64)
    rest = total - int(take.sum())
    order = np.argsort(-(want - take), kind="stable")
    take[order[:rest]] += 1
    return np.minimum(take, counts)


def validation_indices(labels: np.ndarray, cfg: DataConfig) -> np.ndarray:
    """Sorted indices (into the training file) of the validation samples; empty when off."""
    rule = validation_rule(cfg)
    labels = np.asarray(labels, dtype=np.int64)
    if rule is None:
        return np.zeros(0, dtype=np.int64)
    key, value = rule
    classes, counts = np.unique(labels, return_counts=True)
    if key == "val_per_class":
        per_class = np.full(len(classes), int(value), dtype=np.int64)
        if (per_class >= counts).any():
            c = int(classes[np.argmax(per_class >= counts)])
            raise UserError(f"data.val_per_class={int(value)} takes all {int(counts.min())} training samples of a "
                            f"class (class {c}); use a smaller data.val_per_class")
    else:
        total = round(value * len(labels)) if key == "val_fraction" else int(value)
        if total >= len(labels):
            raise UserError(f"data.{key}={value} leaves no training samples of the {len(labels)}; use a smaller "
                            f"data.{key}")
        per_class = _largest_remainder(total, counts)
    rng = np.random.default_rng([cfg.split_seed, 7])
    chosen = []
    for c, k in zip(classes, per_class):
        members = np.flatnonzero(labels == c)
        chosen.append(members[rng.permutation(len(members))[:k]])
    return np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, dtype=np.int64)


def partition_pools(labels: np.ndarray, train_idx: np.ndarray, cfg: DataConfig, seed: int, num_shards: int,
                    min_size: int) -> Optional[list[np.ndarray]]:
    """Each training rank's fixed subset (sorted indices into the training file) of the training
    part `train_idx`; None for IID (the part stays whole)."""
    if cfg.partition == Partition.iid:
        return None
    labels = np.asarray(labels, dtype=np.int64)
    rng = np.random.default_rng([seed, _PARTITION_STREAM])
    part_labels = labels[train_idx]
    classes = np.unique(part_labels)
    by_class = [train_idx[rng.permutation(np.flatnonzero(part_labels == c))] for c in classes]
    if cfg.partition == Partition.classes:
        return _by_classes(by_class, classes, cfg.classes_per_worker, num_shards, rng)
    return _by_dirichlet(by_class, cfg.dirichlet_alpha, num_shards, min_size, rng)


def _by_classes(by_class: list[np.ndarray], classes: np.ndarray, m: int, k: int,
                rng: np.random.Generator) -> list[np.ndarray]:
    if m > len(classes):
        raise UserError(f"data.classes_per_worker={m} is more than the {len(classes)} classes of the training "
                        f"part; use at most {len(classes)}")
    perm = rng.permutation(len(classes))
    held = [[int(perm[(w * m + j) % len(classes)]) for j in range(m)] for w in range(k)]
    pools: list[list[np.ndarray]] = [[] for _ in range(k)]
    for c, members in enumerate(by_class):
        holders = [w for w in range(k) if c in held[w]]
        for share, w in zip(np.array_split(members, len(holders)) if holders else [], holders):
            pools[w].append(share)
    return [np.sort(np.concatenate(p)) for p in pools]


def _by_dirichlet(by_class: list[np.ndarray], alpha: float, k: int, min_size: int,
                  rng: np.random.Generator) -> list[np.ndarray]:
    for _ in range(DIRICHLET_TRIES):
        pools: list[list[np.ndarray]] = [[] for _ in range(k)]
        for members in by_class:
            shares = rng.dirichlet(np.full(k, alpha))
            cuts = np.round(np.cumsum(shares)[:-1] * len(members)).astype(np.int64)
            for w, part in enumerate(np.split(members, cuts)):
                pools[w].append(part)
        out = [np.sort(np.concatenate(p)) for p in pools]
        if min(len(p) for p in out) >= min_size:
            return out
    raise UserError(f"data.dirichlet_alpha={alpha} left a training rank with fewer than {min_size} samples "
                    f"(a batch) in {DIRICHLET_TRIES} draws; use a larger data.dirichlet_alpha, fewer ranks "
                    "or a smaller batch")


def label_skew(labels: np.ndarray, pools: list[np.ndarray], train_idx: np.ndarray) -> float:
    """Mean total-variation distance of the ranks' label distributions from the training part's."""
    labels = np.asarray(labels, dtype=np.int64)
    num_classes = int(labels.max()) + 1 if len(labels) else 1
    whole = np.bincount(labels[train_idx], minlength=num_classes) / max(len(train_idx), 1)
    tvs = [0.5 * np.abs(np.bincount(labels[p], minlength=num_classes) / max(len(p), 1) - whole).sum() for p in pools]
    return float(np.mean(tvs))


@dataclass(frozen=True)
class TrainSplit:
    """What a pipeline needs of the split: validation indices, the training ranks' shard plan,
    and what summary.json records of it."""

    val: np.ndarray
    plan: ShardPlan
    record: dict[str, Any]


def train_split(labels: Any, cfg: DataConfig, seed: int, num_shards: int, batch_size: int) -> TrainSplit:
    """The split of a training file with these labels (index order), for `num_shards` training
    ranks of `batch_size` samples a step."""
    labels = np.asarray(labels, dtype=np.int64)
    n = len(labels)
    val = validation_indices(labels, cfg)
    keep = np.ones(n, dtype=bool)
    keep[val] = False
    train_idx = np.flatnonzero(keep)
    pools = partition_pools(labels, train_idx, cfg, seed, num_shards, batch_size)
    plan = ShardPlan(n, seed, num_shards, train_idx=None if len(val) == 0 else train_idx, pools=pools)
    if pools is None:  # IID: every rank samples the whole training part afresh each epoch
        counts, skew = [plan.per_shard] * num_shards, 0.0
    else:
        counts = [len(p) for p in pools]
        skew = label_skew(labels, pools, train_idx)
    record = {"val_samples": len(val), "train_samples": len(train_idx), "split_seed": cfg.split_seed,
              "partition": str(cfg.partition),
              "worker_samples": counts, "label_skew_tv": round(skew, 6), **_partition_params(cfg)}
    return TrainSplit(val, plan, record)
