"""`python -m tables.ledger_digests STORE RUN_FOLDER_ROOT`: ledger digests for a store's runs carried before.

Why: a run's time ledger stays in its run folder (megabytes, never carried into a store), so a store
gathered on another machine projects from `ledger_digest.json` (projection/ledger_digest.py), which
tables/store.py's `save_run` writes as it carries a run made with `report.ledger=true`. Runs carried
before that have none; while their run folders are still at hand (RUN_FOLDER_ROOT, the table's
hydra.run.dir), this writes one into each such run's folder in the store's loose form:

- a run whose folder under RUN_FOLDER_ROOT has no `ledger/` (made without report.ledger=true, or
  the folder is gone) is counted, not digested;
- a run whose folder's summary.json is not the store's (another run made at the same place since)
  is counted and left alone: a digest must describe the run the store holds;
- a run the store holds only sealed (tables/sealed.py) is counted: digests go into loose runs, which
  the next `python -m tables.seal` packs with them.

It never changes a file other than the digests it adds, and never replaces a digest.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

from core.errors import UserError, report_user_errors
from core.rundir import RunDir
from projection.ledger_digest import digest_text, write
from tables.run_records import LEDGER_DIGEST, SUMMARY, FolderRecords
from tables.store import STORE_FILE, is_sealed, store_records


def backfill(store: Path, root: Path) -> dict[str, list[str]]:
    """Write the digests the store's loose runs lack (the module doc); the runs by outcome."""
    if not (store / STORE_FILE).is_file():
        raise UserError(f"{store}: not a table store (no {STORE_FILE}); name a table.store folder, e.g. "
                        "docs/results/NAME/store")
    if not root.is_dir():
        raise UserError(f"{root}: no such folder; give the table's run folder (its hydra.run.dir), where the runs' "
                        "ledger/ folders are")
    loose = FolderRecords(store)
    found: dict[str, list[str]] = {"written": [], "had one": [], "no ledger": [], "not the same run": []}
    for rel in loose.runs():
        if (store / rel / LEDGER_DIGEST).is_file():
            found["had one"].append(rel)
        elif not RunDir(root / rel).ledger.is_dir():
            found["no ledger"].append(rel)
        elif loose.raw(rel, SUMMARY) != FolderRecords(root).raw(rel, SUMMARY):
            found["not the same run"].append(rel)
        else:
            text = digest_text(root / rel, f"run {rel}")
            assert text is not None  # its ledger folder is there
            write(store / rel / LEDGER_DIGEST, text)
            found["written"].append(rel)
    if is_sealed(store):
        found["sealed"] = [rel for rel in store_records(store).runs() if not loose.has(rel)]
    return found


def summary_line(store: Path, found: dict[str, list[str]]) -> str:
    """One line: how many digests were written (and their sizes), and why the others were not."""
    sizes = [(store / rel / LEDGER_DIGEST).stat().st_size for rel in found["written"]]
    size = (f" ({min(sizes) / 1e3:.1f}-{max(sizes) / 1e3:.1f} kB each, {sum(sizes) / 1e3:.0f} kB in all)"
            if sizes else "")
    parts = [f"{len(found['written'])} ledger digests written{size}", f"{len(found['no ledger'])} runs had no ledger",
             f"{len(found['had one'])} had a digest already"]
    if found["not the same run"]:
        parts.append(f"{len(found['not the same run'])} left alone, their run folder's summary.json not the store's "
                     f"({found['not the same run'][0]}{', ...' if len(found['not the same run']) > 1 else ''})")
    if found.get("sealed"):
        parts.append(f"{len(found['sealed'])} sealed runs skipped (digests go into loose runs only)")
    return f"{store}: " + "; ".join(parts)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tables.ledger_digests", description=__doc__.split("\n\n")[0])
    parser.add_argument("store", type=Path, help="a table.store folder, e.g. docs/results/NAME/store")
    parser.add_argument("root", type=Path, help="the table's run folder (hydra.run.dir), holding the runs' ledger/")
    args = parser.parse_args(argv)
    with report_user_errors("tables.ledger_digests"):
        print(summary_line(args.store, backfill(args.store, args.root)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
