"""A table's finished runs, carried between checkouts and machines: `table.store=PATH`.

Why: a table here is tens of hours of runs, made in sittings, and a sitting's machine may be a fresh
one, its run folder (hydra.run.dir) gone with the last. With `table.store` set, the runner copies
each finished run's record (RECORD_FILES: what the table reads from a run, never its checkpoints
or its time ledger, whose digest it writes instead) into PATH, in the run folder's layout, as the
run finishes, and appends the run's jobs.jsonl line there too. When the table starts it puts back
into its run folder every finished run PATH holds that the folder lacks, and merges the two
jobs.jsonl; a run the folder holds finished but PATH lacks (its runner stopped between the run's
end and the copy) is carried when the runner reaches it. Commit PATH (e.g. docs/results/NAME/store)
and a later checkout resumes the table where the last one stopped, every run keeping the commit it
was made at. PATH is left out of the dirty-tree check, as the run folder is.

A store has two forms, read alike (tables/run_records.py's `RunRecords`, `store_records`):
- LOOSE, while the table is produced: a folder per run, each file written once when the run
  finishes (summary.json, config.yaml, .hydra/overrides.yaml as the run wrote them; the per-step
  metrics xz-compressed, metrics.jsonl.xz, about a sixth of their size), so that what a sitting
  commits is small and never rewrites a large file. A store from before keeps its plain
  metrics.jsonl, read the same.
- SEALED, once the table is final (`python -m tables.seal PATH`, tables/seal.py): every run's record
  in two Parquet files (tables/sealed.py), checked to read back exactly before the loose files are
  removed. A production may go on from a sealed store: its new runs are loose beside the sealed
  ones (a loose run is read before a sealed one of the same name) until the next seal.

A run in progress is not carried (a checkpoint is megabytes per rank): it starts again there. A
store belongs to one table in one form (STORE_FILE records its name and whether it is the quick
form), since runs are put back by label and seed alone: another table, or the quick form of the
same one, is refused in one line. The run folder is claimed the same way (FOLDER_FILE), for the same
reason: a folder that holds another table's runs would have them read as this table's, and its
jobs.jsonl merged into this table's store. Gathering (`table.gather_only`) reads a store where it
is (`gather_view`): it copies no run and never writes to the store.
"""
from __future__ import annotations

import json
import lzma
import shutil
from pathlib import Path

from core.errors import UserError
from core.provenance import REPO
from projection.ledger_digest import digest_text
from projection.ledger_digest import write as write_digest
from tables.config import TableConfig
from tables.jobs import JOBS_FILE, read_jobs
from tables.run_records import (LEDGER_DIGEST, METRICS, METRICS_XZ, RECORD_FILES, SEALED_METRICS, SEALED_RUNS,
                                SUMMARY, TEXT_FILES, FolderRecords, Overlay, RunRecords, corrupt, decode_text,
                                parse_json, rel_of)

STORE_FILE = "store.json"  # which table (and form) the store's runs belong to
FOLDER_FILE = "table.json"  # which table (and form) a run folder's runs belong to
XZ_PRESET = 9 | lzma.PRESET_EXTREME  # a run's metrics are compressed once, when it finishes: the smallest form


def is_sealed(store: Path) -> bool:
    """Whether the store has a sealed form (it may have loose runs beside it)."""
    return (store / SEALED_RUNS).exists() or (store / SEALED_METRICS).exists()


_SEALED: dict[tuple[object, ...], RunRecords] = {}  # a sealed store's reader, while its files are unchanged


def store_records(store: Path, identity: dict[str, object] | None = None) -> RunRecords:
    """The runs of a store in either form: its loose runs before its sealed ones. `identity`: the
    table the sealed files must belong to. The sealed reader is kept while its files are unchanged:
    a production asks the store about every job it finds complete."""
    loose = FolderRecords(store)
    if not is_sealed(store):
        return loose
    from tables.sealed import SealedRecords  # pyarrow: imported only where a sealed store is read

    files = [store / SEALED_RUNS, store / SEALED_METRICS]
    key = (str(store.resolve()), json.dumps(identity), *((p.stat().st_mtime_ns, p.stat().st_size) if p.exists()
                                                          else None for p in files))
    if key not in _SEALED:
        _SEALED[key] = SealedRecords(store, identity)
    return Overlay(loose, _SEALED[key])


