"""Failures as an experiment axis (`faults.*`): kills and stalls injected into a rank at a fixed point.

The methods syncopt reproduces are compared on what failures cost them, so a failure must be a
real one: a kill is SIGKILL of the rank's own process (nothing is flushed, nothing is said), a
stall is SIGSTOP of it, with a detached `sleep; kill -CONT` that thaws it after the stated
seconds, so its heartbeat thread goes silent too and the launching process sees it exactly as it
sees a frozen rank today (engine/launch/rank_watch.py).

- `faults.kill=[RANK@STEP, ...]`: RANK dies once it has finished STEP;
- `faults.stall=[RANK@STEP:SECONDS, ...]`: RANK freezes for SECONDS once it has finished STEP;
- `faults.mtbf_s=S`: random kills, a mean S seconds of training apart, of a rank drawn with the
  gap from a generator seeded with `faults.seed` (after a restart, the next gap of the same
  sequence: failures are memoryless, so each attempt waits a fresh exponential gap);
- `faults.restart_delay_s`: how long the launching process waits before a restart (a node's
  reboot or a scheduler's requeue), read by engine/launch/restart.py.

A fault fires once per run, not again when a restart replays its step: before it fires, the rank
appends an event to the run's fault log (`logs/faults.jsonl`, `FaultLog` in core/run_files.py),
and every rank reads that log when it starts. The launching process appends its own events to the same log (each
attempt, each failure), and the reporting rank turns them into summary.json's numbers
(`fault_summary`): failures, restarts, steps and replica-steps lost, time to recover.
"""
from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Any, Optional

from core.errors import UserError
from core.run_files import FaultLog, current_attempt
from core.rundir import RunDir
from core.schema import Section, option

_KILL = re.compile(r"^\s*(\d+)\s*@\s*(\d+)\s*$")
_STALL = re.compile(r"^\s*(\d+)\s*@\s*(\d+)\s*:\s*(\d+(?:\.\d+)?)\s*$")


@dataclass
class FaultsConfig(Section):
    """`faults`: failures injected into the run (all empty: none, the run is untouched)."""

    kill: list[str] = option(factory=list)  # RANK@STEP: SIGKILL of RANK after STEP, once per run
    stall: list[str] = option(factory=list)  # RANK@STEP:SECONDS: RANK frozen (SIGSTOP) that long
    mtbf_s: Optional[float] = option(None, gt=0)  # mean seconds of training between random kills
    seed: int = 0  # the random kills' generator (which rank, how long until it dies)
    restart_delay_s: float = option(0.0, ge=0)  # wait before launch.max_restarts re-launches

    @property
    def active(self) -> bool:
        return bool(self.kill or self.stall or self.mtbf_s)


@dataclass(frozen=True)
class FaultAt:
    """One planned fault: `rank` after `step` (a stall also lasts `seconds`)."""

    spec: str  # as given, normalised: the fault's identity in the log
    rank: int
    step: int
    seconds: float = 0.0


def parse_faults(cfg: FaultsConfig, world_size: int) -> tuple[list[FaultAt], list[FaultAt]]:
    """(kills, stalls) of the config; `UserError` naming the value and the form it must take."""
    kills, stalls = [], []
    for text in cfg.kill:
        m = _KILL.match(str(text))
        if m is None:
            raise UserError(f"faults.kill: {text!r} is not RANK@STEP (e.g. faults.kill=[1@30])")
        kills.append(_checked(FaultAt(f"kill {m[1]}@{m[2]}", int(m[1]), int(m[2])), "kill", text, world_size))
    for text in cfg.stall:
        m = _STALL.match(str(text))
        if m is None:
            raise UserError(f"faults.stall: {text!r} is not RANK@STEP:SECONDS (e.g. faults.stall=[1@30:20])")
        at = FaultAt(f"stall {m[1]}@{m[2]}:{m[3]}", int(m[1]), int(m[2]), float(m[3]))
        stalls.append(_checked(at, "stall", text, world_size))
    for kind, faults in (("kill", kills), ("stall", stalls)):
        seen = [f.spec for f in faults]
        dup = next((s for s in seen if seen.count(s) > 1), None)
        if dup is not None:
            raise UserError(f"faults.{kind}: {dup.split()[1]} is given twice; each fault fires once")
    return kills, stalls


def _checked(at: FaultAt, kind: str, text: str, world_size: int) -> FaultAt:
    if at.rank >= world_size:
        raise UserError(f"faults.{kind}: {text!r} names rank {at.rank} but the job has {world_size} ranks "
                        f"(0..{world_size - 1})")
    if at.step < 1:
        raise UserError(f"faults.{kind}: {text!r}: the step must be at least 1 (a fault fires after that step)")
    if kind == "stall" and at.seconds <= 0:
        raise UserError(f"faults.stall: {text!r}: the stall must last more than 0 seconds")
    return at


def mtbf_draw(seed: int, mtbf_s: float, world_size: int, index: int) -> tuple[float, int]:
    """The `index`-th random kill: (seconds of training until it, rank), the same on every rank."""
    rng = random.Random(seed * 1_000_003 + 17)
    gap, rank = 0.0, 0
    for _ in range(index + 1):
        gap, rank = rng.expovariate(1.0 / mtbf_s), rng.randrange(world_size)
    return gap, rank


# ---- the rank's component ------------------------------------------------------------------------

