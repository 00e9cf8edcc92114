"""Which ranks a launching cli.py owns, whether they are alive, and how to stop them.

Ranks leave `logs/rank_<r>.pid` ("pid host") and, when they die of an exception,
`logs/rank_<r>.error` in the run directory. With a shared run directory every node sees every
node's files, and emulated hosts (network namespaces) even share a hostname, so which ranks a
launching process owns comes from the launch plan: the ranks it started on this machine, and, for
pdsh, the ranks it started on other hosts (signalled over ssh).
"""
from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from core.run_files import read_step
from core.rundir import USER_ERROR_PREFIX, RunDir
from engine.launch.procs import alive, stopped
from engine.launch.remote import catches, signal_remote


@dataclass(frozen=True)
class Stall:
    """A rank whose heartbeat stopped while its process is still there."""

    rank: int
    step: Optional[int]
    silent_s: float
    stopped: bool  # its process is in the stopped state (SIGSTOP, a debugger)

    def describe(self) -> str:
        where = f"at step {self.step}" if self.step is not None else "before its first step"
        how = "its process is in the stopped state, as after SIGSTOP" if self.stopped else "its process is alive but silent"
        return (f"rank {self.rank} stopped making progress {where}: no sign of life for "
                f"{self.silent_s:.0f} s ({how})")


