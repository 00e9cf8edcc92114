"""The server's logic without transport: versions, staleness, DGS replies, resync, state, turns."""
from __future__ import annotations

import threading
import time

import torch

from dist_algos.compress.topk import layer_k
from dist_algos.param_server import wire
from dist_algos.param_server.layout import Shard
from dist_algos.param_server.server import ServerState, Turns

SIZES = (6, 10)
N = sum(SIZES)


def make_state(downlink: str = "sparse", reply_density: float | None = None, resync_period: int = 100) -> ServerState:
    shard = Shard(server=0, start=0, end=N, sizes=SIZES)
    return ServerState(shard, torch.arange(N, dtype=torch.float32), workers=[1, 2], downlink=downlink,
                       reply_density=reply_density, resync_period=resync_period, value_dtype=torch.float32)


def push(values: torch.Tensor, density: float) -> wire.Message:
    idx = torch.nonzero(values).flatten()
    return wire.sparse(idx, values[idx], torch.float32, density=density)


def test_versions_staleness_and_what_each_worker_holds() -> None:
    state = make_state()
    held = {w: torch.arange(N, dtype=torch.float32) for w in (1, 2)}  # the workers' copies
    gen = torch.Generator().manual_seed(0)
    order = [1, 2, 2, 1, 1, 2, 1]
    expected_staleness = [0, 1, 0, 2, 0, 2, 1]
    for w, want in zip(order, expected_staleness):
        update = torch.randn(N, generator=gen) * (torch.rand(N, generator=gen) < 0.4)
        before = state.global_model.clone()
        missing = before - update - held[w]  # what w lacks once its push is applied
        reply = state.apply(w, push(update, 0.5))
        assert torch.allclose(state.global_model, before - update)
        assert reply.staleness == want and reply.version == state.version
        # the per-layer top-k of what w lacks, at the push's density, zeros left out
        assert reply.kind == wire.Kind.SPARSE
        idx = reply.indices.long()
        assert torch.allclose(reply.values, missing[idx])
        chosen = torch.zeros(N, dtype=torch.bool)
        chosen[idx] = True
        offset = 0
        for n, k in zip(SIZES, layer_k(SIZES, 0.5)):
            layer, picked = missing[offset:offset + n].abs(), chosen[offset:offset + n]
            assert int(picked.sum()) == min(k, int(torch.count_nonzero(layer)))
            if picked.any() and not picked.all():
                assert layer[picked].min() >= layer[~picked].max()
            offset += n
        held[w][idx] += reply.values
        assert torch.allclose(held[w], state.held(w))
    assert state.version == len(order)
    assert [s["pushes"] for s in state.worker_stats()] == [4, 3]
    assert [s["staleness_max"] for s in state.worker_stats()] == [2, 2]


def test_fixed_reply_density_resync_and_dense_downlink() -> None:
    state = make_state(reply_density=0.25, resync_period=3)
    replies = [state.apply(1 + k % 2, push(torch.ones(N), 1.0)) for k in range(4)]
    assert [r.kind for r in replies] == [wire.Kind.SPARSE] * 2 + [wire.Kind.MODEL, wire.Kind.MODEL]
    assert replies[0].count == sum(layer_k(SIZES, 0.25))
    # version 3 resynced: worker 1 (version 3) and then worker 2 (version 4) get the synced model once
    assert state.resyncs == 1 and torch.equal(replies[3].values, state.synced)
    # both copies are now the synced model (version 3), so worker 2 still misses its own push
    assert torch.equal(state.held(1), state.synced) and torch.equal(state.held(2), state.synced)
    assert torch.equal(state.global_model - state.synced, torch.full((N,), -1.0))
    assert state.apply(1, push(torch.ones(N), 1.0)).kind == wire.Kind.SPARSE
    dense = make_state(downlink="model")
    reply = dense.apply(2, wire.dense(torch.ones(N), torch.float32))
    assert reply.kind == wire.Kind.MODEL and torch.equal(reply.values, torch.arange(N) - 1.0)
    assert dense.synced is None


def test_state_round_trip() -> None:
    state = make_state(resync_period=2)
    for k in range(5):
        state.apply(1 + k % 2, push(torch.full((N,), 0.5), 0.3))
    state.buffers[0] = torch.ones(3)
    saved = state.state_dict()
    copy = make_state(resync_period=2)
    copy.load_state_dict(saved)
    assert torch.equal(copy.global_model, state.global_model) and torch.equal(copy.missing[1], state.missing[1])
    assert copy.worker_stats() == state.worker_stats() and copy.version == 5 and copy.resyncs == 2
    a, b = state.apply(2, push(torch.ones(N), 0.3)), copy.apply(2, push(torch.ones(N), 0.3))
    assert torch.equal(a.values, b.values) and a.staleness == b.staleness


def test_round_robin_turns_serve_in_rank_order_and_skip_leavers() -> None:
    turns = Turns([3, 1, 2], ordered=True)
    served: list[int] = []

    def worker(w: int, pushes: int, delay: float) -> None:
        for _ in range(pushes):
            time.sleep(delay)
            with turns.turn(w):
                served.append(w)
        turns.leave(w)

    plan = ((3, 3, 0.0), (1, 3, 0.01), (2, 1, 0.002))  # (rank, pushes, delay before each)
    threads = [threading.Thread(target=worker, args=args) for args in plan]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert served == [1, 2, 3, 1, 3, 1, 3]
