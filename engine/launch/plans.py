"""The five ways to launch a job's ranks, each a `LaunchPlan`: the command (or how to start the
ranks without one), its environment, and the watch over the ranks this process owns
(docs/multinode.md).

- one machine (`local_plan`): DeepSpeed's per-node launcher (or torchrun) on localhost, on a
  free master port;
- one machine, `launch.launcher=fork` (`fork_plan`): the same ranks forked from this process
  (engine/launch/fork.py), on a free master port;
- `launch.hostfile` with ssh (`pdsh_plan`): DeepSpeed's runner starts every node over pdsh; the
  hosts are checked first (engine/launch/remote.py), the environment is exported through a
  DS_ENV_FILE, and the ranks of other hosts are signalled over ssh;
- `launch.hostfile` with `launch.no_ssh=true` (`no_ssh_plan`): this process is one node
  (`launch.node_rank`); node 0 writes `logs/launch.json` and the others wait to see it, which
  proves the run directory is shared before any rank starts;
- `launch.network` (`emulated_plan`): an emulated cluster on this machine, each node's share
  started inside its namespace by DeepSpeed's per-node launcher, as the no-ssh way starts it on
  real nodes.

`plan_for` picks the one the config asks for; engine/launch/loop.py runs it and watches the ranks
each plan names (`local_ranks`, and for pdsh `remote`), so that the choice of a plan is made in
one place and the watch is built in one place.
"""
from __future__ import annotations

import secrets
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from core.errors import UserError
from core.run_files import wait_for_launch_record, write_launch_record
from core.rundir import SUPERVISED_ENV, RunDir
from engine.launch.fork import ForkedRanks, RankBody
from engine.launch.commands import free_port, launcher_command, launcher_env, multi_node_command, port_in_use
from engine.launch.config import Launcher, LaunchConfig, node_plan_of
from engine.launch.network import MASTER_PORT, EmulatedCluster
from engine.launch.node_group import node_group_command, node_launch_command
from engine.launch.remote import probe_hosts, write_deepspeed_env


@dataclass
class LaunchPlan:
    """One launch: the launcher command, its environment, and the ranks it owns (`local_ranks`
    started on this machine; `remote`: host -> ranks started there by pdsh, signalled over ssh on
    `ssh_port`). `start`: how to start the ranks instead of running `cmd` (launch.launcher=fork);
    it takes the signal the ranks must ignore (the job manager's, or None) and returns the process
    that stands for the launcher (`pid`, `poll`, `wait`, `returncode`)."""

    cmd: list[str]
    env: dict[str, str]
    local_ranks: set[int]
    remote: dict[str, list[int]] = field(default_factory=dict)
    ssh_port: Optional[int] = None
    start: Optional[Callable[[Optional[int]], Any]] = None


def plan_for(cfg: LaunchConfig, run_dir: RunDir | Path, args: list[str], cluster: Optional[EmulatedCluster],
             body: Optional[RankBody]) -> LaunchPlan:
    """The one launch plan the config asks for: an emulated cluster (`cluster`, built by the loop),
    forked ranks, one machine, a node of a no-ssh job, or every host over pdsh."""
    if cluster is not None:
        return emulated_plan(cfg, RunDir.of(run_dir), args, cluster)
    if not cfg.hostfile and cfg.launcher == Launcher.fork:
        if body is None:
            raise ValueError("launch.launcher=fork needs the ranks' body (cli.py passes engine.rank.entry's)")
        return fork_plan(cfg, body)
    if not cfg.hostfile:
        return local_plan(cfg, args)
    return no_ssh_plan(cfg, run_dir, args) if cfg.no_ssh else pdsh_plan(cfg, run_dir, args)


def _local_port(cfg: LaunchConfig) -> int:
    """launch.master_port if it is free here, else a free port."""
    if cfg.master_port is not None and port_in_use(cfg.master_port):
        raise UserError(f"launch.master_port={cfg.master_port} is in use on this machine; "
                        "pick another port or leave it null")
    return cfg.master_port or free_port(cfg.master_addr)


def local_plan(cfg: LaunchConfig, args: list[str]) -> LaunchPlan:
    """One machine: launch.nproc ranks on localhost, on launch.master_port or a free port."""
    return LaunchPlan(launcher_command(cfg, _local_port(cfg), args), launcher_env(cfg), set(range(cfg.nproc)))


