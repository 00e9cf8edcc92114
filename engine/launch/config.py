"""The `launch` config section: how cli.py starts the ranks when it is not itself one.

One machine: `launch.nproc` ranks forked from cli.py itself (`launch.launcher=auto`, the default,
or `fork`: the same ranks as DeepSpeed's launcher starts, without an interpreter, a Hydra
composition and the imports per rank; engine/launch/fork.py), or through DeepSpeed's launcher
(`deepspeed`) or torchrun; engine/launch/start.py decides what `auto` starts. Several machines:
`launch.hostfile` (DeepSpeed's format, see hostfile.example) through DeepSpeed's multi-node
runner, over pdsh and ssh by default, or with `launch.no_ssh=true` by running the same command on
every node with its `launch.node_rank` (what slurm/syncopt.sbatch does). docs/multinode.md has
the whole story. An emulated cluster on this machine: `launch.network` (engine/launch/network.py),
whose nodes split `launch.nproc` and are launched as a no-ssh multi-node job.

These checks read no file, so every rank can load the section; the hostfile itself is read by
the launching process (`launch_shape`, `engine.launch`).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Any, Optional

from core.errors import UserError
from core.schema import Section, option, typed_section
from engine.launch.hostfile import NodePlan, node_plan
from engine.launch.network import NetworkConfig

CPU_DEFAULT_NPROC = 4


class Launcher(enum.StrEnum):
    # fork on one machine, DeepSpeed's launcher where forking cannot carry the run (engine/launch/start.py)
    auto = "auto"
    deepspeed = "deepspeed"
    torchrun = "torchrun"
    # one machine's ranks forked from cli.py once it has planned and imported (copy-on-write):
    # seconds instead of minutes at 64 ranks, bit for bit the launcher's run (docs/multinode.md)
    fork = "fork"
    none = "none"  # train in this process


class LogLevel(enum.StrEnum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"
    critical = "critical"

# Variables (names, or prefixes ending in "_") that reach the ranks on every node of a pdsh launch.
# DeepSpeed itself adds PYTHON*, UCX*, MV2*, MLFLOW* (and NCCL* on GPUs).
DEFAULT_EXPORT_ENV = ["OMP_", "MKL_", "NCCL_", "GLOO_", "TP_SOCKET_IFNAME", "TORCH_", "SYNCOPT_",
                      "WANDB_", "HF_", "HYDRA_FULL_ERROR", "CUDA_LAUNCH_BLOCKING"]


@dataclass
class LaunchConfig(Section):
    launcher: Launcher = Launcher.auto
    # ranks per node; null: one per GPU on a GPU machine, 4 on a CPU machine, a hostfile's slots
    nproc: Optional[int] = option(None, ge=1)
    master_addr: Optional[str] = None  # null: 127.0.0.1, or the first host of the hostfile
    master_port: Optional[int] = option(None, ge=1024, le=65535)  # null: a free port (give one with no_ssh)
    omp_threads: Optional[int] = option(None, ge=1)  # null: the shell's OMP_NUM_THREADS, else cores / ranks
    log_level: LogLevel = LogLevel.warning  # DeepSpeed launcher's own logging (info shows every spawn)
    # re-launch the whole job from its last complete checkpoint after a failure, up to N times
    # (engine/launch/restart.py); 0: a failure ends the job
    max_restarts: int = option(0, ge=0)
    # ---- several machines (docs/multinode.md) ----
    hostfile: Optional[str] = None  # DeepSpeed hostfile: one `HOST slots=N` line per machine
    include: Optional[str] = None  # DeepSpeed --include: host[:slot,slot][@host...]
    exclude: Optional[str] = None  # DeepSpeed --exclude, same format
    num_nodes: Optional[int] = option(None, ge=1)  # DeepSpeed --num_nodes: the first N hosts
    no_ssh: bool = False  # DeepSpeed --no_ssh: start cli.py on every node yourself, with node_rank
    node_rank: Optional[int] = None  # this node's line in the hostfile (0-based), with no_ssh
    ssh_port: Optional[int] = option(None, ge=1, le=65535)  # DeepSpeed --ssh_port (pdsh and the pre-launch checks)
    export_env: list[str] = option(factory=lambda: list(DEFAULT_EXPORT_ENV))
    node_wait_s: float = option(120.0, gt=0)  # no_ssh: how long node_rank>0 waits to see node 0's launch.json
    # ---- an emulated cluster on this machine (engine/launch/network.py) ----
    network: NetworkConfig = option(factory=NetworkConfig)  # kind=emulated: nodes and links on this machine


def default_nproc(device: str = "auto") -> int:
    """One rank per GPU on a GPU machine; CPU_DEFAULT_NPROC ranks on a CPU machine, or where the
    ranks are told to train on the CPU (dist.device=cpu): one rank on a one-GPU machine then
    surprised the parameter-server and group plugins, which need several (found on an H100)."""
    import torch

    if device == "cpu":
        return CPU_DEFAULT_NPROC
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return gpus or CPU_DEFAULT_NPROC


def _check_multi_node(launch: LaunchConfig) -> None:
    """The combinations DeepSpeed's runner refuses (or silently ignores), refused here in one line."""
    needs_hostfile = {"include": launch.include, "exclude": launch.exclude, "num_nodes": launch.num_nodes,
                      "no_ssh": "true" if launch.no_ssh else None, "node_rank": launch.node_rank}
    if not launch.hostfile:
        for key, value in needs_hostfile.items():
            if value is not None:
                raise UserError(f"launch.{key}={value} needs launch.hostfile=PATH (see hostfile.example)")
        return
    if launch.launcher not in (Launcher.deepspeed, Launcher.auto):
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


