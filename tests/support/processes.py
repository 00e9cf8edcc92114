"""Which processes of a job are still alive, read from /proc: for tests that a stop leaves none.

A process belongs to the job when its pid is one the job recorded (the launching cli.py, the
fault-tolerant supervisor's `logs/ft_processes_<node>.jsonl`, the ranks' `logs/rank_<r>.pid`),
when its process group is one of those (each replica and the lighthouse lead a group of their
own: their children are in it), or when its command line names the job's run directory (the
launcher and the ranks are started with `hydra.run.dir=RUN`). Zombies have ended.
"""
from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from engine.ft.launch.job_processes import read_process_log


def recorded_pids(run_dir: Path) -> set[int]:
    """Every pid the job wrote down: the supervisors' process records, the ranks' pid files
    (this attempt's and the archived ones of earlier attempts), the lighthouse's."""
    pids: set[int] = set()
    logs = run_dir / "logs"
    for path in logs.glob("ft_processes_*.jsonl"):
        pids |= {int(entry["pid"]) for entry in read_process_log(path)}
    for path in [*run_dir.rglob("rank_*.pid"), *logs.glob("replica_*.pid"), *logs.glob("lighthouse.pid")]:
        try:
            pids.add(int(path.read_text().split()[0]))
        except (OSError, ValueError, IndexError):
            pass
    return pids


def alive_of_job(run_dir: Path, pids: Iterable[int] = ()) -> list[str]:
    """The job's live processes ("pid state command"), given the pids the test knows besides."""
    known = recorded_pids(run_dir) | set(pids)
    marker = str(run_dir).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        state, group = fields[0], int(fields[2])
        if state == "Z":
            continue
        if int(entry.name) in known or group in known or marker in cmdline:
            command = cmdline.replace(b"\0", b" ").decode(errors="replace")[:160]
            found.append(f"{entry.name} {state} {command}")
    return found


def signal_and_wait(proc: subprocess.Popen, signals: list[int], gap_s: float = 0.0,
                    timeout: float = 60) -> tuple[float, str]:
    """Send `signals` to a job `gap_s` apart; the seconds from the last one to the job's exit (what
    a stop bound is stated against) and its stderr."""
    for i, sig in enumerate(signals):
        if i:
            time.sleep(gap_s)
        proc.send_signal(sig)
    last = time.monotonic()
    _, err = proc.communicate(timeout=timeout)
    return time.monotonic() - last, err


def wait_for(predicate: Callable[[], object], timeout: float, what: str) -> None:
    """Poll `predicate` until it holds; fail the test naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
