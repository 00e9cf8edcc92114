"""A published table read again from its runs.csv alone: `table.runs_csv=PATH`.

Why: the tables made before stores were kept (qsr_cpu, the pilots, the MNIST-1D subset, ...) keep
only their final files; their run folders went with the machines that made them. Their runs.csv
holds every reported run's facts and final metrics, which is all a table's cells, differences,
Holm correction, power, ranges and machine column are computed from. So

    python cli.py table=NAME table.runs_csv=docs/results/NAME/runs.csv hydra.run.dir=DIR

gathers the table from it under today's rules (one command, nothing run): each line becomes the
run's summary (`CsvRecords`, a `RunRecords` like a run folder or a store), the table's jobs.jsonl
beside it gives table.md's Production section, and each tuned row keeps the setting its table.csv
names (`carried_tuning`): runs.csv holds no tuning run, so the grid is not chosen again (it is in
the original table.md, in git). What runs.csv cannot give is not made: no curve over a run
(accuracy, wall, series figures: per-step records), no time to target, and a text set's
characters only where the runs recorded them (`test_units`; before, runs.csv named windows only).
"""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any, Optional

from core.errors import UserError
from core.spec import LANGUAGE_MODEL
from tables.run_records import SUMMARY, Record, RunRecords, decode_text
from tables.runs import EVALUATED_ON, UNKNOWN_MACHINE

#: runs.csv's facts that summary.json keeps in its data split (tables/runs.py `split_fact` reads both)
SPLIT_FACTS = ("partition", "dirichlet_alpha", "classes_per_worker", *EVALUATED_ON, "val_samples")
TEXTS = ("commit", "machine")  # kept as written: a commit or machine type of digits is not a number
#: table.csv's columns of a row's tuning that a re-render carries over
TUNED_FIELDS = ("tuned", "tuned_within_noise", "tuned_at_edge", "tuned_rule", "tuned_set_aside")
#: figures drawn from a table's records alone (the others need each run's per-step records)
RECORD_PLOTS = ("intervals", "levels", "pareto", "workers", "throughput")


def _value(text: str) -> Any:
    """A runs.csv cell as summary.json had it: a number (int where it is one), true/false, text;
    None for an empty cell."""
    if text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    try:
        number = float(text)
    except ValueError:
        return text
    return int(number) if math.isfinite(number) and number == int(number) and "." not in text and "e" not in text \
        else number


def summary_of(line: dict[str, str]) -> dict[str, Any]:
    """A run's summary from its runs.csv line (module doc)."""
    values = {k: (v or None) if k in TEXTS else _value(v) for k, v in line.items() if k is not None}
    split = {k: values.pop(k) for k in SPLIT_FACTS if values.get(k) is not None}
    machine = values.pop("machine", None)
    summary = {k: v for k, v in values.items() if v is not None and k not in ("label", "row", "variant", "seed")}
    summary["data_split"] = split
    if any(k.endswith(("_bpc", "_ppl")) for k in summary):  # a language model's: its windows' length is not here
        summary["task"] = LANGUAGE_MODEL
    if isinstance(machine, str) and machine and machine != UNKNOWN_MACHINE:
        summary["machine"] = {"type": machine}
    return summary


class CsvRecords(RunRecords):
    """The reported runs of a runs.csv, by their table's relative path (`<label>/seed_<s>`): each
    with its summary, none with metrics records, overrides or config."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise UserError(f"table.runs_csv={path}: no such file; give a table's runs.csv "
                            f"(docs/results/<table>/runs.csv)")
        text = decode_text(self.path.read_bytes(), self.path)
        reader = csv.DictReader(text.splitlines())
        missing = [k for k in ("label", "seed") if k not in (reader.fieldnames or [])]
        if missing:
            raise UserError(f"{self.path}: no {missing[0]} column, so it is not a table's runs.csv "
                            f"(tables/runs.py writes one); put it back from git")
        self._summaries: dict[str, str] = {}
        for n, line in enumerate(reader, 2):
            seed = _value(line.get("seed") or "")
            if not isinstance(seed, int) or not line.get("label"):
                raise UserError(f"{self.path}: line {n} has no label or an integer seed; put the file back from git")
            self._summaries[f"{line['label']}/seed_{seed}"] = json.dumps(summary_of(line))

    def runs(self) -> list[str]:
        return sorted(self._summaries)

    def has(self, rel: str) -> bool:
        return rel in self._summaries

    def text(self, rel: str, name: str) -> Optional[str]:
        return self._summaries.get(rel) if name == SUMMARY else None

    def metrics(self, rel: str, kind: Optional[str] = None) -> Optional[list[Record]]:
        return None

    def where(self, rel: str, name: str) -> str:
        return f"{self.path} (run {rel})"


def carried_tuning(runs_csv: Path) -> dict[str, dict[str, Any]]:
    """Each tuned row's setting as the table.csv beside `runs_csv` names it ({} without one)."""
    table_csv = Path(runs_csv).with_name("table.csv")
    if not table_csv.is_file():
        return {}
    rows = csv.DictReader(decode_text(table_csv.read_bytes(), table_csv).splitlines())
    return {r["label"]: {k: _value(r.get(k) or "") for k in TUNED_FIELDS if k in r}
            for r in rows if r.get("label") and r.get("tuned")}
