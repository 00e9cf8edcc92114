"""Persistent flat buffers: many tensors as views of one contiguous buffer.

Averaging a model tensor by tensor costs one collective per tensor (hundreds for a ResNet);
concatenating into a fresh buffer each time costs a copy. Instead, the tensors to be averaged
are made views of one buffer once, at set-up (`FlatBuffer`), so each average is a single
collective on memory that already holds the values. Tensors of different dtypes or devices get
one buffer each.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Callable, Optional

import torch
import torch.distributed as dist


class FlatBuffer:
    """Makes `tensors` views of one contiguous buffer per (dtype, device); values are kept.

    `attach` re-points each tensor's storage: for parameters it sets `p.data`, so the Parameter
    objects (and optimizer references to them) stay the same; for gradients pass
    `getter=lambda p: p.grad, setter=lambda p, v: setattr(p, 'grad', v)`.
    """

    def __init__(self, owners: Iterable[torch.Tensor],
                 getter: Callable[[torch.Tensor], Optional[torch.Tensor]] = lambda p: p.data,
                 setter: Callable[[torch.Tensor, torch.Tensor], None] = lambda p, v: setattr(p, "data", v),
                 like_owner: bool = False) -> None:
        self.owners = list(owners)
        self.buffers: list[torch.Tensor] = []
        groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
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


def flat_grads(params: Iterable[torch.nn.Parameter]) -> FlatBuffer:
    """Gradients of `params` as views of one buffer (zero-filled until the first backward).

    Autograd accumulates into an existing `.grad` in place, so the views survive backward
    passes as long as gradients are zeroed with `zero_grad(set_to_none=False)`.
    """
    return FlatBuffer([p for p in params if p.requires_grad], getter=lambda p: p.grad,
                      setter=lambda p, v: setattr(p, "grad", v), like_owner=True)


def average_(buffers: Iterable[torch.Tensor], group: Optional[dist.ProcessGroup], group_size: int) -> None:
    """In-place mean of each buffer over `group`: one all_reduce per buffer, then a scale."""
    for buf in buffers:
        dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=group)
        buf.div_(group_size)