class RankWatch:
    """Follows the ranks' pid files to tell which rank stopped first, and signals the ranks.

    `local_ranks`: the ranks this node started (None: any rank whose pid file names this host).
    `remote`: host -> ranks started there by pdsh, signalled over ssh. With a shared run directory
    every node sees every pid file, and emulated hosts may share a hostname, so ownership comes
    from the launch plan, not from the file.
    """

    def __init__(self, run_dir: RunDir | Path, local_ranks: Optional[set[int]] = None,
                 remote: Optional[dict[str, list[int]]] = None, ssh_port: Optional[int] = None) -> None:
        self.run_dir = RunDir.of(run_dir)
        self.host = os.uname().nodename
        self.local_ranks = local_ranks
        self.remote = remote or {}
        self.ssh_port = ssh_port
        self.pids: dict[int, int] = {}
        self.gone: list[int] = []  # ranks in the order their process disappeared
        self._beats: dict[int, tuple[tuple[int, int], float]] = {}  # rank -> (file stamp, seen at)
        self._request_seen = self._request_stamp()

    def _mine(self, rank: int) -> bool:
        """Started by this launch: here, or by pdsh on a host this process signals."""
        return self.local_ranks is None or rank in self.local_ranks or self._is_remote(rank)

    def _is_remote(self, rank: int) -> bool:
        return any(rank in ranks for ranks in self.remote.values())

    def clear(self) -> None:
        """Remove this launch's ranks' pid and error files from an earlier launch (not other nodes')."""
        for kind in ("pid", "error", "exit", "progress"):
            for rank, path in self.run_dir.rank_files(kind).items():
                if self._mine(rank):
                    path.unlink(missing_ok=True)

    def _request_stamp(self) -> Optional[tuple[int, int]]:
        try:
            st = self.run_dir.stop_request.stat()
            return st.st_ino, st.st_mtime_ns
        except OSError:
            return None

    def stop_requested(self) -> bool:
        """A stop_request file that appeared (or changed) since this launch began."""
        stamp = self._request_stamp()
        if stamp is not None and stamp != self._request_seen:
            self._request_seen = stamp
            return True
        return False

    def poll(self) -> None:
        for rank, f in self.run_dir.rank_files("pid").items():
            if rank in self.pids or self._is_remote(rank) or not self._mine(rank):
                continue
            try:
                pid, host = f.read_text().split()
            except ValueError:
                continue
            if self.local_ranks is not None or host == self.host:
                self.pids[rank] = int(pid)
        for rank, pid in self.pids.items():
            if rank not in self.gone and not alive(pid):
                self.gone.append(rank)

    def exit_codes(self) -> Optional[dict[int, int]]:
        """Every local rank's exit code once all of them have ended (None before that, and for
        launches with ranks on other hosts). Lets the job end as soon as its ranks have, instead of
        waiting for the launcher's polling loop and teardown."""
        if self.remote or not self.pids or (self.local_ranks is not None and set(self.pids) != self.local_ranks):
            return None
        codes = {}
        for rank in self.pids:
            if rank not in self.gone:
                return None
            try:
                codes[rank] = int(self.run_dir.rank_exit(rank).read_text())
            except (OSError, ValueError):
                return None
        return codes

    def stalls(self, silent_s: float) -> list[Stall]:
        """This launch's ranks whose heartbeat has not changed for `silent_s` seconds while their
        process is alive (or, on another host, while no exit is recorded)."""
        now = time.monotonic()
        found = []
        for rank, path in self.run_dir.rank_files("progress").items():
            if not self._mine(rank) or rank in self.gone or self.run_dir.rank_exit(rank).exists():
                continue
            try:
                st = path.stat()
            except OSError:
                continue
            stamp = (st.st_ino, st.st_mtime_ns)
            seen = self._beats.get(rank)
            if seen is None or seen[0] != stamp:
                self._beats[rank] = (stamp, now)
                continue
            if now - seen[1] >= silent_s:
                pid = self.pids.get(rank)
                found.append(Stall(rank, read_step(path), now - seen[1], pid is not None and stopped(pid)))
        return found

    def ready(self) -> bool:
        """Whether a stop signal can be delivered now: every rank of this launch has started, and
        the local ones catch SIGUSR1 (before its handler is installed, SIGUSR1 kills a rank; the
        remote ones are waited for on their host)."""
        if self.local_ranks is not None and not self.local_ranks <= set(self.pids) | set(self.gone):
            return False
        if self.local_ranks is None and not self.pids and not self.remote:
            return False
        if any(self._pid_of(r) is None for ranks in self.remote.values() for r in ranks):
            return False
        return all(catches(pid, signal.SIGUSR1) is not False
                   for rank, pid in self.pids.items() if rank not in self.gone)

    def signal_ranks(self, sig: int) -> int:
        """Signal the live ranks, here and (over ssh) on pdsh-started hosts; returns how many."""
        sent = 0
        for rank, pid in self.pids.items():
            if rank not in self.gone:
                try:
                    os.kill(pid, sig)
                    sent += 1
                except ProcessLookupError:
                    pass
        for host, ranks in self.remote.items():
            pids = [p for p in (self._pid_of(r) for r in ranks) if p is not None]
            signal_remote(host, sys.executable, pids, signal.Signals(sig).name[3:], self.ssh_port)
            sent += len(pids)
        return sent

    def _pid_of(self, rank: int) -> Optional[int]:
        try:
            return int(self.run_dir.rank_pid(rank).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def user_error(self) -> str:
        """The one-line user error the ranks left (the lowest rank's), for exit code 2."""
        for rank, path in sorted(self.run_dir.rank_files("error").items()):
            try:
                text = path.read_text().strip()
            except OSError:
                continue
            if text.startswith(USER_ERROR_PREFIX):
                return text[len(USER_ERROR_PREFIX):]
        return f"the ranks refused the run (exit code 2); see {self.run_dir.logs}"

    def failure_report(self, code: int) -> str:
        """Name the rank that caused the failure: a rank that vanished without leaving an error
        (killed, segfault) comes first; else the earliest error that is not merely a peer's
        connection dropping (which every survivor reports when one rank dies)."""
        errors = {rank: (f.stat().st_mtime, f.read_text().strip())
                  for rank, f in self.run_dir.rank_files("error").items()}
        silent = [r for r in self.gone if r not in errors]
        if silent:
            rank, why = silent[0], "its process ended without an error (killed or crashed)"
        elif errors:
            primary = {r: e for r, e in errors.items() if not _is_peer_loss(e[1])} or errors
            rank = min(primary, key=lambda r: primary[r][0])
            why = primary[rank][1]
        else:
            return f"the job failed (launcher exit code {code}); see {self.run_dir.logs}"
        return (f"rank {rank} failed: {why}; the job was stopped (launcher exit code {code}); "
                f"log: {self.run_dir.rank_log(rank)}")


_PEER_LOSS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Timed out",
              "timed out", "Connection refused")


def _is_peer_loss(message: str) -> bool:
    return any(marker in message for marker in _PEER_LOSS)
