"""A table's finished runs, read through one interface whatever holds them.

Why one interface: a run's record (RECORD_FILES: summary, per-step metrics, composed config, the
overrides it was launched with, the digest of its time ledger where it kept one) lives in three
places in a table's life: the run folder the runner writes (`hydra.run.dir`), a store's loose form
(per-run folders, committed while a table is produced, tables/store.py) and a store's sealed form
(every run's record packed into two Parquet files, written once when the table is finished,
tables/sealed.py). The gather, the tuning choice, runs.csv, the figures and `restore` read runs only
through `RunRecords`, so none of them knows which form it reads and none opens a store's files itself.

Runs are named by their path relative to the folder that holds them (`<label>/seed_<s>`,
`<label>/tune/<setting>/seed_<s>`), the runner's layout in every form.

Files read back are data, never code: JSON through `json`, YAML through the safe loader. A file
that is truncated, hand-edited or another program's ends the reader with ONE line (`UserError`)
naming the file and what is wrong, never a traceback from deep inside a gather.
"""
from __future__ import annotations

import json
import lzma
import math
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Optional, Union

import yaml

from core.errors import UserError

Record = dict[str, Any]
Summary = dict[str, Any]

SUMMARY = "summary.json"  # its presence makes a run finished
METRICS = "metrics.jsonl"  # one JSON object a line: train and eval records, restarts
METRICS_XZ = "metrics.jsonl.xz"  # the same, xz-compressed: a loose store's form of it (written once)
CONFIG = "config.yaml"
OVERRIDES = ".hydra/overrides.yaml"
#: the digest of a run's time ledger (projection/ledger_digest.py), written when a run with a
#: ledger is carried into a store (the ledger itself, megabytes, is never carried)
LEDGER_DIGEST = "ledger_digest.json"
#: the files of a run kept byte for byte in every form (metrics are kept record for record)
TEXT_FILES = (SUMMARY, CONFIG, OVERRIDES, LEDGER_DIGEST)
#: a run's record: what a table reads from a finished run, never its checkpoints
RECORD_FILES = (SUMMARY, METRICS, CONFIG, OVERRIDES, LEDGER_DIGEST)
#: a sealed store's two files (tables/sealed.py): every run's texts, every run's metrics records
SEALED_RUNS, SEALED_METRICS = "runs.parquet", "metrics.parquet"
#: keys of a train or eval record that the tables read as numbers (besides the test_/val_ metrics)
NUMERIC_KEYS = ("loss", "wall_s", "comm_bytes_total")
FIX = ("put the file back as the run wrote it (git checkout -- FILE, where it is committed) or delete the run's "
       "folder so that the table makes it again")


def corrupt(where: object, what: str, fix: str = FIX) -> UserError:
    """The one-line error for a record file that cannot be read as what it should be."""
    return UserError(f"{where}: {what}; {fix}")


def decode_text(data: bytes, where: object) -> str:
    """A record file's text (UTF-8), or one line saying it is not text."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise corrupt(where, f"not UTF-8 text (byte {err.start})") from None


def parse_json(text: str, where: object, line: Optional[int] = None) -> Any:
    """JSON text as data (`json` runs nothing), or one line naming the file and where it breaks."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        at = f"line {line if line is not None else err.lineno}, column {err.colno}"
        raise corrupt(where, f"not valid JSON at {at} ({err.msg}): truncated or edited") from None
    except RecursionError:
        raise corrupt(where, "JSON nested too deeply to be a run's record") from None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def number(summary: Summary, key: str, where: object) -> Optional[float]:
    """A summary's numeric value (None: absent or null, as a diverged run records a loss); one line
    when a hand edit or another program put something else there (a string, a list, true)."""
    value = summary.get(key)
    if value is None or _is_number(value):
        return value
    raise corrupt(where, f"{key} is {json.dumps(value)[:40]}, not a number")


def parse_summary(text: str, where: object) -> Summary:
    """summary.json as a dict; one line for anything else (truncated, a list, a data_split that is
    not an object)."""
    found = parse_json(text, where)
    if not isinstance(found, dict):
        raise corrupt(where, f"holds a JSON {type(found).__name__}, not a run's summary (an object)")
    if not isinstance(found.get("data_split", {}), (dict, type(None))):
        raise corrupt(where, "data_split is not an object")
    return found


