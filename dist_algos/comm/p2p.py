"""Point-to-point sends and receives that work on every process group a run makes.

Gloo's send and recv read and write host memory only (its collectives copy CUDA tensors
themselves, its point-to-point calls do not), and a bare NCCL group carries CUDA tensors only.
When ranks share a GPU the process group is gloo while models, gradients and messages live on the
GPU (`core.distenv.plan_devices`), so a plugin's CUDA payloads on a gloo group travel through a
host copy here: sent from a host copy, received into a host buffer and copied to the target
when the receive is waited on. Everything else goes straight to torch.distributed. The plugins
call these instead of `dist.isend`/`irecv`/`send`/`recv`, so none of them branches on the backend.
"""
from __future__ import annotations

import datetime
from typing import Any, Optional

import torch
import torch.distributed as dist


def staging_device(backend: str, tensor_device: torch.device) -> Optional[torch.device]:
    """Where a tensor on `tensor_device` must be copied to travel point-to-point on a group of
    `backend` (as `dist.get_backend` names it); None: it travels as it is."""
    backend = str(backend)
    devices = {part.split(":")[0] for part in backend.split(",")} if ":" in backend else None
    if devices is not None:  # "cpu:gloo,cuda:nccl": a backend per device type
        return None if tensor_device.type in devices else torch.device("cpu")
    if backend == "gloo" and tensor_device.type != "cpu":
        return torch.device("cpu")
    if backend == "nccl" and tensor_device.type == "cpu":
        return torch.device("cuda", torch.cuda.current_device())
    return None


def _carrier(tensor: torch.Tensor, group: Any) -> Optional[torch.device]:
    return staging_device(dist.get_backend(group), tensor.device)


def _copy_to(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A copy on `device` (pinned when it is the host side of a GPU copy, for a fast transfer)."""
    pin = device.type == "cpu" and tensor.device.type == "cuda"
    out = torch.empty(tensor.shape, dtype=tensor.dtype, device=device, pin_memory=pin)
    return out.copy_(tensor)


class _StagedRecv:
    """A receive into a staging buffer that lands in its target when waited on (a `Work`)."""

    def __init__(self, work: Any, staged: torch.Tensor, target: torch.Tensor) -> None:
        self.work, self.staged, self.target = work, staged, target
        self._landed = False

    def wait(self, timeout: Optional[datetime.timedelta] = None) -> bool:
        done = self.work.wait() if timeout is None else self.work.wait(timeout=timeout)
        if not self._landed:
            self.target.copy_(self.staged)
            self._landed = True
        return done

    def is_completed(self) -> bool:
        return self.work.is_completed()


class _KeepAlive:
    """A send's `Work` holding its staging copy until the send is done."""

    def __init__(self, work: Any, staged: torch.Tensor) -> None:
        self.work, self.staged = work, staged

    def wait(self, timeout: Optional[datetime.timedelta] = None) -> bool:
        return self.work.wait() if timeout is None else self.work.wait(timeout=timeout)

    def is_completed(self) -> bool:
        return self.work.is_completed()


def isend_via(carrier: Optional[torch.device], tensor: torch.Tensor, dst: int, group: Any = None,
              tag: int = 0) -> Any:
    """`dist.isend` of `tensor`, through a copy on `carrier` when it is not None."""
    if carrier is None:
        return dist.isend(tensor, dst=dst, group=group, tag=tag)
    staged = _copy_to(tensor, carrier)
    return _KeepAlive(dist.isend(staged, dst=dst, group=group, tag=tag), staged)


def irecv_via(carrier: Optional[torch.device], tensor: torch.Tensor, src: Optional[int], group: Any = None,
              tag: int = 0) -> Any:
    """`dist.irecv` into `tensor`, through a buffer on `carrier` when it is not None."""
    if carrier is None:
        return dist.irecv(tensor, src=src, group=group, tag=tag)
    staged = torch.empty(tensor.shape, dtype=tensor.dtype, device=carrier,
                         pin_memory=carrier.type == "cpu" and tensor.device.type == "cuda")
    return _StagedRecv(dist.irecv(staged, src=src, group=group, tag=tag), staged, tensor)


def isend(tensor: torch.Tensor, dst: int, group: Any = None, tag: int = 0) -> Any:
    return isend_via(_carrier(tensor, group), tensor, dst, group, tag)


def irecv(tensor: torch.Tensor, src: Optional[int], group: Any = None, tag: int = 0) -> Any:
    return irecv_via(_carrier(tensor, group), tensor, src, group, tag)


def send(tensor: torch.Tensor, dst: int, group: Any = None, tag: int = 0) -> None:
    isend(tensor, dst, group, tag).wait()


def recv(tensor: torch.Tensor, src: Optional[int] = None, group: Any = None, tag: int = 0) -> int:
    """Blocking receive into `tensor`; returns the sender's rank (any sender when `src` is None)."""
    carrier = _carrier(tensor, group)
    if carrier is None:
        return dist.recv(tensor, src=src, group=group, tag=tag)
    staged = torch.empty(tensor.shape, dtype=tensor.dtype, device=carrier)
    sender = dist.recv(staged, src=src, group=group, tag=tag)
    tensor.copy_(staged)
    return sender
