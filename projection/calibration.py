"""Fitting a cluster's link costs to measurements, and judging the fit.

A calibration is a set of timed operations on the emulated cluster (bench/calibrate_network.py:
all-reduces over groups of several sizes, several groups at once, point-to-point messages, and
incast, several senders to one receiver) and the link parameters that make the projection's own
network model (projection/network.py, the same code that projects) reproduce them:

- `alpha_s`: seconds per message step (gloo's and the kernel's per-message cost with the link's
  delay);
- `efficiency`: the share of the nominal shaped rate one flow gets (TCP/IP and Ethernet framing,
  the token bucket's behaviour): the link's bandwidth is `efficiency x nominal`, never the
  nominal rate itself;
- `reduce_s_per_byte`: gamma, one byte reduced by gloo on this CPU;
- `host_s_per_byte`: a per-byte cost outside the link (copies in gloo and the kernel), seen only
  when a sweep includes a rate fast enough for it to show (with one rate it cannot be told apart
  from the link's and is held at 0);
- `backplane_mbit`: what every flow between nodes shares (the one kernel forwarding them), seen
  only when concurrent groups or incast saturate it (optional).

The fit minimises the squared log-ratio of predicted to measured times (every point counts by
its relative error, small messages as much as large), bounded, with scipy's least_squares. The
residuals are (predicted - measured) / measured; a projection refuses a calibration whose median
absolute residual exceeds 10% or whose worst exceeds 20% (the blind proof's own targets).
"""
from __future__ import annotations

import json
import math
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
from scipy.optimize import least_squares

from core.provenance import code_version
from dist_algos.comm.pattern import CommOp, OpKind
from projection.cluster import Cluster, LinkClass
from projection.collectives import Library
from projection.network import Network

TARGET_MEDIAN, TARGET_WORST = 0.10, 0.20
#: (name, lower bound, upper bound, starting value); the fit works on their logarithms
PARAMS = {
    "alpha_s": (1e-6, 1.0, 2e-4),
    "efficiency": (0.05, 1.5, 0.9),
    "reduce_s_per_byte": (1e-13, 1e-6, 1e-9),
    "host_s_per_byte": (1e-13, 1e-6, 1e-10),
    "backplane_mbit": (1.0, 1e6, 5e3),
    "burst_bytes": (1.0, 4e6, 3e4),
    "message_s": (1e-6, 1.0, 1e-3),
    "duplex": (0.5, 1.0, 0.95),
    "oversubscribed": (1e-3, 20.0, 1.0),
}
DEFAULTS = {"reduce_s_per_byte": 0.0, "host_s_per_byte": 0.0, "backplane_mbit": None, "host_cores": None,
            "burst_bytes": 0.0, "message_s": 0.0, "duplex": 1.0, "oversubscribed": 0.0}


@dataclass(frozen=True)
class Point:
    """One measured operation: `kind` allreduce (`groups` disjoint groups of `world` ranks at once,
    one rank per node), p2p (one message), or incast (`senders` messages to one receiver at once);
    `nbytes` per rank or message; `seconds` the median measured time."""

    kind: str
    world: int
    nbytes: int
    mbit: float
    seconds: float
    groups: int = 1
    senders: int = 1


def emulated_cluster(params: dict[str, Any], mbit: float) -> Cluster:
    """The emulated cluster of one rank per node at nominal `mbit`, with these parameters, its
    nodes sharing the host's `host_cores` cores (a constant of the fit: the machine's)."""
    backplane = params.get("backplane_mbit")
    return Cluster(name="emulated", description="", library=Library.GLOO, ranks_per_node=1,
                   intra=LinkClass("intra_node", params["alpha_s"], 1e10),
                   nic=LinkClass("nic", params["alpha_s"], mbit * 1e6 / 8 * params["efficiency"],
                                 params.get("burst_bytes") or 0.0, params.get("duplex") or 1.0),
                   backplane_Bps=backplane * 1e6 / 8 if backplane else None,
                   host_s_per_byte=params.get("host_s_per_byte") or 0.0,
                   reduce_s_per_byte=params.get("reduce_s_per_byte") or 0.0,
                   message_latency_s=params.get("message_s") or 0.0, host_cores=params.get("host_cores") or None,
                   oversubscribed=params.get("oversubscribed") or 0.0)


