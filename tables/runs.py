"""A table's per-seed results: every reported run's summary, read once, and `runs.csv`, the file
beside table.csv from which every interval of table.csv can be recomputed by a reader.

runs.csv has one line per reported run (row x variant x seed): `label` (table.csv's), `row`,
`variant`, `seed`, the code it ran (`commit`, `dirty`), what pairing depends on (`train_ranks`,
`partition`, `dirichlet_alpha`, `classes_per_worker`), which data it was evaluated on (`split_seed`,
and a generated set's `generator_seed`: they follow the seed under table.split_seeds=per_seed),
the evaluation sets' sizes in examples (`test_samples`, `val_samples`) and in the units their
accuracies count (`test_units`, `val_units`: the floor under accuracy intervals), the machine type
it ran on (`machine`, core/machine.py; `unknown` for a run made before summary.json recorded it),
and every reported metric: the table's columns and ratios, its headline and selection metrics, and
every test or validation value the runs recorded (a language model's `bits_per_char` and
`perplexity` included, and the loss's standard error over the set, `test_loss_se`, where recorded).

What a metric counts (`scored_units`): an accuracy is a share of the units its task scores, which
summary.json records from the task (`test_units`, core/task: samples; a language model's
characters). A run made before that record counts them from its data split: a text set's windows
times the context length (every position of a window predicts the next character: 512 windows of
64 are 32,768 characters, not 512 examples), else its examples.
"""
from __future__ import annotations

import csv
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Optional

from core.rundir import RunDir
from core.spec import LANGUAGE_MODEL
from core.task import TASKS
from tables.config import RowConfig, TableConfig, row_dir, target
from tables.config import row_name as row_of  # (the row of a `<row>@<variant>` label)
from tables.measure import Better, evaluation_set, implied_direction, reaches
from tables.run_records import SUMMARY, FolderRecords, Record, RunsAt, number, records_of

Summary = dict[str, Any]
#: metrics a task may report without a test_/val_ prefix (a language model's, on test)
TASK_METRICS = ("bits_per_char", "perplexity")
#: what fixes a run's validation and test data beyond the set's name (`data.<key>` in its config)
EVALUATED_ON = ("split_seed", "generator_seed")
FACTS = ["commit", "dirty", "machine", "train_ranks", "partition", "dirichlet_alpha", "classes_per_worker",
         *EVALUATED_ON, "test_samples", "val_samples", "test_units", "val_units"]
UNKNOWN_MACHINE = "unknown"  # a run made before summary.json recorded its machine (core/machine.py)


def reached(evals: Iterable[Record], target_value: float, metric: str = "test_acc",
            better: Optional[Better] = None) -> tuple[Optional[float], Optional[int]]:
    """Wall-clock seconds and bytes sent (all ranks) at the first of a run's eval records whose
    `metric` reaches target_value in the metric's direction ((None, None): never). The readers have
    checked that wall_s and comm_bytes_total are numbers (tables/run_records.py)."""
    better = better or implied_direction(metric) or Better.higher
    for rec in evals:
        value = rec.get(metric)
        if rec.get("kind") == "eval" and isinstance(value, (int, float)) and not isinstance(value, bool) \
                and reaches(value, target_value, better) and rec.get("wall_s") is not None:
            sent = rec.get("comm_bytes_total")
            return float(rec["wall_s"]), (int(sent) if sent is not None else None)
    return None, None


def to_target(run_dir: RunDir, target_value: float, metric: str = "test_acc",
              better: Optional[Better] = None) -> tuple[Optional[float], Optional[int]]:
    """`reached` of one run folder's metrics."""
    return reached(FolderRecords(run_dir.root).metrics(".", "eval") or [], target_value, metric, better)


def variant_of(label: str) -> str:
    """The variant of a `<row>@<variant>` label ("" for a table without variants)."""
    return label.partition("@")[2]


def row_rel(row: RowConfig, seed: int) -> str:
    """A reported run's path in the table's folder (and store): `<label>/seed_<s>`."""
    return row_dir(Path(), row, seed).root.as_posix()


def table_metrics(table: TableConfig) -> list[str]:
    """The summary keys a table reads as numbers (besides every test_/val_ value, which runs.csv
    lists): its columns, ratios and the metrics it compares, selects and ties on."""
    named = [*table.columns, *table.ratios, table.compare_metric, table.select_metric, table.tie_metric]
    return [m for m in dict.fromkeys(named) if m]


def run_summary(table: TableConfig, row: RowConfig, seed: int, out: RunsAt) -> Optional[Summary]:
    """A finished run's summary, with time_to_target_s and bytes_to_target added when the table
    has a target (None: the run has not finished). A metric the table reads that is there but not
    a number (a hand edit, another program's file) is refused in one line naming the file."""
    records, rel = records_of(out), row_rel(row, seed)
    summary = records.summary(rel)
    if summary is None:
        return None
    read_as_numbers = table_metrics(table)
    for key in summary:
        if key in read_as_numbers or evaluation_set(key) is not None or key in TASK_METRICS:
            number(summary, key, records.where(rel, SUMMARY))
    evals = records.metrics(rel, "eval") if target(table) is not None else None
    if evals is not None:  # (runs read from a runs.csv have no records: their values as it gives them)
        summary["time_to_target_s"], summary["bytes_to_target"] = reached(
            evals, target(table), table.target_metric, table.better or implied_direction(table.target_metric))
    return summary


def read_runs(table: TableConfig, out: RunsAt) -> dict[str, dict[int, Summary]]:
    """Every finished reported run's summary: label -> seed -> summary. `out`: the table's folder,
    or the runs a gather reads (tables/run_records.py)."""
    records = records_of(out)
    runs: dict[str, dict[int, Summary]] = {}
    for row in table.rows:
        found = {seed: run_summary(table, row, seed, records) for seed in table.seeds}
        runs[row.label] = {s: v for s, v in found.items() if v is not None}
    return runs