def fork_plan(cfg: LaunchConfig, body: RankBody) -> LaunchPlan:
    """One machine, launch.launcher=fork: launch.nproc ranks forked from this process, each running
    `body` with the environment DeepSpeed's launcher would give it (engine/launch/fork.py)."""
    port, env = _local_port(cfg), launcher_env(cfg)

    def start(ignore_signal: Optional[int]) -> ForkedRanks:
        return ForkedRanks(cfg.nproc, cfg.master_addr, port, env, body, ignore_signal)

    return LaunchPlan([], env, set(range(cfg.nproc)), start=start)


def pdsh_plan(cfg: LaunchConfig, run_dir: RunDir | Path, args: list[str]) -> LaunchPlan:
    """Every host of the hostfile over pdsh, checked first (a token in the launch record proves
    each sees the run directory); the environment goes to the nodes through a DS_ENV_FILE."""
    plan = node_plan_of(cfg)
    token = secrets.token_hex(8)
    master_addr = cfg.master_addr or plan.hosts[0]
    write_launch_record(run_dir, {"mode": "pdsh", "token": token, "hosts": list(plan.hosts),
                                  "ranks_per_node": plan.ranks_per_node, "master_addr": master_addr,
                                  "launched_from": socket.gethostname(), "time": time.time()})
    reports = probe_hosts(list(plan.hosts), sys.executable, run_dir, token, cfg.master_port, cfg.ssh_port)
    port = cfg.master_port or reports[0].free_port
    # Nodes may differ in cores; one exported value must fit the smallest.
    env = launcher_env(cfg, plan.ranks_per_node, min(r.cpus for r in reports))
    ds_env = run_dir.deepspeed_env
    write_deepspeed_env(ds_env, env, ["OMP_NUM_THREADS", SUPERVISED_ENV, *cfg.export_env])
    env["DS_ENV_FILE"] = str(ds_env)
    remote = {h: plan.ranks_of(i) for i, h in enumerate(plan.hosts)}
    return LaunchPlan(multi_node_command(cfg, master_addr, port, args), env, set(), remote, cfg.ssh_port)


def no_ssh_plan(cfg: LaunchConfig, run_dir: RunDir | Path, args: list[str]) -> LaunchPlan:
    """This node's share (launch.node_rank): node 0 writes the launch record, the others wait for it."""
    run_dir = RunDir.of(run_dir)
    plan = node_plan_of(cfg)
    master_addr = cfg.master_addr or plan.hosts[0]
    record = {"mode": "no_ssh", "hosts": list(plan.hosts), "ranks_per_node": plan.ranks_per_node,
              "master_addr": master_addr, "master_port": cfg.master_port}
    if cfg.node_rank == 0:
        if port_in_use(cfg.master_port):
            raise UserError(f"launch.master_port={cfg.master_port} is in use on node 0 "
                            f"({socket.gethostname()}); pick another port (the same on every node)")
        write_launch_record(run_dir, {**record, "node": socket.gethostname(), "time": time.time()})
    else:
        wait_for_launch_record(run_dir, record, cfg.node_wait_s)
    env = launcher_env(cfg, plan.ranks_per_node)
    return LaunchPlan(multi_node_command(cfg, master_addr, cfg.master_port, args), env, set(plan.ranks_of(cfg.node_rank)))


def emulated_plan(cfg: LaunchConfig, run_dir: RunDir, args: list[str], cluster: EmulatedCluster) -> LaunchPlan:
    """launch.network: node i's share of the ranks started by DeepSpeed's per-node launcher inside
    node i's namespace, as `--no_ssh --node_rank i` starts them on real nodes; all nodes share
    this machine's cores."""
    cmds = [cluster.prefix(i) + node_launch_command(str(cfg.log_level), cluster.world_info(), i, cluster.master_addr,
                                                    MASTER_PORT, args)
            for i in range(cluster.nodes)]
    env = {**launcher_env(cfg, cfg.nproc), **cluster.env()}
    return LaunchPlan(node_group_command(cmds), env, set(range(cfg.nproc)))
