"""Restart-all (`launch.max_restarts=N`): after a failure, re-launch the whole job from its last
complete checkpoint, as a person re-running the command would, up to N times.

This is the recovery every algorithm has: each rank checkpoints its own state, and the ranks of
a new launch agree on the newest checkpoint complete for all of them (`resume=auto`), so the
re-launched job continues bit for bit where that checkpoint left it. What happened in between
(the work after the checkpoint) is lost and counted. The fault-tolerant mode (`ft.enabled`) is
the other way: survivors go on without a restart.

Not retried: success, a refused run (exit code 2: bad input stays bad), and a job the user
stopped (a stop signal, during an attempt or between two: then no further attempt starts).
Before each retry the previous attempt's rank files (logs, errors, exit codes, heartbeats) and
metrics are moved to `logs/attempt_<k>/`, so no attempt overwrites what an earlier one wrote. Each attempt and each failure is appended to the fault log
(core.run_files.FaultLog), from which the reporting rank writes summary.json's counts.
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from types import FrameType
from typing import Any, Callable, Optional

from core.errors import USER_ERROR_EXIT
from core.run_files import ATTEMPT_ENV, FaultLog, read_step
from core.rundir import RunDir
from core.stop_signals import stop_signals_to
from engine.launch.fork import RankBody
from engine.launch.loop import launch, stall_after_s

#: launch one attempt: (attempt number, the list a stop signal's number is appended to) -> exit code
LaunchAttempt = Callable[[int, list[int]], int]

_RANK_FILES = ("log", "error", "exit", "progress", "pid")


def run_with_restarts(launch_attempt: LaunchAttempt, run_dir: RunDir, max_restarts: int, restart_delay_s: float,
                      fresh: bool) -> int:
    """Run the job, re-launching it after a failure up to `max_restarts` times; the last exit code.
    `fresh`: the job starts from nothing (no checkpoint to resume), so an old fault log is dropped;
    a job that continues keeps it, so a fault that fired before does not fire again."""
    log = FaultLog(run_dir)
    if fresh:
        log.reset()
    first = sum(1 for e in log.events() if e.get("event") == "attempt")  # earlier launches of this run
    # a stop signal between attempts (while the failed one is archived, during faults.restart_delay_s)
    # ends the job there; during an attempt the launcher's own handler takes it (the same list)
    signals: list[int] = []

    def between(signum: int, frame: Optional[FrameType]) -> None:
        signals.append(signum)
        print(f"syncopt: {signal.Signals(signum).name} between attempts: no further attempt; run the same command to "
              "resume from the last complete checkpoint", file=sys.stderr, flush=True)

    code = 0
    with stop_signals_to(between):
        for retry in range(max_restarts + 1):
            attempt = first + retry
            if retry:
                _archive_attempt(run_dir, attempt - 1)
            if signals:
                return code
            log.append({"event": "attempt", "attempt": attempt, "restart": retry > 0})
            os.environ[ATTEMPT_ENV] = str(attempt)  # the launcher passes it down to the ranks (SYNCOPT_ prefix)
            code = launch_attempt(attempt, signals)
            if code == 0 or code == USER_ERROR_EXIT or signals:
                return code
            log.append({"event": "failure", "attempt": attempt, "code": code,
                        "step": _failure_step(run_dir, log, attempt), "will_restart": retry < max_restarts})
            if retry == max_restarts:
                break
            print(f"syncopt: restarting the whole job from its last complete checkpoint "
                  f"(restart {retry + 1} of {max_restarts})"
                  + (f" in {restart_delay_s:g} s" if restart_delay_s else ""), file=sys.stderr, flush=True)
            deadline = time.monotonic() + restart_delay_s
            while not signals and time.monotonic() < deadline:
                time.sleep(min(0.1, restart_delay_s))
    return code


def _failure_step(run_dir: RunDir, log: FaultLog, attempt: int) -> int | None:
    """The step the failed attempt had reached: where an injected fault fired, else the furthest
    step a rank's heartbeat reported (every few seconds, so a lower bound)."""
    fired = [e["step"] for e in log.events()
             if e.get("event") in ("kill", "stall") and e.get("attempt") == attempt and e.get("step") is not None]
    if fired:
        return max(fired)
    steps = [read_step(p) for p in run_dir.rank_files("progress").values()]
    steps = [s for s in steps if s is not None]
    return max(steps) if steps else None


def _archive_attempt(run_dir: RunDir, attempt: int) -> None:
    """Move the failed attempt's rank files and a copy of its metrics to logs/attempt_<k>/."""
    dest = run_dir.attempt_logs(attempt)
    dest.mkdir(parents=True, exist_ok=True)
    for kind in _RANK_FILES:
        for path in run_dir.rank_files(kind).values():
            shutil.move(str(path), str(dest / path.name))
    if run_dir.metrics.exists():  # the next attempt trims it back to its checkpoint
        shutil.copy2(run_dir.metrics, dest / run_dir.metrics.name)


def launch_with_restarts(plan: Any, run_dir: RunDir, overrides: list[str], body: Optional[RankBody] = None) -> int:
    """Launch the planned job and supervise it, restarting it as `launch.max_restarts` allows;
    `body`: what a forked rank runs (launch.launcher=fork)."""
    cfg = plan.config
    stall_s = stall_after_s(cfg.dist.timeout_s)

    def attempt(_: int, received: list[int]) -> int:
        return launch(cfg.launch, run_dir, overrides, stall_s, received, body)

    if not cfg.launch.max_restarts and not cfg.faults.active:
        # nothing to restart or inject: launch once and write no fault log (a plain run's run
        # directory stays as it was, and a launch-time refusal leaves nothing behind)
        return attempt(0, [])
    return run_with_restarts(attempt, run_dir, cfg.launch.max_restarts, cfg.faults.restart_delay_s,
                             fresh=not plan.resume_from)
