"""The interface between a data pipeline and the trainer.

The trainer says what this rank needs (`DataRequest`); a pipeline gives it a `TrainStream`
(this rank's shard of the training part, as batches from a given position) and `EvalStream`s
(this rank's slice of the test set, and of the validation samples carved out of the training
file: `data.split`). The trainer only ever asks for `batches(epoch, start)`,
which is all an exact resume needs.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Optional, Protocol

import torch

from data.sampler import ShardPlan, eval_slice

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass(frozen=True)
class DataRequest:
    """What the trainer asks of a pipeline on this rank."""

    batch_size: int  # per training rank
    eval_batch_size: int
    seed: int
    shard: Optional[int]  # index among the training ranks; None: this rank does not train
    num_shards: int
    eval_shard: int
    eval_num_shards: int
    device: Any = "cpu"


class TrainStream(Protocol):
    steps_per_epoch: int
    num_samples: int  # training samples in the whole data set

    def batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        """Batches start, start+1, ... of this rank's shard for that epoch."""
        ...


class EvalStream(Protocol):
    num_samples: int  # samples of the whole evaluation set (test, or validation)

    def batches(self) -> Iterator[Batch]:
        """This rank's slice of the evaluation set (possibly empty)."""
        ...


class TensorTrainStream:
    """A training shard over in-memory tensors (the digits set; tests). `plan`: the ranks'
    orders (`data.sampler.ShardPlan`); None: IID over all of `x`."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int, seed: int,
                 shard: int, num_shards: int, plan: Optional[ShardPlan] = None) -> None:
        self.x, self.y = x, y
        self.batch_size, self.seed = batch_size, seed
        self.shard, self.num_shards = shard, num_shards
        self.plan = plan if plan is not None else ShardPlan(len(x), seed, num_shards)
        self.num_samples = len(x)
        self.steps_per_epoch = self.plan.per_shard // batch_size

    def batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        idx = self.plan.order(epoch, self.shard)
        for b in range(start, self.steps_per_epoch):
            sel = idx[b * self.batch_size:(b + 1) * self.batch_size]
            yield self.x[sel], self.y[sel]


class TensorEvalStream:
    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int, shard: int,
                 num_shards: int) -> None:
        self.num_samples = len(x)
        sl = eval_slice(len(x), shard, num_shards)
        self.x, self.y = x[sl.start:sl.stop], y[sl.start:sl.stop]
        self.batch_size = batch_size

    def batches(self) -> Iterator[Batch]:
        for i in range(0, len(self.x), self.batch_size):
            yield self.x[i:i + self.batch_size], self.y[i:i + self.batch_size]
