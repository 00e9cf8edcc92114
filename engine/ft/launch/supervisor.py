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

A quorum that can no longer form (the replicas still running are fewer than ft.min_replicas and
none is left to restart) ends the job: the supervisor writes `logs/ft_quorum_lost`, the survivors
give up the round they wait in at once, checkpoint what they hold and stop, and the job ends with
one line naming the replicas gone, exit code 1 and `ft_ended.json` saying so. Stop signals end a
fault-tolerant job as they end a plain one: the first (or `RUN/stop_request`) makes every replica
checkpoint and stop at the next round the replicas agree on (engine/ft/rank/rounds.py), or, if no
round can complete, `ft.stop_wait_s` after it reached it; a replica that neither trains nor ends
for `ft.stop_wait_s + STOP_GRACE_S` after it is told is killed. The second (or `logs/ft_stop_now`,
written by a launching process over ssh) kills every process the job started at once
(engine/ft/launch/job_processes.py records them).

Several nodes (`launch.hostfile` with `launch.no_ssh=true`, as slurm/syncopt.sbatch runs it): one
supervisor per node, each owning its hostfile line's replicas; they meet through the shared run
directory (engine/ft/launch/nodes.py), node 0 holding the lighthouse and writing the job's summary.
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

from core import stop_signals
from core.errors import USER_ERROR_EXIT
from core.run_files import FaultLog, go_flag, quorum_lost_flag, read_step, ready_flag, stop_now_flag
from core.rundir import SUPERVISED_ENV, RunDir
from engine.checkpoint.files import complete_checkpoints
from engine.ft.launch.nodes import (NodeLayout, NodeRecord, NodeWatch, clear_job_files, layout_of, meet,
                                     read_job_end, read_node_record, write_job_end, write_node_record)
from engine.ft.launch.job_processes import JobProcesses, process_log
from engine.ft.launch.lighthouse import Lighthouse
from engine.launch.rank_watch import RankWatch
from engine.ft.config import LIGHTHOUSE_ENV, REPLICA_ENV, FTConfig, quorum_size
from engine.launch.commands import REPO, free_port, omp_threads, script_args
from engine.launch.config import LaunchConfig
from engine.launch.remote import catches

POLL_S = 0.2


#: seconds a replica left behind (see Supervisor._stop_the_outrun) must stay at one step before it
#: is stopped: five heartbeats, so that one finishing its last steps is never taken for it
OUTRUN_S = 10.0

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


def replica_env(index: int, count: int, host: str, port: int, lighthouse: str, launch: LaunchConfig,
                here: Optional[int] = None) -> dict[str, str]:
    """Replica `index` of `count`; `here`: how many replicas share this node's cores (None: all)."""
    env = dict(os.environ)
    env.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_SIZE": "1", "MASTER_ADDR": host,
                "MASTER_PORT": str(port), REPLICA_ENV: f"{index}/{count}", LIGHTHOUSE_ENV: lighthouse,
                "OMP_NUM_THREADS": str(omp_threads(launch, here or count)), "PYTHONUNBUFFERED": "1", SUPERVISED_ENV: "1"})
    env.setdefault("PYTHONPATH", str(REPO))
    return env


