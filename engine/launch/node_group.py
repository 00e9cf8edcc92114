"""The launch of an emulated cluster's nodes: DeepSpeed's per-node launcher on every node, as one process.

`engine.launch.loop.run_launcher` supervises one child process (its process group receives
the second stop signal, its exit code is the job's). With `launch.network` the job is one
DeepSpeed launch per node, each inside its node's namespace; this module is that one child:

    python -m engine.launch.node_group '<JSON list of commands>'

Each node's command is `node_launch_command`: what DeepSpeed's runner executes on a node for
`--no_ssh --node_rank N` (deepspeed.launcher.launch, which sets RANK, LOCAL_RANK, CROSS_RANK,
LOCAL_SIZE, ... and starts the node's ranks), without the runner process in between: every node
runs on this one machine, where a runner per node would only add its start-up (seconds per node
on a loaded 2-core machine).

It starts every command in its own process group, the one run_launcher made (so that its
`killpg` reaches them all), passes on a SIGTERM or SIGINT sent to it alone, waits for all of
them, and exits with the first non-zero exit code. It does not stop the
other nodes when one fails: their ranks fail on the lost peer by themselves and leave their
error files, from which the launcher names the rank that failed first (killing them here would
make them look like the first to go).
"""
from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Optional

REPO = Path(__file__).resolve().parents[2]


def encode_world_info(world_info: dict[str, list[int]]) -> str:
    """Hosts and their slots as DeepSpeed's runner hands them to its launcher (its encode_world_info)."""
    return base64.urlsafe_b64encode(json.dumps(world_info).encode("utf-8")).decode("utf-8")


def node_launch_command(log_level: str, world_info: dict[str, list[int]], node_rank: int, master_addr: str,
                        port: int, script_args: list[str]) -> list[str]:
    """DeepSpeed's per-node launch of cli.py on node `node_rank` (see the module docstring)."""
    return [sys.executable, "-u", "-m", "deepspeed.launcher.launch", f"--world_info={encode_world_info(world_info)}",
            f"--master_addr={master_addr}", f"--master_port={port}", f"--node_rank={node_rank}", "--no_local_rank",
            f"--log_level={log_level}", str(REPO / "cli.py"), *script_args]


def node_group_command(commands: list[list[str]]) -> list[str]:
    """The command that runs `commands` together (see the module docstring)."""
    return [sys.executable, "-u", "-m", "engine.launch.node_group", json.dumps(commands)]


def run_all(commands: list[list[str]]) -> int:
    procs = [subprocess.Popen(cmd) for cmd in commands]

    def forward(signum: int, frame: Optional[FrameType]) -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    code = 0
    while any(p.poll() is None for p in procs):
        time.sleep(0.2)
    for proc in procs:
        if proc.returncode and not code:
            code = proc.returncode
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(run_all(json.loads(sys.argv[1])))
