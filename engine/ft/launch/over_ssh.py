"""Fault-tolerant mode over ssh: every node's supervisor started from one machine through pdsh.

`launch.hostfile` without `launch.no_ssh` in fault-tolerant mode. DeepSpeed's runner cannot start
the replicas (its per-node launcher ends every rank when one fails), so this process does what a
no-ssh job asks of a person or of SLURM: it checks the hosts as every pdsh launch does
(engine/launch/remote.py: ssh without a password, this Python, the shared run directory, cores,
the master port on the first host) and then runs, on every host at once through pdsh as
DeepSpeed's runner does (pdsh puts the host's rank in `%n`), the same cli.py command with
`launch.no_ssh=true launch.node_rank=%n`: one supervisor per node (engine/ft/launch/nodes.py), node 0
holding the lighthouse and the run directory's lock.

A stop signal here writes RUN/stop_request, which every node's supervisor watches (their replicas
checkpoint and stop); a second one writes logs/ft_stop_now, on which every node's supervisor kills
its share of the job at once, and ends pdsh, which ends the remote commands' ssh sessions. The
exit code is the job's: pdsh -S returns the largest of the nodes', which all exit with the job's.
"""
from __future__ import annotations

import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
from types import FrameType
from typing import Optional

from core.run_files import stop_now_flag, write_launch_record
from core.rundir import RunDir
from core.stop_signals import stop_signals_to
from engine.launch.commands import REPO, omp_threads, script_args
from engine.launch.config import LaunchConfig, node_plan_of
from engine.launch.remote import exported_env, probe_hosts

#: what this process sets on the nodes' command lines; a user's value for them is replaced
NODE_KEYS = ("launch.no_ssh=", "launch.node_rank=", "launch.master_addr=", "launch.master_port=")


def node_command(run_dir: RunDir, overrides: list[str], master_addr: str, port: int, env: dict[str, str]) -> str:
    """The shell command every node runs (pdsh replaces %n with the node's rank)."""
    args = [o for o in script_args(run_dir, overrides) if not o.startswith(NODE_KEYS)]
    cmd = [sys.executable, str(REPO / "cli.py"), *args, "launch.no_ssh=true", "launch.node_rank=%n",
           f"launch.master_addr={master_addr}", f"launch.master_port={port}"]
    exports = [f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    return f"cd {shlex.quote(str(REPO))} && env {' '.join(exports)} {' '.join(shlex.quote(c) for c in cmd)}"


def launch_over_ssh(launch: LaunchConfig, run_dir: RunDir, overrides: list[str]) -> int:
    """Check the hosts, start a supervisor on each through pdsh, and wait; the job's exit code."""
    plan = node_plan_of(launch)
    master_addr = launch.master_addr or plan.hosts[0]
    token = secrets.token_hex(8)  # the hosts prove they share the run directory by reading it back
    write_launch_record(run_dir, {"mode": "ft_pdsh", "token": token, "hosts": list(plan.hosts),
                                  "launched_from": socket.gethostname(), "time": time.time()})
    reports = probe_hosts(list(plan.hosts), sys.executable, run_dir, token, launch.master_port, launch.ssh_port)
    port = launch.master_port or reports[0].free_port
    env = {**os.environ, "OMP_NUM_THREADS": str(omp_threads(launch, plan.ranks_per_node,
                                                            min(r.cpus for r in reports)))}
    exported = exported_env(env, ["OMP_NUM_THREADS", *launch.export_env])
    pdsh_env = dict(os.environ, PDSH_RCMD_TYPE="ssh")
    if launch.ssh_port is not None:
        pdsh_env["PDSH_SSH_ARGS_APPEND"] = f"{pdsh_env.get('PDSH_SSH_ARGS_APPEND', '')} -p {launch.ssh_port}".strip()
    cmd = ["pdsh", "-S", "-f", "1024", "-w", ",".join(plan.hosts),
           node_command(run_dir, overrides, master_addr, port, exported)]
    print(f"syncopt: fault-tolerant mode on {len(plan.hosts)} hosts over pdsh, lighthouse on {master_addr}:{port}",
          file=sys.stderr, flush=True)
    proc = subprocess.Popen(cmd, env=pdsh_env, start_new_session=True)
    received: list[int] = []

    def on_signal(signum: int, frame: Optional[FrameType]) -> None:
        received.append(signum)
        if len(received) == 1:
            run_dir.stop_request.touch()  # every node's supervisor watches it
            print(f"syncopt: {signal.Signals(signum).name}: every replica will checkpoint and stop (signal again to "
                  "end the nodes at once)", file=sys.stderr, flush=True)
        else:
            if len(received) == 2:
                try:  # every node's supervisor kills its replicas (and node 0 the lighthouse) now
                    stop_now_flag(run_dir.logs).touch()
                except OSError:
                    pass
            os.killpg(proc.pid, signal.SIGTERM if len(received) < 3 else signal.SIGKILL)

    with stop_signals_to(on_signal):
        return proc.wait()