def split_fact(summary: Summary, key: str) -> Any:
    """A data-split fact of a run (`data_split` in summary.json, a generated set's record within it),
    or a top-level key of the same name."""
    split = summary.get("data_split") if isinstance(summary.get("data_split"), dict) else {}
    generated = split.get("generated") if isinstance(split.get("generated"), dict) else {}
    return split.get(key, generated.get(key, summary.get(key)))


def _positive(value: Any) -> Optional[int]:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def metric_set(metric: str) -> Optional[str]:
    """`test` or `val`: the set a metric was measured on (a task metric without a prefix is test's)."""
    return evaluation_set(metric) or ("test" if metric in TASK_METRICS else None)


def set_size(summary: Summary, metric: str, table: TableConfig) -> Optional[int]:
    """How many examples `metric` was measured on: the run's record (summary `test_samples` or
    `data_split.val_samples`), else the table's `test_examples`/`val_examples` (None: unknown,
    or a metric of no evaluation set)."""
    which = metric_set(metric)
    if which is None:
        return None
    recorded = _positive(split_fact(summary, f"{which}_samples"))
    if recorded:
        return recorded
    return table.test_examples if which == "test" else table.val_examples


def recorded_units(summary: Summary, which: str) -> Optional[int]:
    """The units a set's shares count as the run records them (`<set>_units`, from its task), or
    as its data split gives them (a text set's windows x context length, else its examples);
    None where neither says."""
    recorded = _positive(summary.get(f"{which}_units"))
    if recorded:
        return recorded
    examples = _positive(split_fact(summary, f"{which}_samples"))
    context = _positive(split_fact(summary, "context_length"))
    if summary.get("task") == LANGUAGE_MODEL and not context:
        return None  # windows of an unknown length: no count rather than a wrong one
    return examples * context if examples and context else examples


def scored_units(summary: Summary, metric: str, table: TableConfig) -> Optional[int]:
    """How many units an accuracy `metric` is a share of (module doc): the run's record, else the
    table's `test_examples`/`val_examples` (which a table states in the units its task scores)."""
    which = metric_set(metric)
    if which is None:
        return None
    return recorded_units(summary, which) or (table.test_examples if which == "test" else table.val_examples)


def loss_set_se(summary: Summary, metric: str) -> Optional[float]:
    """The standard error of a loss `metric` over its set as the run recorded it (`test_loss_se`,
    per the task's scoring group: a sample, a window), in the metric's units (bits per character:
    / ln 2); None for another metric, or a run that did not record it."""
    which = metric_set(metric)
    base = metric.removeprefix("best_").removesuffix("_at_best")
    if which is None:
        return None
    if base in (f"{which}_loss",):
        scale = 1.0
    elif base in (f"{which}_bpc", "bits_per_char"):
        scale = 1 / math.log(2)
    else:
        return None
    value = summary.get(f"{which}_loss_se" + ("_at_best" if metric.endswith("_at_best") else ""))
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    return float(value) * scale if ok else None


def unit_name(runs: dict[str, dict[int, Summary]]) -> str:
    """What one scored unit of the runs' task is (`Task.unit`: a sample, a character; a text set's
    runs from before the task said so: a character; else an example)."""
    for by_seed in runs.values():
        for summary in by_seed.values():
            task = summary.get("task")
            if isinstance(task, str) and task in TASKS.names():
                return TASKS.get(task).unit
            if split_fact(summary, "context_length"):
                return "character"
    return "example"


def machine_type(summary: Summary) -> str:
    """The machine type a run ran on (summary.json `machine.type`), or `unknown`."""
    record = summary.get("machine")
    found = record.get("type") if isinstance(record, dict) else None
    return str(found) if isinstance(found, str) and found else UNKNOWN_MACHINE


def reported_metrics(table: TableConfig, runs: dict[str, dict[int, Summary]]) -> list[str]:
    """The metric columns of runs.csv (see the module doc), in a stable order."""
    named = [*table.columns, *table.ratios, table.compare_metric, table.select_metric, table.tie_metric]
    recorded = sorted({key for by_seed in runs.values() for s in by_seed.values() for key, value in s.items()
                       if isinstance(value, (int, float)) and not isinstance(value, bool)
                       and (evaluation_set(key) is not None or key in TASK_METRICS)})
    return [m for m in dict.fromkeys([*named, *recorded]) if m not in FACTS and "_units" not in m]


def run_rows(table: TableConfig, runs: dict[str, dict[int, Summary]]) -> Iterable[dict[str, Any]]:
    metrics = reported_metrics(table, runs)
    for row in table.rows:
        for seed, summary in sorted(runs.get(row.label, {}).items()):
            line: dict[str, Any] = {"label": row.label, "row": row_of(row.label), "variant": variant_of(row.label),
                                    "seed": seed}
            for key in FACTS:
                value = split_fact(summary, key)
                if key in ("test_samples", "val_samples"):
                    value = set_size(summary, key.replace("_samples", "_acc"), table)
                elif key in ("test_units", "val_units"):
                    value = recorded_units(summary, key.removesuffix("_units"))
                elif key == "machine":
                    value = machine_type(summary)
                line[key] = value
            for metric in metrics:
                value = summary.get(metric)
                line[metric] = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
            yield line


def write_runs_csv(path: Path, table: TableConfig, runs: dict[str, dict[int, Summary]]) -> None:
    keys = ["label", "row", "variant", "seed", *FACTS, *reported_metrics(table, runs)]
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=keys)
        writer.writeheader()
        for line in run_rows(table, runs):
            writer.writerow({k: ("" if line.get(k) is None else line[k]) for k in keys})
