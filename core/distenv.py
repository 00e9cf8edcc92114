"""Who this process is in the job, which device it trains on, and torch.distributed set-up.

A launched rank learns its place from the launcher's environment (DeepSpeed: RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_SIZE, CROSS_RANK, CROSS_SIZE; torchrun: LOCAL_WORLD_SIZE, GROUP_RANK, NNODES).
A run with no launcher is a world of one, still with a (gloo) process group so that plugins
and the trainer never branch on "is distributed".

Devices and backend are one decision (`plan_devices`), taken the same way by cli.py before
launch and by every rank: a GPU per rank and NCCL where the node has a GPU for each of its
ranks; where it has fewer (four ranks on a one-GPU machine, where most people try a method
first), the ranks share the GPUs round-robin and the process group is gloo, which carries CUDA
tensors in its collectives but, unlike NCCL, accepts several ranks on one GPU. The context
(`DistContext`) carries the choice, so that every side group a plugin makes follows it.
"""
from __future__ import annotations

import datetime
import enum
import os
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist

from core.errors import UserError
from core.schema import Section, option

LAUNCHED_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
#: NCCL groups get a gloo side for CPU tensors (evaluation sums, stop flags, object gathers),
#: which a bare "nccl" group refuses
NCCL_WITH_CPU = "cpu:gloo,cuda:nccl"


def inside_launched_rank() -> bool:
    """True when a launcher (DeepSpeed, torchrun, SLURM script) started this process as a rank."""
    return all(v in os.environ for v in LAUNCHED_VARS)


#: the GPUs the user showed cli.py (its CUDA_VISIBLE_DEVICES), for its ranks on this machine.
#: DeepSpeed's per-node launcher sets CUDA_VISIBLE_DEVICES to its slot ids (0..n-1) for every rank
#: (deepspeed/launcher/launch.py, through the accelerator's set_visible_devices_envs, the CPU
#: one's too), so a user's `CUDA_VISIBLE_DEVICES=` (the CPU) or `=2,3` (two chosen GPUs) held for
#: cli.py and not for its ranks: on an H100 the suite's CPU runs (`CUDA_VISIBLE_DEVICES=` for
#: cli.py) had ranks that saw the GPU, and fault-tolerant QSR no longer equalled its plain twin.
USER_VISIBLE_DEVICES_ENV = "SYNCOPT_CUDA_VISIBLE_DEVICES"


def user_visible_devices_env() -> dict[str, str]:
    """What a launch on this machine passes its ranks so that they see the GPUs cli.py sees:
    nothing where the user set no CUDA_VISIBLE_DEVICES (the launcher's slots then choose)."""
    if "CUDA_VISIBLE_DEVICES" not in os.environ:
        return {}
    return {USER_VISIBLE_DEVICES_ENV: os.environ["CUDA_VISIBLE_DEVICES"]}


def apply_user_visible_devices() -> None:
    """In a rank, before anything touches CUDA (which reads CUDA_VISIBLE_DEVICES once): the
    user's GPUs replace the launcher's slot list. A rank's device is then its local rank among
    them (`plan_devices`), as cli.py planned it."""
    if USER_VISIBLE_DEVICES_ENV in os.environ:
        os.environ["CUDA_VISIBLE_DEVICES"] = os.environ[USER_VISIBLE_DEVICES_ENV]


class Backend(enum.StrEnum):
    auto = "auto"  # NCCL with a GPU per rank, gloo when ranks share GPUs or run on the CPU
    gloo = "gloo"  # CUDA tensors too where the ranks use GPUs
    nccl = "nccl"  # needs a GPU of its own for every rank


class DeviceKind(enum.StrEnum):
    auto = "auto"  # a GPU when one is visible, else the CPU
    cpu = "cpu"
    cuda = "cuda"


@dataclass
class DistConfig(Section):
    """The `dist` section: the process group's backend, the ranks' device, and how long a
    collective may wait."""

    backend: Backend = Backend.auto
    device: DeviceKind = DeviceKind.auto
    timeout_s: float = option(60.0, gt=0)  # a collective waiting longer than this fails the job


@dataclass(frozen=True)
class DevicePlan:
    """One rank's device and the job's backend, as `plan_devices` decides them."""

    backend: str  # "gloo" or "nccl"
    device_index: Optional[int]  # this rank's GPU; None: the CPU
    shared: bool  # the node has more ranks than GPUs: they take turns on them (round-robin)

    @property
    def device(self) -> torch.device:
        return torch.device("cpu") if self.device_index is None else torch.device("cuda", self.device_index)


