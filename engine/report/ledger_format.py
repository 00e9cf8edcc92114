"""The time ledger's files: one rank's records between two writes, as numpy columns in one `.npz`.

A part file holds, for one rank of one attempt (a launch of the run, resumed or not), six arrays:
- `format` (FORMAT), `meta` (int64: rank, world, ranks per node, the attempt's first step, the
  part's index within the attempt, the run's total steps, steps per epoch, the parameters'
  element size, the attempt's clock origin in wall-clock nanoseconds, how many of `names` are
  groups; `META`), `layout` (int64: the model's `ParamLayout` as counts then values, `LAYOUT`);
- `names`: the symbolic groups, then the threads, the operations refer to by index;
- `segments`: the compute segments, one structured row each (`SEG_DTYPE`: step, kind as an index
  into SEGMENTS, start and end);
- `ops`: the communications (`OP_DTYPE`: step, seq, kind as an index into OpKind, group and thread
  as indices into `names`, group size, payload, wire and received bytes, blocking, bucket (-1:
  none), issue, completion and ready times (NaN: none)).
Times are seconds since the attempt's origin. Every array is plain numbers or fixed-width
strings, written compressed and read with `allow_pickle=False`: reading runs no code.
"""
from __future__ import annotations

import io
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from core.errors import UserError
from dist_algos.comm.pattern import CommOp, OpKind, ParamLayout

FORMAT = "syncopt-ledger-2"
#: compute segments, by the index stored in a segment's `kind`: waiting for the batch; this rank's
#: forward and backward (the gradient, micro-batches included); a delay the imbalance injector
#: added; the plugin's `step` (its communication and local work; the optimizer inside it); the
#: local optimizer update (`StepContext.optimizer_step`, nested in `plugin`)
SEGMENTS = ("data_wait", "forward_backward", "imbalance", "plugin", "optimizer")
KINDS = tuple(OpKind)
META = ("rank", "world", "local_size", "start_step", "part", "total_steps", "steps_per_epoch", "element_size",
        "origin_ns", "groups")
SEG_DTYPE = np.dtype([("step", "<i8"), ("kind", "u1"), ("start", "<f8"), ("end", "<f8")])
OP_DTYPE = np.dtype([("step", "<i8"), ("seq", "<i8"), ("kind", "u1"), ("group", "<i4"), ("thread", "<i4"),
                     ("size", "<i4"), ("payload", "<i8"), ("wire", "<i8"), ("recv", "<i8"), ("blocking", "?"),
                     ("bucket", "<i4"), ("issue", "<f8"), ("complete", "<f8"), ("ready", "<f8")])
Record = tuple[int, int, CommOp, float, float, Optional[float]]  # (step, seq, op, issued, completed, ready)


@dataclass
class Part:
    """One part file's content (see the module docstring)."""

    meta: dict[str, int]
    layout: ParamLayout
    segments: np.ndarray  # SEG_DTYPE rows
    ops: np.ndarray  # OP_DTYPE rows
    groups: list[str]
    threads: list[str]

    @property
    def origin_unix(self) -> float:
        return self.meta["origin_ns"] / 1e9


def layout_vector(layout: ParamLayout) -> np.ndarray:
    """[parameters, buffers, numels..., each shape's length..., the shapes' sizes..., buffer numels...]."""
    shapes = layout.layer_shapes()
    return np.asarray([len(layout.numels), len(layout.buffer_numels), *layout.numels, *map(len, shapes),
                       *(d for s in shapes for d in s), *layout.buffer_numels], np.int64)


def layout_of(vector: list[int], element_size: int) -> ParamLayout:
    params, buffers = vector[0], vector[1]
    numels, dims = vector[2:2 + params], vector[2 + params:2 + 2 * params]
    sizes = vector[2 + 2 * params:len(vector) - buffers]
    if len(numels) != params or len(dims) != params or sum(dims) != len(sizes) or min(dims, default=0) < 0:
        raise ValueError("its layout does not add up")
    shapes, at = [], 0
    for d in dims:
        shapes.append(tuple(sizes[at:at + d]))
        at += d
    return ParamLayout(tuple(numels), element_size, tuple(shapes), tuple(vector[len(vector) - buffers:]))


