"""How long a table's remaining runs will take, from the runs of the same kind already made.

Why not the mean of the runs made so far: a table's runs are not alike. `workers_cpu` runs its
rows from 4 to 64 workers, and a run at 64 takes twenty times one at 4 here, so the mean of the
runs one sitting had made said 8.4 hours where about 16 were left (2026-11-26). A remaining run
is estimated from the made runs most like it: the same row label (its other seeds, its other
tuning settings), else the same row under another variant (`<row>@iid` for `<row>@dir0.1`),
else the runs at the same worker count (`.w64` in a workers table), else all made runs. The made
runs are read from the table's jobs.jsonl, so the estimate also uses the sittings before this one;
a run made over several sittings (paused, resumed) counts its pieces together.
"""
from __future__ import annotations

import re
import statistics
from typing import Iterable, Optional, Sequence

from tables.jobs import JobRecord, hours_text

_WORKERS = re.compile(r"\.w(\d+)(?=@|$)")


def job_label(job: str) -> str:
    """A job name's row label: its first word ('allreduce.w64@iid seed 1', or
    'lsgd@iid optim.lr=0.1 seed 0' for a tuning run)."""
    return job.split(" ", 1)[0]


def kinds(label: str) -> list[str]:
    """The keys a run is grouped by, most alike first: the label, the row without its variant, the
    worker count (' workers 64') and ' all' (every run); the last two begin with a space, which a
    job name's first word never has, so they cannot meet a label."""
    keys = [label]
    row = label.partition("@")[0]
    if row != label:
        keys.append(row)
    workers = _WORKERS.search(label)
    if workers:
        keys.append(f" workers {workers.group(1)}")
    return keys + [" all"]


def made_runs(records: Iterable[JobRecord]) -> dict[str, float]:
    """Seconds of each job the table has finished (status done), summed over the sittings it ran
    in (a paused run resumes in a later record under the same name); the records are jobs.jsonl's
    (tables.jobs.read_jobs) and the ones run since it was read."""
    spent: dict[tuple[str, str], float] = {}
    done: set[tuple[str, str]] = set()
    for rec in records:
        key = (rec.phase, rec.job)
        spent[key] = spent.get(key, 0.0) + rec.seconds
        if rec.status == "done":
            done.add(key)
    return {job: spent[(phase, job)] for phase, job in done}


def estimate_seconds(remaining: Sequence[str], made: dict[str, float]) -> Optional[float]:
    """Seconds the remaining jobs (by name) should take, each from the mean of the made jobs of its
    nearest kind; None when no job has been made yet."""
    if not made:
        return None
    by_kind: dict[str, list[float]] = {}
    for job, seconds in made.items():
        for key in kinds(job_label(job)):
            by_kind.setdefault(key, []).append(seconds)
    total = 0.0
    for job in remaining:
        key = next(k for k in kinds(job_label(job)) if k in by_kind)
        total += statistics.fmean(by_kind[key])
    return total


def time_left_text(remaining: Sequence[str], made: dict[str, float], phase: str) -> str:
    """'; 12 runs left in this phase (tune), about 1.4 h by the runs like them so far' ('' when
    nothing is left or nothing has been made to estimate from)."""
    seconds = estimate_seconds(remaining, made) if remaining else None
    if seconds is None:
        return ""
    left = len(remaining)
    return (f"; {left} run{'s' * (left != 1)} left in this phase ({phase}), about {hours_text(seconds)} by the runs "
            f"like them so far")
