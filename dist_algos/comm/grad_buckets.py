"""Gradient averaging overlapped with the backward pass, as torch's DistributedDataParallel does it.

Averaging one flat gradient buffer after backward makes every step pay the whole transfer after
the compute; on a slow link that is most of the step. DDP instead cuts the gradients into buckets
in reverse parameter order (the order backward produces them: the last layers first), and as
soon as every gradient of a bucket has been accumulated it starts that bucket's all_reduce
asynchronously, so the transfer of the late layers' gradients runs while the early layers'
gradients are still being computed. `OverlappedAverage` does the same with gradient hooks
(`register_post_accumulate_grad_hook`):

- the gradients are views of one flat buffer (`dist_algos.comm.flat.flat_grads`), so a bucket is a
  contiguous slice of it and its all_reduce needs no copy in or out;
- buckets follow DDP's assignment: reverse parameter order, one dtype/device per bucket, a bucket
  closes once it holds at least its cap (the first cap is small, 1 MiB by default, so the first
  transfer starts early; then 25 MiB);
- a bucket's gradients are divided by the world size when it is launched, then summed (DDP's
  default hook), and buckets are launched strictly in bucket order on every rank, so the ranks
  issue their collectives in the same order whatever order their hooks fire in;
- `wait()` (before the optimizer step) launches any bucket whose hooks did not all fire (a
  parameter unused in this step keeps its zero gradient), then waits for every bucket;
- `paused()` holds the hooks during gradient accumulation (DDP's `no_sync`): only the last
  micro-batch's backward communicates.

Each bucket's all_reduce is counted and logged (`CommStats.record`) when `wait()` has seen it
complete, with the time its gradients were all there (`ready`: when its last hook fired, or the
wait for a bucket whose hooks did not all fire), its launch and its completion: the time ledger's
view of how much of the transfer backward hid. The buckets' bytes add up to the count of one
all_reduce of the whole buffer (`allreduce_bytes_split`).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.distributed as dist

from dist_algos.comm.accounting import CommStats, allreduce_bytes_split, now
from dist_algos.comm.flat import FlatBuffer, flat_grads
from dist_algos.comm.pattern import WORLD, CommOp, OpKind

MIB = 1024 * 1024
DDP_BUCKET_BYTES = 25 * MIB  # torch DDP's bucket_cap_mb default
DDP_FIRST_BUCKET_BYTES = 1 * MIB  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES


@dataclass
class Bucket:
    view: torch.Tensor  # a contiguous slice of a flat gradient buffer
    size: int  # parameters in it
    pending: int = 0  # their hooks still to fire in this backward
    work: Optional[Any] = None  # the all_reduce in flight
    params: list[int] = field(default_factory=list)  # their indices (for tests and reports)
    ready_at: Optional[float] = None  # when its last gradient arrived in this backward (`now()`)
    issued_at: Optional[float] = None  # when its collective was launched


def assign_buckets(sizes: list[tuple[Any, int]], caps: tuple[int, int]) -> list[list[int]]:
    """Parameter indices per bucket, DDP's way: given (key, bytes) per parameter in parameter
    order, walk them in reverse, one open bucket per key (dtype, device); a bucket closes once it
    holds at least its cap, the first bucket of a key having `caps[0]`, the others `caps[1]`.
    Buckets are ordered by when they close (the order backward fills them)."""
    open_: dict[Any, list[int]] = {}
    filled: dict[Any, int] = {}
    closed: dict[Any, int] = {}
    buckets: list[list[int]] = []
    for index in reversed(range(len(sizes))):
        key, nbytes = sizes[index]
        open_.setdefault(key, []).append(index)
        filled[key] = filled.get(key, 0) + nbytes
        if filled[key] >= caps[0 if not closed.get(key) else 1]:
            buckets.append(open_.pop(key))
            filled[key] = 0
            closed[key] = closed.get(key, 0) + 1
    buckets.extend(rest for rest in open_.values() if rest)
    return buckets


def bucket_members(sizes: list[int], bucket_bytes: int, first_bucket_bytes: int) -> list[list[int]]:
    """The buckets of parameters of one dtype and device with these byte sizes (parameter
    order), as `OverlappedAverage` makes them: what a declared pattern needs, without a model."""
    return assign_buckets([(0, n) for n in sizes], (first_bucket_bytes, bucket_bytes))


class OverlappedAverage:
    """Averages the gradients of `params` over `group` while backward runs (see the module doc)."""

    def __init__(self, params: list[torch.nn.Parameter], group_size: int, group: Optional[dist.ProcessGroup] = None,
                 bucket_bytes: int = DDP_BUCKET_BYTES, first_bucket_bytes: int = DDP_FIRST_BUCKET_BYTES,
                 stats: Optional[CommStats] = None) -> None:
        self.params = [p for p in params if p.requires_grad]
        self.group, self.group_size = group, group_size
        self.stats = stats if stats is not None else CommStats()  # where each bucket's collective is counted
        self.flat: FlatBuffer = flat_grads(self.params)
        self.buckets = self._make_buckets((first_bucket_bytes, bucket_bytes))
        self.wire = allreduce_bytes_split([b.view.numel() * b.view.element_size() for b in self.buckets],
                                          group_size)
        self._addresses = [p.grad.data_ptr() for p in self.params]
        self.bucket_of = {id(p): b for b in self.buckets for p in (self.params[i] for i in b.params)}
        self.next = 0  # the next bucket to launch
        self.enabled = True
        self._reset()
        self.handles = [p.register_post_accumulate_grad_hook(self._on_grad) for p in self.params]

    @property
    def nbytes(self) -> int:
        return self.flat.nbytes

    def _make_buckets(self, caps: tuple[int, int]) -> list[Bucket]:
        # Where each gradient lies in its buffer, from the views' addresses (no reference to a
        # .grad is kept: autograd accumulates in place only into a .grad nobody else holds).
        base = {(b.dtype, b.device): b for b in self.flat}
        spans = []
        for p in self.params:
            buf = base[(p.grad.dtype, p.grad.device)]
            start = (p.grad.data_ptr() - buf.data_ptr()) // buf.element_size()
            spans.append(((p.grad.dtype, p.grad.device), start, start + p.numel()))
        sizes = [(key, p.numel() * p.element_size()) for (key, _, _), p in zip(spans, self.params)]
        buckets = []
        for members in assign_buckets(sizes, caps):
            key = spans[members[0]][0]
            lo, hi = min(spans[i][1] for i in members), max(spans[i][2] for i in members)
            assert hi - lo == sum(self.params[i].numel() for i in members), "a bucket must be one slice"
            buckets.append(Bucket(view=base[key][lo:hi], size=len(members), params=members))
        return buckets

    def _reset(self) -> None:
        self.next = 0
        for b in self.buckets:
            b.pending, b.work, b.ready_at, b.issued_at = b.size, None, None, None

    def _on_grad(self, param: torch.Tensor) -> None:
        if not self.enabled:
            return
        bucket = self.bucket_of[id(param)]
        bucket.pending -= 1
        if bucket.pending <= 0:
            bucket.ready_at = now()
        while self.next < len(self.buckets) and self.buckets[self.next].pending <= 0:
            self._launch(self.buckets[self.next])

    def _launch(self, bucket: Bucket) -> None:
        bucket.issued_at = now()
        if bucket.ready_at is None:  # launched by `wait`: its gradients were there when backward ended
            bucket.ready_at = bucket.issued_at
        bucket.view.div_(self.group_size)
        bucket.work = dist.all_reduce(bucket.view, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
        self.next += 1

    def wait(self) -> None:
        """Launch what backward did not, wait for every bucket; the gradients are then the mean."""
        self._check_views()
        while self.next < len(self.buckets):
            self._launch(self.buckets[self.next])
        for i, bucket in enumerate(self.buckets):
            bucket.work.wait()
            nbytes = bucket.view.numel() * bucket.view.element_size()
            op = CommOp(OpKind.ALLREDUCE, WORLD, self.group_size, nbytes, self.wire[i], bucket=i,
                        recv_bytes=self.wire[i])
            self.stats.record(op, bucket.issued_at, now(), bucket.ready_at)
        self._reset()

    def _check_views(self) -> None:
        if any(p.grad is None or p.grad.data_ptr() != at for p, at in zip(self.params, self._addresses)):
            raise RuntimeError("allreduce: a gradient is no longer a view of the flat buffer; zero gradients "
                               "with zero_grad(set_to_none=False)")

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Backward passes inside only accumulate (DDP's no_sync): the next one communicates."""
        previous, self.enabled = self.enabled, False
        try:
            yield
        finally:
            self.enabled = previous

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = []
