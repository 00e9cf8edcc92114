#!/usr/bin/env python
"""Parameter-server throughput: server updates per second and bytes per update, asgd vs dgs.

One server and `--workers` workers (default 4) on gloo over loopback, in one run, the same model
for both methods. Workers push synthetic gradients (seeded noise, no forward/backward), so what is
measured is the exchange itself: the worker's compression, the wire, the server's update and
reply. updates/s = server versions over the slowest worker's wall time for the measured steps;
bytes/update = everything on the wire (pushes and replies, headers included) per server version.
Loopback is far faster than the 1-10 Gbps links of the paper, so the table also shows the update
rate those links would cap each method at (bytes per update through the server's link).

    .venv/bin/python bench/param_server.py                  # CIFAR ResNet-18, 4 workers
    .venv/bin/python bench/param_server.py --model small_cnn --steps 50

The last line is a JSON object (asgd_updates_per_s, dgs_updates_per_s, asgd_bytes_per_update,
dgs_bytes_per_update, ...).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from core.distenv import init_distributed  # noqa: E402
from core.schema import typed_section  # noqa: E402
from core.spec import ImageSpec  # noqa: E402
from dist_algos import get_algorithm  # noqa: E402
from dist_algos.base import HyperParams, StepContext, TrainInfo  # noqa: E402
from models import build_model  # noqa: E402

MODELS = {
    "resnet18": ({"name": "resnet18", "small_input": True}, (3, 32, 10)),  # the paper's CIFAR-10 model
    "small_cnn": ({"name": "small_cnn", "width": 32}, (1, 8, 10)),
}


def bench_rank(rank: int, world: int, algos: list[str], model_name: str, steps: int, warmup: int,
               density: float) -> dict[str, Any]:
    import torch
    import torch.distributed as dist


    ctx = init_distributed("gloo")
    model_cfg, (channels, size, classes) = MODELS[model_name]
    out: dict[str, Any] = {}
    for algo in algos:
        cls = get_algorithm(algo)
        overrides = {"density": density} if algo != "asgd" else {}
        cfg = typed_section(cls.Config, {"name": algo, **overrides}, "algo")
        plugin = cls(cfg, ctx)
        torch.manual_seed(0)
        model = build_model(dict(model_cfg), ImageSpec(channels, size, classes))
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
        info = TrainInfo(total_steps=steps, steps_per_epoch=steps, lr_at=lambda s: 0.1, warmup_steps=0,
                         train_batches=lambda n: iter(()), forward=lambda m, x: m(x),
                         hyper=HyperParams(optimizer="sgd", peak_lr=0.1, momentum=0.9, weight_decay=5e-4))
        plugin.setup(model, opt, info)
        gen = torch.Generator().manual_seed(rank)
        elapsed = torch.zeros(1, dtype=torch.float64)
        if plugin.server is None:
            for step in range(warmup):
                plugin.grad.copy_(torch.randn(plugin.grad.shape, generator=gen) * 0.01)
                plugin.step(StepContext(step=step, epoch=0, loss=torch.zeros(()), lr=0.1, optimizer_step=opt.step))
        dist.barrier()
        bytes_before = plugin.comm.as_metrics()
        if plugin.server is None:
            start = time.perf_counter()
            for step in range(warmup, warmup + steps):
                plugin.grad.copy_(torch.randn(plugin.grad.shape, generator=gen) * 0.01)
                plugin.step(StepContext(step=step, epoch=0, loss=torch.zeros(()), lr=0.1, optimizer_step=opt.step))
            elapsed[0] = time.perf_counter() - start
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        plugin.finalize(model)
        if plugin.server is not None:
            after = plugin.comm.as_metrics()
            moved = (after["comm_bytes"] + after["comm_recv_bytes"]
                     - bytes_before["comm_bytes"] - bytes_before["comm_recv_bytes"])
            updates = steps * (world - 1)
            out[algo] = {"updates_per_s": updates / float(elapsed[0]), "bytes_per_update": moved / updates,
                         "seconds": float(elapsed[0]), "updates": updates,
                         "params": plugin.flat.numel(), "resyncs": plugin.server.state.resyncs}
        plugin.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="resnet18")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20, help="measured steps per worker")
    parser.add_argument("--warmup", type=int, default=3, help="unmeasured steps per worker first")
    parser.add_argument("--density", type=float, default=0.01)
    args = parser.parse_args()

    from tests.support.harness import run_ranks  # gloo ranks from a forkserver, as the tests start them

    algos = ["asgd", "dgs"]
    per_rank = run_ranks(bench_rank, args.workers + 1, algos, args.model, args.steps, args.warmup, args.density,
                         timeout=1800)
    res = per_rank[0]
    print(f"parameter server, {args.workers} workers on loopback, {args.model} "
          f"({res['asgd']['params']:,} parameters), density {args.density}, {args.steps} steps per worker")
    header = (f"{'algo':6} {'updates/s':>10} {'bytes/update':>14} {'MB/s moved':>11} {'1 Gbps cap/s':>13} "
              f"{'10 Gbps cap/s':>14}")
    print(header)
    print("-" * len(header))
    for algo in algos:
        r = res[algo]
        caps = [gbps * 1e9 / 8 / r["bytes_per_update"] for gbps in (1, 10)]
        print(f"{algo:6} {r['updates_per_s']:10.2f} {r['bytes_per_update']:14,.0f} "
              f"{r['updates_per_s'] * r['bytes_per_update'] / 1e6:11.1f} {caps[0]:13.1f} {caps[1]:14.1f}")
    speed = res["dgs"]["updates_per_s"] / res["asgd"]["updates_per_s"]
    ratio = res["dgs"]["bytes_per_update"] / res["asgd"]["bytes_per_update"]
    print(f"dgs / asgd: {speed:.2f}x updates per second on loopback, {ratio:.4f}x bytes per update "
          f"({1 / ratio:.0f}x fewer)")
    print(json.dumps({"asgd_updates_per_s": round(res["asgd"]["updates_per_s"], 3),
                      "dgs_updates_per_s": round(res["dgs"]["updates_per_s"], 3),
                      "asgd_bytes_per_update": round(res["asgd"]["bytes_per_update"], 1),
                      "dgs_bytes_per_update": round(res["dgs"]["bytes_per_update"], 1),
                      "dgs_over_asgd_updates": round(speed, 4), "dgs_over_asgd_bytes": round(ratio, 6),
                      "workers": args.workers, "model": args.model, "params": res["asgd"]["params"],
                      "density": args.density, "steps_per_worker": args.steps}))


if __name__ == "__main__":
    main()
