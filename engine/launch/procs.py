"""What /proc says about a process on this machine: whether it is alive, stopped, which program
it runs, when it started, and which processes it started. One reader, for the rank watch, the run
lock, the emulated network's owner records, the test harness and the start-up bench.

`/proc/<pid>/stat` holds the command name in parentheses, which may itself contain spaces and
parentheses, so the fields are read after its last ")".
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional


def stat_fields(pid: int) -> Optional[list[str]]:
    """The fields of /proc/<pid>/stat after the command name (state first); None: no process."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie (a zombie has ended for our purpose)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def stopped(pid: int) -> bool:
    """In the stopped (T) or traced (t) state: SIGSTOP, a debugger."""
    fields = stat_fields(pid)
    return fields is not None and fields[0] in ("T", "t")


def start_time(pid: int) -> Optional[int]:
    """The start time in clock ticks since boot (None: no such process), which tells a process
    from a later one that reused its pid."""
    fields = stat_fields(pid)
    try:
        return int(fields[19]) if fields is not None else None
    except (IndexError, ValueError):
        return None


def runs_cli(pid: int) -> bool:
    """A live process whose command line runs cli.py (a rank or a launching cli.py)."""
    if not alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(arg.endswith(b"cli.py") for arg in cmdline)


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`, children before grandchildren. Read from every process's
    parent field, so that children forked by any of its threads are found (a thread's
    /proc/<pid>/task/<tid>/children lists only those that thread forked)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        fields = stat_fields(int(entry.name)) if entry.name.isdigit() else None
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, frontier = [], [pid]
    while frontier:
        frontier = [c for parent in frontier for c in children.get(parent, [])]
        found += frontier
    return found