def check_record(record: Any, where: object, line: int) -> Record:
    """One metrics record as the tables read it: an object whose `kind` is a string, `step` an integer,
    and, in a train or eval record, the losses, accuracies and times a number or null."""
    if not isinstance(record, dict):
        raise corrupt(where, f"line {line} holds a JSON {type(record).__name__}, not a record (an object)")
    if not isinstance(record.get("kind", ""), str):
        raise corrupt(where, f"line {line}: kind is not a string")
    if "step" in record and (not isinstance(record["step"], int) or isinstance(record["step"], bool)):
        raise corrupt(where, f"line {line}: step is {json.dumps(record['step'])[:40]}, not an integer")
    if record.get("kind") in ("train", "eval"):
        for key, value in record.items():
            if (key in NUMERIC_KEYS or key.startswith(("test_", "val_"))) and value is not None \
                    and not _is_number(value):
                raise corrupt(where, f"line {line}: {key} is {json.dumps(value)[:40]}, not a number")
    return record


def parse_metrics_lines(lines: Sequence[str] | Iterator[str], where: object) -> Iterator[Record]:
    """The records of metrics.jsonl, one a non-blank line, each checked (`check_record`)."""
    for n, line in enumerate(lines, 1):
        if line.strip():
            yield check_record(parse_json(line, where, n), where, n)


def parse_overrides(text: str, where: object) -> list[str]:
    """.hydra/overrides.yaml (a YAML list of `key=value` strings), read by the safe loader."""
    try:
        found = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise corrupt(where, f"not valid YAML ({str(err).splitlines()[0]})") from None
    if found is None:
        return []
    if not isinstance(found, list) or not all(isinstance(item, (str, int, float, bool)) for item in found):
        raise corrupt(where, "not a list of overrides (key=value lines)")
    return [str(item) for item in found]


def first_finite_loss(records: Iterator[Record]) -> Optional[float]:
    """The first train record's finite loss (tables/tuning.py's divergence rule)."""
    for record in records:
        loss = record.get("loss") if record.get("kind") == "train" else None
        if _is_number(loss) and math.isfinite(loss):
            return float(loss)
    return None


class RunRecords(ABC):
    """Finished runs by relative path: their record files' texts, their metrics records."""

    @abstractmethod
    def runs(self) -> list[str]:
        """Every finished run (one that holds summary.json), sorted."""

    @abstractmethod
    def has(self, rel: str) -> bool:
        """Whether `rel` is a finished run here."""

    def under(self, prefix: str) -> list[str]:
        """The finished runs inside the folder `prefix` (a row's tuning runs: `<label>/tune`), sorted."""
        head = prefix.rstrip("/") + "/"
        return [rel for rel in self.runs() if rel.startswith(head)]

    @abstractmethod
    def text(self, rel: str, name: str) -> Optional[str]:
        """One of TEXT_FILES of a finished run, exactly as the run wrote it (None: not there)."""

    @abstractmethod
    def metrics(self, rel: str, kind: Optional[str] = None) -> Optional[list[Record]]:
        """The run's metrics records in the order written (only those of `kind` if given); None
        when the run has no metrics file."""

    @abstractmethod
    def where(self, rel: str, name: str) -> str:
        """A file of a run as its reader names it in a message."""

    def summary(self, rel: str) -> Optional[Summary]:
        """The run's summary.json, parsed afresh (callers add keys to it); None: not finished here."""
        text = self.text(rel, SUMMARY) if self.has(rel) else None
        return None if text is None else parse_summary(text, self.where(rel, SUMMARY))

    def overrides(self, rel: str) -> Optional[list[str]]:
        """The overrides the run was launched with (None: not recorded)."""
        text = self.text(rel, OVERRIDES) if self.has(rel) else None
        return None if text is None else parse_overrides(text, self.where(rel, OVERRIDES))

    def first_train_loss(self, rel: str) -> Optional[float]:
        """The run's first finite training loss (None: none recorded)."""
        return first_finite_loss(iter(self.metrics(rel, "train") or []))

    def metrics_text(self, rel: str) -> Optional[str]:
        """The run's metrics.jsonl as a run folder holds it: a JSON line a record (None: none)."""
        records = self.metrics(rel)
        return None if records is None else "".join(json.dumps(r) + "\n" for r in records)


def finished_runs(root: Path) -> list[str]:
    """Every finished run under `root` (a folder holding summary.json), relative to it, sorted."""
    if not root.is_dir():
        return []
    return sorted(p.parent.relative_to(root).as_posix() for p in root.glob(f"**/{SUMMARY}"))


