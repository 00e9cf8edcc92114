"""This rank's view of the data: what it asks for (its training shard, its evaluation slice, its
batch sizes), the steps per epoch every rank agrees on, and the batches a plugin may read to
re-estimate BatchNorm statistics."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Optional

import torch
import torch.distributed as dist

from core.distenv import DistContext
from data import DataRequest
from engine.ft.config import Replica
from engine.plan import RunPlan


def data_request(plan: RunPlan, ctx: DistContext, replica: Optional[Replica] = None) -> DataRequest:
    """This rank's part of the data: its training shard (None on serving ranks) and test slice.
    A fault-tolerant replica trains on shard `index` of `count` and evaluates the whole test set
    (an evaluation sum over replicas would be a collective a failure could break)."""
    train, evaluate = plan.layout.train, plan.layout.evaluate
    per_rank = plan.batch.per_rank
    if replica is not None:
        parts = {"shard": replica.index, "num_shards": replica.count, "eval_shard": 0, "eval_num_shards": 1}
    else:
        parts = {"shard": train.index(ctx.rank) if ctx.rank in train else None, "num_shards": len(train),
                 "eval_shard": evaluate.index(ctx.rank) if ctx.rank in evaluate else 0,
                 "eval_num_shards": len(evaluate)}
    return DataRequest(batch_size=per_rank, eval_batch_size=plan.config.data.eval_batch_size or max(per_rank, 64),
                       seed=plan.config.seed, device=ctx.device, **parts)


def agree_steps_per_epoch(train_stream: Any, first_train_rank: int) -> int:
    """The training ranks' steps per epoch, known on serving ranks too (they step along)."""
    box = [train_stream.steps_per_epoch if train_stream is not None else 0]
    dist.broadcast_object_list(box, src=first_train_rank)
    return int(box[0])


def reestimation_batches(train_stream: Any, epoch: int, n: int,
                         device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Up to n training batches of `epoch`'s shard, for BatchNorm re-estimation; leaves the
    training position and the RNG as they were."""
    if train_stream is None:
        return
    with torch.random.fork_rng(devices=[]):
        for i, (x, y) in enumerate(train_stream.batches(epoch, 0)):
            if i >= n:
                break
            yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)
