#!/usr/bin/env python
"""Fit the emulated cluster's link costs from a sweep, never from the nominal shaped rate.

Eight ranks run in the namespaces of `engine.launch.network.EmulatedCluster`, one per node, on
gloo (as `launch.network.kind=emulated` runs them), and time, at each nominal rate:
- all_reduce of several sizes over groups of 2, 4 and 8 ranks;
- several groups of 2 (and of 4) all-reducing at once (concurrent groups);
- point-to-point messages of several sizes;
- incast: 2, 3 and 4 senders to one receiver at once.
Each is the median of `--repeats` timings (the slowest participant's), after a warm-up.

The fit (projection/calibration.py) uses the points at the calibration rate (`--rate`) on groups
of at most `--fit-worlds` ranks; every other point is held out and predicted blind: groups of 8
from 2 and 4, and the other rates (`--validate-rates`) from the calibration rate alone. The
residuals of both are printed; the fitted calibration is written to
conf/cluster/calibration/NAME.json with the commit and the machine, which `cluster=emulated`
reads (and `project` refuses if its residuals miss the targets).

Needs root and iproute2. A few minutes per rate.

    .venv/bin/python bench/calibrate_network.py                       # 100 Mbit/s; checks 20 and 1000
    .venv/bin/python bench/calibrate_network.py --rate 100 --validate-rates --name emulated_quick

The last line is a JSON object: the parameters, the fit's residuals (median, worst) and the held-out
predictions' errors (median, worst), per group of points.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from core.distenv import init_distributed  # noqa: E402
from engine.launch.network import (EmulatedCluster, NetworkConfig, NetworkKind,  # noqa: E402
                                   requirements_problem)
from bench.network import run_job  # noqa: E402
from projection.calibration import Point, fit, make_record, predict, write_record  # noqa: E402
from projection.cluster import CALIBRATIONS  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
RANKS = 8
SIZES = (16_384, 262_144, 1_048_576, 4_194_304)  # all_reduce and message bytes at 100 Mbit/s


# ---- inside a rank ----------------------------------------------------------------------------

def cases(sizes: list[int]) -> list[dict[str, Any]]:
    """Every timed operation, the same list on every rank (groups are made collectively)."""
    out: list[dict[str, Any]] = []
    for world in (2, 4, 8):
        out += [{"kind": "allreduce", "world": world, "groups": 1, "nbytes": n} for n in sizes]
    for world, groups in ((2, 2), (2, 4), (4, 2)):
        out += [{"kind": "allreduce", "world": world, "groups": groups, "nbytes": n} for n in sizes[1:3]]
    out += [{"kind": "p2p", "world": 2, "nbytes": n} for n in sizes]
    out += [{"kind": "incast", "world": s + 1, "senders": s, "nbytes": sizes[2]} for s in (2, 3, 4)]
    return out


def timed(case: dict[str, Any], rank: int, groups: dict[tuple[int, ...], Any]) -> float:
    """Seconds of one operation on this rank (0 where it takes no part)."""
    n = case["nbytes"] // 4
    if case["kind"] == "allreduce":
        world, count = case["world"], case["groups"]
        mine = [tuple(range(g * world, (g + 1) * world)) for g in range(count)]
        group = next((g for g in mine if rank in g), None)
        if group is None:
            return 0.0
        buf = torch.ones(n)
        start = time.perf_counter()
        dist.all_reduce(buf, group=groups[group])
        return time.perf_counter() - start
    if case["kind"] == "p2p":
        start = time.perf_counter()
        if rank == 0:
            dist.send(torch.ones(n), dst=1)
        elif rank == 1:
            dist.recv(torch.empty(n), src=0)
        return time.perf_counter() - start if rank in (0, 1) else 0.0
    senders = case["senders"]
    start = time.perf_counter()
    if rank == 0:
        works = [dist.irecv(torch.empty(n), src=s) for s in range(1, senders + 1)]
        for w in works:
            w.wait()
    elif rank <= senders:
        dist.send(torch.ones(n), dst=0)
    return time.perf_counter() - start if rank <= senders else 0.0


def rank_main(job: dict[str, Any]) -> None:
    torch.set_num_threads(1)
    ctx = init_distributed("gloo", timeout_s=600)
    todo = cases(job["sizes"])
    groups: dict[tuple[int, ...], Any] = {}
    for case in todo:
        if case["kind"] == "allreduce":
            for g in range(case["groups"]):
                members = tuple(range(g * case["world"], (g + 1) * case["world"]))
                if members not in groups:
                    groups[members] = dist.new_group(list(members))
    results = []
    for case in todo:
        seconds = []
        for i in range(job["repeats"] + 1):  # the first warms the connections up
            dist.barrier()
            took = torch.tensor([timed(case, ctx.rank, groups)], dtype=torch.float64)
            dist.all_reduce(took, op=dist.ReduceOp.MAX)
            if i:
                seconds.append(float(took))
        results.append({**case, "seconds": statistics.median(seconds)})
    if ctx.rank == 0:
        Path(job["out"]).write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


# ---- the launching process --------------------------------------------------------------------

def measure(mbit: float, sizes: list[int], repeats: int, timeout: float = 1800) -> list[Point]:
    """Every case at nominal `mbit`, eight ranks on eight emulated nodes."""
    cfg = NetworkConfig(kind=NetworkKind.emulated, bandwidth_mbit=mbit)
    with EmulatedCluster(cfg, ranks=RANKS) as net:
        try:
            rows = run_job(net, RANKS, {"sizes": sizes, "repeats": repeats}, timeout, script=__file__)
        except RuntimeError as err:
            raise SystemExit(f"bench/calibrate_network.py: ranks failed at {mbit:g} Mbit/s ({err})") from None
    return [Point(kind=r["kind"], world=r["world"], nbytes=r["nbytes"], mbit=mbit, seconds=r["seconds"],
                  groups=r.get("groups", 1), senders=r.get("senders", 1)) for r in rows]


def errors(points: list[Point], params: dict[str, Any]) -> dict[str, float]:
    rel = [abs(predict(p, params) - p.seconds) / p.seconds for p in points]
    return {"median": round(statistics.median(rel), 4), "worst": round(max(rel), 4), "points": len(rel)} if rel else {}


def show(title: str, points: list[Point], params: dict[str, Any]) -> None:
    print(title)
    for p in points:
        pred = predict(p, params)
        label = {"allreduce": f"all_reduce {p.groups}x{p.world}", "p2p": "message", "incast": f"incast {p.senders}->1"}
        print(f"  {p.mbit:6g} Mbit/s  {label[p.kind]:16} {p.nbytes:>9,} B  measured {p.seconds * 1e3:9.2f} ms  "
              f"model {pred * 1e3:9.2f} ms  residual {(pred - p.seconds) / p.seconds:+7.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rank-job", help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=float, default=100.0, help="the calibration rate, Mbit/s")
    parser.add_argument("--validate-rates", type=float, nargs="*", default=[20.0, 1000.0],
                        help="rates measured only to check the blind prediction")
    parser.add_argument("--fit-worlds", type=int, default=4, help="largest group the fit sees (8 is held out)")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="bytes at the calibration rate")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--free", nargs="+", default=["alpha_s", "efficiency", "burst_bytes", "message_s", "duplex",
                                                      "oversubscribed"],
                        help="parameters to fit (projection/calibration.py PARAMS)")
    parser.add_argument("--host-cores", type=int, default=os.cpu_count(),
                        help="the cores the emulated nodes share (0: model no sharing; docs/projection.md)")
    parser.add_argument("--name", default="emulated", help="conf/cluster/calibration/NAME.json")
    parser.add_argument("--from-json", type=Path, help="refit points saved by an earlier run (no measuring)")
    args = parser.parse_args()
    if args.rank_job:
        rank_main(json.loads(args.rank_job))
        return
    if args.from_json:
        points = [Point(**p) for p in json.loads(args.from_json.read_text())]
    else:
        problem = requirements_problem()
        if problem:
            raise SystemExit(f"bench/calibrate_network.py {problem}")
        points = []
        for mbit in [args.rate, *args.validate_rates]:
            scale = mbit / args.rate  # the same seconds per transfer at every rate
            sizes = sorted({max(4096, int(n * scale) // 4 * 4) for n in args.sizes})
            points += measure(mbit, sizes, args.repeats)
        saved = Path(tempfile.gettempdir()) / f"calibration_points_{args.name}.json"
        saved.write_text(json.dumps([p.__dict__ for p in points]))
        print(f"points saved to {saved} (--from-json refits them)")
    fitted = [p for p in points if p.mbit == args.rate and p.world <= args.fit_worlds and p.kind != "incast"
              and p.groups * p.world <= args.fit_worlds * 2]
    held = [p for p in points if p not in fitted]
    params = fit(fitted, args.free, {"host_cores": args.host_cores})
    record = make_record(fitted, params, "python bench/calibrate_network.py " + " ".join(sys.argv[1:]),
                         note=f"fitted at {args.rate:g} Mbit/s on groups of at most {args.fit_worlds}")
    record["held_out"] = {"errors": errors(held, params),
                          "by_rate": {f"{m:g}": errors([p for p in held if p.mbit == m], params)
                                      for m in sorted({p.mbit for p in held})},
                          "world_8": errors([p for p in held if p.world == 8 and p.mbit == args.rate], params)}
    show("fitted points", fitted, params)
    show("held out (predicted blind)", held, params)
    write_record(record, CALIBRATIONS / f"{args.name}.json")
    print(f"parameters: {json.dumps(params)}; written to {CALIBRATIONS / (args.name + '.json')}")
    print(json.dumps({"params": params, "fit": {k: record["residuals"][k] for k in ("median", "worst")},
                      "held_out": record["held_out"]}))


if __name__ == "__main__":
    main()
