"""Every process a fault-tolerant job's supervisor starts, recorded so that none outlives the job.

The lighthouse and each replica process (a restarted replica is a new one) are started in a
session of their own, so each leads a process group holding whatever it starts in turn (data
loader workers, torchft's threads live inside it). The supervisor appends one line per process to
`logs/ft_processes_<node>.jsonl` (role, replica, pid = process group) as it starts it, and at the
job's end, or at once on a second stop signal, SIGKILLs every group it recorded: a replica that
died leaves no orphan, and a test can check by pid that nothing of the job is left.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Optional


def process_log(logs: Path, node: int) -> Path:
    """logs/ft_processes_<node>.jsonl: the processes node `node`'s supervisor started."""
    return logs / f"ft_processes_{node}.jsonl"


def read_process_log(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    return [json.loads(line) for line in lines if line.strip()]


class JobProcesses:
    """The process groups this supervisor started (each process leads its own)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("")  # this attempt's: a resume starts a new record
        self.groups: list[int] = []

    def add(self, role: str, proc: subprocess.Popen, replica: Optional[int] = None) -> None:
        self.groups.append(proc.pid)
        with self.path.open("a") as fh:
            fh.write(json.dumps({"role": role, "replica": replica, "pid": proc.pid, "time": time.time()}) + "\n")

    def kill_all(self) -> None:
        """SIGKILL every group recorded (safe from a signal handler: system calls only)."""
        for group in self.groups:
            try:
                os.killpg(group, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
