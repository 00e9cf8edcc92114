"""A table's finished runs, carried between checkouts and machines: `table.store=PATH`.

Why: a table here is tens of hours of runs, made in sittings, and a sitting's machine may be a fresh
one, its run folder (hydra.run.dir) gone with the last. With `table.store` set, the runner copies
each finished run's record (RECORD_FILES: what the table reads from a run, never its checkpoints)
into PATH, in the run folder's layout, as the run finishes, and appends the run's jobs.jsonl line
there too. When the table starts it puts back into its run folder every finished run PATH holds
that the folder lacks, and merges the two jobs.jsonl; a run the folder holds finished but PATH
lacks (its runner stopped between the run's end and the copy) is carried when the runner reaches
it. Commit PATH (e.g. docs/results/NAME/store) and a later checkout resumes the table where the
last one stopped, every run keeping the commit it was made at. PATH is left out of the dirty-tree
check, as the run folder is.

A run in progress is not carried (a checkpoint is megabytes per rank): it starts again there. A
store belongs to one table in one form (STORE_FILE records its name and whether it is the quick
form), since runs are put back by label and seed alone: another table, or the quick form of the
same one, is refused in one line. The run folder is claimed the same way (FOLDER_FILE), for the same
reason: a folder that holds another table's runs would have them read as this table's, and its
jobs.jsonl merged into this table's store. Gathering (`table.gather_only`) reads a store and never
writes to it.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from core.errors import UserError
from core.provenance import REPO
from tables.config import TableConfig
from tables.jobs import JOBS_FILE, read_jobs

STORE_FILE = "store.json"  # which table (and form) the store's runs belong to
FOLDER_FILE = "table.json"  # which table (and form) a run folder's runs belong to

#: a run's record: what a table reads from a finished run (summary, eval curve, composed config and
#: the overrides that tell a stale tuning choice); paths relative to the run folder
RECORD_FILES = ("summary.json", "metrics.jsonl", "config.yaml", ".hydra/overrides.yaml")


def finished_runs(root: Path) -> list[Path]:
    """Every finished run under `root` (a folder holding summary.json), relative to it, sorted."""
    if not root.is_dir():
        return []
    return sorted(p.parent.relative_to(root) for p in root.glob("**/summary.json"))


def copy_record(src: Path, dst: Path) -> None:
    """Copy one run's record files that exist from run folder `src` into `dst`. summary.json goes
    last, so that a copy cut short is never taken for a finished run."""
    for name in sorted(RECORD_FILES, key=lambda n: n == "summary.json"):
        if (src / name).is_file():
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / name, dst / name)


def save_run(store: Path, out: Path, run_root: Path) -> None:
    """Carry a run that has just finished in `out` into the store."""
    copy_record(run_root, store / run_root.relative_to(out))


def carry_if_missing(store: Path, out: Path, run_root: Path) -> bool:
    """Carry a finished run the store lacks: its runner was stopped (a pause) between the run's
    end and the copy, and the next start finds it complete in `out`. True when it carried it."""
    if (store / run_root.relative_to(out) / "summary.json").is_file():
        return False
    save_run(store, out, run_root)
    return True


def _job_lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def _ended(line: str) -> float:
    try:
        return float(json.loads(line).get("ended", 0.0))
    except (ValueError, TypeError, AttributeError):
        return 0.0


def merge_jobs(store: Path, out: Path, into_store: bool = True) -> None:
    """Both folders' jobs.jsonl become their union, each line once, in the order the jobs ended
    (only the run folder's, when not `into_store`: a gather)."""
    lines = list(dict.fromkeys(_job_lines(out / JOBS_FILE) + _job_lines(store / JOBS_FILE)))
    text = "".join(f"{line}\n" for line in sorted(lines, key=_ended))
    for folder in (out, store) if into_store else (out,):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / JOBS_FILE).write_text(text)


def store_path(table: TableConfig) -> Path:
    """table.store as a path (a relative one is the repository's)."""
    return REPO / str(table.store)


def store_identity(table: TableConfig) -> dict[str, object]:
    """What a store's runs belong to: the table's name and form."""
    return {"table": table.name, "quick": table.quick}


def _refuse_other(path: Path, identity: dict[str, object], what: str, fix: str) -> bool:
    """Refuse (one line) a folder whose record `path` names another table or form; True if the
    record is there (and names this one)."""
    if not path.is_file():
        return False
    found = json.loads(path.read_text())
    if found != identity:
        raise UserError(f"{what} holds the runs of {found}, not of {identity}; {fix}")
    return True


def check_store(store: Path, identity: dict[str, object]) -> bool:
    """Refuse a store made for another table or form (one line); True if it is this one's."""
    return _refuse_other(store / STORE_FILE, identity, f"table.store={store}", "give this table a store of its own")


def claim(store: Path, identity: dict[str, object]) -> None:
    """Record the store's table (first use), or refuse a store made for another one (one line)."""
    if check_store(store, identity):
        return
    store.mkdir(parents=True, exist_ok=True)
    (store / STORE_FILE).write_text(json.dumps(identity) + "\n")


def claim_folder(out: Path, identity: dict[str, object], rows: set[str]) -> None:
    """Record the run folder's table (first use), or refuse, in one line and before anything is
    written there, a folder made for another table or form. A folder from before this record is
    claimed unless its jobs.jsonl names a row the table does not have (another table's jobs)."""
    fix = "give this table a run folder of its own (hydra.run.dir=...)"
    if _refuse_other(out / FOLDER_FILE, identity, f"the run folder {out}", fix):
        return
    foreign = sorted({job.row for job in read_jobs(out / JOBS_FILE)[0] if job.row not in rows})
    if foreign:
        raise UserError(f"the run folder {out} holds jobs of rows table {identity['table']} does not have "
                        f"({', '.join(foreign[:3])}{', ...' if len(foreign) > 3 else ''}): another table's; {fix}")
    out.mkdir(parents=True, exist_ok=True)
    (out / FOLDER_FILE).write_text(json.dumps(identity) + "\n")


def restore(store: Path, out: Path, identity: dict[str, object], into_store: bool = True) -> int:
    """Put back into `out` every finished run of the store that `out` does not hold finished (a run
    left half-made there is completed by the store's record; its checkpoints stay, unused), merge the
    two jobs.jsonl (into both, or only into `out` when not `into_store`); returns how many runs were
    put back. A store of another table is refused."""
    if into_store:
        claim(store, identity)
    else:
        check_store(store, identity)
    put_back = 0
    for rel in finished_runs(store):
        if not (out / rel / "summary.json").exists():
            copy_record(store / rel, out / rel)
            put_back += 1
    merge_jobs(store, out, into_store)
    return put_back


def append_job(store: Path, line: str) -> None:
    """One job's jobs.jsonl line, in the store as in the run folder."""
    store.mkdir(parents=True, exist_ok=True)
    with open(store / JOBS_FILE, "a") as fh:
        fh.write(line + "\n")
