"""cli.py's supervisor for a fault-tolerant job: the fault-tolerant policy on the launching side's
own supervision loop (engine/launch/supervision.py), the loop a plain launch runs on too.

The loop does for it what it does for the launcher: stop signals and RUN/stop_request, the
delivery of a stop, stalled ranks, the end of the job. The supervisor supplies the policy that
is fault tolerance's own:

- one process per replica (engine/ft/launch/replicas.py), each restarted alone from its own last
  checkpoint when it dies, up to `ft.max_restarts` times; it heals from a live peer at its first
  round while the survivors go on with the participants they have. A stalled replica (its
  heartbeat silent for `stall_s`) is killed alone, by pid, and restarted like any failed one; a
  user error in a replica (exit code 2) ends the job at once, as it would any job;
- torchft's lighthouse (engine/ft/launch/lighthouse.py): if it dies no round can form any more,
  so the replicas and the job end with one line naming it; a resume (the same command) continues
  from the replicas' last checkpoints;
- a quorum that can no longer form and replicas outrun by the finished ones
  (engine/ft/launch/quorum.py): the first ends the job (`logs/ft_quorum_lost`: the survivors give
  up the round they wait in at once, checkpoint and stop; exit code 1, `ft_ended.json`), the
  second stops the replicas left behind;
- the stop, delivered to each replica once that replica catches SIGUSR1 and again to every
  replacement: every replica checkpoints and stops at the next round the replicas agree on
  (engine/ft/rank/rounds.py), or, if no round can complete, `ft.stop_wait_s` after it reached it;
  one that neither trains nor ends for `ft.stop_wait_s + STOP_GRACE_S` after it is told is
  killed. The second signal (or `logs/ft_stop_now`, written by a launching process over ssh)
  kills every process the job started at once (engine/ft/launch/job_processes.py records them);
- several nodes (`launch.hostfile` with `launch.no_ssh=true`, as slurm/syncopt.sbatch runs it):
  one supervisor per node, each owning its hostfile line's replicas; they meet through the shared
  run directory (engine/ft/launch/nodes.py). Node 0 holds the lighthouse, gives the start gate's
  go and, once every node's replicas are done (a second pass of the same loop,
  `AwaitingNodes`), writes the job's summary (engine/ft/launch/ending.py) and its end.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

from core import stop_signals
from core.errors import USER_ERROR_EXIT
from core.run_files import go_flag, quorum_lost_flag, ready_flag, stop_now_flag
from core.rundir import RunDir
from engine.ft.config import FTConfig, quorum_size
from engine.ft.launch.ending import Tally, finish, write_summary
from engine.ft.launch.job_processes import JobProcesses, process_log
from engine.ft.launch.lighthouse import Lighthouse
from engine.ft.launch.nodes import (NodeLayout, NodeRecord, NodeWatch, clear_job_files, layout_of, meet,
                                     read_job_end, read_node_record, write_job_end, write_node_record)
from engine.ft.launch.quorum import OutrunRule, States, quorum_lost
from engine.ft.launch.replicas import Replicas
from engine.launch.rank_watch import Stall
from engine.launch import supervision
from engine.launch.config import LaunchConfig
from engine.launch.supervision import StopSignals


def _stamp(path: Path) -> Optional[int]:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


class Supervisor:
    """This node's share of a fault-tolerant job, as the supervision loop's `Supervised`."""

    def __init__(self, ft: FTConfig, launch: LaunchConfig, run_dir: RunDir, layout: NodeLayout, overrides: list[str],
                 stall_s: float = 30.0) -> None:
        self.ft, self.launch, self.run_dir, self.stall_s = ft, launch, run_dir, stall_s
        self.layout, self.count = layout, layout.count
        self.replicas = Replicas(run_dir, layout, launch, overrides, ft.max_restarts, stall_s)  # this node's
        self.lighthouse: Optional[Lighthouse] = None
        self.address = ""  # the lighthouse's, once known
        self.outrun: list[dict[str, Any]] = []  # replicas stopped because the others finished first
        self.outrun_rule = OutrunRule(run_dir, self.count, quorum_size(ft, self.count))
        self.started = time.time()
        # the other nodes (several nodes only): lost when their record is silent for longer than a stall
        self.nodes = NodeWatch(run_dir, layout, stale_s=max(30.0, 2 * stall_s), first_s=launch.node_wait_s)
        self.stops = StopSignals(self)
        self._stop_stamp = _stamp(self.run_dir.stop_request)
        self._stop_now_stamp = _stamp(stop_now_flag(self.run_dir.logs))
        self._stop_now: Optional[int] = None  # the signal that asked to stop at once
        self.quorum_lost: Optional[dict[str, Any]] = None  # why no quorum can form any more (it ended the job)
        self.processes: Optional[JobProcesses] = None  # every process this supervisor started

    # ---- the job ----------------------------------------------------------------------------
    def run(self) -> int:
        logs = self.run_dir.logs
        logs.mkdir(parents=True, exist_ok=True)
        # first: a signal from here on is heard, and every process started from here on is recorded
        previous = self.stops.install()
        self.processes = self.replicas.processes = JobProcesses(process_log(logs, self.layout.node))
        try:
            if self.layout.node == 0:
                clear_job_files(self.run_dir, self.layout.nodes)
            self.address = self._lighthouse_address()
            if self.layout.multi and not self._stopping():
                self._meet()
                self.nodes.started = time.monotonic()  # every node has joined: their records come next
            if self._stopping():
                return self._stopped_before_start()
            for rep in self.replicas:
                self.replicas.start(rep, self.address)
            code = supervision.supervise(self, self.stops)
            if self.layout.multi and self._stop_now is None:
                return supervision.supervise(AwaitingNodes(self, code), self.stops)
            return code
        finally:
            self.replicas.end_all()
            if self.lighthouse is not None:
                self.lighthouse.stop()
            self.processes.kill_all()  # whatever a replica left behind (a dead replica's children)
            stop_signals.restore(previous)

    def _lighthouse_address(self) -> str:
        """Node 0 starts the lighthouse (unless ft.lighthouse names a cluster's); the other nodes
        use node 0's, on the master address and port every node was given."""
        if self.ft.lighthouse is not None:
            return self.ft.lighthouse if "://" in self.ft.lighthouse else f"http://{self.ft.lighthouse}"
        if self.layout.node == 0:
            processes = self.processes
            assert processes is not None
            self.lighthouse = Lighthouse.start(self.layout.lighthouse_host, self.ft, self.run_dir.logs / "lighthouse.log",
                                               quorum_size(self.ft, self.count), port=self.layout.lighthouse_port,
                                               started=lambda proc: processes.add("lighthouse", proc))
            return self.lighthouse.address
        return f"http://{self.layout.lighthouse_host}:{self.layout.lighthouse_port}"

    def _meet(self) -> None:
        """Several nodes: node 0 (old files cleared, lighthouse up) writes its launch record once
        every node has joined this attempt (engine.ft.launch.nodes.meet)."""
        record = {"mode": "ft_no_ssh", "nodes": self.layout.nodes, "replicas": self.count,
                  "master_addr": self.layout.lighthouse_host, "master_port": self.layout.lighthouse_port,
                  "node": os.uname().nodename}
        meet(self.run_dir, self.layout, record, self.launch.node_wait_s, abort=self._stopping)

    # ---- the loop's job (engine.launch.supervision.Supervised) -------------------------------
    def stop_line(self, signum: int) -> str:
        return (f"syncopt: {signal.Signals(signum).name}: every replica checkpoints and stops at the next round the "
                f"replicas agree on (or, if none can complete, ft.stop_wait_s={self.ft.stop_wait_s:g} after reaching "
                "it); signal again to stop at once")

    def stop_requested(self) -> bool:
        """RUN/stop_request (slurm/syncopt.sbatch's time-limit warning; every node watches it)."""
        return _stamp(self.run_dir.stop_request) not in (None, self._stop_stamp)

    def end_now(self, signum: int, count: int) -> None:
        """The second stop signal: kill every process of this node's share of the job now; the
        next poll reaps them and reports."""
        if self._stop_now is None:
            self._stop_now = signum
            if self.processes is not None:
                self.processes.kill_all()

    def poll(self) -> Optional[int]:
        self._stop_now_requested()
        if self._stop_now is not None:
            return self._end_at_once()
        if self.layout.multi:
            self.nodes.poll()
            other = self.nodes.ended()
            if other is not None:
                return self._end_early(other.code, other.ended or "", (
                    f"syncopt: node {other.node} ended the job ({other.ended}); this node's replicas were stopped"))
            if self.layout.node != 0 and self.nodes.lost(0):
                return self._end_early(1, "node 0 lost", f"syncopt: node 0 (the lighthouse's, {self.address}) has "
                                       "been silent: no round can form; this node's replicas were stopped; run the "
                                       "same command again on every node to resume from their last checkpoints")
        go = go_flag(self.run_dir.logs)
        if self.layout.node == 0 and not go.exists() and self._ready_to_go():
            go.write_text("go\n")  # every replica's Manager is up: training starts together
        if self.lighthouse is not None and self.lighthouse.dead() is not None and self._stop_now is None:
            return self._end_early(1, "lighthouse died", (
                f"syncopt: the torchft lighthouse ({self.address}, pid {self.lighthouse.proc.pid}) died with code "
                f"{self.lighthouse.dead()}: no round can form; the replicas were stopped; run the same command "
                "again to resume from their last checkpoints"))
        refused = self.replicas.reap(self.stops.first is not None, self.address)
        if refused is not None:
            self._record("user error", USER_ERROR_EXIT)
            self.replicas.end_all()
            print(f"syncopt: error: {self.replicas.user_error(refused)}", file=sys.stderr, flush=True)
            return USER_ERROR_EXIT
        self._stop_the_outrun()
        self._check_quorum()
        self._record()
        return None

    def ready(self) -> bool:
        return True  # each replica is judged on its own when the stop is delivered

    def deliver_stop(self) -> bool:
        self.replicas.tell_stop(self.ft.stop_wait_s)
        return False  # again next time: a replica starting or restarted meanwhile is told too

    def stalls(self) -> list[Stall]:
        return self.replicas.stalls()

    def end_stalled(self, stalls: Sequence[Stall]) -> None:
        self.replicas.kill_stalled(stalls)  # each alone: the next poll restarts it

    def done(self) -> Optional[int]:
        if not self.replicas.all_done():
            return None
        self._record()
        if self.layout.multi:
            return 0  # the job's end is decided once every node's replicas are (AwaitingNodes)
        return self._finish()

    # ---- stopping ---------------------------------------------------------------------------
    def _stopping(self) -> bool:
        return self.stops.first is not None or self._stop_now is not None

    def _stop_now_requested(self) -> None:
        """logs/ft_stop_now (a launching process's second signal, over ssh) is a second signal."""
        stamp = _stamp(stop_now_flag(self.run_dir.logs))
        if self._stop_now is None and stamp not in (None, self._stop_now_stamp):
            self.stops.received.append(signal.SIGUSR1)  # (a signal after it is not a first one)
            self.end_now(signal.SIGTERM, 2)

    def _stopped_before_start(self) -> int:
        """A stop before any replica started: nothing to checkpoint; the lighthouse ends in run()."""
        signum = self._stop_now or self.stops.first or signal.SIGTERM
        print(f"syncopt: {signal.Signals(signum).name}: stopped before any replica started; nothing to checkpoint",
              file=sys.stderr, flush=True)
        self._record("stopped", 128 + signum)
        return 128 + signum

    def _end_at_once(self) -> int:
        """The second stop signal: every process of this node's share of the job is killed (the
        signal handler already sent SIGKILL to each group); reap them and say so."""
        signum = self._stop_now or signal.SIGKILL
        assert self.processes is not None
        self.processes.kill_all()  # (again: one started while the handler ran)
        self.replicas.reap_killed()
        if self.lighthouse is not None:
            self.lighthouse.proc.wait()
        print(f"syncopt: second {signal.Signals(signum).name}: stopped at once; every replica and the lighthouse "
              "were killed, each replica's last checkpoint stays; run the same command to resume from them",
              file=sys.stderr, flush=True)
        self._record("stopped at once", 128 + signum)
        if self.layout.node == 0:
            self._write_summary(ended="stopped at once")
        return 128 + signum

    def _end_early(self, code: int, ended: str, line: str) -> int:
        """End this node's replicas and the job: one line, the record that tells the other nodes,
        and (node 0) what the job left (ft_ended.json)."""
        self._record(ended, code)  # first: the other nodes end theirs meanwhile
        self.replicas.end_all()
        if line:
            print(line, file=sys.stderr, flush=True)
        if self.layout.node == 0:
            self._write_summary(ended=ended)
        return code

    # ---- the job's replicas, every node's -----------------------------------------------------
    def _ready_to_go(self) -> bool:
        """Every replica of the job is ready (its Manager is up) or done."""
        remote = self.nodes.remote_replicas()
        local = {r.index: r for r in self.replicas}
        return all(ready_flag(self.run_dir.logs, i).exists()
                   or (local[i].done if i in local else remote.get(i, {}).get("done", False))
                   for i in range(self.count))

    def _all_replicas(self) -> States:
        """Every replica of the job: this node's from its processes, the others' from their nodes' records."""
        states = dict(self.nodes.remote_replicas()) if self.layout.multi else {}
        states.update(self.replicas.states())
        return states

    def _record(self, ended: Optional[str] = None, code: int = 0) -> None:
        """This node's record for the others (several nodes only)."""
        if not self.layout.multi:
            return
        write_node_record(self.run_dir, NodeRecord(
            self.layout.node, {str(i): state for i, state in self.replicas.states().items()},
            self.replicas.failures, self.outrun, ended, code))

    def _end_reason(self) -> Optional[str]:
        """Why the job ended early, as this node or another recorded it (None: it did not)."""
        mine = read_node_record(self.run_dir, self.layout.node)
        if mine is not None and mine.ended:
            return mine.ended
        other = self.nodes.ended()
        return other.ended if other is not None else None

    def _check_quorum(self) -> None:
        """A quorum that can no longer form (engine/ft/launch/quorum.py) ends the job: the
        survivors checkpoint what they hold and stop (`quorum_lost_flag` makes one waiting in a
        round's quorum give it up at once; the stop reaches one still training, which stops at
        its next round); no replica is restarted from here on. Over several nodes every
        supervisor sees the same replicas and tells its own."""
        if self.quorum_lost is not None or self.stops.first is not None:
            return
        lost = quorum_lost(self._all_replicas(), self.ft, self.count, quorum_size(self.ft, self.count))
        if lost is None:
            return
        self.quorum_lost = lost
        quorum_lost_flag(self.run_dir.logs).write_text(json.dumps(lost) + "\n")
        self.stops.begin(signal.SIGUSR1)  # the job's own stop: no signal counted, no line

    def _stop_the_outrun(self) -> None:
        """Replicas the finished ones left behind (engine/ft/launch/quorum.py) are stopped, with
        one line; the job's result is the finished replicas'. Every supervisor stops only its own."""
        states = self._all_replicas()
        local = {r.index: r for r in self.replicas}
        running = [i for i in range(self.count) if not states.get(i, {}).get("done", False)
                   and (i not in local or (local[i].proc is not None and local[i].proc.poll() is None))]
        left = self.outrun_rule.left_behind(states, running)
        if left is None:
            return
        final, behind = left
        for index, step in behind:
            rep = self.replicas.local(index)
            if rep is None:
                continue  # another node's: its supervisor stops it
            print(f"syncopt: replica {index} (at step {step}) cannot rejoin: the other replicas finished at step "
                  f"{final} before it healed, and {len(running)} replica(s) cannot form a quorum of "
                  f"{quorum_size(self.ft, self.count)}; stopping it (the job's result is the finished replicas')",
                  file=sys.stderr, flush=True)
            self.outrun.append({"replica": index, "step": step, "final_step": final})
            self.replicas.stop_for_good(rep)

    # ---- the job's end ----------------------------------------------------------------------
    def _tally(self) -> Tally:
        failures, outrun = list(self.replicas.failures), list(self.outrun)
        for record in self.nodes.records.values():  # the other nodes' (several nodes)
            failures += record.failures
            outrun += record.outrun
        return Tally(self.count, self.layout.nodes, self._all_replicas(), failures, outrun, self.quorum_lost,
                     self.started)

    def _write_summary(self, ended: str) -> None:
        write_summary(self.run_dir, self._tally(), ended)

    def _finish(self) -> int:
        """Every replica of the job is done: the summary, and the job's exit code."""
        return finish(self.run_dir, self._tally(), self.stops.first)


class AwaitingNodes:
    """Several nodes, this node's replicas done (or the job ended early here): the job as the
    supervision loop sees it until the job's end is known. Node 0 waits for every other node's
    replicas (stopping the outrun and watching the quorum meanwhile), then writes the summary and
    the job's end; the others wait for that end, so that every node exits with the job's code.
    `code`: this node's, the job's if it ended early."""

    def __init__(self, sup: Supervisor, code: int) -> None:
        self.sup, self.code = sup, code
        self.stop_line, self.stop_requested, self.end_now = sup.stop_line, sup.stop_requested, sup.end_now

    def poll(self) -> Optional[int]:
        sup = self.sup
        sup._stop_now_requested()
        if sup._stop_now is not None:
            return sup._end_at_once()
        sup.nodes.poll()
        if sup.layout.node == 0:
            sup._stop_the_outrun()
            sup._check_quorum()
            return None
        end = read_job_end(sup.run_dir)
        if end is not None:
            return int(end["code"])
        if sup.nodes.lost(0):
            print(f"syncopt: node 0 went silent before the job's end was written; see {sup.run_dir.logs}",
                  file=sys.stderr, flush=True)
            return 1
        return None

    def ready(self) -> bool:
        return True

    def deliver_stop(self) -> bool:
        return True  # this node's replicas are done: none to tell

    def stalls(self) -> list[Stall]:
        return []

    def end_stalled(self, stalls: Sequence[Stall]) -> None:
        return None

    def done(self) -> Optional[int]:
        sup = self.sup
        if sup.layout.node != 0:
            return None
        ended_early = sup._end_reason()
        if not ended_early and not sup.nodes.all_done():
            return None
        code = self.code if ended_early else sup._finish()
        write_job_end(sup.run_dir, code, ended_early or "finished")
        return code


def supervise(ft: FTConfig, launch: LaunchConfig, run_dir: RunDir, count: int, overrides: list[str],
                  stall_s: float = 30.0) -> int:
    """Run this node's replicas of a fault-tolerant job of `count` replicas; the job's exit code."""
    return Supervisor(ft, launch, run_dir, layout_of(launch, count), overrides, stall_s).run()
