"""The files the two sides of a run exchange through its run directory, and their formats.

The launching process (engine/launch/: the loop, restart-all, the rank watch; engine/ft/launch/: the
fault-tolerant supervisor) and the ranks (engine/rank/) never import each other; what one must
know of the other travels through the run directory (core/rundir.py names its paths). This
module is that contract, read and written by both sides:

- a rank's heartbeat, `logs/rank_<r>.progress`: "<step> <unix time>", rewritten every few
  seconds (`write_step`, `read_step`);
- the run's fault log, `logs/faults.jsonl` (`FaultLog`), and the attempt number the launching
  process hands its ranks (`ATTEMPT_ENV`, `current_attempt`);
- the launch record, `logs/launch.json`: how the job was launched, the proof over several nodes
  that they share the run directory (`write_launch_record`, `read_launch_record`, and node 0's
  record that the other nodes wait for, `wait_for_launch_record`);
- fault-tolerant mode's start gate in the job's `logs/`: each replica's ready flag and the
  supervisor's go (`ready_flag`, `go_flag`);
- `stopped.json`, which a run that stopped early with a checkpoint leaves (`stopped_message`).

Writes that a reader on another process or node may meet halfway are atomic (a temporary file
renamed over the target); `wait_for` is the one loop that waits for another process's file.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

from core.errors import UserError
from core.rundir import RunDir

T = TypeVar("T")


# ---- atomic JSON and waiting ---------------------------------------------------------------------

def write_json_atomic(path: Path, data: Any, indent: Optional[int] = None) -> None:
    """Write `data` as JSON so that a reader sees the old file or the new one, never half of it."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=indent, default=str))
    tmp.replace(path)


def read_json(path: Path) -> Any:
    """A JSON file's content; None while it is missing or unreadable (not yet written, or cut short)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def wait_for(found: Callable[[], Optional[T]], wait_s: float, poll_s: float,
             timed_out: Optional[Callable[[], str]]) -> Optional[T]:
    """Poll `found` every `poll_s` seconds until it returns something other than None (returned);
    after `wait_s` seconds raise `UserError(timed_out())`, or return None where waiting is only a
    courtesy (`timed_out` None). `found` may do each poll's work (write this side's own file again
    when it is gone) before it looks at the other side's."""
    deadline = time.monotonic() + wait_s
    while True:
        value = found()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            if timed_out is None:
                return None
            raise UserError(timed_out())
        time.sleep(poll_s)


# ---- a rank's heartbeat --------------------------------------------------------------------------

