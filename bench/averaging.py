"""Model averaging of a ResNet-50-sized parameter set across local gloo ranks, four ways.

What a local-SGD synchronisation costs is one average of every parameter. Measured in one run,
interleaved repetition by repetition (so a busy machine slows all candidates alike):

- ours: `dist_algos.comm.flat.average_` on a persistent `FlatBuffer` (parameters are views of it),
  bucketed all_reduces in flight while the previous bucket is divided;
- torch_average_parameters: `torch.distributed.algorithms.model_averaging.utils.average_parameters`
  (torch.cat into a fresh buffer, divide, one all_reduce, re-point the parameters);
- per_tensor: one all_reduce and one divide per tensor (what QSR's and torchft-style code do);
- flat_allreduce: one bare all_reduce of a preallocated flat buffer, no divide (the floor).

Each timing is the slowest rank's (an average is done when every rank has it); the table shows
medians over repeats and the last line is a JSON object for scripts.

    .venv/bin/python bench/averaging.py [--world 4] [--repeats 11]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from dist_algos.comm.flat import BUCKET_BYTES, INFLIGHT, FlatBuffer, average_  # noqa: E402

METHODS = ("ours", "torch_average_parameters", "per_tensor", "flat_allreduce")


def resnet50_shapes() -> list[torch.Size]:
    """The parameter shapes of torchvision's ResNet-50 (25,557,032 values), built on `meta`."""
    from torchvision.models import resnet50

    with torch.device("meta"):
        return [p.shape for p in resnet50().parameters()]


def rank_tensors(shapes: list[torch.Size], rank: int) -> list[torch.Tensor]:
    """This rank's parameter values: distinct per rank, so an average has something to do."""
    gen = torch.Generator().manual_seed(rank)
    return [torch.randn(shape, generator=gen) for shape in shapes]


def check_ours(shapes: list[torch.Size], rank: int, world: int, bucket_bytes: int, inflight: int) -> None:
    """`average_` must give the exact mean that one all_reduce + divide gives (same dtype, same op)."""

    params = rank_tensors(shapes[:8], rank)
    expected = torch.stack([torch.cat([t.reshape(-1) for t in rank_tensors(shapes[:8], r)])
                            for r in range(world)]).sum(0) / world
    flat = FlatBuffer(params)
    average_(flat, None, world, bucket_bytes=bucket_bytes, inflight=inflight)
    got = torch.cat([t.reshape(-1) for t in params])
    if not torch.allclose(got, expected, atol=1e-6, rtol=1e-6):
        raise AssertionError(f"rank {rank}: average_ is off by {(got - expected).abs().max().item()}")


def candidates(shapes: list[torch.Size], rank: int, world: int, bucket_bytes: int,
               inflight: int) -> dict[str, Callable[[], None]]:
    from torch.distributed.algorithms.model_averaging.utils import average_parameters


    ours_params = rank_tensors(shapes, rank)
    ours = FlatBuffer(ours_params)
    torch_params = [torch.nn.Parameter(t) for t in rank_tensors(shapes, rank)]
    loop_params = rank_tensors(shapes, rank)
    floor = torch.cat([t.reshape(-1) for t in rank_tensors(shapes, rank)])

    def per_tensor() -> None:
        for t in loop_params:
            dist.all_reduce(t)
            t.div_(world)

    return {
        "ours": lambda: average_(ours, None, world, bucket_bytes=bucket_bytes, inflight=inflight),
        "torch_average_parameters": lambda: average_parameters(iter(torch_params), None),
        "per_tensor": per_tensor,
        "flat_allreduce": lambda: dist.all_reduce(floor),
    }


def rank_main(rank: int, world: int, port: int, args: argparse.Namespace, out: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    shapes = resnet50_shapes()
    bucket_bytes = int(args.bucket_mb * 2**20)
    check_ours(shapes, rank, world, bucket_bytes, args.inflight)
    fns = candidates(shapes, rank, world, bucket_bytes, args.inflight)
    times: dict[str, list[float]] = {name: [] for name in METHODS}
    for rep in range(args.warmup + args.repeats):
        order = METHODS[rep % len(METHODS):] + METHODS[:rep % len(METHODS)]  # no fixed position bias
        for name in order:
            dist.barrier()
            start = time.perf_counter()
            fns[name]()
            elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            if rep >= args.warmup:
                times[name].append(elapsed.item())
    if rank == 0:
        out.put({"times": times, "numel": sum(s.numel() for s in shapes), "tensors": len(shapes)})
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(args: argparse.Namespace) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, args.world, port, args, out)) for r in range(args.world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    if any(p.exitcode for p in procs):
        raise SystemExit(f"bench/averaging.py: a rank failed (exit codes {[p.exitcode for p in procs]})")
    return out.get()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=int, default=4, help="gloo ranks on this machine")
    parser.add_argument("--repeats", type=int, default=11, help="timed repetitions of each method")
    parser.add_argument("--warmup", type=int, default=2, help="untimed repetitions first")
    parser.add_argument("--bucket-mb", type=float, default=None, help="ours: bucket cap (default: the library's)")
    parser.add_argument("--inflight", type=int, default=None, help="ours: all_reduces in flight (default: the library's)")
    args = parser.parse_args()

    args.bucket_mb = BUCKET_BYTES / 2**20 if args.bucket_mb is None else args.bucket_mb
    args.inflight = INFLIGHT if args.inflight is None else args.inflight
    got = run(args)
    med = {name: statistics.median(got["times"][name]) for name in METHODS}
    floor = med["flat_allreduce"]
    print(f"averaging {got['numel'] / 1e6:.1f}M float32 in {got['tensors']} tensors (ResNet-50 shapes) across "
          f"{args.world} gloo ranks; median of {args.repeats} (slowest rank); ours: buckets of "
          f"{args.bucket_mb:g} MiB, {args.inflight} in flight")
    print(f"{'method':<26}{'median ms':>11}{'min ms':>9}{'x floor':>9}")
    for name in METHODS:
        print(f"{name:<26}{med[name] * 1e3:>11.1f}{min(got['times'][name]) * 1e3:>9.1f}{med[name] / floor:>9.2f}")
    result = {f"{name}_s": round(med[name], 6) for name in METHODS}
    result.update(ours_vs_floor=round(med["ours"] / floor, 4),
                  torch_average_parameters_vs_floor=round(med["torch_average_parameters"] / floor, 4),
                  per_tensor_vs_floor=round(med["per_tensor"] / floor, 4),
                  world=args.world, repeats=args.repeats, numel=got["numel"],
                  bucket_mb=args.bucket_mb, inflight=args.inflight, cpus=os.cpu_count())
    print(json.dumps(result))


if __name__ == "__main__":
    main()