class FaultInjector:
    """Fires this rank's planned faults at one fixed point of the loop (after a step's report,
    evaluation and checkpoint), each once per run."""

    def __init__(self, cfg: FaultsConfig, rank: int, world_size: int, run_dir: RunDir) -> None:
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.log = FaultLog(run_dir)
        kills, stalls = parse_faults(cfg, world_size)
        events = self.log.events()
        fired = {e.get("spec") for e in events if e.get("event") in ("kill", "stall")}
        self.kills = {f.step: f for f in kills if f.rank == rank and f.spec not in fired}
        self.stalls = {f.step: f for f in stalls if f.rank == rank and f.spec not in fired}
        self.mtbf_index = sum(1 for e in events if e.get("event") == "kill" and e.get("kind") == "mtbf")
        self.attempt = current_attempt()
        self._mtbf: Optional[tuple[float, int]] = None
        self._started = time.monotonic()

    def start(self, step: int, resumed: bool, reporting: bool) -> Optional[dict[str, Any]]:
        """Training begins (after restore): the random kill's clock starts; the reporting rank
        records where this attempt resumed. Returns that event for the metrics (None elsewhere)."""
        self._started = time.monotonic()
        if self.cfg.mtbf_s:
            self._mtbf = mtbf_draw(self.cfg.seed, self.cfg.mtbf_s, self.world_size, self.mtbf_index)
        if not reporting or not self.log.path.parent.is_dir():
            return None
        event = {"event": "resume" if resumed else "start", "attempt": self.attempt, "step": step}
        self.log.append(event)
        return event

    def after_step(self, step: int) -> None:
        stall = self.stalls.pop(step, None)
        if stall is not None:
            self._stall(stall, step)
        kill = self.kills.get(step)
        if kill is not None:
            self._kill("kill", kill.spec, step)
        if self._mtbf is not None and self._mtbf[1] == self.rank and time.monotonic() - self._started >= self._mtbf[0]:
            self._kill("mtbf", f"mtbf #{self.mtbf_index}", step, gap_s=round(self._mtbf[0], 3))

    def _kill(self, kind: str, spec: str, step: int, **extra: Any) -> None:
        self.log.append({"event": "kill", "kind": kind, "spec": spec, "rank": self.rank, "step": step,
                         "attempt": self.attempt, **extra})
        os.kill(os.getpid(), signal.SIGKILL)

    def _stall(self, stall: FaultAt, step: int) -> None:
        self.log.append({"event": "stall", "spec": stall.spec, "rank": self.rank, "step": step,
                         "seconds": stall.seconds, "attempt": self.attempt})
        # the thaw comes from outside: a stopped process runs nothing, its heartbeat thread included
        subprocess.Popen(["sh", "-c", f"sleep {stall.seconds}; kill -CONT {os.getpid()} 2>/dev/null"],
                         start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
        os.kill(os.getpid(), signal.SIGSTOP)


# ---- what the log says about the run -------------------------------------------------------------

def fault_summary(events: list[dict[str, Any]], train_ranks: int, now: Optional[float] = None) -> dict[str, Any]:
    """summary.json's fault numbers from the log: failures (attempts that ended in failure),
    automatic restarts, faults injected, optimizer steps lost (the step a failed attempt reached
    minus the step the next attempt resumed at), replica-steps lost (times the training ranks,
    all of which redo them in a restart of the whole job), seconds from each failure to the
    resumed training, and the job's wall-clock over every attempt (lost work and waits included).

    A failure begins when its fault fires (`failure_began`), not when the launching process has
    seen it and ended the other ranks: that detection is part of the time to recover, and the
    fault-tolerant supervisor counts from the kill too, so the two modes' recover_s compare."""
    now = time.time() if now is None else now
    failures = [e for e in events if e.get("event") == "failure"]
    steps_lost, recover = 0, []
    for fail in failures:
        nxt = next((e for e in events if e.get("event") == "resume" and e["time"] >= fail["time"]), None)
        if nxt is None:
            continue
        if fail.get("step") is not None:
            steps_lost += max(0, int(fail["step"]) - int(nxt["step"]))
        recover.append(round(nxt["time"] - failure_began(events, fail), 3))
    attempts = [e for e in events if e.get("event") == "attempt"]
    return {
        "failures": len(failures),
        "restarts": sum(1 for e in attempts if e.get("restart")),
        "faults_injected": sum(1 for e in events if e.get("event") in ("kill", "stall")),
        "steps_lost": steps_lost,
        "replica_steps_lost": steps_lost * train_ranks,
        "recover_s": round(sum(recover), 3),
        "recover_s_each": recover,
        "job_wall_s": round(now - attempts[0]["time"], 3) if attempts else None,
    }


def failure_began(events: list[dict[str, Any]], fail: dict[str, Any]) -> float:
    """When the failed attempt's failure happened: its first kill (a killed rank ends the attempt),
    else its last stall (one that outlasted the rank watch), else the launching process's record
    (a failure nothing injected: only its detection time is known)."""
    mine = [e for e in events if e.get("attempt") == fail.get("attempt") and e["time"] <= fail["time"]]
    kills = [e["time"] for e in mine if e.get("event") == "kill"]
    if kills:
        return min(kills)
    stalls = [e["time"] for e in mine if e.get("event") == "stall"]
    return max(stalls) if stalls else fail["time"]
