"""The sealed form of a table's store: every run's record in two Parquet files, written once.

Why: a finished table's runs were ~2,000 folders of JSON lines (155 MB for three tables, 96% of the
repository); columnar with zstd the same records are ~15 MB, lossless. Per-step curves are columns
of one type each (float64 stored byte-stream-split, int64 delta-coded, strings by dictionary), so
their repetition across runs compresses.

The store folder then holds, beside store.json and jobs.jsonl:

- `runs.parquet`: one row per finished run: `run` (its path in the runner's layout), one column per
  text file of the run named as the file (`summary.json`, `config.yaml`, `.hydra/overrides.yaml`,
  `ledger_digest.json`) holding its exact text (null: the run had none), and `metrics` (whether it
  had a metrics file). A file sealed before a column existed (the digests' came later) reads as
  null in every run: such a store's runs have no digest.
- `metrics.parquet`: one row per metrics record, the runs in runs.parquet's order and each run's
  records in the order written: `run`, `@keys` (the record's keys in their order, a JSON list), and
  one column per key, typed by the key's values (int64, float64, bool or string; null where a
  record lacks the key). A value of another type than its key's column (a JSON null, a list, an
  integer beyond 64 bits) is kept as JSON text in `<key>:json`. So every record comes back equal,
  types and key order included.

Both files carry FORMAT and the table's identity in their metadata: a file of another store or of
another program is refused in one line. Reading is data only (no pickled extension types: pyarrow
>= 14 refuses them). tables/seal.py writes these files and checks them before the loose files go;
a reader with pyarrow alone: `pq.read_table(".../metrics.parquet", filters=[("kind", "=", "eval")])`.
"""
from __future__ import annotations

import itertools
import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Optional

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from core.errors import UserError
from tables.run_records import (SEALED_METRICS, SEALED_RUNS, SUMMARY, TEXT_FILES, Record, RunRecords, check_record,
                                corrupt, first_finite_loss, parse_json)

FORMAT_KEY, FORMAT = b"syncopt.store", b"1"
TABLE_KEY = b"syncopt.table"  # the store's identity (store.json's), as JSON
RUN, KEYS, HAS_METRICS = "run", "@keys", "metrics"
SIDE = ":json"  # suffix of the column holding a key's values of another type, as JSON text
ARROW = {"int": pa.int64(), "float": pa.float64(), "bool": pa.bool_(), "str": pa.string()}
SEALED_FIX = ("put the file back from git (git checkout -- FILE; the loose runs it was sealed from are in the commit "
              "before its seal)")
Runs = Sequence[tuple[str, dict[str, Optional[str]], Optional[list[Record]]]]  # (run, texts, metrics)


def value_type(value: Any) -> Optional[str]:
    """The typed column a JSON value fits (None: kept as JSON text)."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int" if -2 ** 63 <= value < 2 ** 63 else None
    return {float: "float", str: "str"}.get(type(value))


def runs_table(runs: Runs) -> pa.Table:
    """runs.parquet's table: each run's text files and whether it has metrics."""
    columns: dict[str, pa.Array] = {RUN: pa.array([rel for rel, _, _ in runs], pa.string())}
    for name in TEXT_FILES:
        columns[name] = pa.array([texts.get(name) for _, texts, _ in runs], pa.string())
    columns[HAS_METRICS] = pa.array([records is not None for _, _, records in runs], pa.bool_())
    return pa.table(columns)


def metrics_table(runs: Runs) -> pa.Table:
    """metrics.parquet's table: every record of every run, a typed column per key (module doc)."""
    rows = [(rel, rec) for rel, _, records in runs for rec in records or []]
    seen: dict[str, Counter[Optional[str]]] = {}
    for rel, rec in rows:
        for key, value in rec.items():
            if key in (RUN, KEYS) or key.endswith(SIDE):
                raise UserError(f"run {rel}: a metrics record has the key {key!r}, which the sealed form uses for "
                                f"itself; this store cannot be sealed (its loose files are kept)")
            seen.setdefault(key, Counter())[value_type(value)] += 1
    columns: dict[str, pa.Array] = {RUN: pa.array([rel for rel, _ in rows], pa.string()),
                                    KEYS: pa.array([json.dumps(list(rec)) for _, rec in rows], pa.string())}
    for key, types in seen.items():
        main = max((t for t in types if t), key=lambda t: types[t], default=None)  # the key's most frequent type
        fits = [key in rec and main is not None and value_type(rec[key]) == main for _, rec in rows]
        if main:
            columns[key] = pa.array([rec[key] if fit else None for (_, rec), fit in zip(rows, fits)], ARROW[main])
        if not all(fit or key not in rec for (_, rec), fit in zip(rows, fits)):
            columns[key + SIDE] = pa.array([json.dumps(rec[key]) if key in rec and not fit else None
                                            for (_, rec), fit in zip(rows, fits)], pa.string())
    return pa.table(columns)


