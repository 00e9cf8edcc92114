"""Persistent flat buffers: many tensors as views of one contiguous buffer.

Averaging a model tensor by tensor costs one collective per tensor (hundreds for a ResNet);
concatenating into a fresh buffer each time costs a copy. Instead, the tensors to be averaged
are made views of one buffer once, at set-up (`FlatBuffer`), so each average is a single
collective on memory that already holds the values. Tensors of different dtypes or devices get
one buffer each.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist


class FlatBuffer:
    """Makes `tensors` views of one contiguous buffer per (dtype, device); values are kept.

    `attach` re-points each tensor's storage: for parameters it sets `p.data`, so the Parameter
    objects (and optimizer references to them) stay the same; for gradients pass
    `getter=lambda p: p.grad, setter=lambda p, v: setattr(p, 'grad', v)`; for places that are
    not tensor attributes (optimizer state), owners can be `Slot`s.
    """

    def __init__(self, owners: Iterable[Any],
                 getter: Callable[[Any], Optional[torch.Tensor]] = lambda p: p.data,
                 setter: Callable[[Any, torch.Tensor], None] = lambda p, v: setattr(p, "data", v),
                 like_owner: bool = False) -> None:
        self.owners = list(owners)
        self.buffers: list[torch.Tensor] = []
        groups: dict[tuple[torch.dtype, torch.device], list[Any]] = {}
        for owner in self.owners:
            ref = owner if like_owner else getter(owner)
            if ref is None:
                raise ValueError("FlatBuffer: a tensor to flatten is None (use like_owner=True for grads)")
            groups.setdefault((ref.dtype, ref.device), []).append(owner)
        for (dtype, device), members in groups.items():
            refs = [m if like_owner else getter(m) for m in members]
            flat = torch.zeros(sum(r.numel() for r in refs), dtype=dtype, device=device)
            offset = 0
            for member, ref in zip(members, refs):
                view = flat[offset:offset + ref.numel()].view_as(ref)
                current = getter(member)
                if current is not None:
                    view.copy_(current)
                setter(member, view)
                offset += ref.numel()
            self.buffers.append(flat)

    @property
    def numel(self) -> int:
        return sum(b.numel() for b in self.buffers)

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers)

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(self.buffers)


class Slot:
    """A place holding a tensor that is not itself a tensor attribute (an optimizer-state entry,
    say), so it can be a `FlatBuffer` owner: `FlatBuffer(slots, getter=Slot.read, setter=Slot.write)`."""

    __slots__ = ("_get", "_set")

    def __init__(self, get: Callable[[], Optional[torch.Tensor]], set: Callable[[torch.Tensor], None]) -> None:
        self._get, self._set = get, set

    def read(self) -> Optional[torch.Tensor]:
        return self._get()

    def write(self, value: torch.Tensor) -> None:
        self._set(value)


def flat_grads(params: Iterable[torch.nn.Parameter]) -> FlatBuffer:
    """Gradients of `params` as views of one buffer (zero-filled until the first backward).

    Autograd accumulates into an existing `.grad` in place, so the views survive backward
    passes as long as gradients are zeroed with `zero_grad(set_to_none=False)`.
    """
    return FlatBuffer([p for p in params if p.requires_grad], getter=lambda p: p.grad,
                      setter=lambda p, v: setattr(p, "grad", v), like_owner=True)


#: Default size cap of one all_reduce in `average_`. Gloo's ring is most efficient on large
#: buffers, so buckets are few and large: on the 2-core development machine a ResNet-50-sized
#: average (100 MB) measured 1.17-1.22x the bare all_reduce with 16 MiB buckets and 1.10-1.16x
#: with two equal halves (bench/averaging.py, 31 repeats; a bare all_reduce followed by one
#: divide measures 1.12-1.19x there, since 4 ranks on 2 cores leave no idle core to hide it).
BUCKET_BYTES = 64 * 2**20
#: Collectives in flight at once in `average_` (ProcessGroupGloo runs two at a time by default).
INFLIGHT = 2


def buckets(buf: torch.Tensor, bucket_bytes: Optional[int]) -> list[torch.Tensor]:
    """Contiguous views of `buf` of equal size, each at most `bucket_bytes` (None or 0: the whole
    buffer). Equal pieces, because only the last piece's divide is left exposed."""
    flat = buf.view(-1)
    nbytes = flat.numel() * flat.element_size()
    if not bucket_bytes or nbytes <= bucket_bytes:
        return [flat]
    count = -(-nbytes // bucket_bytes)
    return list(flat.split(-(-flat.numel() // count)))


def average_(buffers: Iterable[torch.Tensor], group: Optional[dist.ProcessGroup], group_size: int,
             bucket_bytes: Optional[int] = BUCKET_BYTES, inflight: int = INFLIGHT) -> None:
    """In-place mean of each buffer over `group` (all ranks of the group call this alike).

    NCCL averages inside the collective (`ReduceOp.AVG`), one call per buffer. Elsewhere (gloo)
    a SUM is followed by a divide, which is a full extra pass over memory; to hide it behind the
    communication each buffer is cut into size-capped buckets whose all_reduces are issued
    asynchronously, `inflight` at a time, and bucket i is divided while the next ones are still
    being reduced. Only the last bucket's divide is left exposed.
    """
    if group_size <= 1:
        return
    if "nccl" in str(dist.get_backend(group)):  # "nccl" or "cpu:gloo,cuda:nccl" (core.distenv)
        for buf in buffers:
            dist.all_reduce(buf, op=dist.ReduceOp.AVG, group=group)
        return
    pieces = [piece for buf in buffers for piece in buckets(buf, bucket_bytes)]
    works: list[Any] = []
    for i, piece in enumerate(pieces):
        while len(works) < min(len(pieces), i + max(1, inflight)):
            works.append(dist.all_reduce(pieces[len(works)], op=dist.ReduceOp.SUM, group=group, async_op=True))
        works[i].wait()
        piece.div_(group_size)
