"""The prefetcher for host-memory pipelines (data/prefetch.py): its ordering on the CPU, the
pass-through on a CPU run, and the real side-stream copy on a GPU (`gpu`)."""
from __future__ import annotations

import pytest
import torch

from data.prefetch import Lookahead, prefetched


def test_one_batch_ahead_in_order() -> None:
    events: list[str] = []

    def source():
        for i in range(4):
            events.append(f"read {i}")
            yield i

    def stage(i: int) -> int:
        events.append(f"stage {i}")
        return i * 10

    def finish(s: int) -> int:
        events.append(f"finish {s // 10}")
        return s // 10

    got = []
    for item in Lookahead(source(), stage, finish, depth=1):
        events.append(f"use {item}")
        got.append(item)
    assert got == [0, 1, 2, 3]
    # batch i+1 is read and staged before batch i is used; the last one is finished after the end
    assert events[:6] == ["read 0", "stage 0", "read 1", "stage 1", "finish 0", "use 0"]
    assert events[-3:] == ["use 2", "finish 3", "use 3"]
    assert list(Lookahead(iter([]), stage, finish)) == []


def test_abandoned_epoch_stops_reading() -> None:
    read = []

    def source():
        for i in range(100):
            read.append(i)
            yield i

    it = iter(Lookahead(source(), lambda i: i, lambda i: i, depth=2))
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    it.close()
    assert read == [0, 1, 2, 3, 4]  # depth ahead, no further


def test_cpu_runs_pass_streams_through() -> None:
    stream = object()
    assert prefetched(stream, "cpu") is stream and prefetched(None, "cuda:0") is None


@pytest.mark.gpu
def test_side_stream_copies_arrive_intact() -> None:
    from data.stream import TensorTrainStream

    x, y = torch.randn(64, 1, 8, 8), torch.arange(64)
    host = TensorTrainStream(x, y, batch_size=8, seed=0, shard=0, num_shards=1)
    device = torch.device("cuda", torch.cuda.current_device())
    fast = prefetched(host, device)
    assert fast.steps_per_epoch == host.steps_per_epoch
    for (a, b), (c, d) in zip(host.batches(1, 2), fast.batches(1, 2)):
        assert c.device == device and torch.equal(a, c.cpu()) and torch.equal(b, d.cpu())