def write(table: pa.Table, path: Path, identity: dict[str, object]) -> None:
    """One sealed file: zstd at its strongest level, floats byte-stream-split, integers
    delta-coded, strings by dictionary, one row group (the whole table compresses as one)."""
    table = table.replace_schema_metadata({FORMAT_KEY: FORMAT, TABLE_KEY: json.dumps(identity).encode()})
    floats = [f.name for f in table.schema if pa.types.is_floating(f.type)]
    ints = [f.name for f in table.schema if pa.types.is_integer(f.type)]
    pq.write_table(table, path, compression="zstd", compression_level=19, write_statistics=False,
                   use_dictionary=[f.name for f in table.schema if pa.types.is_string(f.type)],
                   column_encoding={**{c: "BYTE_STREAM_SPLIT" for c in floats},
                                    **{c: "DELTA_BINARY_PACKED" for c in ints}},
                   row_group_size=max(1, table.num_rows))


def read(path: Path, identity: Optional[dict[str, object]], columns: Optional[list[str]] = None) -> pa.Table:
    """A sealed file's table (only `columns` if given, those present), checked to be this store's
    (FORMAT, and `identity` where given); one line for anything else."""
    try:
        schema = pq.read_schema(path)
        meta = schema.metadata or {}
        if meta.get(FORMAT_KEY) != FORMAT:
            raise corrupt(path, "not a sealed table store file (no syncopt.store format in its metadata)", SEALED_FIX)
        found = json.loads(meta.get(TABLE_KEY, b"null"))
        if identity is not None and found != identity:
            raise corrupt(path, f"holds the runs of {found}, not of {identity}", SEALED_FIX)
        names = None if columns is None else [c for c in columns if c in schema.names]
        return pq.ParquetFile(path).read(columns=names)
    except UserError:
        raise
    except (pa.ArrowException, OSError, ValueError) as err:
        raise corrupt(path, f"not a readable Parquet file ({str(err).splitlines()[0][:120]})", SEALED_FIX) from None


def check_types(table: pa.Table, path: Path, strings: Sequence[str]) -> None:
    """Refuse (one line) a file whose columns are not the sealed form's types."""
    for f in table.schema:
        must = pa.string() if f.name in strings or f.name.endswith(SIDE) else None
        if (must is not None and f.type != must) or (must is None and f.type not in ARROW.values()):
            raise corrupt(path, f"column {f.name!r} is {f.type}, not the sealed form's type", SEALED_FIX)


def blocks(table: pa.Table, path: Path) -> dict[str, tuple[int, int]]:
    """run -> (first row, rows) of a table whose rows are grouped by run; one line if they are not."""
    found: dict[str, tuple[int, int]] = {}
    start = 0
    for rel, group in itertools.groupby(table.column(RUN).to_pylist()):
        n = sum(1 for _ in group)
        if rel is None or rel in found:
            raise corrupt(path, f"the records of run {rel} are not together", SEALED_FIX)
        found[rel], start = (start, n), start + n
    return found


