"""A corpus's split into training, validation and test text by contiguous blocks, and the training
text's partition over the training ranks: pure functions of the corpus and the config, so every
rank computes the same split with no communication (as `data.split` does for labelled sets).

Blocks (`contiguous_blocks`): the corpus is cut into `data.split_blocks` blocks of (nearly) equal
length; a seeded permutation (`data.split_seed`: one split for every run seed) makes
round(B x test_fraction) of them test and round(B x val_fraction) validation, the rest training.
A window never straddles two blocks (training windows lie inside a training block, evaluation
windows tile a held-out block), so no training window shares a character with a held-out one.
Held-out blocks are spread over the whole corpus, every play contributing, rather than its last
tenth (nanoGPT's cut), so that a source partition is not judged on plays no rank trained on.

Partition (`data.partition`): `iid` gives every rank the whole training text (random windows
over all of it); `source` gives each rank whole sources (`data.source_unit`: `play`, or `role`,
a play's speaking role as LEAF's Shakespeare benchmark makes each role a client), dealt out in a
seeded order, each to the rank holding the fewest training characters so far. A rank reads windows
inside its plays' training text (`play`), or over the concatenation of its roles' speeches in
corpus order (`role`: most speeches are shorter than a window; LEAF likewise joins a role's
lines). The partition is drawn from the run's seed and fixed for the run.

Skew (`text_skew`): the mean over ranks of the total-variation distance between the rank's
character distribution and the training text's, for single characters and for pairs of adjacent
characters; IID records 0 (every rank samples the whole training text).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import torch

from core.errors import UserError
from data.config import DataConfig, Partition
from data.text.corpus import TextCorpus
from data.text.windows import Pool, WindowPlan, tiling_starts

Intervals = list[tuple[int, int]]
TRAIN, VAL, TEST = 0, 1, 2
_PARTITION_STREAM = 0x5EED_1D  # as data.split's: the partition's generator apart from the epochs'


@dataclass(frozen=True)
class Blocks:
    bounds: np.ndarray  # int64, B + 1 offsets into the corpus
    part: np.ndarray  # int64, B: TRAIN, VAL or TEST

    def intervals(self, part: int) -> Intervals:
        return [(int(self.bounds[b]), int(self.bounds[b + 1])) for b in np.flatnonzero(self.part == part)]


def held_out_blocks(num_blocks: int, fraction: Optional[float]) -> int:
    return round(num_blocks * fraction) if fraction else 0


def contiguous_blocks(n: int, num_blocks: int, val_fraction: Optional[float], test_fraction: float,
                      split_seed: int) -> Blocks:
    n_test, n_val = held_out_blocks(num_blocks, test_fraction), held_out_blocks(num_blocks, val_fraction)
    if n_test < 1 or n_test + n_val >= num_blocks:
        raise UserError(f"data.split_blocks={num_blocks} with data.test_fraction={test_fraction} and "
                        f"data.val_fraction={val_fraction} gives {n_test} test, {n_val} validation and "
                        f"{num_blocks - n_test - n_val} training blocks; each needs at least one (change the fractions "
                        "or data.split_blocks)")
    bounds = np.round(np.linspace(0, n, num_blocks + 1)).astype(np.int64)
    order = np.random.default_rng([split_seed, 11]).permutation(num_blocks)
    part = np.full(num_blocks, TRAIN, dtype=np.int64)
    part[order[:n_test]] = TEST
    part[order[n_test:n_test + n_val]] = VAL
    return Blocks(bounds, part)


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """The parts common to two sorted lists of disjoint intervals."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo < hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def source_runs(corpus: TextCorpus, unit: str, owner: np.ndarray) -> list[Intervals]:
    """Each rank's text in corpus order as intervals: the runs of consecutive speeches whose source
    (of `unit`) rank `owner[source]` holds."""
    held = owner[corpus.speech_sources[unit]]  # the rank of every speech
    runs: list[Intervals] = [[] for _ in range(int(owner.max()) + 1)]
    change = np.flatnonzero(np.diff(held)) + 1
    for first, stop in zip(np.concatenate([[0], change]), np.concatenate([change, [len(held)]])):
        runs[int(held[first])].append((int(corpus.speech_bounds[first]), int(corpus.speech_bounds[stop])))
    return runs


def source_sizes(corpus: TextCorpus, unit: str, intervals: Intervals) -> np.ndarray:
    """Each source's characters inside `intervals` (the training text)."""
    edges = np.zeros(len(corpus) + 1, dtype=np.int64)
    for lo, hi in intervals:
        edges[lo] += 1
        edges[hi] -= 1
    inside = np.concatenate([[0], np.cumsum(np.cumsum(edges)[:-1])])  # inside[i]: chars before i in intervals
    per_speech = inside[corpus.speech_bounds[1:]] - inside[corpus.speech_bounds[:-1]]
    return np.bincount(corpus.speech_sources[unit], weights=per_speech,
                       minlength=len(corpus.source_names[unit])).astype(np.int64)


