"""What the parameter-server family puts on the wire, from the model's layout alone: the declared
side of its time ledger (`ParamServerAlgorithm.comm_pattern`).

Per step every worker sends one push to each server (its shard's update, with the worker's
BatchNorm statistics riding on the push to the first server) and waits for each server's reply,
in shard order; each server's thread for that worker receives the push and sends the reply. A
message is `wire.HEADER_BYTES` plus its tensors: a dense push or a model reply holds every entry
of the shard, a sparse one a per-layer top-k (`layer_k`) of int32 positions and values.

What only the run knows: a top-k leaves zeros out, so a sparse message's size is at most its k
(declared data-dependent); with a sparse downlink every worker's first reply after a resync is
the dense model, and which reply that is follows the order the server applied the pushes in:
the workers' rank order, round by round, with `serving=round_robin` (declared exactly), arrival
order with `serving=async` (every reply then declared data-dependent, at most the larger form).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

from dist_algos.comm.pattern import CommOp, ParamLayout
from dist_algos.compress.topk import layer_k
from dist_algos.param_server import wire
from dist_algos.param_server.layout import Shard, partition

#: The reference code resynchronises every 150 pushes of its first worker.
REFERENCE_RESYNC_PUSHES = 150
VALUE_BYTES = {"float32": 4, "float16": 2}
INDEX_BYTES = 4  # int32 positions


def resync_period(cfg: Any, workers: int) -> int:
    """Server versions between dense resyncs (sparse downlink)."""
    return getattr(cfg, "resync_period", None) or REFERENCE_RESYNC_PUSHES * workers


def sparse_bytes(sizes: Sequence[int], density: float, value_bytes: int) -> int:
    """The most a per-layer top-k message of these layers carries, header included."""
    return wire.HEADER_BYTES + sum(layer_k(sizes, density)) * (INDEX_BYTES + value_bytes)


def dense_bytes(numel: int, value_bytes: int) -> int:
    return wire.HEADER_BYTES + numel * value_bytes


def full_reply(worker_index: int, step: int, workers: int, period: int) -> bool:
    """Whether a worker's reply at `step` is the dense model after a resync, under round-robin
    serving: the server's version after this push is step x workers + index + 1, and a resync
    at a multiple of `period` since this worker's previous push makes its next reply dense."""
    version = step * workers + worker_index + 1
    return version // period > max(version - workers, 0) // period


def exchange_pattern(rank: int, step: int, world: int, config: Any, layout: ParamLayout,
                     downlink: str, push_density: Optional[float]) -> list[CommOp]:
    """This rank's messages at `step`: a worker's pushes, then its replies, shard by shard; a
    server's, for each worker in rank order, on the thread serving it: the push received, the
    reply sent. `push_density`: the sparse push's per-layer density (None: dense)."""
    cfg = config.algo
    servers, workers = list(range(cfg.servers)), list(range(cfg.servers, world))
    if step >= config.total_steps or not workers:
        return []
    shards = partition(layout.numels, servers)
    if rank in servers:
        shard = shards[rank]
        return [op for w in workers for op in _pair(shard, workers.index(w), w, step, len(workers), config,
                                                     layout, downlink, push_density, at_worker=False)]
    mine = workers.index(rank)
    pairs = [_pair(shard, mine, shard.server, step, len(workers), config, layout, downlink, push_density,
                   at_worker=True) for shard in shards]
    return [push for push, _ in pairs] + [pull for _, pull in pairs]


def _pair(shard: Shard, index: int, peer: int, step: int, workers: int, config: Any, layout: ParamLayout,
          downlink: str, push_density: Optional[float], at_worker: bool) -> list[CommOp]:
    """[the push, the reply] of worker number `index` to `shard`'s server, seen from one end."""
    cfg = config.algo
    value = VALUE_BYTES[cfg.value_dtype]
    if push_density is None:
        push, push_varies, density = dense_bytes(shard.numel, value), False, 0.0
    else:
        push, push_varies = sparse_bytes(shard.sizes, push_density, value), True
        density = round(push_density * wire.PPB) / wire.PPB  # as the header carries it
    if shard.start == 0:  # the first shard's push carries the BatchNorm statistics
        push += layout.buffer_bytes
    model = dense_bytes(shard.numel, layout.element_size)  # the global model's own dtype
    if downlink == "model":
        reply, reply_varies = model, False
    else:
        sparse = sparse_bytes(shard.sizes, getattr(cfg, "reply_density", None) or density or 1.0, value)
        if cfg.serving != "round_robin":
            reply, reply_varies = max(model, sparse), True
        elif full_reply(index, step, workers, resync_period(cfg, workers)):
            reply, reply_varies = model, False
        else:
            reply, reply_varies = sparse, True
    return [wire.push_op(push, peer, at_worker, push_varies), wire.pull_op(reply, peer, at_worker, reply_varies)]
