#!/usr/bin/env python
"""The emulated network (launch.network) checked against models and baselines, in one run.

Ranks run in the namespaces of `engine.launch.network.EmulatedCluster`, one rank per node (so every
byte between ranks crosses the shaped links), on gloo:

1. the link itself: all_reduce time of `--size-mb` across 2, 4 and 8 ranks at 20 and 100 Mbit/s,
   against the ring model 2 (n-1)/n x size / bandwidth + 2 (n-1) x one-way latency (gloo's ring
   all_reduce: a reduce-scatter and an all-gather, n-1 steps each). Medians over repeats;
   `measured_vs_model_<bw>mbit` is the ratio farthest from 1 over the world sizes;
2. the parameter-server exchange at 100 Mbit/s: worker updates per second of asgd and dgs, 1 server
   + 3 workers, measured as bench/param_server.py measures them (synthetic gradients, so the
   exchange itself: compression, wire, server update and reply);
3. the `allreduce` baseline's step time (forward, backward, overlapped all_reduce, optimizer step)
   against torch DistributedDataParallel's on the same model, ranks and link, interleaved block by
   block so a busy machine slows both alike; also with `algo.overlap=false` (average after
   backward), to show what the overlap hides.

Needs root and iproute2 (it builds the namespaces). Takes a few minutes.

    .venv/bin/python bench/network.py
    .venv/bin/python bench/network.py --repeats 5 --step-model resnet20

The last line is a JSON object: measured_vs_model_20mbit, measured_vs_model_100mbit,
dgs_vs_asgd_updates_100mbit, allreduce_vs_ddp_step_100mbit, and the numbers behind them.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.param_server import bench_rank as param_server_rank  # noqa: E402
from core.distenv import init_distributed  # noqa: E402
from core.errors import UserError  # noqa: E402
from core.schema import typed_section  # noqa: E402
from core.spec import ImageSpec  # noqa: E402
from dist_algos import get_algorithm  # noqa: E402
from dist_algos.base import HyperParams, StepContext, TrainInfo  # noqa: E402
from models import build_model  # noqa: E402
from engine.launch.network import (MASTER_PORT, EmulatedCluster, NetworkConfig,  # noqa: E402
                                   NetworkKind, requirements_problem)

REPO = Path(__file__).resolve().parent.parent
WORLDS = (2, 4, 8)
PARTS = ("link", "param_server", "steps")
STEP_MODELS = {"resnet20": ({"name": "resnet20"}, (3, 32, 10)), "small_cnn": ({"name": "small_cnn"}, (1, 8, 10))}


def ring_model_s(nbytes: int, world: int, mbit: float, latency_ms: float = 0.0) -> float:
    """Seconds of a bandwidth-optimal ring all_reduce of `nbytes` over `world` ranks, one per node."""
    return 2 * (world - 1) / world * nbytes * 8 / (mbit * 1e6) + 2 * (world - 1) * latency_ms / 1e3


# ---- inside a rank ----------------------------------------------------------------------------

def allreduce_times(rank: int, sizes: dict[int, int], repeats: int) -> dict[str, list[float]]:
    """Per world size n: seconds of each all_reduce over ranks 0..n-1 (the slowest rank's)."""
    out: dict[str, list[float]] = {}
    for world in WORLDS:
        group = dist.new_group(list(range(world)))  # collective: every rank creates every group
        buf = torch.ones(sizes[world] // 4)
        times = []
        for _ in range(repeats + 1):  # the first warms the connections up
            dist.barrier()
            start = time.perf_counter()
            if rank < world:
                dist.all_reduce(buf, group=group)
            took = torch.tensor([time.perf_counter() - start if rank < world else 0.0], dtype=torch.float64)
            dist.all_reduce(took, op=dist.ReduceOp.MAX)
            times.append(float(took))
        out[str(world)] = times[1:]
    return out


def step_times(rank: int, world: int, model_name: str, batch: int, block: int, rounds: int) -> dict[str, list[float]]:
    """Seconds per training step of torch DDP, the allreduce plugin and the plugin without overlap,
    in interleaved blocks of `block` steps (slowest rank's time per block)."""
    ctx = init_distributed("gloo")
    cfg, (channels, size, classes) = STEP_MODELS[model_name]
    gen = torch.Generator().manual_seed(rank)
    x, y = torch.randn(batch, channels, size, size, generator=gen), torch.randint(0, classes, (batch,), generator=gen)
    runners = {}

    def make(overlap: bool | None) -> Any:
        torch.manual_seed(0)
        model = build_model(dict(cfg), ImageSpec(channels, size, classes))
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        if overlap is None:
            ddp = DistributedDataParallel(model)
            return lambda: (F.cross_entropy(ddp(x), y).backward(), opt.step(), opt.zero_grad(set_to_none=False))
        cls = get_algorithm("allreduce")
        plugin = cls(typed_section(cls.Config, {"name": "allreduce", "overlap": overlap}, "algo"), ctx)
        plugin.setup(model, opt, TrainInfo(total_steps=1, steps_per_epoch=1, lr_at=lambda s: 0.01, warmup_steps=0,
                                           train_batches=lambda n: iter(()), forward=lambda m, v: m(v),
                                           hyper=HyperParams()))
        step = StepContext(step=0, epoch=0, loss=torch.zeros(()), lr=0.01, optimizer_step=opt.step)
        return lambda: (F.cross_entropy(model(x), y).backward(), plugin.step(step), opt.zero_grad(set_to_none=False))

    for name, overlap in (("ddp", None), ("allreduce", True), ("allreduce_no_overlap", False)):
        runners[name] = make(overlap)
        runners[name]()  # warm-up
    out: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(rounds):
        for name, run in runners.items():
            dist.barrier()
            start = time.perf_counter()
            for _ in range(block):
                run()
            took = torch.tensor([(time.perf_counter() - start) / block], dtype=torch.float64)
            dist.all_reduce(took, op=dist.ReduceOp.MAX)
            out[name].append(float(took))
    return out


def rank_main(job: dict[str, Any]) -> None:
    torch.set_num_threads(1)
    ctx = init_distributed("gloo", timeout_s=600)
    if job["kind"] == "allreduce":
        result: Any = allreduce_times(ctx.rank, {int(k): v for k, v in job["sizes"].items()}, job["repeats"])
    elif job["kind"] == "param_server":
        result = param_server_rank(ctx.rank, ctx.world_size, ["asgd", "dgs"], job["model"], job["steps"], 3,
                                   job["density"])
    else:
        result = step_times(ctx.rank, ctx.world_size, job["model"], job["batch"], job["block"], job["rounds"])
    if ctx.rank == 0:
        Path(job["out"]).write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()  # gloo's threads must end before the process does


# ---- the launching process ----------------------------------------------------------------------

def run_job(cluster: EmulatedCluster, world: int, job: dict[str, Any], timeout: float = 900,
            script: str = __file__) -> Any:
    """`world` ranks, rank r on node r, each running `script --rank-job JOB` (by default this one's
    `rank_main(job)`); the result rank 0 wrote to `job["out"]`. bench/calibrate_network.py runs its
    own rank job through it."""
    with tempfile.TemporaryDirectory() as tmp:
        job = {**job, "out": str(Path(tmp) / "result.json")}
        env = {**os.environ, **cluster.env(), "MASTER_ADDR": cluster.master_addr, "MASTER_PORT": str(MASTER_PORT),
               "WORLD_SIZE": str(world), "LOCAL_SIZE": "1", "LOCAL_RANK": "0", "OMP_NUM_THREADS": "1",
               "PYTHONPATH": str(REPO)}
        procs = [subprocess.Popen(cluster.prefix(r) + [sys.executable, script, "--rank-job", json.dumps(job)],
                                  env={**env, "RANK": str(r)}, cwd=REPO) for r in range(world)]
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.2)
        for p in procs:
            if p.poll() is None:
                p.kill()
        codes = [p.wait() for p in procs]
        if any(codes):
            raise RuntimeError(f"bench ranks failed (exit codes {codes})")
        return json.loads(Path(job["out"]).read_text())


def cluster(mbit: float) -> EmulatedCluster:
    return EmulatedCluster(NetworkConfig(kind=NetworkKind.emulated, bandwidth_mbit=mbit), ranks=max(WORLDS))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rank-job", help=argparse.SUPPRESS)
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="what to measure")
    parser.add_argument("--size-mb", type=float, nargs=2, default=[2.0, 8.0],
                        help="all_reduce size in MB at 20 and at 100 Mbit/s (about a second each)")
    parser.add_argument("--repeats", type=int, default=3, help="measured all_reduces per world size")
    parser.add_argument("--ps-model", default="small_cnn", help="bench/param_server.py's model")
    parser.add_argument("--ps-workers", type=int, default=3, help="workers of the one server")
    parser.add_argument("--ps-steps", type=int, default=20, help="measured pushes per worker")
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--step-model", choices=sorted(STEP_MODELS), default="resnet20")
    parser.add_argument("--step-world", type=int, default=2, help="ranks of the step-time comparison")
    parser.add_argument("--batch", type=int, default=32, help="per rank, for the step-time comparison")
    parser.add_argument("--block", type=int, default=4, help="steps per timed block")
    parser.add_argument("--rounds", type=int, default=6, help="blocks per method")
    args = parser.parse_args()
    if args.rank_job:
        rank_main(json.loads(args.rank_job))
        return
    problem = requirements_problem()
    if problem:
        raise SystemExit(f"bench/network.py {problem}")
    summary: dict[str, Any] = {}
    for mbit, size_mb in zip((20.0, 100.0), args.size_mb):
        with cluster(mbit) as net:
            if "link" in args.parts:
                summary.update(link_part(args, net, mbit, size_mb))
            if mbit == 100.0 and "param_server" in args.parts:
                summary.update(param_server_part(args, net))
            if mbit == 100.0 and "steps" in args.parts:
                summary.update(steps_part(args, net))
    print(json.dumps(summary))


