"""cli.py's supervisor for a fault-tolerant job: one process per replica, restarted alone.

DeepSpeed's per-node launcher ends every rank when one exits non-zero, which is exactly what
fault-tolerant mode must not do. Here cli.py starts each replica itself (`python cli.py ...` with
RANK=0, WORLD_SIZE=1 and a TCP store of its own: a replica group of one rank) and watches them by
pid: a replica that dies (or is killed, or whose heartbeat stalls: then it is killed alone, by
pid) is counted as a failure and restarted from its own last
checkpoint, up to `ft.max_restarts` times; it heals from a live peer at its first round. The
survivors go on meanwhile, their rounds with the participants they have. The job succeeds when
every replica has finished or given up and at least one finished cleanly. If the lighthouse dies,
no round can form any more: the supervisor ends the replicas and the job with one line naming
it; a resume (the same command) continues from the replicas' last checkpoints. A user error in a
replica (exit code 2) ends the job at once, as it would any job.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from core.errors import USER_ERROR_EXIT
from core.rundir import SUPERVISED_ENV, RunDir
from engine.ft.config import LIGHTHOUSE_ENV, REPLICA_ENV, FTConfig, quorum_size
from engine.ft.lighthouse import Lighthouse
from engine.launch.launcher import REPO, _script_args, free_port, omp_threads
from engine.launch.config import LaunchConfig
from engine.launch.rank_watch import RankWatch
from engine.train.faults import FaultLog
from engine.train.heartbeat import read_step

POLL_S = 0.2


#: seconds a replica left behind (see Supervisor._stop_the_outrun) must stay at one step before it
#: is stopped: five heartbeats, so that one finishing its last steps is never taken for it
OUTRUN_S = 10.0


@dataclass
class ReplicaProcess:
    index: int
    proc: Optional[subprocess.Popen] = None
    port: int = 0
    restarts: int = 0
    beat: tuple[int, float] = (0, 0.0)  # (mtime_ns of its heartbeat file, when it last changed)
    exits: list[int] = field(default_factory=list)  # exit codes of its processes, in order
    done: bool = False  # finished cleanly or gave up


def replica_env(index: int, count: int, host: str, port: int, lighthouse: str, launch: LaunchConfig) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_SIZE": "1", "MASTER_ADDR": host,
                "MASTER_PORT": str(port), REPLICA_ENV: f"{index}/{count}", LIGHTHOUSE_ENV: lighthouse,
                "OMP_NUM_THREADS": str(omp_threads(launch, count)), "PYTHONUNBUFFERED": "1", SUPERVISED_ENV: "1"})
    env.setdefault("PYTHONPATH", str(REPO))
    return env


class Supervisor:
    def __init__(self, ft: FTConfig, launch: LaunchConfig, run_dir: RunDir, count: int, overrides: list[str],
                 stall_s: float = 30.0) -> None:
        self.ft, self.launch, self.run_dir, self.count, self.stall_s = ft, launch, run_dir, count, stall_s
        self.host = launch.master_addr or "127.0.0.1"
        self.cmd = [sys.executable, str(REPO / "cli.py"), *_script_args(run_dir, overrides)]
        self.replicas = [ReplicaProcess(i) for i in range(count)]
        self.lighthouse: Optional[Lighthouse] = None
        self.failures: list[dict[str, Any]] = []
        self.outrun: list[dict[str, Any]] = []  # replicas stopped because the others finished first
        self.started = time.time()
        self._behind: dict[int, tuple[int, float]] = {}  # replica -> (its step, since when) while left behind
        self._stop_signal: Optional[int] = None

    def _replica_dir(self, index: int) -> RunDir:
        """RUN/replicas/<i>: the run directory replica `index` writes (engine.ft.config.Replica)."""
        return RunDir(self.run_dir.root / "replicas" / str(index))

    # ---- processes --------------------------------------------------------------------------
    def _start(self, rep: ReplicaProcess, address: str) -> None:
        rep.port = free_port(self.host)
        rep.beat = (0, time.monotonic())
        log = self.run_dir.logs / f"replica_{rep.index}.out"
        log.parent.mkdir(parents=True, exist_ok=True)
        rep.proc = subprocess.Popen(self.cmd, env=replica_env(rep.index, self.count, self.host, rep.port, address,
                                                              self.launch),
                                    stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)
        self._write_pids()

    def _write_pids(self) -> None:
        """RUN/logs/replica_<i>.pid: the pid of each replica's current process (tests and people
        kill one by it)."""
        for rep in self.replicas:
            if rep.proc is not None:
                (self.run_dir.logs / f"replica_{rep.index}.pid").write_text(f"{rep.proc.pid}\n")

    def _end_all(self, sig: int = signal.SIGTERM, grace_s: float = 10.0) -> None:
        live = [r.proc for r in self.replicas if r.proc is not None and r.proc.poll() is None]
        for proc in live:
            os.killpg(proc.pid, sig)
        deadline = time.monotonic() + grace_s
        for proc in live:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    # ---- the job ----------------------------------------------------------------------------
    def run(self) -> int:
        if self.ft.lighthouse is None:
            self.lighthouse = Lighthouse.start(self.host, self.ft, self.run_dir.logs / "lighthouse.log",
                                               quorum_size(self.ft, self.count))
            address = self.lighthouse.address
        else:
            address = self.ft.lighthouse if "://" in self.ft.lighthouse else f"http://{self.ft.lighthouse}"
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        logs = self.run_dir.logs
        logs.mkdir(parents=True, exist_ok=True)
        for stale in [logs / "ft_go", *logs.glob("replica_*.ready")]:
            stale.unlink(missing_ok=True)
        try:
            for rep in self.replicas:
                self._start(rep, address)
            return self._watch(address)
        finally:
            self._end_all()
            if self.lighthouse is not None:
                self.lighthouse.stop()
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self._stop_signal = signum  # the replicas checkpoint and stop on it (engine/train/stop.py)
        for rep in self.replicas:
            if rep.proc is not None and rep.proc.poll() is None:
                os.kill(rep.proc.pid, signum)

    def _watch(self, address: str) -> int:
        go = self.run_dir.logs / "ft_go"
        while not all(r.done for r in self.replicas):
            time.sleep(POLL_S)
            if not go.exists() and all((self.run_dir.logs / f"replica_{r.index}.ready").exists() or r.done
                                       for r in self.replicas):
                go.write_text("go\n")  # every replica's Manager is up: training starts together
            if self.lighthouse is not None and self.lighthouse.dead() is not None:
                self._end_all()
                print(f"syncopt: the torchft lighthouse ({address}, pid {self.lighthouse.proc.pid}) died with code "
                      f"{self.lighthouse.dead()}: no round can form; the replicas were stopped; run the same command "
                      "again to resume from their last checkpoints", file=sys.stderr, flush=True)
                self._write_summary(ended="lighthouse died")
                return 1
            for rep in self.replicas:
                self._kill_if_stalled(rep)
                if rep.done or rep.proc is None or rep.proc.poll() is None:
                    continue
                code = rep.proc.returncode
                rep.exits.append(code)
                if code == 0 or self._stop_signal is not None:
                    rep.done = True
                    continue
                if code == USER_ERROR_EXIT:
                    self._end_all()
                    self._report_user_error(rep)
                    return USER_ERROR_EXIT
                self.failures.append({"replica": rep.index, "exit": code, "time": time.time()})
                if rep.restarts < self.ft.max_restarts:
                    rep.restarts += 1
                    print(f"syncopt: replica {rep.index} died (exit code {code}); restarting it "
                          f"({rep.restarts}/{self.ft.max_restarts}); it heals from a live peer", file=sys.stderr,
                          flush=True)
                    self._start(rep, address)
                else:
                    rep.done = True
                    print(f"syncopt: replica {rep.index} died (exit code {code}) and used its ft.max_restarts="
                          f"{self.ft.max_restarts}; the others go on", file=sys.stderr, flush=True)
            self._stop_the_outrun()
        finished = [r.index for r in self.replicas if r.exits and r.exits[-1] == 0]
        self._write_summary(ended="finished" if finished else "failed")
        if not finished:
            print(f"syncopt: every replica failed; see {self.run_dir.logs}", file=sys.stderr, flush=True)
            return 1
        return 0

    def _stop_the_outrun(self) -> None:
        """Replicas left behind: every other replica has finished, and those still running are
        too few to form a quorum (`quorum_size`) and short of the finished ones' last step. They
        can never heal or train again (seen: a replica killed near the end, whose replacement
        started after the survivors had finished, waited for a quorum until ft.quorum_timeout_s),
        so they are stopped, with one line; the job's result is the finished replicas'."""
        running = [r for r in self.replicas if not r.done and r.proc is not None and r.proc.poll() is None]
        finished = [r for r in self.replicas if r.done and r.exits and r.exits[-1] == 0]
        if not running or not finished or len(running) >= quorum_size(self.ft, self.count):
            return
        if any(not r.done for r in self.replicas if r not in running):
            return  # a replica is being restarted: it may still make up a quorum
        final = max(self._final_step(r.index) for r in finished)
        behind = [(r, read_step(self._replica_dir(r.index).rank_progress(0))) for r in running]
        # unknown (no heartbeat: starting, or ending, which removes it), at the last step or with
        # its summary written: ending or not yet judgeable, not left behind
        if final < 0 or any(step is None or step >= final or self._replica_dir(r.index).summary.exists()
                            for r, step in behind):
            self._behind.clear()
            return
        # its heartbeat lags by up to a beat: stopped only when its step has not moved for OUTRUN_S
        now = time.monotonic()
        for rep, step in behind:
            if self._behind.get(rep.index, (None, 0.0))[0] != step:
                self._behind[rep.index] = (step, now)
        if any(now - self._behind[rep.index][1] < OUTRUN_S for rep, _ in behind):
            return
        for rep, step in behind:
            print(f"syncopt: replica {rep.index} (at step {step}) cannot rejoin: the other replicas finished at step "
                  f"{final} before it healed, and {len(running)} replica(s) cannot form a quorum of "
                  f"{quorum_size(self.ft, self.count)}; stopping it (the job's result is the finished replicas')",
                  file=sys.stderr, flush=True)
            rep.done = True
            self.outrun.append({"replica": rep.index, "step": step, "final_step": final})
            os.killpg(rep.proc.pid, signal.SIGKILL)  # (blocked in a quorum: a signal to stop is not heard)
            rep.proc.wait()
            rep.exits.append(rep.proc.returncode)

    def _final_step(self, index: int) -> int:
        try:
            return int(json.loads(self._replica_dir(index).summary.read_text())["steps"])
        except (OSError, ValueError, KeyError):
            return -1

    def _kill_if_stalled(self, rep: ReplicaProcess) -> None:
        """A replica whose heartbeat (RUN/replicas/<i>/logs/rank_0.progress, written by a thread)
        has not changed for `stall_s` while its process lives is stopped: kill it alone, by pid;
        it is then restarted like any failed replica."""
        if rep.done or rep.proc is None or rep.proc.poll() is not None:
            return
        try:
            stamp = self._replica_dir(rep.index).rank_progress(0).stat().st_mtime_ns
        except OSError:
            return  # not beating yet (starting up): nothing to judge
        now = time.monotonic()
        if stamp != rep.beat[0]:
            rep.beat = (stamp, now)
        elif now - rep.beat[1] >= self.stall_s:
            print(f"syncopt: replica {rep.index} (pid {rep.proc.pid}) has been silent for {now - rep.beat[1]:.0f} s: "
                  "killing it alone", file=sys.stderr, flush=True)
            os.killpg(rep.proc.pid, signal.SIGKILL)

    def _report_user_error(self, rep: ReplicaProcess) -> None:
        """The replica's one-line user error, as a launched job's (engine.launch.rank_watch)."""
        print(f"syncopt: error: {RankWatch(self._replica_dir(rep.index)).user_error()}", file=sys.stderr, flush=True)

    def _lost_work(self, per_replica: dict[str, Any], final_step: int) -> dict[str, Any]:
        """What the failures cost, in restart-all's terms: no optimizer step is lost (the survivors
        go on), a killed replica's absence is lost work (replica-steps from its kill to the step it
        healed at, or to the end if it never rejoined), recovery is the time from its kill to its
        replacement training again (resumed from its checkpoint, before healing), and the job's
        wall-clock is the supervisor's."""
        injected, absent, recover = 0, 0, []
        for rep in self.replicas:
            events = FaultLog(self._replica_dir(rep.index)).events()
            heals = sorted(int(h[0]) for h in per_replica.get(str(rep.index), {}).get("ft", {}).get("healed_state", []))
            for kill in (e for e in events if e.get("event") in ("kill", "stall")):
                injected += 1
                rejoined = next((h for h in heals if h >= int(kill["step"])), final_step)
                absent += max(0, rejoined - int(kill["step"]))
                back = next((e for e in events if e.get("event") == "resume" and e["time"] >= kill["time"]), None)
                if back is not None:
                    recover.append(round(back["time"] - kill["time"], 3))
        return {"faults_injected": injected, "steps_lost": 0, "replica_steps_lost": absent,
                "recover_s": round(sum(recover), 3), "recover_s_each": recover,
                "job_wall_s": round(time.time() - self.started, 3)}

    def _write_summary(self, ended: str) -> None:
        """RUN/summary.json: each replica's summary (from RUN/replicas/<i>/summary.json) and the
        job's failures and restarts; the metrics are the first finished replica's."""
        per_replica: dict[str, Any] = {}
        for rep in self.replicas:
            path = self._replica_dir(rep.index).summary
            if path.exists():
                per_replica[str(rep.index)] = json.loads(path.read_text())
        first = next(iter(per_replica.values()), {})
        summary = {**first, "ft": {"ended": ended, "replicas": self.count, "failures": len(self.failures),
                                   "restarts": {str(r.index): r.restarts for r in self.replicas},
                                   "failure_log": self.failures, "outrun": self.outrun,
                                   "per_replica": {i: s.get("ft", s.get("ranks", {})) for i, s in per_replica.items()}}}
        # the job-level counts under the names restart-all uses (summary.json, table columns)
        summary["failures"] = len(self.failures)
        summary["restarts"] = sum(r.restarts for r in self.replicas)
        summary.update(self._lost_work(per_replica, int(first.get("steps", 0))))
        if ended != "finished":
            summary = {"ft": summary["ft"]}  # no results: the job did not finish
            path = self.run_dir.root / "ft_ended.json"
        else:
            path = self.run_dir.summary
        path.write_text(json.dumps(summary, indent=1, default=str))


def supervise(ft: FTConfig, launch: LaunchConfig, run_dir: RunDir, count: int, overrides: list[str],
              stall_s: float = 30.0) -> int:
    return Supervisor(ft, launch, run_dir, count, overrides, stall_s).run()