def deal_sources(sizes: np.ndarray, num_shards: int, rng: np.random.Generator) -> np.ndarray:
    """Source -> rank: sources in a seeded order, each to the rank with the fewest characters so far."""
    owner = np.zeros(len(sizes), dtype=np.int64)
    load = np.zeros(num_shards, dtype=np.int64)
    for source in rng.permutation(len(sizes)):
        owner[source] = int(np.argmin(load))
        load[owner[source]] += sizes[source]
    return owner


def gather(ids: torch.Tensor, intervals: Intervals) -> np.ndarray:
    parts = [ids[lo:hi].numpy() for lo, hi in intervals]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint8)


def _distribution(texts: Sequence[np.ndarray], vocab: int, pairs: bool) -> np.ndarray:
    counts = np.zeros(vocab * vocab if pairs else vocab, dtype=np.float64)
    for t in texts:
        t = t.astype(np.int64)
        counts += np.bincount(t[:-1] * vocab + t[1:] if pairs else t, minlength=len(counts))
    return counts / max(counts.sum(), 1.0)


def text_skew(ranks: Sequence[Sequence[np.ndarray]], whole: Sequence[np.ndarray], vocab: int) -> dict[str, float]:
    """Mean total-variation distance of each rank's character (and adjacent-pair) distribution from
    the whole training text's; `ranks[k]`: rank k's pieces of text, `whole`: the training text's."""
    out = {}
    for key, pairs in (("char_skew_tv", False), ("bigram_skew_tv", True)):
        p = _distribution(whole, vocab, pairs)
        out[key] = round(float(np.mean([0.5 * np.abs(_distribution(r, vocab, pairs) - p).sum() for r in ranks])), 6)
    return out


@dataclass(frozen=True)
class TextSplit:
    """The training ranks' windows (`plan`), the held-out windows' starts, and the record."""

    plan: WindowPlan
    val: np.ndarray  # starts (corpus positions) of the validation windows
    test: np.ndarray
    record: dict[str, Any]


def text_split(corpus: TextCorpus, cfg: DataConfig, context: int, num_blocks: int, unit: str, seed: int,
               num_shards: int) -> TextSplit:
    """The split of `corpus` for `num_shards` training ranks reading windows of `context` tokens."""
    blocks = contiguous_blocks(len(corpus), num_blocks, cfg.val_fraction, cfg.test_fraction, cfg.split_seed)
    train = blocks.intervals(TRAIN)
    num_windows = int(sum((hi - lo - 1) // context for lo, hi in train))
    record: dict[str, Any] = {"partition": str(cfg.partition), "context_length": context, "split_blocks": num_blocks,
                              "eval_windows": cfg.eval_windows}
    if cfg.partition == Partition.source:
        rng = np.random.default_rng([seed, _PARTITION_STREAM])
        sizes = source_sizes(corpus, unit, train)
        if (sizes > 0).sum() < num_shards:
            raise UserError(f"data.partition=source deals {int((sizes > 0).sum())} {unit}s to {num_shards} training "
                            f"ranks; use at most that many ranks, or data.source_unit=role")
        owner = deal_sources(sizes, num_shards, rng)
        texts = [intersect(runs, train) for runs in source_runs(corpus, unit, owner)]
        texts += [[] for _ in range(num_shards - len(texts))]
        if unit == "role":  # a rank's speeches, joined: windows run from one into the next
            pools = [Pool.of(torch.from_numpy(gather(corpus.ids, t)), [(0, sum(b - a for a, b in t))], context)
                     for t in texts]
        else:
            pools = [Pool.of(corpus.ids, t, context) for t in texts]
        pieces = [[gather(corpus.ids, t)] if unit == "role" else [gather(corpus.ids, [iv]) for iv in t] for t in texts]
        record.update(source_unit=unit, worker_sources=[int((owner == k).sum()) for k in range(num_shards)],
                      worker_chars=[int(sum(len(p) for p in ps)) for ps in pieces],
                      **text_skew(pieces, [gather(corpus.ids, [iv]) for iv in train], len(corpus.vocab)))
    else:
        pools = [Pool.of(corpus.ids, train, context)] * num_shards
        record.update(worker_chars=[int(sum(hi - lo for lo, hi in train))] * num_shards,
                      char_skew_tv=0.0, bigram_skew_tv=0.0)
    empty = [k for k, pool in enumerate(pools) if pool.size == 0]
    if empty:
        raise UserError(f"training rank {empty[0]} has no window of data.context_length={context} in its text; use a "
                        "shorter context or fewer ranks")
    val = tiling_starts(blocks.intervals(VAL), context, cfg.eval_windows)
    test = tiling_starts(blocks.intervals(TEST), context, cfg.eval_windows)
    chars = {name: int(sum(hi - lo for lo, hi in blocks.intervals(part)))
             for name, part in (("train_chars", TRAIN), ("val_chars", VAL), ("test_chars", TEST))}
    record.update(train_samples=num_windows, val_samples=len(val), test_samples=len(test), split_seed=cfg.split_seed,
                  **chars,
                  worker_samples=[num_windows // num_shards] * num_shards)
    return TextSplit(WindowPlan(pools, num_windows, seed, context), val, test, record)