def link_part(args: argparse.Namespace, net: EmulatedCluster, mbit: float, size_mb: float) -> dict[str, Any]:
    nbytes = int(size_mb * 1e6) // 4 * 4
    times = run_job(net, max(WORLDS), {"kind": "allreduce", "sizes": {w: nbytes for w in WORLDS},
                                       "repeats": args.repeats})
    print(f"all_reduce of {nbytes / 1e6:g} MB at {mbit:g} Mbit/s, one rank per node, median of {args.repeats}, "
          "against the ring model 2(n-1)/n x size / bandwidth")
    ratios = {}
    for world in WORLDS:
        measured, model = statistics.median(times[str(world)]), ring_model_s(nbytes, world, mbit)
        ratios[str(world)] = round(measured / model, 4)
        print(f"  {world} ranks: {measured:7.3f} s measured, {model:7.3f} s model, ratio {measured / model:.3f}")
    worst = max(ratios.values(), key=lambda r: abs(r - 1))
    return {f"measured_vs_model_{mbit:g}mbit": worst, f"ratios_{mbit:g}mbit": ratios}


def param_server_part(args: argparse.Namespace, net: EmulatedCluster) -> dict[str, Any]:
    ps = run_job(net, args.ps_workers + 1, {"kind": "param_server", "model": args.ps_model, "steps": args.ps_steps,
                                            "density": args.density})
    speed = ps["dgs"]["updates_per_s"] / ps["asgd"]["updates_per_s"]
    print(f"parameter server at 100 Mbit/s, 1 server + {args.ps_workers} workers, {args.ps_model}, "
          f"density {args.density}:")
    for algo in ("asgd", "dgs"):
        print(f"  {algo:5} {ps[algo]['updates_per_s']:8.2f} worker updates/s, {ps[algo]['bytes_per_update']:12,.0f} "
              "bytes/update")
    print(f"  dgs / asgd: {speed:.2f}x worker updates per second")
    return {"dgs_vs_asgd_updates_100mbit": round(speed, 3),
            "asgd_updates_per_s_100mbit": round(ps["asgd"]["updates_per_s"], 3),
            "dgs_updates_per_s_100mbit": round(ps["dgs"]["updates_per_s"], 3), "ps_model": args.ps_model,
            "ps_workers": args.ps_workers}


def steps_part(args: argparse.Namespace, net: EmulatedCluster) -> dict[str, Any]:
    blocks = run_job(net, args.step_world, {"kind": "steps", "model": args.step_model, "batch": args.batch,
                                            "block": args.block, "rounds": args.rounds})
    steps = {k: statistics.median(v) for k, v in blocks.items()}
    print(f"step time at 100 Mbit/s, {args.step_world} ranks, {args.step_model}, batch {args.batch}/rank "
          f"(median of {args.rounds} interleaved blocks of {args.block} steps):")
    for name, seconds in steps.items():
        print(f"  {name:22} {seconds * 1e3:8.1f} ms  ({seconds / steps['ddp']:.3f}x ddp)")
    return {"allreduce_vs_ddp_step_100mbit": round(steps["allreduce"] / steps["ddp"], 4),
            "allreduce_no_overlap_vs_ddp_step_100mbit": round(steps["allreduce_no_overlap"] / steps["ddp"], 4),
            "step_ms_100mbit": {k: round(v * 1e3, 2) for k, v in steps.items()}, "step_model": args.step_model,
            "step_ranks": args.step_world}


if __name__ == "__main__":
    try:
        main()
    except UserError as err:
        raise SystemExit(f"bench/network.py: error: {err}")
