"""Runs several launcher commands as one process: one DeepSpeed no-ssh launch per emulated node.

`engine.launch.launcher.run_launcher` supervises one child process (its process group receives
the second stop signal, its exit code is the job's). With `launch.network` the job is one
DeepSpeed launch per node, each inside its node's namespace; this module is that one child:

    python -m engine.launch.node_group '<JSON list of commands>'

It starts every command in its own process group, the one run_launcher made (so that its
`killpg` reaches them all), passes on a SIGTERM or SIGINT sent to it alone, waits for all of
them, and exits with the first non-zero exit code. It does not stop the
other nodes when one fails: their ranks fail on the lost peer by themselves and leave their
error files, from which the launcher names the rank that failed first (killing them here would
make them look like the first to go).
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from types import FrameType
from typing import Optional


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