def _check_network(launch: LaunchConfig, device: str = "auto") -> None:
    """An emulated cluster splits this machine's `launch.nproc` ranks over its nodes; it is one
    machine's launch, so the multi-node and address options have no place beside it."""
    net = launch.network
    if not net.emulated:
        unused = net.unused_settings()
        if unused:
            raise UserError(f"launch.network.{unused[0]} is set but launch.network.kind=none; add "
                            "launch.network.kind=emulated to emulate the cluster, or drop it")
        return
    if launch.hostfile or launch.launcher not in (Launcher.deepspeed, Launcher.auto):
        what = f"launch.hostfile={launch.hostfile}" if launch.hostfile else f"launch.launcher={launch.launcher}"
        raise UserError(f"launch.network emulates nodes on this machine through DeepSpeed's launcher; "
                        f"it cannot be combined with {what}")
    if launch.master_addr is not None:
        raise UserError(f"launch.master_addr={launch.master_addr}: with launch.network the master is "
                        "the first emulated node; leave it null")
    nproc = launch.nproc or default_nproc(device)
    nodes = net.nodes or nproc
    if nproc < 2 or nproc % nodes:
        raise UserError(f"launch.network.nodes={nodes} must divide launch.nproc={nproc} (the ranks are split "
                        "evenly over the nodes; at least 2 nodes)")


def load_launch_config(node: Any, device: str = "auto") -> LaunchConfig:
    """The checked section, with this machine's defaults filled in (ranks, master address);
    `device`: the run's dist.device, which the default rank count follows."""
    launch = typed_section(LaunchConfig, node, "launch")
    _check_multi_node(launch)
    _check_network(launch, device)
    if launch.nproc is None and not launch.hostfile:
        launch = replace(launch, nproc=default_nproc(device))
    if launch.master_addr is None and not launch.hostfile:
        launch = replace(launch, master_addr="127.0.0.1")
    return launch


def launch_shape(launch: LaunchConfig) -> tuple[int, int]:
    """(world size, ranks per node) of the job this config launches; reads the hostfile if any."""
    if launch.launcher == Launcher.none:
        return 1, 1
    if launch.hostfile:
        plan = node_plan_of(launch)
        return plan.world_size, plan.ranks_per_node
    if launch.network.emulated:
        return launch.nproc, launch.nproc // emulated_nodes(launch)
    return launch.nproc, launch.nproc


def emulated_nodes(launch: LaunchConfig) -> int:
    """The number of nodes of `launch.network` (null: one per rank)."""
    return launch.network.nodes or launch.nproc


def node_plan_of(launch: LaunchConfig) -> NodePlan:
    """The checked `NodePlan` of a hostfile launch (node_rank checked too)."""
    plan = node_plan(launch.hostfile, launch.include, launch.exclude, launch.num_nodes, launch.nproc)
    if launch.no_ssh and launch.node_rank >= plan.num_nodes:
        raise UserError(f"launch.node_rank={launch.node_rank} but launch.hostfile={launch.hostfile} "
                        f"gives {plan.num_nodes} nodes (node ranks 0..{plan.num_nodes - 1})")
    return plan


def check_supervision(launch_cfg: LaunchConfig, faults: Any) -> None:
    """Faults and restarts need a launching process that outlives the ranks, and one only:
    refused in one line where there is none (launch.launcher=none) or one per node (no_ssh).
    `faults`: the `faults` section (engine/train/faults.py), read for whether any is active."""
    if launch_cfg.launcher == Launcher.none and (faults.active or launch_cfg.max_restarts):
        what = "faults.*" if faults.active else f"launch.max_restarts={launch_cfg.max_restarts}"
        raise UserError(f"{what} needs launched ranks (a killed rank would take this process with it); "
                        "use launch.launcher=deepspeed or torchrun")
    if launch_cfg.no_ssh and launch_cfg.max_restarts:
        raise UserError(f"launch.max_restarts={launch_cfg.max_restarts} cannot be combined with launch.no_ssh=true "
                        "(every node has its own launching process); requeue the job instead (SLURM --requeue), "
                        "it resumes from its last checkpoint")
