"""One run per run directory: a lock the launching process holds for the run's whole life.

Two runs started in one directory would overwrite each other's checkpoints, metrics and pid
files, and each would report the other's rank failures. The launching cli.py takes an exclusive
`flock` on `run.lock` before it writes anything there; the kernel releases it when that process
ends in any way (even kill -9), so a lock left by a dead run is simply taken over. Because ranks
outlive a killed cli.py (they finish the job and write its summary), a directory whose ranks are
still alive on this machine is refused as well, even without a lock holder.

A process forked from the holder (launch.launcher=fork's ranks) would share the lock's open file
and keep the directory locked after cli.py is killed; ranks started by DeepSpeed's launcher do
not hold it (their file descriptors are closed at exec). So a forked child closes its copy at
once (`os.register_at_fork`): the lock stays the parent's alone, as under the launcher.
"""
from __future__ import annotations

import fcntl
import os
import time
import weakref
from typing import IO, Optional

from core.errors import UserError
from core.rundir import RunDir
from engine.launch.procs import runs_cli


class RunLock:
    """Held from `acquire()` until `release()` or the end of this process (never by its forked children)."""

    def __init__(self, run_dir: RunDir) -> None:
        self.run_dir = run_dir
        self._fh: Optional[IO[str]] = None

    def acquire(self) -> "RunLock":
        """Take the directory or raise `UserError` naming the run that has it."""
        self.run_dir.root.mkdir(parents=True, exist_ok=True)
        fh = open(self.run_dir.lock, "a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "unknown"
            fh.close()
            raise UserError(f"hydra.run.dir={self.run_dir.root} is in use by another run ({describe(holder)}); "
                            "wait for it to end or pick another hydra.run.dir") from None
        alive = live_ranks(self.run_dir)
        if alive:
            fcntl.flock(fh, fcntl.LOCK_UN)
            fh.close()
            raise UserError(f"hydra.run.dir={self.run_dir.root}: ranks of an earlier run are still running there "
                            f"(pids {', '.join(map(str, alive))}); wait for them to end, or kill them, or pick "
                            "another hydra.run.dir")
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()} {os.uname().nodename} {time.time():.0f}\n")
        fh.flush()
        self._fh = fh
        _HELD.add(self)
        return self

    def release(self) -> None:
        if self._fh is not None:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None


    def _forget(self) -> None:
        """In a forked child: close this process's copy of the lock file without unlocking it
        (the lock belongs to the open file, which the parent keeps)."""
        if self._fh is not None:
            self._fh.close()  # no LOCK_UN: that would unlock the parent's lock too
            self._fh = None


_HELD: "weakref.WeakSet[RunLock]" = weakref.WeakSet()


def _forget_in_child() -> None:
    for lock in list(_HELD):
        lock._forget()
    _HELD.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def describe(holder: str) -> str:
    """'pid host time' as a person reads it."""
    parts = holder.split()
    if len(parts) < 3 or not parts[0].isdigit():
        return f"lock holder {holder!r}"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(parts[2])))
    return f"cli.py pid {parts[0]} on {parts[1]}, started {started}"


def live_ranks(run_dir: RunDir) -> list[int]:
    """Pids of this machine's ranks of the directory's last run that are still training it: a
    pid file naming this host, no exit record, and a live process that runs cli.py."""
    host = os.uname().nodename
    found = []
    for rank, path in sorted(run_dir.rank_files("pid").items()):
        if run_dir.rank_exit(rank).exists():
            continue
        try:
            pid_text, pid_host = path.read_text().split()
            pid = int(pid_text)
        except (OSError, ValueError):
            continue
        if pid_host == host and pid != os.getpid() and runs_cli(pid):
            found.append(pid)
    return found
