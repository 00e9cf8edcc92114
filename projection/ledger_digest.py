"""A run's ledger digest: what the projection takes from a time ledger, in a few kilobytes of JSON.

Why: a run's time ledger (`ledger/rank_<r>/part_*.npz`, `report.ledger=true`) is megabytes per run,
too big for git, so a table's store does not carry it, and a store gathered on another machine
would lose the run's own compute and byte ratios. The projection needs only four things from it,
and `ledger_digest.json` keeps exactly those:

- the compute profile: the measured (before, after) step pairs pooled over ranks with the warm-up
  left out (`ledger_view.profile`), in full up to `CAP` pairs, else `CAP` of them, each the middle
  one of an equal share of the steps sorted by time (`spaced`), with the pooled count and
  quantiles (the extremes among them); each bucket's ready time;
- the byte ratios of the data-dependent ops, per op shape (`workload.byte_ratios`: the run's
  recorded bytes against its own declaration at its own world), each key written out field by field;
- the parameter servers' service time per push (`ledger_view.service_times`);
- the model's parameter layout as the ledger recorded it (the bytes a declared op carries);

with the world, the steps and the source: what was measured, when (the ledger's clock origin) and
on which machine (summary.json's `machine`, core/machine.py). `RunMeasures` is the part beside the
compute; projection/command.py projects through it whether it came from a ledger or a digest, so
the two give the same projection when the digest kept every pair.

Reading is data only (`json`); a truncated, edited or foreign digest is one line naming the file.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Optional

import numpy as np

from core.errors import UserError
from core.rundir import RunDir
from dist_algos.comm.pattern import OpKind, ParamLayout
from projection.compute import ComputeProfile, profile_from_steps
from projection.ledger_view import bucket_ready, local_times, recorded_ops, service_times, train_steps
from projection.run_inputs import RunInputs, read_run
from projection.workload import byte_ratios, declared

DIGEST_FILE = "ledger_digest.json"
FORMAT, VERSION = "syncopt.ledger_digest", 1
CAP = 512  # compute pairs kept at most (`spaced`)
WARMUP = 2  # steps of each rank left out of the profile, as ledger_view.profile leaves them
QUANTILES = (0.0, 0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99, 1.0)
RATIO_FIELDS = ("kind", "group", "bucket", "thread")  # workload.shape_key's fields, in its order
FIX = "remake it (python -m tables.ledger_digests STORE RUN_FOLDER_ROOT, where the run's ledger/ is) or delete it"


@dataclass(frozen=True)
class RunMeasures:
    """What a run measured besides its compute: the layout its ops are declared over, the byte
    ratios of its data-dependent ops, each server's seconds per push."""

    layout: ParamLayout
    byte_ratios: dict[tuple, float] = field(default_factory=dict)
    service_s: dict[int, float] = field(default_factory=dict)

    @property
    def per_server_s(self) -> float:
        """The median server's service time (what every projected server is given)."""
        return float(np.median(list(self.service_s.values()))) if self.service_s else 0.0


@dataclass(frozen=True)
class LedgerDigest:
    """A run's ledger digest (the module doc)."""

    world: int
    steps: int
    pairs: np.ndarray  # (kept, 2): (before, after) seconds
    count: int  # pairs pooled before any was left out of the digest
    bucket_ready: tuple[float, ...]
    measures: RunMeasures
    source: dict[str, Any]  # what, measured (UTC), machine
    quantiles: dict[str, list[float]] = field(default_factory=dict)

    def profile(self, what: str) -> ComputeProfile:
        """The compute profile it keeps, its source `what`."""
        return profile_from_steps(self.pairs[:, 0], self.pairs[:, 1], what, self.bucket_ready)


def measures_of(run: RunInputs) -> RunMeasures:
    """A run's measures from its ledger; a run without one: its model's layout, nothing measured."""
    if run.ledger is None:
        return RunMeasures(run.layout())
    layout, recorded = run.layout(), recorded_ops(run.ledger)
    ratios: dict[tuple, float] = {}
    if recorded:  # what the run's data-dependent ops carried, of their declared most
        own = declared(run.algorithm, run.config.algo, run.world,
                       run.pattern_config(run.ledger.facts().local_size), layout, run.steps)
        ratios = byte_ratios(own.ops, recorded)
    servers = [r for r in range(run.world) if r not in set(run.algorithm.layout(run.config.algo, run.world).train)]
    service = service_times(run.ledger, servers) if servers else {}
    return RunMeasures(layout, ratios, service)


