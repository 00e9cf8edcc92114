"""The `launch` config section: how cli.py starts the ranks when it is not itself one.

One machine: `launch.nproc` ranks through DeepSpeed's launcher (or torchrun). Several machines:
`launch.hostfile` (DeepSpeed's format, see hostfile.example) through DeepSpeed's multi-node
runner, over pdsh and ssh by default, or with `launch.no_ssh=true` by running the same command on
every node with its `launch.node_rank` (what slurm/syncopt.sbatch does). docs/multinode.md has
the whole story.

These checks read no file, so every rank can load the section; the hostfile itself is read by
the launching process (`launch_shape`, `engine.launch`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from engine.errors import UserError

LAUNCHERS = ("deepspeed", "torchrun", "none")
CPU_DEFAULT_NPROC = 4

# Variables (names, or prefixes ending in "_") that reach the ranks on every node of a pdsh launch.
# DeepSpeed itself adds PYTHON*, UCX*, MV2*, MLFLOW* (and NCCL* on GPUs).
DEFAULT_EXPORT_ENV = ["OMP_", "MKL_", "NCCL_", "GLOO_", "TP_SOCKET_IFNAME", "TORCH_", "SYNCOPT_",
                      "WANDB_", "HF_", "HYDRA_FULL_ERROR", "CUDA_LAUNCH_BLOCKING"]


@dataclass
class LaunchConfig:
    launcher: str = "deepspeed"  # deepspeed | torchrun | none (train in this process)
    # ranks per node; null: one per GPU on a GPU machine, 4 on a CPU machine, a hostfile's slots
    nproc: Optional[int] = None
    master_addr: Optional[str] = None  # null: 127.0.0.1, or the first host of the hostfile
    master_port: Optional[int] = None  # null: a free port is picked (give one with no_ssh)
    omp_threads: Optional[int] = None  # null: the node's cores / its ranks
    log_level: str = "warning"  # DeepSpeed launcher's own logging (info shows every spawn)
    # ---- several machines (docs/multinode.md) ----
    hostfile: Optional[str] = None  # DeepSpeed hostfile: one `HOST slots=N` line per machine
    include: Optional[str] = None  # DeepSpeed --include: host[:slot,slot][@host...]
    exclude: Optional[str] = None  # DeepSpeed --exclude, same format
    num_nodes: Optional[int] = None  # DeepSpeed --num_nodes: the first N hosts
    no_ssh: bool = False  # DeepSpeed --no_ssh: start cli.py on every node yourself, with node_rank
    node_rank: Optional[int] = None  # this node's line in the hostfile (0-based), with no_ssh
    ssh_port: Optional[int] = None  # DeepSpeed --ssh_port (pdsh and the pre-launch checks)
    export_env: list[str] = field(default_factory=lambda: list(DEFAULT_EXPORT_ENV))
    node_wait_s: float = 120.0  # no_ssh: how long node_rank>0 waits to see node 0's launch.json


def default_nproc() -> int:
    """One rank per GPU on a GPU machine; CPU_DEFAULT_NPROC ranks on a CPU machine."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return gpus or CPU_DEFAULT_NPROC


def _check_ranges(launch: LaunchConfig) -> None:
    if launch.launcher not in LAUNCHERS:
        raise UserError(f"launch.launcher={launch.launcher!r} is not one of {', '.join(LAUNCHERS)}")
    if launch.nproc is not None and launch.nproc < 1:
        raise UserError(f"launch.nproc={launch.nproc} must be at least 1 (ranks on each machine)")
    if launch.omp_threads is not None and launch.omp_threads < 1:
        raise UserError(f"launch.omp_threads={launch.omp_threads} must be at least 1 (or null)")
    if launch.master_port is not None and not 1024 <= launch.master_port <= 65535:
        raise UserError(f"launch.master_port={launch.master_port} must be in 1024..65535 (or null)")
    if launch.ssh_port is not None and not 1 <= launch.ssh_port <= 65535:
        raise UserError(f"launch.ssh_port={launch.ssh_port} must be in 1..65535 (or null)")
    if launch.num_nodes is not None and launch.num_nodes < 1:
        raise UserError(f"launch.num_nodes={launch.num_nodes} must be at least 1 (or null)")


def _check_multi_node(launch: LaunchConfig) -> None:
    """The combinations DeepSpeed's runner refuses (or silently ignores), refused here in one line."""
    needs_hostfile = {"include": launch.include, "exclude": launch.exclude, "num_nodes": launch.num_nodes,
                      "no_ssh": "true" if launch.no_ssh else None, "node_rank": launch.node_rank}
    if not launch.hostfile:
        for key, value in needs_hostfile.items():
            if value is not None:
                raise UserError(f"launch.{key}={value} needs launch.hostfile=PATH (see hostfile.example)")
        return
    if launch.launcher != "deepspeed":
        raise UserError(f"launch.hostfile goes through DeepSpeed's multi-node runner; "
                        f"use launch.launcher=deepspeed (not {launch.launcher})")
    if launch.include and launch.exclude:
        raise UserError("launch.include and launch.exclude exclude each other (as in DeepSpeed); give one")
    if launch.num_nodes is not None and (launch.include or launch.exclude):
        raise UserError("launch.num_nodes cannot be combined with launch.include/exclude (as in DeepSpeed)")
    if launch.no_ssh:
        if launch.node_rank is None or launch.node_rank < 0:
            raise UserError(f"launch.no_ssh=true needs launch.node_rank=N (this node's line in the "
                            f"hostfile, from 0), not {launch.node_rank}")
        if launch.master_port is None:
            raise UserError("launch.no_ssh=true needs launch.master_port=PORT, the same on every node "
                            "(no node can pick a free one for the others)")
    elif launch.node_rank is not None:
        raise UserError(f"launch.node_rank={launch.node_rank} is only used with launch.no_ssh=true "
                        "(with ssh, pdsh starts every node itself)")


def load_launch_config(node: Any) -> LaunchConfig:
    from engine.config import typed_section

    launch = typed_section(LaunchConfig, node, "launch")
    _check_ranges(launch)
    _check_multi_node(launch)
    if launch.nproc is None and not launch.hostfile:
        launch.nproc = default_nproc()
    if launch.master_addr is None and not launch.hostfile:
        launch.master_addr = "127.0.0.1"
    return launch


def launch_shape(launch: LaunchConfig) -> tuple[int, int]:
    """(world size, ranks per node) of the job this config launches; reads the hostfile if any."""
    if launch.launcher == "none":
        return 1, 1
    if launch.hostfile:
        plan = node_plan_of(launch)
        return plan.world_size, plan.ranks_per_node
    return launch.nproc, launch.nproc


def node_plan_of(launch: LaunchConfig) -> Any:
    """The checked `engine.hostfile.NodePlan` of a hostfile launch (node_rank checked too)."""
    from engine.hostfile import node_plan

    plan = node_plan(launch.hostfile, launch.include, launch.exclude, launch.num_nodes, launch.nproc)
    if launch.no_ssh and launch.node_rank >= plan.num_nodes:
        raise UserError(f"launch.node_rank={launch.node_rank} but launch.hostfile={launch.hostfile} "
                        f"gives {plan.num_nodes} nodes (node ranks 0..{plan.num_nodes - 1})")
    return plan
