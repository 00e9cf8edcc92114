"""`python -m tables.seal STORE [STORE ...]`: a finished table's store put in its sealed form.

Run it once a table is final, after its last gather (docs/tables.md, "The two forms of a store").
For each store:

1. every finished run it holds is read through the readers' checks (its loose runs; and its sealed
   ones, where a production went on from a sealed store): a corrupt file stops the seal in one line,
   nothing changed;
2. both sealed files (tables/sealed.py) are written beside the loose ones under temporary names;
3. they are read back and compared with what the store held: every text file byte for byte, every
   metrics record equal, its types and key order included (a float by its exact value, NaN and -0.0
   too). A difference stops the seal: the temporary files go, the loose files stay;
4. only then the sealed files take their names and the loose run folders are removed (the record's
   files alone: a folder holding anything else is kept, and named).

`--check` does steps 1 to 3 and changes nothing. One line per store says what was sealed: runs,
bytes before and after, and how many metrics files a restore gives back byte for byte (the others
record for record). The loose files stay in git history: the commit before the seal holds them.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Optional

from core.errors import UserError, report_user_errors
from tables.run_records import (METRICS_XZ, RECORD_FILES, SEALED_METRICS, SEALED_RUNS, TEXT_FILES, FolderRecords,
                                RunRecords, corrupt, decode_text, parse_json)
from tables.sealed import Runs, SealedRecords, write_sealed
from tables.store import STORE_FILE, is_sealed, store_records

TEMPORARY = ".sealing"  # the suffix of a sealed file written but not yet checked


def same(a: Any, b: Any) -> bool:
    """JSON values equal in type and value, objects in key order too; floats by their exact value
    (NaN equals NaN, -0.0 differs from 0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return repr(a) == repr(b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def identity_of(store: Path) -> dict[str, object]:
    """The table a store belongs to (its store.json); one line if it is not a store."""
    path = store / STORE_FILE
    if not path.is_file():
        raise UserError(f"{store}: not a table store (no {STORE_FILE}); name a table.store folder, e.g. "
                        f"docs/results/NAME/store")
    found = parse_json(decode_text(path.read_bytes(), path), path)
    if not isinstance(found, dict) or set(found) != {"table", "quick"}:
        raise corrupt(path, "not a record of a table ({\"table\": NAME, \"quick\": false})", "put it back from git")
    return found


def gather_runs(records: RunRecords) -> Runs:
    """Every finished run's texts and metrics records, each file read through its checks."""
    runs = []
    for rel in records.runs():
        records.summary(rel)
        records.overrides(rel)
        runs.append((rel, {name: records.text(rel, name) for name in TEXT_FILES}, records.metrics(rel)))
    return runs


def differences(runs: Runs, sealed: SealedRecords) -> list[str]:
    """Where the sealed files do not give back what the store held (empty: nowhere). Texts compare
    as strings of the same code points: the same bytes in UTF-8."""
    wrong = [] if sealed.runs() == [rel for rel, _, _ in runs] else ["the list of runs"]
    for rel, texts, records in runs:
        wrong += [f"{rel}/{name}" for name, text in texts.items() if sealed.text(rel, name) != text]
        back = sealed.metrics(rel)
        if (back is None) != (records is None) or not same(back or [], records or []):
            wrong.append(f"{rel}: its metrics records")
    return wrong


def byte_identical(store: Path, sealed: SealedRecords) -> tuple[int, int]:
    """Of the loose runs' metrics files, how many a restore from the sealed form writes back byte
    for byte, and how many there are."""
    loose = FolderRecords(store)
    files = [(rel, found[0]) for rel in loose.runs() if (found := loose.metrics_file(rel)) is not None]
    return sum(1 for rel, text in files if sealed.metrics_text(rel) == text), len(files)


def remove_loose(store: Path, rels: list[str]) -> list[str]:
    """Remove the loose runs' record files and the folders left empty; the folders kept (they hold
    something else)."""
    kept = []
    for rel in rels:
        folder = store / rel
        for name in (*RECORD_FILES, METRICS_XZ):
            (folder / name).unlink(missing_ok=True)
        for empty in (folder / ".hydra", folder):
            if empty.is_dir() and not any(empty.iterdir()):
                empty.rmdir()
        if folder.exists():
            kept.append(rel)
        parent = folder.parent
        while parent != store and parent.is_dir() and not any(parent.iterdir()):
            parent.rmdir()
            parent = parent.parent
    return kept


def size_of(paths: list[Path]) -> int:
    return sum(p.stat().st_size for p in paths if p.is_file())


def seal(store: Path, check_only: bool = False) -> str:
    """Seal one store (the module doc's steps); returns the line that says what was done."""
    identity = identity_of(store)
    source = store_records(store, identity)
    loose = FolderRecords(store).runs()
    if not loose and is_sealed(store):
        return f"{store}: sealed already ({len(source.runs())} runs), no loose run to add; nothing changed"
    runs = gather_runs(source)
    if not runs:
        raise UserError(f"{store}: no finished run to seal")
    before = size_of([p for rel in loose for p in (store / rel).glob("**/*")]
                     + [store / SEALED_RUNS, store / SEALED_METRICS])
    temporary = [store / (SEALED_RUNS + TEMPORARY), store / (SEALED_METRICS + TEMPORARY)]
    try:
        write_sealed(runs, *temporary, identity)
        sealed = SealedRecords(store, identity, *temporary)
        wrong = differences(runs, sealed)
        if wrong:
            raise UserError(f"{store}: the sealed files do not give back {wrong[0]}"
                            f"{f' (and {len(wrong) - 1} more)' if len(wrong) > 1 else ''}; nothing was changed "
                            f"(please report it: a seal must be lossless)")
        exact, files = byte_identical(store, sealed)
        after = size_of(temporary)
        if check_only:
            return (f"{store}: {len(runs)} runs would seal into {after / 1e6:.2f} MB (now {before / 1e6:.2f} MB); "
                    f"checked, nothing changed")
        temporary[0].replace(store / SEALED_RUNS)
        temporary[1].replace(store / SEALED_METRICS)
    finally:
        for path in temporary:
            path.unlink(missing_ok=True)
    kept = remove_loose(store, loose)
    return (f"{store}: sealed {len(runs)} runs ({len(loose)} loose) into {SEALED_RUNS} and {SEALED_METRICS}, "
            f"{before / 1e6:.2f} MB -> {after / 1e6:.2f} MB; read back equal, every text byte for byte, "
            f"every metrics record value for value, {exact} of {files} loose metrics files byte for byte"
            + (f"; kept {len(kept)} folders holding other files: {', '.join(kept[:3])}" if kept else ""))


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tables.seal", description=__doc__.split("\n\n")[0])
    parser.add_argument("stores", nargs="+", type=Path, help="table.store folders, e.g. docs/results/NAME/store")
    parser.add_argument("--check", action="store_true", help="write and check the sealed form, change nothing")
    args = parser.parse_args(argv)
    with report_user_errors("tables.seal"):
        for store in args.stores:
            print(seal(store, args.check), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