def plan_devices(backend: str, ranks_per_node: int, visible_gpus: int, local_rank: int = 0,
                 device: str = DeviceKind.auto) -> DevicePlan:
    """The backend, this rank's device and whether GPUs are shared, from what was asked
    (`dist.backend`, `dist.device`) and what the node has; a `UserError` naming the value and
    the fix for a combination that cannot run (checked before launch, again in every rank)."""
    backend, device = str(backend), str(device)
    if device == DeviceKind.cuda and visible_gpus < 1:
        raise UserError("dist.device=cuda but no GPU is visible here (CUDA_VISIBLE_DEVICES, driver); "
                        "use dist.device=auto or cpu")
    use_cuda = visible_gpus > 0 and device != DeviceKind.cpu
    if not use_cuda:
        if backend == Backend.nccl:
            raise UserError("dist.backend=nccl needs a GPU per rank, but these ranks run on the CPU "
                            f"({'dist.device=cpu' if device == DeviceKind.cpu else 'no GPU is visible'}); "
                            "use dist.backend=auto or gloo")
        return DevicePlan(backend=Backend.gloo.value, device_index=None, shared=False)
    shared = ranks_per_node > visible_gpus
    if backend == Backend.nccl and shared:
        raise UserError(f"dist.backend=nccl with {ranks_per_node} ranks on a node of {visible_gpus} GPU(s): NCCL "
                        "cannot put two ranks on one GPU; use dist.backend=auto (the ranks share the GPUs over "
                        f"gloo) or launch.nproc={visible_gpus}")
    chosen = Backend.gloo if backend == Backend.gloo or shared else Backend.nccl
    return DevicePlan(backend=chosen.value, device_index=local_rank % visible_gpus, shared=shared)


def sharing_note(ranks_per_node: int, visible_gpus: int) -> str:
    """The one line cli.py prints before launching ranks that share GPUs."""
    return (f"{ranks_per_node} ranks per node share {visible_gpus} GPU(s) round-robin (local rank r on GPU "
            f"r % {visible_gpus}); process group: gloo with CUDA tensors, since NCCL needs a GPU per rank "
            f"(launch.nproc={visible_gpus} for that)")


def visible_gpus() -> int:
    """GPUs this process can use (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def process_group_backend(backend: str) -> str:
    """What torch.distributed is given for a group of `backend` (see NCCL_WITH_CPU)."""
    return NCCL_WITH_CPU if str(backend) == Backend.nccl else str(backend)


@dataclass
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    local_size: int
    node_rank: int
    num_nodes: int
    device: torch.device
    backend: str  # "gloo" or "nccl": the one every group of the run uses unless it asks otherwise
    timeout_s: float
    shared_device: bool = False  # ranks of this node share GPUs (the backend is gloo then)

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def num_devices(self) -> int:
        """Distinct devices of the job (GPUs, or CPU processes): what per-device rates divide by."""
        if not self.is_cuda:
            return self.world_size
        per_node = min(self.local_size, max(visible_gpus(), 1)) if self.shared_device else self.local_size
        return per_node * self.num_nodes

    def new_group(self, ranks: Optional[list[int]] = None, backend: Optional[str] = None) -> Any:
        """A process group; every rank must call this with the same arguments in the same order.
        Its backend is the run's unless `backend` says otherwise (a gloo group for CPU messages)."""
        return dist.new_group(ranks=ranks, backend=process_group_backend(backend or self.backend),
                              timeout=datetime.timedelta(seconds=self.timeout_s))


def _env_int(*names: str, default: int) -> int:
    for name in names:
        if name in os.environ:
            return int(os.environ[name])
    return default


def init_distributed(backend: str = "auto", timeout_s: float = 60.0, device: str = "auto") -> DistContext:
    """Initialise torch.distributed from the launcher's environment (or as a world of one), on
    the device and backend `plan_devices` gives this rank."""
    launched = inside_launched_rank()
    rank = _env_int("RANK", default=0)
    world = _env_int("WORLD_SIZE", default=1)
    local_rank = _env_int("LOCAL_RANK", default=0)
    local_size = _env_int("LOCAL_SIZE", "LOCAL_WORLD_SIZE", default=world)
    node_rank = _env_int("CROSS_RANK", "GROUP_RANK", "NODE_RANK", default=rank // max(local_size, 1))
    num_nodes = _env_int("CROSS_SIZE", "NNODES", default=max(world // max(local_size, 1), 1))
    plan = plan_devices(backend, local_size if launched else 1, visible_gpus(), local_rank, device)
    if plan.device_index is not None:
        torch.cuda.set_device(plan.device_index)
    timeout = datetime.timedelta(seconds=timeout_s)
    chosen = plan.backend
    if not dist.is_initialized():
        if launched:
            dist.init_process_group(process_group_backend(chosen), rank=rank, world_size=world, timeout=timeout,
                                    device_id=plan.device if chosen == Backend.nccl else None)
        else:
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
            chosen = Backend.gloo.value
    else:  # set up already (tests): the context says what the group is
        chosen = Backend.nccl.value if Backend.nccl in str(dist.get_backend()) else Backend.gloo.value
    return DistContext(rank, world, local_rank, local_size, node_rank, num_nodes, plan.device, chosen, timeout_s,
                       shared_device=plan.shared)


def shutdown_distributed() -> None:
    """Leave together. Once, on an emulated slow link, a rank of a finished run aborted in gloo's
    teardown ("terminate called without an active exception") while rank 0 was still writing the
    summary, which failed the run; the ranks now tear their connections down only after all of
    them are done (a suspected race, not a proven cause)."""
    if dist.is_initialized():
        if dist.get_world_size() > 1:
            dist.barrier()
        dist.destroy_process_group()
