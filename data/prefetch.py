"""Overlap for the pipelines that hand batches over in host memory (torchvision, in-memory
tensors) when the ranks train on a GPU: the next batch is copied to the GPU on a side CUDA
stream while the current one computes.

Without it the copy of batch i+1 starts only when the trainer asks for it, on the compute
stream, so the GPU idles for the transfer every step. Here the stream keeps one batch ahead:
when batch i is handed out, batch i+1 has already been taken from the loader and its copy
issued (from pinned memory, so it runs asynchronously) on a side stream; handing a batch out
makes the compute stream wait for that copy's event and tells the allocator the tensors are used
there. On the CPU nothing is copied, and the stream is returned as it is (a pass-through).

`Lookahead` is the ordering (which batch is staged when), free of CUDA, so it is tested on the
CPU; `CudaStager` is the copy.
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any, Callable, Generic, TypeVar

import torch

T = TypeVar("T")
S = TypeVar("S")


class Lookahead(Generic[T, S]):
    """Yields `finish(stage(item))` for the items of `source` in order, with `stage` called
    `depth` items ahead of what has been yielded (the staged items wait in a queue)."""

    def __init__(self, source: Iterator[T], stage: Callable[[T], S], finish: Callable[[S], T],
                 depth: int = 1) -> None:
        self.source, self.stage, self.finish, self.depth = source, stage, finish, depth

    def __iter__(self) -> Iterator[T]:
        staged: deque[S] = deque()
        for item in self.source:
            staged.append(self.stage(item))
            if len(staged) > self.depth:
                yield self.finish(staged.popleft())
        while staged:
            yield self.finish(staged.popleft())


class CudaStager:
    """Copies a batch's tensors to `device` on a side stream; `finish` hands them to the
    current stream once copied."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)

    def stage(self, batch: tuple[torch.Tensor, ...]) -> tuple[tuple[torch.Tensor, ...], Any]:
        with torch.cuda.stream(self.stream):
            moved = tuple(self._to_device(t) for t in batch)
            event = torch.cuda.Event()
            event.record(self.stream)
        return moved, event

    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        if t.device == self.device:
            return t
        if t.device.type == "cpu" and not t.is_pinned():  # an asynchronous copy needs pinned memory
            t = t.pin_memory()
        return t.to(self.device, non_blocking=True)

    def finish(self, staged: tuple[tuple[torch.Tensor, ...], Any]) -> tuple[torch.Tensor, ...]:
        moved, event = staged
        current = torch.cuda.current_stream(self.device)
        current.wait_event(event)
        for t in moved:
            t.record_stream(current)  # allocated on the side stream, freed after use on this one
        return moved


class PrefetchedStream:
    """A train or eval stream whose `batches(...)` arrive on the GPU one batch ahead; any other
    attribute (steps_per_epoch, num_samples, close) is the wrapped stream's."""

    def __init__(self, inner: Any, device: torch.device, depth: int = 1) -> None:
        self.inner, self.depth = inner, depth
        self.stager = CudaStager(device)

    def batches(self, *args: Any) -> Iterator[Any]:
        return iter(Lookahead(self.inner.batches(*args), self.stager.stage, self.stager.finish, self.depth))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def prefetched(stream: Any, device: Any) -> Any:
    """`stream` with batches copied ahead to `device` when that is a GPU; else `stream` itself."""
    if stream is None or torch.device(device).type != "cuda":
        return stream
    return PrefetchedStream(stream, torch.device(device))