def predict(point: Point, params: dict[str, Any]) -> float:
    """The projection's time for `point` under `params`, only its participants busy."""
    ranks = max(point.world * point.groups, point.senders + 1, 2)
    busy = {"allreduce": point.world * point.groups, "incast": point.senders + 1}.get(point.kind, 2)
    net = Network(emulated_cluster(params, point.mbit), ranks, busy=busy)
    if point.kind == "allreduce":
        op = CommOp(OpKind.ALLREDUCE, "world", point.world, point.nbytes, 0)
        groups = [tuple(range(g * point.world, (g + 1) * point.world)) for g in range(point.groups)]
    elif point.kind == "p2p":
        op, groups = CommOp(OpKind.SEND, "pair:1", 2, point.nbytes, point.nbytes), [(0, 1)]
    elif point.kind == "incast":
        op = CommOp(OpKind.SEND, "server:0", 2, point.nbytes, point.nbytes)
        groups = [(s, 0) for s in range(1, point.senders + 1)]
    else:
        raise ValueError(f"unknown calibration point kind {point.kind!r}")
    return max(t.seconds for t in net.times(op, groups))


def fit(points: Sequence[Point], free: Sequence[str], fixed: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """The parameters in `free` that best explain `points` (`fixed` as given, the others at
    their defaults)."""
    names = list(free)
    lower = np.log([PARAMS[n][0] for n in names])
    upper = np.log([PARAMS[n][1] for n in names])
    start = np.log([PARAMS[n][2] for n in names])
    measured = np.log([p.seconds for p in points])

    def params_of(x: np.ndarray) -> dict[str, Any]:
        return {**DEFAULTS, **(fixed or {}), **{n: float(math.exp(v)) for n, v in zip(names, x)}}

    def error(x: np.ndarray) -> np.ndarray:
        p = params_of(x)
        return np.log([predict(pt, p) for pt in points]) - measured

    best = least_squares(error, start, bounds=(lower, upper), x_scale=1.0)
    return params_of(best.x)


def residuals(points: Sequence[Point], params: dict[str, Any]) -> dict[str, Any]:
    rows = []
    for p in points:
        predicted = predict(p, params)
        rows.append({**asdict(p), "predicted": predicted, "residual": (predicted - p.seconds) / p.seconds})
    errors = np.abs([r["residual"] for r in rows])
    return {"median": float(np.median(errors)), "worst": float(errors.max()), "points": rows}


def failing(record: dict[str, Any]) -> Optional[str]:
    """Why a calibration's residuals fail the targets (None: they meet them)."""
    res = record["residuals"]
    if res["median"] > TARGET_MEDIAN or res["worst"] > TARGET_WORST:
        return (f"its residuals are {res['median']:.1%} median and {res['worst']:.1%} worst against targets of "
                f"{TARGET_MEDIAN:.0%} and {TARGET_WORST:.0%}")
    return None


def make_record(points: Sequence[Point], params: dict[str, Any], command: str, note: str = "") -> dict[str, Any]:
    version = code_version()
    return {"fitted_by": "bench/calibrate_network.py", "command": command, "commit": version.short,
            "dirty": version.dirty,
            "machine": f"{platform.node()} ({platform.machine()}, {platform.processor() or 'cpu'}, "
                       f"{os.cpu_count()} cores)",
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "note": note,
            "rates_mbit": sorted({p.mbit for p in points}), "worlds": sorted({p.world for p in points}),
            "params": params, "residuals": residuals(points, params),
            "targets": {"median": TARGET_MEDIAN, "worst": TARGET_WORST}}


def write_record(record: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")


def points_of(record: dict[str, Any]) -> list[Point]:
    fields = Point.__dataclass_fields__
    return [Point(**{k: v for k, v in row.items() if k in fields}) for row in record["residuals"]["points"]]