def spaced(totals: np.ndarray, cap: int) -> np.ndarray:
    """Indices of at most `cap` of `totals`, in their original order: all of them, or, of the
    sorted values cut into `cap` bins of equal count, each bin's middle one. Each kept step then
    stands for as many measured ones, so a uniform draw from them follows the measured
    distribution; keeping the extremes instead gives the slowest of 26,240 steps a weight of
    1 in 512, which put a projection of 8 workers 18% slow (docs/projection.md)."""
    if len(totals) <= cap:
        return np.arange(len(totals))
    order = np.argsort(totals, kind="stable")
    ranks = np.floor((np.arange(cap) + 0.5) * len(totals) / cap).astype(int)
    return np.sort(order[ranks])


def digest_of(run: RunInputs, what: str, cap: int = CAP) -> LedgerDigest:
    """The digest of a run read with its ledger (`what`: how the source names the run)."""
    if run.ledger is None:
        raise UserError(f"{run.root}: no time ledger to digest; digests come from runs made with report.ledger=true")
    times = local_times(run.ledger, spans=False)
    keep = slice(min(WARMUP, max(times.before.shape[1] - 1, 0)), None)
    pooled = np.column_stack([times.before[:, keep].ravel(), times.after[:, keep].ravel()])
    if len(pooled) == 0:
        raise UserError(f"{run.root / 'ledger'}: holds no training step to digest; rerun with report.ledger=true")
    ranks, _ = train_steps(run.ledger)
    origin = min((f.origins_unix[0] for f in run.ledger.ranks.values() if f.origins_unix), default=None)
    machine = run.summary.get("machine") if isinstance(run.summary.get("machine"), dict) else None
    source = {"what": f"the time ledger of {what}: {len(pooled)} (before, after) steps pooled over {len(ranks)} "
                      f"ranks, each rank's first {WARMUP} left out",
              "measured": None if origin is None else
              datetime.fromtimestamp(origin, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "machine": machine}
    totals = pooled.sum(axis=1)
    quantiles = {name: [float(v) for v in np.quantile(col, QUANTILES)]
                 for name, col in (("before", pooled[:, 0]), ("after", pooled[:, 1]), ("total", totals))}
    return LedgerDigest(run.world, run.steps, pooled[spaced(totals, cap)], len(pooled),
                        bucket_ready(run.ledger, local_times(run.ledger)), measures_of(run), source,
                        {"q": list(QUANTILES), **quantiles})


def machine_words(record: Any) -> str:
    """A machine record (summary.json's `machine`, a digest's source) in a few words."""
    m = record if isinstance(record, dict) else {}
    if not m:
        return "a machine it does not record"
    gpu = f", {m['gpus']}x {m['gpu']}" if m.get("gpu") else ""
    return f"{m.get('cpu', '?')} ({m.get('cores', '?')} cores{gpu}; machine type {m.get('type', '?')})"


def to_text(digest: LedgerDigest) -> str:
    """The JSON file: one top-level key a line, each value compact (floats exact: `repr`)."""
    m = digest.measures
    node = {"format": FORMAT, "version": VERSION, "source": digest.source, "world": digest.world,
            "steps": digest.steps,
            "compute": {"count": digest.count, "kept": len(digest.pairs), "warmup_steps": WARMUP,
                        "bucket_ready": list(digest.bucket_ready), "quantiles": digest.quantiles,
                        "pairs": digest.pairs.tolist()},
            "byte_ratios": [{**dict(zip(RATIO_FIELDS, key)), "ratio": ratio}
                            for key, ratio in sorted(m.byte_ratios.items(), key=lambda kv: repr(kv[0]))],
            "service_s": {str(rank): s for rank, s in sorted(m.service_s.items())},
            "layout": {"numels": list(m.layout.numels), "element_size": m.layout.element_size,
                       "shapes": [list(s) for s in m.layout.shapes], "buffer_numels": list(m.layout.buffer_numels)}}
    body = ",\n".join(f"{json.dumps(k)}: {json.dumps(v, separators=(',', ':'), allow_nan=False)}"
                      for k, v in node.items())
    return "{\n" + body + "\n}\n"


def digest_text(run_root: Path, what: str) -> Optional[str]:
    """The digest's text of the finished run at `run_root` (`what` names it in the source), or None
    when it kept no ledger; one line for a damaged ledger or run file."""
    if not RunDir(run_root).ledger.is_dir():
        return None
    return to_text(digest_of(read_run(str(run_root), need_ledger=True), what))


def write(path: Path, text: str) -> None:
    """A digest's text (`to_text`) written whole: under a temporary name first, so that a digest cut
    short is never left under its own."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def read(path: Path) -> LedgerDigest:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: not a readable ledger digest ({type(err).__name__}); {FIX}") from None
    return parse(text, path)


class Foreign(ValueError):
    """A digest's field that is not what a digest holds (turned into one line by `parse`)."""


def _int(value: Any, what: str, least: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise Foreign(f"{what} is {json.dumps(value)[:40]}, not an integer >= {least}")
    return value


def _seconds(values: Any, what: str) -> list[float]:
    """A list of finite non-negative numbers (seconds, fractions, ratios)."""
    if not isinstance(values, list) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                               and math.isfinite(v) and v >= 0 for v in values):
        raise Foreign(f"{what} is not a list of non-negative numbers")
    return [float(v) for v in values]


def _ratios(items: Any) -> dict[tuple, float]:
    kinds = {k.value for k in OpKind}
    if not isinstance(items, list):
        raise Foreign("byte_ratios is not a list")
    out: dict[tuple, float] = {}
    for item in items:
        if not isinstance(item, dict) or set(item) != {*RATIO_FIELDS, "ratio"}:
            raise Foreign(f"a byte ratio is not {{{', '.join(RATIO_FIELDS)}, ratio}}")
        kind, group, bucket, thread = (item[f] for f in RATIO_FIELDS)
        if kind not in kinds or not isinstance(group, str) or not isinstance(thread, str) \
                or not (bucket is None or (isinstance(bucket, int) and not isinstance(bucket, bool))):
            raise Foreign(f"the byte ratio of {json.dumps(item)[:60]} names no op shape")
        out[(kind, group, bucket, thread)] = _seconds([item["ratio"]], "a byte ratio")[0]
    return out


def _layout(node: Any) -> ParamLayout:
    if not isinstance(node, dict) or set(node) != {"numels", "element_size", "shapes", "buffer_numels"}:
        raise Foreign("layout is not {numels, element_size, shapes, buffer_numels}")
    lists = [node["numels"], node["buffer_numels"], *(node["shapes"] if isinstance(node["shapes"], list) else [0])]
    if not all(isinstance(x, list) for x in lists):
        raise Foreign("layout's numels, shapes and buffer_numels are not lists")
    return ParamLayout(tuple(_int(n, "a parameter's numel") for n in node["numels"]),
                       _int(node["element_size"], "layout's element_size", 1),
                       tuple(tuple(_int(d, "a shape's size") for d in s) for s in node["shapes"]),
                       tuple(_int(n, "a buffer's numel") for n in node["buffer_numels"]))


def _digest(node: Any) -> LedgerDigest:
    """The digest a parsed JSON value holds, every field checked."""
    if not isinstance(node, dict) or node.get("format") != FORMAT:
        raise Foreign(f"no \"format\": \"{FORMAT}\"")
    if node.get("version") != VERSION:
        raise Foreign(f"version {json.dumps(node.get('version'))[:20]}, not {VERSION}")
    compute, source, service = node.get("compute"), node.get("source"), node.get("service_s")
    if not isinstance(compute, dict) or not isinstance(source, dict) or not isinstance(service, dict):
        raise Foreign("compute, source or service_s is not an object")
    pairs = compute.get("pairs")
    if not isinstance(pairs, list) or not pairs or not all(isinstance(p, list) and len(p) == 2 for p in pairs):
        raise Foreign("compute.pairs is not a non-empty list of (before, after) pairs")
    flat = _seconds([v for p in pairs for v in p], "compute.pairs")
    count = _int(compute.get("count"), "compute.count", len(pairs))
    quantiles = compute.get("quantiles")
    if not isinstance(quantiles, dict) or not all(isinstance(v, list) for v in quantiles.values()):
        raise Foreign("compute.quantiles is not an object of lists")
    if not all(isinstance(k, str) and k.isdigit() for k in service):
        raise Foreign("service_s is not keyed by rank")
    times = _seconds(list(service.values()), "service_s")
    measures = RunMeasures(_layout(node.get("layout")), _ratios(node.get("byte_ratios")),
                           {int(k): t for k, t in zip(service, times)})
    return LedgerDigest(_int(node.get("world"), "world", 1), _int(node.get("steps"), "steps"),
                        np.asarray(flat, dtype=float).reshape(-1, 2), count,
                        tuple(_seconds(compute.get("bucket_ready"), "compute.bucket_ready")), measures, source,
                        {str(k): _seconds(v, f"compute.quantiles.{k}") for k, v in quantiles.items()})


def parse(text: str, where: object) -> LedgerDigest:
    """A digest's text read as data; one line naming `where` for anything that is not a digest."""
    try:
        return _digest(json.loads(text))
    except json.JSONDecodeError as err:
        raise UserError(f"{where}: not a ledger digest (not valid JSON at line {err.lineno}, column {err.colno}: "
                        f"truncated or edited); {FIX}") from None
    except RecursionError:
        raise UserError(f"{where}: not a ledger digest (JSON nested too deeply); {FIX}") from None
    except Foreign as err:
        raise UserError(f"{where}: not a ledger digest ({err}); {FIX}") from None