def save_run(store: Path, out: Path, run_root: Path) -> None:
    """Carry a run that has just finished in `out` into the store (the loose form): its text files
    as they are, its metrics xz-compressed, summary.json last, so that a copy cut short is never
    taken for a finished run. A run that kept a time ledger (`ledger/`, never carried: megabytes)
    gets its digest (projection/ledger_digest.py) among them, so that a store gathered elsewhere
    still projects from the run's own compute; a ledger that cannot be read is named in one line
    and the run is carried without one."""
    dst = store / run_root.relative_to(out)
    try:
        digest = digest_text(run_root, f"run {rel_of(out, run_root)}")
    except UserError as err:
        print(f"table.store: {rel_of(out, run_root)} carried without a ledger digest: {err}", flush=True)
        digest = None
    if digest is not None:
        write_digest(dst / LEDGER_DIGEST, digest)
    for name in sorted(RECORD_FILES, key=lambda n: n == SUMMARY):
        if not (run_root / name).is_file() or (name == LEDGER_DIGEST and digest is not None):
            continue
        (dst / name).parent.mkdir(parents=True, exist_ok=True)
        if name == METRICS:
            (dst / METRICS_XZ).write_bytes(lzma.compress((run_root / name).read_bytes(), preset=XZ_PRESET))
        else:
            shutil.copyfile(run_root / name, dst / name)


def carry_if_missing(store: Path, out: Path, run_root: Path) -> bool:
    """Carry a finished run the store lacks: its runner was stopped (a pause) between the run's
    end and the copy, and the next start finds it complete in `out`. True when it carried it."""
    if store_records(store).has(rel_of(out, run_root)):
        return False
    save_run(store, out, run_root)
    return True


def put_back(records: RunRecords, rel: str, dst: Path) -> None:
    """Write a finished run of `records` into the run folder `dst` as the runner wrote it (metrics
    as plain metrics.jsonl), after reading every file through the reader's checks (one line for a
    corrupt one, before this run is written); summary.json last."""
    records.summary(rel)  # a truncated or foreign summary is refused here, not by a later gather
    records.overrides(rel)
    texts = {name: records.text(rel, name) for name in TEXT_FILES}
    metrics = records.metrics_text(rel)
    for name, text in [(METRICS, metrics), *sorted(texts.items(), key=lambda kv: kv[0] == SUMMARY)]:
        if text is not None:
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            (dst / name).write_bytes(text.encode("utf-8"))


def _job_lines(path: Path) -> list[str]:
    """jobs.jsonl's lines (a line that is not JSON is kept as it is: jobs.py counts it unreadable)."""
    if not path.is_file():
        return []
    return [line for line in decode_text(path.read_bytes(), path).splitlines() if line.strip()]


def _ended(line: str) -> float:
    try:
        return float(json.loads(line).get("ended", 0.0))
    except (ValueError, TypeError, AttributeError, RecursionError):
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
    found = parse_json(decode_text(path.read_bytes(), path), path)
    if not isinstance(found, dict) or set(found) != set(identity):
        raise corrupt(path, f"is not a record of a table ({json.dumps(found)[:60]})",
                      f"put it back from git, or write {json.dumps(identity)} there if this is table "
                      f"{identity['table']}'s")
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
    """Put back into `out` every finished run of the store (either form) that `out` does not hold
    finished (a run left half-made there is completed by the store's record; its checkpoints stay,
    unused), merge the two jobs.jsonl (into both, or only into `out` when not `into_store`); returns
    how many runs were put back. A store of another table is refused."""
    if into_store:
        claim(store, identity)
    else:
        check_store(store, identity)
    records = store_records(store, identity)
    put = 0
    for rel in records.runs():
        if not (out / rel / SUMMARY).exists():
            put_back(records, rel, out / rel)
            put += 1
    merge_jobs(store, out, into_store)
    return put


def gather_view(store: Path, out: Path, identity: dict[str, object]) -> RunRecords:
    """What a gather (`table.gather_only`) reads: the run folder's own finished runs before the
    store's, the store read where it is (nothing copied, nothing written to it); the run folder's
    jobs.jsonl gets the store's lines."""
    check_store(store, identity)
    merge_jobs(store, out, into_store=False)
    return Overlay(FolderRecords(out), store_records(store, identity))


def append_job(store: Path, line: str) -> None:
    """One job's jobs.jsonl line, in the store as in the run folder."""
    store.mkdir(parents=True, exist_ok=True)
    with open(store / JOBS_FILE, "a") as fh:
        fh.write(line + "\n")