class SealedRecords(RunRecords):
    """The runs of a sealed store (or of the files `runs_file`, `metrics_file`: a seal's check)."""

    def __init__(self, store: Path, identity: Optional[dict[str, object]] = None,
                 runs_file: Optional[Path] = None, metrics_file: Optional[Path] = None) -> None:
        self.runs_path = runs_file or store / SEALED_RUNS
        self.metrics_path = metrics_file or store / SEALED_METRICS
        self.identity = identity
        self._texts: Optional[dict[str, dict[str, Any]]] = None
        self._tables: dict[Optional[str], tuple[pa.Table, dict[str, tuple[int, int]]]] = {}
        self._orders: dict[str, list[str]] = {}
        self._first_loss: Optional[dict[str, Optional[float]]] = None

    def texts(self) -> dict[str, dict[str, Any]]:
        if self._texts is None:
            table = read(self.runs_path, self.identity)
            if RUN not in table.column_names or SUMMARY not in table.column_names:
                raise corrupt(self.runs_path, f"has no {RUN} or {SUMMARY} column", SEALED_FIX)
            check_types(table, self.runs_path, [RUN, *TEXT_FILES])
            rows = table.to_pylist()
            self._texts = {row[RUN]: row for row in rows if row[RUN] is not None and row[SUMMARY] is not None}
            if len(self._texts) != len(rows):
                raise corrupt(self.runs_path, "a run is listed twice or without its summary", SEALED_FIX)
        return self._texts

    def runs(self) -> list[str]:
        return sorted(self.texts())

    def has(self, rel: str) -> bool:
        return rel in self.texts()

    def text(self, rel: str, name: str) -> Optional[str]:
        row = self.texts().get(rel)
        return None if row is None else row.get(name)

    def where(self, rel: str, name: str) -> str:
        return f"{self.runs_path if name in TEXT_FILES else self.metrics_path} (run {rel}, {name})"

    def _kind(self, kind: Optional[str]) -> tuple[pa.Table, dict[str, tuple[int, int]]]:
        """The records of one kind (or all) and each run's rows among them (read once)."""
        if kind not in self._tables:
            table = read(self.metrics_path, self.identity)
            check_types(table, self.metrics_path, [RUN, KEYS, "kind"])
            if kind is not None:
                table = table.filter(pc.equal(table.column("kind"), kind)) if "kind" in table.column_names \
                    else table.slice(0, 0)
            self._tables[kind] = (table, blocks(table, self.metrics_path))
        return self._tables[kind]

    def _order(self, text: Any) -> list[str]:
        if text not in self._orders:
            keys = parse_json(text, self.metrics_path) if isinstance(text, str) else None
            if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
                raise corrupt(self.metrics_path, f"a record's {KEYS} is not a list of keys", SEALED_FIX)
            self._orders[text] = keys
        return self._orders[text]

    def metrics(self, rel: str, kind: Optional[str] = None) -> Optional[list[Record]]:
        row = self.texts().get(rel)
        if row is None or not row.get(HAS_METRICS):
            return None
        table, runs = self._kind(kind)
        start, n = runs.get(rel, (0, 0))
        part = table.slice(start, n)  # one run's rows, converted to Python values alone
        columns = {name: part.column(name).to_pylist() for name in part.column_names}
        where = self.where(rel, "metrics")
        return [check_record(self._record(columns, i, where), where, i + 1) for i in range(n)]

    def _record(self, columns: dict[str, list[Any]], i: int, where: str) -> Record:
        record = {}
        for key in self._order(columns[KEYS][i]):
            value = columns[key][i] if key in columns else None
            if value is None:
                side = columns.get(key + SIDE)
                if side is None or side[i] is None:
                    raise corrupt(where, f"record {i + 1} lists {key!r} but holds no value for it", SEALED_FIX)
                value = parse_json(side[i], where)
            record[key] = value
        return record

    def first_train_loss(self, rel: str) -> Optional[float]:
        """Read from three columns alone: a gather needs it of every tuning run, not their curves."""
        if self._first_loss is None:
            table = read(self.metrics_path, self.identity, [RUN, KEYS, "kind", "loss", "loss" + SIDE])
            check_types(table, self.metrics_path, [RUN, KEYS, "kind"])
            columns = {name: table.column(name).to_pylist() for name in table.column_names}
            kinds, losses = columns.get("kind", [None] * table.num_rows), columns.get("loss", [None] * table.num_rows)
            side = columns.get("loss" + SIDE, [None] * table.num_rows)
            self._first_loss = {}
            for run, (start, n) in blocks(table, self.metrics_path).items():
                self._first_loss[run] = first_finite_loss(
                    {"kind": kinds[i], "loss": losses[i] if losses[i] is not None or side[i] is None
                     else parse_json(side[i], self.metrics_path)} for i in range(start, start + n))
        return self._first_loss.get(rel) if self.has(rel) else None


def write_sealed(runs: Runs, runs_file: Path, metrics_file: Path, identity: dict[str, object]) -> None:
    """Both sealed files of `runs` (run, its texts by name, its metrics records or None)."""
    write(runs_table(runs), runs_file, identity)
    write(metrics_table(runs), metrics_file, identity)
