"""How a fault-tolerant job ends: its exit code, the one line that says why, and what it leaves
(RUN/summary.json when it finished, RUN/ft_ended.json when it did not).

The job succeeds when every replica has finished or given up and at least one finished cleanly;
its metrics are then the first finished replica's, beside each replica's summary and the job's
failures and restarts under the names restart-all uses (summary.json's `failures`, `restarts`,
the lost work), so that the tables compare the two modes. A job that every replica stopped
(a stop signal or RUN/stop_request) leaves the first stopped replica's `stopped.json`, to be
resumed by the same command. A lost quorum ends with exit code 1 and the survivors' checkpoints
named. On several nodes node 0 writes all of it, with every node's replicas and failures.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from typing import Any, Optional

from core.run_files import FaultLog
from core.rundir import RunDir
from engine.checkpoint.files import complete_checkpoints
from engine.ft.launch.quorum import States, finished_cleanly
from engine.ft.launch.replicas import replica_dir


@dataclass
class Tally:
    """What the job did, every node's: what its end and its summary are made of. `quorum_lost`
    is the supervisor's own record, completed here when the job ends on it."""

    count: int
    nodes: int
    states: States
    failures: list[dict[str, Any]]
    outrun: list[dict[str, Any]]
    quorum_lost: Optional[dict[str, Any]]
    started: float  # the supervisor's start (time.time())


def finish(run_dir: RunDir, tally: Tally, stop_signal: Optional[int]) -> int:
    """Every replica of the job is done: the summary, and the job's exit code. `stop_signal`: the
    stop the job was asked for (None: none)."""
    finished = [i for i, state in tally.states.items() if finished_cleanly(state)
                and replica_dir(run_dir, i).summary.exists()]
    stopped = [i for i in range(tally.count) if replica_dir(run_dir, i).stopped.exists()]
    if tally.quorum_lost is not None:
        return end_quorum_lost(run_dir, tally, stopped)
    if not finished and stopped:  # a stop signal or stop_request: checkpointed, to be resumed
        run_dir.stopped.write_text(replica_dir(run_dir, stopped[0]).stopped.read_text())
        write_summary(run_dir, tally, ended="stopped")
        return 0
    if not finished and stop_signal is not None:  # stopped while every replica was still starting
        write_summary(run_dir, tally, ended="stopped")
        print("syncopt: stopped before any replica had trained: nothing new to checkpoint", file=sys.stderr,
              flush=True)
        return 128 + stop_signal
    write_summary(run_dir, tally, ended="finished" if finished else "failed")
    if not finished:
        print(f"syncopt: every replica failed; see {run_dir.logs}", file=sys.stderr, flush=True)
        return 1
    return 0


def end_quorum_lost(run_dir: RunDir, tally: Tally, stopped: list[int]) -> int:
    """Every survivor has checkpointed and stopped (or ended): one line, ft_ended.json, exit 1."""
    lost = tally.quorum_lost
    assert lost is not None
    lost["checkpoints"] = {str(i): newest_checkpoint(run_dir, i) for i in lost["live"]}
    lost["stopped"] = [i for i in lost["live"] if i in stopped]
    saved = ", ".join(f"replica {i} at step {step}" for i, step in lost["checkpoints"].items() if step is not None)
    write_summary(run_dir, tally, ended="quorum lost")
    print(f"syncopt: the quorum can no longer form: replica(s) {', '.join(map(str, lost['gone']))} are gone "
          f"(ft.max_restarts={lost['max_restarts']} spent), leaving {len(lost['live'])} of {lost['replicas']} "
          f"replicas, fewer than ft.min_replicas={lost['min_replicas']}; the job ended with checkpoints of what "
          f"the survivors hold ({saved or 'none'}); run the same command to resume every replica from its last "
          "checkpoint", file=sys.stderr, flush=True)
    return 1


def newest_checkpoint(run_dir: RunDir, index: int) -> Optional[int]:
    found = complete_checkpoints(replica_dir(run_dir, index))
    return found[0].step if found else None


def lost_work(run_dir: RunDir, tally: Tally, per_replica: dict[str, Any], final_step: int) -> dict[str, Any]:
    """What the failures cost, in restart-all's terms: no optimizer step is lost (the survivors
    go on), a killed replica's absence is lost work (replica-steps from its kill to the step it
    healed at, or to the end if it never rejoined), recovery is the time from its kill to its
    replacement training again (resumed from its checkpoint, before healing), and the job's
    wall-clock is the supervisor's."""
    injected, absent, recover = 0, 0, []
    for index in range(tally.count):
        events = FaultLog(replica_dir(run_dir, index)).events()
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
            "job_wall_s": round(time.time() - tally.started, 3)}


def write_summary(run_dir: RunDir, tally: Tally, ended: str) -> None:
    """RUN/summary.json: each replica's summary (from RUN/replicas/<i>/summary.json) and the
    job's failures and restarts; the metrics are the first finished replica's. A job that did
    not finish writes only its `ft` record, to RUN/ft_ended.json."""
    per_replica: dict[str, Any] = {}
    for index in range(tally.count):
        path = replica_dir(run_dir, index).summary
        if path.exists():
            per_replica[str(index)] = json.loads(path.read_text())
    first = next(iter(per_replica.values()), {})
    restarts = {str(i): int(state.get("restarts", 0)) for i, state in sorted(tally.states.items())}
    summary = {**first, "ft": {"ended": ended, "replicas": tally.count, "nodes": tally.nodes,
                               "failures": len(tally.failures), "restarts": restarts,
                               "failure_log": tally.failures, "outrun": tally.outrun,
                               "quorum_lost": tally.quorum_lost,
                               "per_replica": {i: s.get("ft", s.get("ranks", {})) for i, s in per_replica.items()}}}
    # the job-level counts under the names restart-all uses (summary.json, table columns)
    summary["failures"] = len(tally.failures)
    summary["restarts"] = sum(restarts.values())
    summary.update(lost_work(run_dir, tally, per_replica, int(first.get("steps", 0))))
    if ended != "finished":
        summary = {"ft": summary["ft"]}  # no results: the job did not finish
        path = run_dir.root / "ft_ended.json"
    else:
        path = run_dir.summary
    path.write_text(json.dumps(summary, indent=1, default=str))
