"""This node's replica processes in a fault-tolerant job: started, restarted alone, told to stop,
killed, each with its record (exit codes, restarts, the failures).

DeepSpeed's per-node launcher ends every rank when one exits non-zero, which is exactly what
fault-tolerant mode must not do. So the supervisor starts each replica itself (`python cli.py ...`
with RANK=0, WORLD_SIZE=1 and a TCP store of its own: a replica group of one rank, writing its own
run directory RUN/replicas/<i>/) in a session of its own, and judges each by its pid and its
heartbeat file: a replica that dies is restarted from its own last checkpoint, up to
`ft.max_restarts` times, and heals from a live peer at its first round; one whose heartbeat stalls
is killed alone, by its process group, and then restarted like any failed replica.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

from core.errors import USER_ERROR_EXIT
from core.run_files import read_step
from core.rundir import SUPERVISED_ENV, RunDir
from engine.ft.config import LIGHTHOUSE_ENV, REPLICA_ENV
from engine.ft.launch.job_processes import JobProcesses
from engine.ft.launch.nodes import NodeLayout
from engine.launch.commands import REPO, free_port, omp_threads, script_args
from engine.launch.config import LaunchConfig
from engine.launch.rank_watch import RankWatch, Stall
from engine.launch.remote import catches

#: after a stop reached a replica, how long beyond ft.stop_wait_s it may neither advance a step nor end
#: (a checkpoint, a final evaluation) before it is killed
STOP_GRACE_S = 60.0


@dataclass
class ReplicaProcess:
    index: int
    proc: Optional[subprocess.Popen] = None
    port: int = 0
    restarts: int = 0
    beat: tuple[int, float] = (0, 0.0)  # (mtime_ns of its heartbeat file, when it last changed)
    exits: list[int] = field(default_factory=list)  # exit codes of its processes, in order
    done: bool = False  # finished cleanly or gave up
    told: Optional[tuple[Optional[int], float]] = None  # a stop delivered: (its step, since when at it)

    def running(self) -> bool:
        """Its current process lives and it has not finished or given up."""
        return not self.done and self.proc is not None and self.proc.poll() is None

    def state(self) -> dict[str, Any]:
        """What the other nodes and the job's summary know of it."""
        return {"done": self.done, "exits": self.exits, "restarts": self.restarts}


def replica_env(index: int, count: int, host: str, port: int, lighthouse: str, launch: LaunchConfig,
                here: Optional[int] = None) -> dict[str, str]:
    """Replica `index` of `count`; `here`: how many replicas share this node's cores (None: all)."""
    env = dict(os.environ)
    env.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_SIZE": "1", "MASTER_ADDR": host,
                "MASTER_PORT": str(port), REPLICA_ENV: f"{index}/{count}", LIGHTHOUSE_ENV: lighthouse,
                "OMP_NUM_THREADS": str(omp_threads(launch, here or count)), "PYTHONUNBUFFERED": "1", SUPERVISED_ENV: "1"})
    env.setdefault("PYTHONPATH", str(REPO))
    return env


