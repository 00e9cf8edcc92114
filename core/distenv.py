"""Who this process is in the job, and torch.distributed set-up.

A launched rank learns its place from the launcher's environment (DeepSpeed: RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_SIZE, CROSS_RANK, CROSS_SIZE; torchrun: LOCAL_WORLD_SIZE, GROUP_RANK, NNODES).
A run with no launcher is a world of one, still with a (gloo) process group so that plugins
and the trainer never branch on "is distributed".
"""
from __future__ import annotations

import datetime
import enum
import os
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist

from core.schema import Section, option

LAUNCHED_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def inside_launched_rank() -> bool:
    """True when a launcher (DeepSpeed, torchrun, SLURM script) started this process as a rank."""
    return all(v in os.environ for v in LAUNCHED_VARS)


class Backend(enum.StrEnum):
    auto = "auto"  # NCCL with CUDA, gloo without
    gloo = "gloo"
    nccl = "nccl"


@dataclass
class DistConfig(Section):
    """The `dist` section: the process group's backend and how long a collective may wait."""

    backend: Backend = Backend.auto
    timeout_s: float = option(60.0, gt=0)  # a collective waiting longer than this fails the job


@dataclass
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    local_size: int
    node_rank: int
    num_nodes: int
    device: torch.device
    backend: str
    timeout_s: float

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def new_group(self, ranks: Optional[list[int]] = None, backend: Optional[str] = None) -> Any:
        """A process group; every rank must call this with the same arguments in the same order."""
        return dist.new_group(ranks=ranks, backend=backend or self.backend,
                              timeout=datetime.timedelta(seconds=self.timeout_s))


def _env_int(*names: str, default: int) -> int:
    for name in names:
        if name in os.environ:
            return int(os.environ[name])
    return default


def init_distributed(backend: str = "auto", timeout_s: float = 60.0) -> DistContext:
    """Initialise torch.distributed from the launcher's environment (or as a world of one)."""
    backend = str(backend)
    launched = inside_launched_rank()
    rank = _env_int("RANK", default=0)
    world = _env_int("WORLD_SIZE", default=1)
    local_rank = _env_int("LOCAL_RANK", default=0)
    local_size = _env_int("LOCAL_SIZE", "LOCAL_WORLD_SIZE", default=world)
    node_rank = _env_int("CROSS_RANK", "GROUP_RANK", "NODE_RANK", default=rank // max(local_size, 1))
    num_nodes = _env_int("CROSS_SIZE", "NNODES", default=max(world // max(local_size, 1), 1))
    use_cuda = torch.cuda.is_available() and backend != "gloo"
    if backend == "auto":
        backend = "nccl" if use_cuda else "gloo"
    if use_cuda:
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    timeout = datetime.timedelta(seconds=timeout_s)
    if not dist.is_initialized():
        if launched:
            dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout,
                                    device_id=device if use_cuda else None)
        else:
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
            backend = "gloo"
    return DistContext(rank, world, local_rank, local_size, node_rank, num_nodes, device, backend, timeout_s)


def shutdown_distributed() -> None:
    """Leave together. Once, on an emulated slow link, a rank of a finished run aborted in gloo's
    teardown ("terminate called without an active exception") while rank 0 was still writing the
    summary, which failed the run; the ranks now tear their connections down only after all of
    them are done (a suspected race, not a proven cause)."""
    if dist.is_initialized():
        if dist.get_world_size() > 1:
            dist.barrier()
        dist.destroy_process_group()
