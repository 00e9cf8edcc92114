"""`python -m tables.curves STORE`: the per-step records of a table's runs, for a reader.

A gather keeps only what a table shows; the curves behind it (every logged training step and
every evaluation of every run) stay in the table's store, loose or sealed (tables/store.py). This
command reads them through the same reader a gather uses, in either form:

    python -m tables.curves docs/results/NAME/store                    # the runs and their record counts
    python -m tables.curves docs/results/NAME/store --csv > all.csv    # every record, one CSV row each
    python -m tables.curves docs/results/NAME/store --run 'allreduce@iid/seed_0' --kind eval --csv

The CSV's columns are `run` and every key the chosen records have, in the order first met; a list
is written as JSON. With pyarrow alone, a sealed store's metrics.parquet is one table already
(tables/sealed.py's doc). STORE may also be a table's run folder (hydra.run.dir).
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Optional

from core.errors import UserError, report_user_errors
from tables.store import store_records


def write_csv(records: dict[str, list[dict[str, object]]], out: object) -> int:
    """The records as CSV (`run` first, then every key in first-met order); returns the rows written."""
    keys = list(dict.fromkeys(k for recs in records.values() for rec in recs for k in rec))
    writer = csv.writer(out)  # type: ignore[arg-type]
    writer.writerow(["run", *keys])
    rows = 0
    for run, recs in records.items():
        for rec in recs:
            writer.writerow([run, *("" if rec.get(k) is None else json.dumps(rec[k]) if isinstance(rec[k], (list, dict))
                                    else rec[k] for k in keys)])
            rows += 1
    return rows


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tables.curves", description=__doc__.split("\n\n")[0])
    parser.add_argument("store", type=Path, help="a table.store folder (loose or sealed), or a table's run folder")
    parser.add_argument("--run", action="append", default=[], help="a run's path, e.g. 'allreduce@iid/seed_0' "
                        "(repeatable; default: every run)")
    parser.add_argument("--kind", help="only records of this kind (train, eval)")
    parser.add_argument("--csv", action="store_true", help="write the records as CSV to stdout")
    args = parser.parse_args(argv)
    with report_user_errors("tables.curves"):
        if not args.store.is_dir():
            raise UserError(f"{args.store}: no such folder; give a table.store folder, e.g. docs/results/NAME/store")
        records = store_records(args.store)
        runs = args.run or records.runs()
        missing = [r for r in runs if not records.has(r)]
        if missing:
            raise UserError(f"{args.store} holds no finished run {missing[0]}; `python -m tables.curves "
                            f"{args.store}` lists them")
        found = {run: records.metrics(run, args.kind) or [] for run in runs}
        if args.csv:
            write_csv(found, sys.stdout)
        else:
            for run, recs in found.items():
                print(f"{run}: {len(recs)} records")
    return 0


if __name__ == "__main__":
    sys.exit(main())