def replica_dir(run_dir: RunDir, index: int) -> RunDir:
    """RUN/replicas/<i>: the run directory replica `index` writes (engine.ft.config.Replica)."""
    return RunDir(run_dir.root / "replicas" / str(index))


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL a replica's process group (it may have just ended: the next poll counts it)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class Replicas:
    """This node's replicas (`layout.indices`), their processes and their failures."""

    def __init__(self, run_dir: RunDir, layout: NodeLayout, launch: LaunchConfig, overrides: list[str],
                 max_restarts: int, stall_s: float) -> None:
        self.run_dir, self.layout, self.launch = run_dir, layout, launch
        self.max_restarts, self.stall_s = max_restarts, stall_s
        self.cmd = [sys.executable, str(REPO / "cli.py"), *script_args(run_dir, overrides)]
        self.all = [ReplicaProcess(i) for i in layout.indices]
        self.failures: list[dict[str, Any]] = []
        self.processes: Optional[JobProcesses] = None  # every process the supervisor started (set before any)

    def __iter__(self) -> Iterator[ReplicaProcess]:
        return iter(self.all)

    def __len__(self) -> int:
        return len(self.all)

    def all_done(self) -> bool:
        return all(r.done for r in self.all)

    def states(self) -> dict[int, dict[str, Any]]:
        return {r.index: r.state() for r in self.all}

    # ---- starting and ending ----------------------------------------------------------------
    def start(self, rep: ReplicaProcess, address: str) -> None:
        """Start (or restart) `rep`'s process against the lighthouse at `address`."""
        rep.port = free_port(self.layout.host)
        rep.beat = (0, time.monotonic())
        log = self.run_dir.logs / f"replica_{rep.index}.out"
        log.parent.mkdir(parents=True, exist_ok=True)
        rep.proc = subprocess.Popen(self.cmd, env=replica_env(rep.index, self.layout.count, self.layout.host,
                                                              rep.port, address, self.launch, len(self.all)),
                                    stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)
        rep.told = None
        assert self.processes is not None
        self.processes.add("replica", rep.proc, rep.index)
        self.write_pids()

    def write_pids(self) -> None:
        """RUN/logs/replica_<i>.pid: the pid of each replica's current process (tests and people
        kill one by it)."""
        for rep in self.all:
            if rep.proc is not None:
                (self.run_dir.logs / f"replica_{rep.index}.pid").write_text(f"{rep.proc.pid}\n")

    def end_all(self, sig: int = signal.SIGTERM, grace_s: float = 10.0) -> None:
        """Signal every live replica's group, and kill what has not ended within `grace_s`."""
        live = [r.proc for r in self.all if r.proc is not None and r.proc.poll() is None]
        for proc in live:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        for proc in live:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def reap_killed(self) -> None:
        """After every group was killed at once: wait for each process and count it done."""
        for rep in self.all:
            if rep.proc is not None:
                rep.proc.wait()
                rep.done = True

    # ---- what ended -------------------------------------------------------------------------
    def reap(self, stopping: bool, address: str) -> Optional[ReplicaProcess]:
        """Count every replica process that ended: clean, or during a stop, it is done; a user
        error (exit code 2) is returned, for the job to end on; any other failure is recorded and
        restarted alone (it heals from a live peer), or, past ft.max_restarts, given up."""
        for rep in self.all:
            if rep.done or rep.proc is None or rep.proc.poll() is None:
                continue
            code = rep.proc.returncode
            rep.exits.append(code)
            if code == 0 or stopping:
                rep.done = True
                continue
            if code == USER_ERROR_EXIT:
                return rep
            self.failures.append({"replica": rep.index, "exit": code, "time": time.time()})
            if rep.restarts < self.max_restarts:
                rep.restarts += 1
                print(f"syncopt: replica {rep.index} died (exit code {code}); restarting it "
                      f"({rep.restarts}/{self.max_restarts}); it heals from a live peer", file=sys.stderr, flush=True)
                self.start(rep, address)
            else:
                rep.done = True
                print(f"syncopt: replica {rep.index} died (exit code {code}) and used its ft.max_restarts="
                      f"{self.max_restarts}; the others go on", file=sys.stderr, flush=True)
        return None

    def user_error(self, rep: ReplicaProcess) -> str:
        """The replica's one-line user error, as a launched job's (engine.launch.rank_watch)."""
        return RankWatch(replica_dir(self.run_dir, rep.index)).user_error()

    # ---- stalls -----------------------------------------------------------------------------
    def stalls(self) -> list[Stall]:
        """Replicas whose heartbeat (RUN/replicas/<i>/logs/rank_0.progress, written by a thread)
        has not changed for `stall_s` while their process lives (`Stall.rank`: the replica)."""
        found = []
        now = time.monotonic()
        for rep in self.all:
            if not rep.running():
                continue
            try:
                stamp = replica_dir(self.run_dir, rep.index).rank_progress(0).stat().st_mtime_ns
            except OSError:
                continue  # not beating yet (starting up): nothing to judge
            if stamp != rep.beat[0]:
                rep.beat = (stamp, now)
            elif now - rep.beat[1] >= self.stall_s:
                found.append(Stall(rep.index, None, now - rep.beat[1], False))
        return found

    def kill_stalled(self, stalls: Sequence[Stall]) -> None:
        """Kill each stalled replica alone, by its process group; it is then restarted like any
        failed replica."""
        by_index = {r.index: r for r in self.all}
        for stall in stalls:
            proc = by_index[stall.rank].proc
            assert proc is not None
            print(f"syncopt: replica {stall.rank} (pid {proc.pid}) has been silent for {stall.silent_s:.0f} s: "
                  "killing it alone", file=sys.stderr, flush=True)
            os.killpg(proc.pid, signal.SIGKILL)

    # ---- a stop -----------------------------------------------------------------------------
    def tell_stop(self, stop_wait_s: float) -> None:
        """Tell each live replica of a pending stop (SIGUSR1: engine/train/stop.py), once its stop
        handler is installed; one still starting (no handler yet: SIGUSR1 would kill it anyway)
        has trained nothing since its checkpoint and is ended. A told replica that neither
        advances a step nor ends for ft.stop_wait_s + STOP_GRACE_S is killed."""
        now = time.monotonic()
        for rep in self.all:
            if not rep.running():
                continue
            assert rep.proc is not None
            step = read_step(replica_dir(self.run_dir, rep.index).rank_progress(0))
            if rep.told is None:
                handles = catches(rep.proc.pid, signal.SIGUSR1)
                try:
                    if handles:
                        os.kill(rep.proc.pid, signal.SIGUSR1)
                    elif handles is False:
                        os.killpg(rep.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass  # (it has just ended: the next poll counts it)
                rep.told = (step, now)
            elif rep.told[0] != step:
                rep.told = (step, now)
            elif now - rep.told[1] > stop_wait_s + STOP_GRACE_S:
                print(f"syncopt: replica {rep.index} (pid {rep.proc.pid}) neither trained nor stopped for "
                      f"{now - rep.told[1]:.0f} s after the stop (ft.stop_wait_s={stop_wait_s:g} + "
                      f"{STOP_GRACE_S:.0f} s): killing it", file=sys.stderr, flush=True)
                kill_group(rep.proc)

    def local(self, index: int) -> Optional[ReplicaProcess]:
        """Replica `index` if it is this node's and has been started."""
        rep = next((r for r in self.all if r.index == index), None)
        return rep if rep is not None and rep.proc is not None else None

    def stop_for_good(self, rep: ReplicaProcess) -> None:
        """End `rep` without a restart: killed (one left behind is blocked in a quorum, where a
        signal to stop is not heard), reaped and counted done."""
        assert rep.proc is not None
        rep.done = True
        os.killpg(rep.proc.pid, signal.SIGKILL)
        rep.proc.wait()
        rep.exits.append(rep.proc.returncode)


def final_step(run_dir: RunDir, index: int) -> int:
    """The step replica `index` finished at (its summary's), -1 before it has finished."""
    try:
        return int(json.loads(replica_dir(run_dir, index).summary.read_text())["steps"])
    except (OSError, ValueError, KeyError):
        return -1