def write_step(path: Path, step: int) -> None:
    """One beat: "<step> <unix time>" (raises OSError; the writer decides what a failure means)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{step} {time.time():.3f}\n")
    os.replace(tmp, path)


def read_step(path: Path) -> Optional[int]:
    """The step a progress file last reported (None: unreadable, or before the first step)."""
    try:
        step = int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return step if step >= 0 else None


# ---- the fault log and the attempt number --------------------------------------------------------

ATTEMPT_ENV = "SYNCOPT_ATTEMPT"  # the launching process's attempt number, for the ranks' events


def current_attempt() -> int:
    try:
        return int(os.environ.get(ATTEMPT_ENV, "0"))
    except ValueError:
        return 0


#: fields of a fault-log event that must be whole numbers where present (None allowed)
_EVENT_INTEGERS = ("attempt", "step", "code", "rank")


def event_problem(event: Any) -> Optional[str]:
    """What makes a parsed line of the fault log no event (None: it is one): every event is an
    object with its kind (`event`) and the time it was written, and numbers where numbers go."""
    if not isinstance(event, dict):
        return f"a JSON {type(event).__name__}, not an event object"
    if not isinstance(event.get("event"), str):
        return "no event name (\"event\")"
    if not isinstance(event.get("time"), (int, float)) or isinstance(event.get("time"), bool):
        return f"time={json.dumps(event.get('time'))} is not a number"
    for key in _EVENT_INTEGERS:
        value = event.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            return f"{key}={json.dumps(value)} is not a whole number"
    return None


class FaultLog:
    """`logs/faults.jsonl`: one JSON event per line, appended by the ranks (kill, stall, resume)
    and by the launching process (attempt, failure). Appends of one short line are atomic on a
    local or NFS file opened with O_APPEND; each is flushed and synced before a kill follows it."""

    def __init__(self, run_dir: RunDir | Path) -> None:
        self.path = RunDir.of(run_dir).faults_log

    def events(self) -> list[dict[str, Any]]:
        """The events in the order they were appended. A line that is not JSON was cut short by a
        kill of its writer (the next append goes on after it) and is no event; a JSON line that is
        not an event (edited by hand, another file's) is a `UserError` naming the line, as every
        reader (restart-all, the ranks' injector, summary.json's counts) would trip over it."""
        try:
            lines = self.path.read_text().splitlines()
        except OSError:
            return []
        out = []
        for number, line in enumerate(lines, 1):
            try:
                event = json.loads(line)
            except ValueError:  # a line cut short by a kill of the writer: not an event
                continue
            problem = event_problem(event)
            if problem:
                raise UserError(f"{self.path}, line {number}: {problem}; this file is syncopt's own record of the "
                                "run's faults: restore the line, or delete the file to forget them")
            out.append(event)
        return out

    def append(self, event: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps({**event, "time": event.get("time", time.time())}) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def reset(self) -> None:
        self.path.unlink(missing_ok=True)


# ---- the launch record ---------------------------------------------------------------------------

def write_launch_record(run_dir: RunDir | Path, record: dict[str, Any]) -> None:
    """logs/launch.json: how this job was launched (a token the nodes read back, node 0's ports)."""
    path = RunDir.of(run_dir).launch_record
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, record, indent=1)


def read_launch_record(run_dir: RunDir | Path) -> Optional[dict[str, Any]]:
    return read_json(RunDir.of(run_dir).launch_record)


def wait_for_launch_record(run_dir: RunDir | Path, expected: dict[str, Any], wait_s: float) -> None:
    """Wait until node 0's launch record for this job is visible here: the run dir is shared."""
    path = RunDir.of(run_dir).launch_record

    def matches() -> Optional[bool]:
        seen = read_launch_record(run_dir)
        return True if isinstance(seen, dict) and all(seen.get(k) == v for k, v in expected.items()) else None

    wait_for(matches, wait_s, 0.5, lambda: (
        f"launch.no_ssh: node 0 did not write {path} for this job within {wait_s:.0f} s: start node 0 with the "
        "same hostfile, master address and port, and keep the run directory on storage every node shares"))


# ---- fault-tolerant mode's start gate ------------------------------------------------------------

def ready_flag(logs: Path, replica: int) -> Path:
    """Written by replica `replica` once its Manager is up (engine/ft/rank/rounds.py)."""
    return logs / f"replica_{replica}.ready"


def go_flag(logs: Path) -> Path:
    """Written by the supervisor once every replica is ready: training starts together."""
    return logs / "ft_go"


def stop_now_flag(logs: Path) -> Path:
    """Written by a launching process on its second stop signal (fault-tolerant mode over ssh):
    every node's supervisor kills its share of the job at once."""
    return logs / "ft_stop_now"


def quorum_lost_flag(logs: Path) -> Path:
    """Written by the supervisor when the replicas still running are fewer than ft.min_replicas and
    none can be restarted: a replica waiting in a round's quorum stops at once, with a checkpoint."""
    return logs / "ft_quorum_lost"


# ---- a run that stopped early --------------------------------------------------------------------

def stopped_message(run_dir: RunDir | Path) -> Optional[str]:
    """What to tell the user when the run left stopped.json (a stop with a checkpoint), else None."""
    marker = RunDir.of(run_dir).stopped
    if marker.exists():
        record = read_json(marker)
        reason = record.get("reason") if isinstance(record, dict) else f"{marker} unreadable"
        return f"stopped early ({reason}) with a checkpoint; run the same command to continue"
    return None