def op_rows(records: list[Record]) -> tuple[np.ndarray, list[str], list[str]]:
    """`OP_DTYPE` rows of records (times already relative), and their group and thread names."""
    groups: dict[str, int] = {}
    threads: dict[str, int] = {}
    rows = [(step, seq, KINDS.index(OpKind(op.kind)), groups.setdefault(op.group, len(groups)),
             threads.setdefault(op.thread, len(threads)), op.group_size, op.payload_bytes, op.wire_bytes,
             op.recv_bytes, op.blocking, -1 if op.bucket is None else op.bucket, issued, completed,
             np.nan if ready is None else ready) for step, seq, op, issued, completed, ready in records]
    return np.array(rows, dtype=OP_DTYPE), list(groups), list(threads)


def write_part(path: Path, meta: dict[str, int], layout: ParamLayout, segments: list[tuple[int, int, float, float]],
               ops: list[Record]) -> None:
    """Write one part atomically (a reader never sees half a file)."""
    rows, groups, threads = op_rows(ops)
    values = {**meta, "groups": len(groups)}
    arrays = {"format": np.asarray(FORMAT), "meta": np.asarray([values[k] for k in META], np.int64),
              "layout": layout_vector(layout), "names": np.asarray(groups + threads, dtype=np.str_),
              "segments": np.array(segments, dtype=SEG_DTYPE), "ops": rows}
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(buffer.getvalue())
    os.replace(tmp, path)


def _array(arrays: Any, name: str, dtype: Any) -> np.ndarray:
    if name not in arrays.files:
        raise ValueError(f"it has no {name!r} array")
    array = arrays[name]
    if array.ndim != 1 or array.dtype != np.dtype(dtype):
        raise ValueError(f"its {name!r} array is not a vector of {np.dtype(dtype)}")
    return array


def _refuse(path: Path, why: object) -> UserError:
    return UserError(f"{path}: not a readable time ledger part ({why}); remove the run's ledger/ folder to drop "
                     "it, or rerun with report.ledger=true")


def read_part(path: Path) -> Part:
    """One part file, checked array by array; anything else is one line naming the file."""
    try:
        with np.load(path, allow_pickle=False) as arrays:
            if "format" not in arrays.files or str(arrays["format"]) != FORMAT:
                raise ValueError(f"it is not a {FORMAT} file")
            values = _array(arrays, "meta", np.int64).tolist()
            if len(values) != len(META):
                raise ValueError("its meta has the wrong length")
            meta = dict(zip(META, values))
            layout = layout_of(_array(arrays, "layout", np.int64).tolist(), meta["element_size"])
            names = arrays["names"]
            if names.ndim != 1 or names.dtype.kind != "U":
                raise ValueError("its names are not strings")
            names = names.tolist()
            segments, ops = _array(arrays, "segments", SEG_DTYPE), _array(arrays, "ops", OP_DTYPE)
    except (OSError, EOFError, ValueError, KeyError, TypeError, zipfile.BadZipFile) as err:
        raise _refuse(path, err) from None
    groups, threads = names[:meta["groups"]], names[meta["groups"]:]
    if len(segments) and int(segments["kind"].max()) >= len(SEGMENTS):
        raise _refuse(path, "it names an unknown compute segment")
    if len(ops) and (int(ops["kind"].max()) >= len(KINDS) or int(ops["group"].max()) >= len(groups)
                     or int(ops["thread"].max()) >= len(threads) or min(int(ops["group"].min()),
                                                                          int(ops["thread"].min())) < 0):
        raise _refuse(path, "an operation names an unknown kind, group or thread")
    return Part(meta, layout, segments, ops, groups, threads)