class Supervisor:
    def __init__(self, ft: FTConfig, launch: LaunchConfig, run_dir: RunDir, layout: NodeLayout, overrides: list[str],
                 stall_s: float = 30.0) -> None:
        self.ft, self.launch, self.run_dir, self.stall_s = ft, launch, run_dir, stall_s
        self.layout, self.count, self.host = layout, layout.count, layout.host
        self.cmd = [sys.executable, str(REPO / "cli.py"), *script_args(run_dir, overrides)]
        self.replicas = [ReplicaProcess(i) for i in layout.indices]  # this node's
        self.lighthouse: Optional[Lighthouse] = None
        self.failures: list[dict[str, Any]] = []
        self.outrun: list[dict[str, Any]] = []  # replicas stopped because the others finished first
        self.started = time.time()
        self._behind: dict[int, tuple[int, float]] = {}  # replica -> (its step, since when) while left behind
        self._stop_signal: Optional[int] = None
        # the other nodes (several nodes only): lost when their record is silent for longer than a stall
        self.nodes = NodeWatch(run_dir, layout, stale_s=max(30.0, 2 * stall_s), first_s=launch.node_wait_s)
        self._stop_stamp = self._stamp(self.run_dir.stop_request)
        self._stop_now_stamp = self._stamp(stop_now_flag(self.run_dir.logs))
        self._signals: list[int] = []  # the stop signals received, in order
        self._stop_now: Optional[int] = None  # the signal that asked to stop at once
        self.quorum_lost: Optional[dict[str, Any]] = None  # why no quorum can form any more (it ended the job)
        self.processes: Optional[JobProcesses] = None  # every process this supervisor started

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
                                                              self.launch, len(self.replicas)),
                                    stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)
        rep.told = None
        assert self.processes is not None
        self.processes.add("replica", rep.proc, rep.index)
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

    # ---- the job ----------------------------------------------------------------------------
    def _lighthouse_address(self) -> str:
        """Node 0 starts the lighthouse (unless ft.lighthouse names a cluster's); the other nodes
        use node 0's, on the master address and port every node was given."""
        if self.ft.lighthouse is not None:
            return self.ft.lighthouse if "://" in self.ft.lighthouse else f"http://{self.ft.lighthouse}"
        if self.layout.node == 0:
            assert self.processes is not None
            self.lighthouse = Lighthouse.start(self.layout.lighthouse_host, self.ft, self.run_dir.logs / "lighthouse.log",
                                               quorum_size(self.ft, self.count), port=self.layout.lighthouse_port,
                                               started=lambda proc: self.processes.add("lighthouse", proc))
            return self.lighthouse.address
        return f"http://{self.layout.lighthouse_host}:{self.layout.lighthouse_port}"

    def _meet(self) -> None:
        """Several nodes: node 0 (old files cleared, lighthouse up) writes its launch record once
        every node has joined this attempt (engine.ft.launch.nodes.meet)."""
        record = {"mode": "ft_no_ssh", "nodes": self.layout.nodes, "replicas": self.count,
                  "master_addr": self.layout.lighthouse_host, "master_port": self.layout.lighthouse_port,
                  "node": os.uname().nodename}
        meet(self.run_dir, self.layout, record, self.launch.node_wait_s, abort=self._stopping)

    def run(self) -> int:
        logs = self.run_dir.logs
        logs.mkdir(parents=True, exist_ok=True)
        # first: a signal from here on is heard, and every process started from here on is recorded
        previous = stop_signals.install(self._on_signal)
        self.processes = JobProcesses(process_log(logs, self.layout.node))
        try:
            if self.layout.node == 0:
                clear_job_files(self.run_dir, self.layout.nodes)
            address = self._lighthouse_address()
            if self.layout.multi and not self._stopping():
                self._meet()
                self.nodes.started = time.monotonic()  # every node has joined: their records come next
            if self._stopping():
                return self._stopped_before_start()
            for rep in self.replicas:
                self._start(rep, address)
            code = self._watch(address)
            return self._end_job(code) if self.layout.multi and self._stop_now is None else code
        finally:
            self._end_all()
            if self.lighthouse is not None:
                self.lighthouse.stop()
            self.processes.kill_all()  # whatever a replica left behind (a dead replica's children)
            stop_signals.restore(previous)

    # ---- stopping ---------------------------------------------------------------------------
    def _on_signal(self, signum: int, frame: Any) -> None:
        """The first stop signal: every replica checkpoints and stops at the next round the
        replicas agree on (delivered by `_deliver_stop`); the second: everything ends at once."""
        self._signals.append(signum)
        name = signal.Signals(signum).name
        if len(self._signals) == 1:
            self._stop_signal = signum
            print(f"syncopt: {name}: every replica checkpoints and stops at the next round the replicas agree on "
                  f"(or, if none can complete, ft.stop_wait_s={self.ft.stop_wait_s:g} after reaching it); signal "
                  "again to stop at once", file=sys.stderr, flush=True)
        elif self._stop_now is None:
            self._stop_now = signum
            if self.processes is not None:
                self.processes.kill_all()  # now; the watch loop reaps them and reports

    def _stopping(self) -> bool:
        return self._stop_signal is not None or self._stop_now is not None

    def _stopped_before_start(self) -> int:
        """A stop before any replica started: nothing to checkpoint; the lighthouse ends in run()."""
        signum = self._stop_now or self._stop_signal or signal.SIGTERM
        print(f"syncopt: {signal.Signals(signum).name}: stopped before any replica started; nothing to checkpoint",
              file=sys.stderr, flush=True)
        self._record("stopped", 128 + signum)
        return 128 + signum

    def _deliver_stop(self) -> None:
        """Tell each live replica of a pending stop (SIGUSR1: engine/train/stop.py), once its stop
        handler is installed; one still starting (no handler yet: SIGUSR1 would kill it anyway)
        has trained nothing since its checkpoint and is ended. A told replica that neither
        advances a step nor ends for ft.stop_wait_s + STOP_GRACE_S is killed."""
        now = time.monotonic()
        for rep in self.replicas:
            if rep.done or rep.proc is None or rep.proc.poll() is not None:
                continue
            step = read_step(self._replica_dir(rep.index).rank_progress(0))
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
            elif now - rep.told[1] > self.ft.stop_wait_s + STOP_GRACE_S:
                print(f"syncopt: replica {rep.index} (pid {rep.proc.pid}) neither trained nor stopped for "
                      f"{now - rep.told[1]:.0f} s after the stop (ft.stop_wait_s={self.ft.stop_wait_s:g} + "
                      f"{STOP_GRACE_S:.0f} s): killing it", file=sys.stderr, flush=True)
                try:
                    os.killpg(rep.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def _end_at_once(self) -> int:
        """The second stop signal: every process of this node's share of the job is killed (the
        signal handler already sent SIGKILL to each group); reap them and say so."""
        signum = self._stop_now or signal.SIGKILL
        assert self.processes is not None
        self.processes.kill_all()  # (again: one started while the handler ran)
        for rep in self.replicas:
            if rep.proc is not None:
                rep.proc.wait()
                rep.done = True
        if self.lighthouse is not None:
            self.lighthouse.proc.wait()
        print(f"syncopt: second {signal.Signals(signum).name}: stopped at once; every replica and the lighthouse "
              "were killed, each replica's last checkpoint stays; run the same command to resume from them",
              file=sys.stderr, flush=True)
        self._record("stopped at once", 128 + signum)
        if self.layout.node == 0:
            self._write_summary(ended="stopped at once")
        return 128 + signum

    @staticmethod
    def _stamp(path: Path) -> Optional[int]:
        try:
            return path.stat().st_mtime_ns
        except OSError:
            return None

    def _requests(self) -> None:
        """RUN/stop_request (slurm/syncopt.sbatch's time-limit warning; every node watches it)
        is a first stop signal; logs/ft_stop_now (a launching process's second signal, over ssh)
        a second."""
        if self._stop_signal is None and self._stamp(self.run_dir.stop_request) not in (None, self._stop_stamp):
            self._on_signal(signal.SIGUSR1, None)
        now_stamp = self._stamp(stop_now_flag(self.run_dir.logs))
        if self._stop_now is None and now_stamp not in (None, self._stop_now_stamp):
            self._signals.append(signal.SIGUSR1)
            self._stop_now = signal.SIGTERM
            assert self.processes is not None
            self.processes.kill_all()

    def _ready_to_go(self) -> bool:
        """Every replica of the job is ready (its Manager is up) or done."""
        remote = self.nodes.remote_replicas()
        local = {r.index: r for r in self.replicas}
        return all(ready_flag(self.run_dir.logs, i).exists()
                   or (local[i].done if i in local else remote.get(i, {}).get("done", False))
                   for i in range(self.count))

    def _record(self, ended: Optional[str] = None, code: int = 0) -> None:
        """This node's record for the others (several nodes only)."""
        if not self.layout.multi:
            return
        write_node_record(self.run_dir, NodeRecord(
            self.layout.node, {str(r.index): {"done": r.done, "exits": r.exits, "restarts": r.restarts}
                               for r in self.replicas}, self.failures, self.outrun, ended, code))

    def _end_early(self, code: int, ended: str, line: str) -> int:
        """End this node's replicas and the job: one line, the record that tells the other nodes,
        and (node 0) what the job left (ft_ended.json)."""
        self._record(ended, code)  # first: the other nodes end theirs meanwhile
        self._end_all()
        if line:
            print(line, file=sys.stderr, flush=True)
        if self.layout.node == 0:
            self._write_summary(ended=ended)
        return code

    def _watch(self, address: str) -> int:
        go = go_flag(self.run_dir.logs)
        while not all(r.done for r in self.replicas):
            time.sleep(POLL_S)
            self._requests()
            if self._stop_now is not None:
                return self._end_at_once()
            if self.layout.multi:
                self.nodes.poll()
                other = self.nodes.ended()
                if other is not None:
                    return self._end_early(other.code, other.ended or "", (
                        f"syncopt: node {other.node} ended the job ({other.ended}); this node's replicas were stopped"))
                if self.layout.node != 0 and self.nodes.lost(0):
                    return self._end_early(1, "node 0 lost", f"syncopt: node 0 (the lighthouse's, {address}) has been "
                                           "silent: no round can form; this node's replicas were stopped; run the same "
                                           "command again on every node to resume from their last checkpoints")
            if self.layout.node == 0 and not go.exists() and self._ready_to_go():
                go.write_text("go\n")  # every replica's Manager is up: training starts together
            if self.lighthouse is not None and self.lighthouse.dead() is not None and self._stop_now is None:
                return self._end_early(1, "lighthouse died", (
                    f"syncopt: the torchft lighthouse ({address}, pid {self.lighthouse.proc.pid}) died with code "
                    f"{self.lighthouse.dead()}: no round can form; the replicas were stopped; run the same command "
                    "again to resume from their last checkpoints"))
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
                    self._record("user error", USER_ERROR_EXIT)
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
            self._check_quorum()
            if self._stop_signal is not None:
                self._deliver_stop()
            self._record()
        self._record()
        if self.layout.multi:
            return 0  # the job's end is decided in _end_job
        return self._finish()

    def _finish(self) -> int:
        """Every replica of the job is done: the summary, and the job's exit code."""
        finished = [i for i, state in self._all_replicas().items() if state["exits"] and state["exits"][-1] == 0
                    and self._replica_dir(i).summary.exists()]
        stopped = [i for i in range(self.count) if self._replica_dir(i).stopped.exists()]
        if self.quorum_lost is not None:
            return self._end_quorum_lost(stopped)
        if not finished and stopped:  # a stop signal or stop_request: checkpointed, to be resumed
            self.run_dir.stopped.write_text(self._replica_dir(stopped[0]).stopped.read_text())
            self._write_summary(ended="stopped")
            return 0
        if not finished and self._stop_signal is not None:  # stopped while every replica was still starting
            self._write_summary(ended="stopped")
            print("syncopt: stopped before any replica had trained: nothing new to checkpoint", file=sys.stderr,
                  flush=True)
            return 128 + self._stop_signal
        self._write_summary(ended="finished" if finished else "failed")
        if not finished:
            print(f"syncopt: every replica failed; see {self.run_dir.logs}", file=sys.stderr, flush=True)
            return 1
        return 0

    # ---- a quorum that can no longer form ---------------------------------------------------------
    def _check_quorum(self) -> None:
        """The replicas still running (or being restarted) are fewer than ft.min_replicas and none
        has finished (that case is `_stop_the_outrun`'s): every other replica used its
        ft.max_restarts (or its node was lost), so no quorum can form again and the survivors would
        wait in theirs for as long as ft.quorum_timeout_s allows (an hour). End the job instead:
        the survivors checkpoint what they hold and stop (`quorum_lost_flag` makes one waiting in a
        round's quorum give it up at once; SIGUSR1 reaches one still training, which stops at its
        next round). Over several nodes every supervisor sees the same replicas and tells its own."""
        if self.quorum_lost is not None or self._stop_signal is not None:
            return
        states = self._all_replicas()
        if len(states) < self.count:
            return  # another node's replicas are not known yet
        live = sorted(i for i, st in states.items() if not st["done"])
        need = quorum_size(self.ft, self.count)
        if not live or len(live) >= need or any(st["exits"] and st["exits"][-1] == 0 for st in states.values()):
            return
        gone = sorted(i for i, st in states.items() if st["done"])
        self.quorum_lost = {"gone": gone, "live": live, "min_replicas": need, "replicas": self.count,
                            "max_restarts": self.ft.max_restarts, "time": time.time()}
        quorum_lost_flag(self.run_dir.logs).write_text(json.dumps(self.quorum_lost) + "\n")
        self._stop_signal = signal.SIGUSR1  # delivered by _deliver_stop; no replica is restarted from here on

    def _end_quorum_lost(self, stopped: list[int]) -> int:
        """Every survivor has checkpointed and stopped (or ended): one line, ft_ended.json, exit 1."""
        assert self.quorum_lost is not None
        lost = self.quorum_lost
        lost["checkpoints"] = {str(i): self._newest_checkpoint(i) for i in lost["live"]}
        lost["stopped"] = [i for i in lost["live"] if i in stopped]
        saved = ", ".join(f"replica {i} at step {step}" for i, step in lost["checkpoints"].items() if step is not None)
        self._write_summary(ended="quorum lost")
        print(f"syncopt: the quorum can no longer form: replica(s) {', '.join(map(str, lost['gone']))} are gone "
              f"(ft.max_restarts={lost['max_restarts']} spent), leaving {len(lost['live'])} of {lost['replicas']} "
              f"replicas, fewer than ft.min_replicas={lost['min_replicas']}; the job ended with checkpoints of what "
              f"the survivors hold ({saved or 'none'}); run the same command to resume every replica from its last "
              "checkpoint", file=sys.stderr, flush=True)
        return 1

    def _newest_checkpoint(self, index: int) -> Optional[int]:
        found = complete_checkpoints(self._replica_dir(index))
        return found[0].step if found else None

    def _end_job(self, code: int) -> int:
        """Several nodes, this node's replicas done (or the job ended early): node 0 waits for the
        other nodes' replicas, writes the summary and the job's end; the others wait for that end,
        so every node exits with the job's code."""
        ended_early = self._end_reason()
        if self.layout.node == 0:
            while not ended_early and not self.nodes.all_done():
                time.sleep(POLL_S)
                self._requests()
                if self._stop_now is not None:
                    return self._end_at_once()
                self.nodes.poll()
                self._stop_the_outrun()
                self._check_quorum()
                ended_early = self._end_reason()
            if not ended_early:
                code = self._finish()
            write_job_end(self.run_dir, code, ended_early or "finished")
            return code
        while True:
            end = read_job_end(self.run_dir)
            if end is not None:
                return int(end["code"])
            self._requests()
            if self._stop_now is not None:
                return self._end_at_once()
            self.nodes.poll()
            if self.nodes.lost(0):
                print("syncopt: node 0 went silent before the job's end was written; see "
                      f"{self.run_dir.logs}", file=sys.stderr, flush=True)
                return 1
            time.sleep(POLL_S)

    def _end_reason(self) -> Optional[str]:
        """Why the job ended early, as this node or another recorded it (None: it did not)."""
        mine = read_node_record(self.run_dir, self.layout.node)
        if mine is not None and mine.ended:
            return mine.ended
        other = self.nodes.ended()
        return other.ended if other is not None else None

    def _all_replicas(self) -> dict[int, dict[str, Any]]:
        """Every replica of the job: this node's from its processes, the others' from their nodes' records."""
        states = {i: s for i, s in self.nodes.remote_replicas().items()} if self.layout.multi else {}
        states.update({r.index: {"done": r.done, "exits": r.exits, "restarts": r.restarts} for r in self.replicas})
        return states

    def _stop_the_outrun(self) -> None:
        """Replicas left behind: every other replica has finished, and those still running are
        too few to form a quorum (`quorum_size`) and short of the finished ones' last step. They
        can never heal or train again (seen: a replica killed near the end, whose replacement
        started after the survivors had finished, waited for a quorum until ft.quorum_timeout_s),
        so they are stopped, with one line; the job's result is the finished replicas'. Over
        several nodes every supervisor sees the same replicas (the others' through their records)
        and stops only its own."""
        states = self._all_replicas()
        local = {r.index: r for r in self.replicas}
        running = [i for i in range(self.count) if not states.get(i, {}).get("done", False)
                   and (i not in local or (local[i].proc is not None and local[i].proc.poll() is None))]
        finished = [i for i, st in states.items() if st["done"] and st["exits"] and st["exits"][-1] == 0]
        if not running or not finished or len(running) >= quorum_size(self.ft, self.count):
            return
        if any(not states.get(i, {}).get("done", False) for i in range(self.count) if i not in running):
            return  # a replica is being restarted: it may still make up a quorum
        final = max(self._final_step(i) for i in finished)
        behind = [(i, read_step(self._replica_dir(i).rank_progress(0))) for i in running]
        # unknown (no heartbeat: starting, or ending, which removes it), at the last step or with
        # its summary written: ending or not yet judgeable, not left behind
        if final < 0 or any(step is None or step >= final or self._replica_dir(i).summary.exists()
                            for i, step in behind):
            self._behind.clear()
            return
        # its heartbeat lags by up to a beat: stopped only when its step has not moved for OUTRUN_S
        now = time.monotonic()
        for index, step in behind:
            if self._behind.get(index, (None, 0.0))[0] != step:
                self._behind[index] = (step, now)
        if any(now - self._behind[index][1] < OUTRUN_S for index, _ in behind):
            return
        for index, step in behind:
            rep = local.get(index)
            if rep is None or rep.proc is None:
                continue  # another node's: its supervisor stops it
            print(f"syncopt: replica {index} (at step {step}) cannot rejoin: the other replicas finished at step "
                  f"{final} before it healed, and {len(running)} replica(s) cannot form a quorum of "
                  f"{quorum_size(self.ft, self.count)}; stopping it (the job's result is the finished replicas')",
                  file=sys.stderr, flush=True)
            rep.done = True
            self.outrun.append({"replica": index, "step": step, "final_step": final})
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
        for index in range(self.count):
            events = FaultLog(self._replica_dir(index)).events()
            heals = sorted(int(h[0]) for h in per_replica.get(str(index), {}).get("ft", {}).get("healed_state", []))
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
        for index in range(self.count):
            path = self._replica_dir(index).summary
            if path.exists():
                per_replica[str(index)] = json.loads(path.read_text())
        first = next(iter(per_replica.values()), {})
        failures, outrun = list(self.failures), list(self.outrun)
        for record in self.nodes.records.values():  # the other nodes' (several nodes)
            failures += record.failures
            outrun += record.outrun
        restarts = {str(i): int(state.get("restarts", 0)) for i, state in sorted(self._all_replicas().items())}
        summary = {**first, "ft": {"ended": ended, "replicas": self.count, "nodes": self.layout.nodes,
                                   "failures": len(failures), "restarts": restarts,
                                   "failure_log": failures, "outrun": outrun, "quorum_lost": self.quorum_lost,
                                   "per_replica": {i: s.get("ft", s.get("ranks", {})) for i, s in per_replica.items()}}}
        # the job-level counts under the names restart-all uses (summary.json, table columns)
        summary["failures"] = len(failures)
        summary["restarts"] = sum(restarts.values())
        summary.update(self._lost_work(per_replica, int(first.get("steps", 0))))
        if ended != "finished":
            summary = {"ft": summary["ft"]}  # no results: the job did not finish
            path = self.run_dir.root / "ft_ended.json"
        else:
            path = self.run_dir.summary
        path.write_text(json.dumps(summary, indent=1, default=str))


def supervise(ft: FTConfig, launch: LaunchConfig, run_dir: RunDir, count: int, overrides: list[str],
              stall_s: float = 30.0) -> int:
    """Run this node's replicas of a fault-tolerant job of `count` replicas; the job's exit code."""
    return Supervisor(ft, launch, run_dir, layout_of(launch, count), overrides, stall_s).run()