class FolderRecords(RunRecords):
    """Runs in the runner's layout under `root`: a table's run folder, or a store's loose form
    (whose metrics may be xz-compressed). `rel` "." is `root` itself: one run's folder."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def runs(self) -> list[str]:
        return finished_runs(self.root)

    def under(self, prefix: str) -> list[str]:
        return [f"{prefix.rstrip('/')}/{rel}" for rel in finished_runs(self.root / prefix)]

    def has(self, rel: str) -> bool:
        return (self.root / rel / SUMMARY).is_file()

    def where(self, rel: str, name: str) -> str:
        return str(self.root / rel / name)

    def raw(self, rel: str, name: str) -> Optional[bytes]:
        """A file's bytes (None: not there); one line when it cannot be read."""
        path = self.root / rel / name
        try:
            return path.read_bytes() if path.is_file() else None
        except OSError as err:
            raise corrupt(path, f"cannot be read ({err.strerror})") from None

    def text(self, rel: str, name: str) -> Optional[str]:
        data = self.raw(rel, name)
        return None if data is None else decode_text(data, self.where(rel, name))

    def metrics_file(self, rel: str) -> Optional[tuple[str, str]]:
        """The text of the run's metrics file and its name (plain, else xz; None: neither)."""
        plain = self.raw(rel, METRICS)
        if plain is not None:
            return decode_text(plain, self.where(rel, METRICS)), self.where(rel, METRICS)
        packed = self.raw(rel, METRICS_XZ)
        if packed is None:
            return None
        where = self.where(rel, METRICS_XZ)
        try:
            return decode_text(lzma.decompress(packed), where), where
        except (lzma.LZMAError, EOFError) as err:
            raise corrupt(where, f"not a complete xz file ({err})") from None

    def metrics_lines(self, rel: str) -> Optional[tuple[list[str], str]]:
        found = self.metrics_file(rel)
        return None if found is None else (found[0].splitlines(), found[1])

    def metrics(self, rel: str, kind: Optional[str] = None) -> Optional[list[Record]]:
        found = self.metrics_lines(rel)
        if found is None:
            return None
        lines, where = found
        return [r for r in parse_metrics_lines(lines, where) if kind is None or r.get("kind") == kind]

    def first_train_loss(self, rel: str) -> Optional[float]:
        found = self.metrics_lines(rel)  # records are read only up to the first loss, as before
        return None if found is None else first_finite_loss(parse_metrics_lines(*found))

    def metrics_text(self, rel: str) -> Optional[str]:
        """The file's own text, every line checked first (one line for a corrupt one)."""
        found = self.metrics_file(rel)
        if found is None:
            return None
        for _ in parse_metrics_lines(found[0].splitlines(), found[1]):
            pass
        return found[0]


class Overlay(RunRecords):
    """Several holders of runs read as one: a run is read from the first layer that has it finished
    (a run folder before its table's store; a store's loose runs before its sealed ones)."""

    def __init__(self, *layers: RunRecords) -> None:
        self.layers = layers

    def _layer(self, rel: str) -> Optional[RunRecords]:
        return next((layer for layer in self.layers if layer.has(rel)), None)

    def runs(self) -> list[str]:
        return sorted({rel for layer in self.layers for rel in layer.runs()})

    def under(self, prefix: str) -> list[str]:
        return sorted({rel for layer in self.layers for rel in layer.under(prefix)})

    def has(self, rel: str) -> bool:
        return self._layer(rel) is not None

    def text(self, rel: str, name: str) -> Optional[str]:
        layer = self._layer(rel)
        return None if layer is None else layer.text(rel, name)

    def metrics(self, rel: str, kind: Optional[str] = None) -> Optional[list[Record]]:
        layer = self._layer(rel)
        return None if layer is None else layer.metrics(rel, kind)

    def first_train_loss(self, rel: str) -> Optional[float]:
        layer = self._layer(rel)
        return None if layer is None else layer.first_train_loss(rel)

    def metrics_text(self, rel: str) -> Optional[str]:
        layer = self._layer(rel)
        return None if layer is None else layer.metrics_text(rel)

    def where(self, rel: str, name: str) -> str:
        layer = self._layer(rel) or self.layers[0]
        return layer.where(rel, name)


RunsAt = Union[Path, str, RunRecords]


def records_of(where: RunsAt) -> RunRecords:
    """Runs given as a folder (the runner's layout) or as records already."""
    return where if isinstance(where, RunRecords) else FolderRecords(Path(where))


def rel_of(root: Path, run_root: Path) -> str:
    """A run folder's path relative to the folder that holds it, as RunRecords names runs."""
    return run_root.relative_to(root).as_posix()
