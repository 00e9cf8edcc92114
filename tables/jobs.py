"""When, for how long and under what load a table's runs were made: table.md's "Production"
section, read from the table's own DIR/jobs.jsonl (one line per job its command ran).

Why it is computed rather than written by hand: a head-to-head here is a day of runs or more, and a
session's processes end with the session, so such a table is made in parts, over several sittings,
beside other work. A reader needs the dates, the hours of runs, the sittings and the machine's load
to read its wall-clock columns (issue 34: "the command, the commit, the date and the machine's
load"), and hand-copied prose drifts from the record. Runs a table did not start (a `cli.py`
command run by hand into a row's folder) have no line in jobs.jsonl: the section counts them as
such, so that a gap between the runs the table reports and the runs it made is visible.
"""
from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from core.errors import UserError

JOBS_FILE = "jobs.jsonl"  # in the table's folder, written by tables/runner.py
# a pause between one run's end and the next one's start of at least this long ends a sitting (the
# table starts its next run within seconds: a longer pause is the table stopped, or the session ended)
SITTING_GAP_S = 600.0
MAX_SITTINGS_LISTED = 12
MAX_TIME_S = 1e11  # seconds since 1970 (the year 5138): a time beyond it is not a clock's


@dataclass(frozen=True)
class JobRecord:
    """One line of jobs.jsonl: a job the table ran, when it ended, how long it took, the 1-minute
    load average before and after it."""
    job: str
    phase: str
    status: str
    seconds: float
    ended: float
    loads: tuple[float, ...]

    @property
    def started(self) -> float:
        return self.ended - self.seconds

    @property
    def row(self) -> str:
        """The row the job belongs to: its name's first word ("<row> [setting] seed <n>")."""
        return self.job.split(" ", 1)[0]


def read_jobs(path: Path) -> tuple[list[JobRecord], int]:
    """The records of jobs.jsonl in file order, and how many lines could not be read (a line cut by
    a killed process, edited by hand, or another program's: not an object, or times no clock gives):
    those are counted, not fatal. A file that is not text at all is refused in one line."""
    if not path.is_file():
        return [], 0
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(f"{path}: not UTF-8 text (byte {err.start}); put it back from git (git checkout -- FILE) "
                        f"or remove it (table.md's Production section is read from it)") from None
    records, unreadable = [], 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            loads = tuple(float(raw[k][0]) for k in ("load_before", "load_after") if raw.get(k))
            record = JobRecord(str(raw["job"]), str(raw.get("phase", "")), str(raw["status"]),
                               float(raw["seconds"]), float(raw["ended"]), loads)
            if not (0 <= record.seconds < MAX_TIME_S and 0 <= record.ended < MAX_TIME_S):  # (a date table.md can print)
                raise ValueError(record)
            records.append(record)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError):
            unreadable += 1
    return records, unreadable


def sittings(records: list[JobRecord], gap_s: float = SITTING_GAP_S) -> list[tuple[float, float, int]]:
    """(start, end, runs) of each stretch of runs with no pause of `gap_s` or more between one run's
    end and the next one's start, in time order."""
    spans: list[tuple[float, float, int]] = []
    for rec in sorted(records, key=lambda r: r.started):
        if spans and rec.started - spans[-1][1] < gap_s:
            start, end, n = spans[-1]
            spans[-1] = (start, max(end, rec.ended), n + 1)
        else:
            spans.append((rec.started, rec.ended, 1))
    return spans


def _utc(t: float, fmt: str = "%Y-%m-%d %H:%M") -> str:
    return time.strftime(fmt, time.gmtime(t))


def hours_text(seconds: float) -> str:
    """'1.4 h', or '35 min' under an hour: how the table's texts say a duration."""
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def production_lines(jobs_file: Path, finished_runs: Optional[int] = None) -> list[str]:
    """table.md's Production section ([] when the table's command ran no job: every run was made
    elsewhere, or before jobs.jsonl existed). `finished_runs`: how many runs the table gathered
    (reported and tuning), to count those its command did not make."""
    records, unreadable = read_jobs(jobs_file)
    if not records:
        return []
    done = {r.job for r in records if r.status == "done"}
    failed = [r for r in records if r.status != "done"]
    spans = sittings(records)
    run_s = sum(r.seconds for r in records)
    lines = ["## Production", "",
             f"From {jobs_file.name}: this table's command ran {len(records)} job{'s' * (len(records) != 1)} "
             f"({len(done)} made a run"
             + (f"; {len(failed)} ended without one ({', '.join(sorted({r.status for r in failed}))}), "
                f"{len({r.job for r in failed} & done)} of them made by a later try" if failed else "")
             + f"), {hours_text(run_s)} of runs, from {_utc(spans[0][0])} to {_utc(spans[-1][1])} UTC in "
             f"{len(spans)} sitting{'s' * (len(spans) != 1)} (a pause of {SITTING_GAP_S / 60:.0f} minutes or more "
             f"between runs ends one)."]
    if unreadable:
        lines.append(f"{unreadable} line{'s' * (unreadable != 1)} of {jobs_file.name} could not be read and "
                     f"{'are' if unreadable != 1 else 'is'} not counted.")
    if finished_runs is not None and finished_runs > len(done):
        lines.append(f"{finished_runs - len(done)} of the {finished_runs} runs gathered have no line there: "
                     f"made by a command other than the table's (cli.py into the row's folder), or before "
                     f"jobs.jsonl was kept.")
    loads = [v for r in records for v in r.loads]
    if loads:
        lines.append(f"Load average (1 minute) before and after each run: median {statistics.median(loads):.1f}, "
                     f"from {min(loads):.1f} to {max(loads):.1f} (two cores: the wall-clock columns are read "
                     f"against it).")
    if len(spans) > 1:
        lines.append("")
        shown = spans[:MAX_SITTINGS_LISTED]
        lines += [f"- {_utc(a)} to {_utc(b, '%H:%M') if _utc(a, '%F') == _utc(b, '%F') else _utc(b)}: "
                  f"{n} run{'s' * (n != 1)} ({hours_text(b - a)})" for a, b, n in shown]
        if len(spans) > len(shown):
            lines.append(f"- and {len(spans) - len(shown)} more sittings")
    return lines + [""]
