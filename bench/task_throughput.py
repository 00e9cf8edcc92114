#!/usr/bin/env python
"""Tokens per second of the character-level GPT, and samples per second of MNIST-1D's 1-D CNN, in
the runner against a bare PyTorch loop of the same model, batch and optimizer, on the CPU or a GPU.

    python bench/task_throughput.py                       # both tasks, 3 rounds each, 1 thread
    python bench/task_throughput.py --tasks lm --rounds 5 --steps 200
    python bench/task_throughput.py --tasks lm --device cuda --lm-recipe lm/shakespeare_gpu --compile

For each task, in one process, the two are measured in turns (bare, runner, bare, runner, ...,
bare), and each runner measurement is compared with the mean of the two bare measurements around
it, so that a change in a shared machine's load touches both sides:

- the bare loop: the model from the project's builder with the recipe's options, one batch of the
  recipe's real data (the same windows or signals every step), the recipe's optimizer and its
  gradient clipping, forward, the task's loss, backward, step, zero_grad; nothing else;
- the runner: the real trainer on one rank (`launch.launcher=none`, the recipe's algorithm: a
  one-rank allreduce) over the recipe's data pipeline, its rate over the log windows after the
  warm-up steps (training time as the summary counts it: evaluation and checkpoints excluded).

The recipes are the tasks' defaults (`recipe=lm/shakespeare_cpu`: 3 windows of 64 characters a
rank, the per-rank batch of its 4-rank run; `recipe=cpu_mnist1d/allreduce`: 32 signals a rank),
with `--batch` to change the per-rank batch. Both sides are timed in windows of `--log-every`
steps.

On a GPU (`--device cuda`) both sides run under the runner's precision (`--precision`, bf16 by
default there) and, with `--compile`, torch.compile's forward. The bare loop synchronises the
device at its window edges, as the runner's clock does. The table adds each side's model FLOPs
utilisation: nanoGPT's estimate for the GPT (6N + 12·layers·width·context FLOPs per token)
against `--peak-tflops` (989 by default: the H100 SXM's dense bf16 peak).

Prints a table and one JSON line with `runner_vs_bare_lm` and `runner_vs_bare_mnist1d` (the
median over rounds of each runner measurement against the bare ones around it; target >= 0.9),
and `runner_vs_bare_fastest_*`, the fastest runner window against the fastest bare window of the
whole run: on a machine whose load moves within a measurement (other jobs), the fastest windows
are the ones least disturbed on either side.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402  (the repository is on the path from here on)

from core.task import task_for  # noqa: E402
from data import DataRequest, build_streams, data_spec  # noqa: E402
from engine.config import load_run_config, register_schemas  # noqa: E402
from engine.train.config import Precision  # noqa: E402
from engine.train.optim import build_optimizer  # noqa: E402
from engine.train.step import AUTOCAST, resolve_precision  # noqa: E402
from bench.throughput import train_windows  # noqa: E402  (the trainer on one rank, in process)
from models import build_model  # noqa: E402

#: the task's default recipe, its unit, and what keeps the bench's end cheap (the runner's final
#: evaluation and checkpoint are outside its timed windows, but take time)
TASKS = {"lm": ("lm/shakespeare_cpu", "tokens", ["data.eval_windows=8"]),
         "mnist1d": ("cpu_mnist1d/allreduce", "samples", ["data.num_samples=20000"])}


def run_config(recipe: str, args: argparse.Namespace, *more: str) -> Any:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_schemas()
    GlobalHydra.instance().clear()
    overrides = [f"recipe={recipe}", "launch.launcher=none", "launch.nproc=1", f"dist.device={args.device}",
                 f"train.precision={args.precision}", f"train.compile={str(args.compile).lower()}",
                 *([f"train.batch_size={args.batch}", "train.global_batch_size=null"] if args.batch else []), *more]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return load_run_config(compose(config_name="config", overrides=overrides))


def rank_batch(cfg: Any) -> int:
    """The one rank's batch: a recipe's global batch (lm/shakespeare_gpu: 64) is all of it here."""
    return int(cfg.train.global_batch_size or cfg.train.batch_size)


def units_per_sample(cfg: Any) -> int:
    """Tokens in a text window (context length), 1 for a signal."""
    return int(data_spec(cfg.data).fields().get("context_length", 1))


def bare(cfg: Any, args: argparse.Namespace) -> list[float]:
    """Samples per second of the bare loop on one real batch of the recipe's data, per window of
    `--log-every` steps after the warm-up (as the runner's log windows)."""
    spec = data_spec(cfg.data)
    task = task_for(spec)
    streams = build_streams(cfg.data, DataRequest(batch_size=rank_batch(cfg), eval_batch_size=8, seed=cfg.seed,
                                                  shard=0, num_shards=1, eval_shard=0, eval_num_shards=1))
    device = torch.device(args.device)
    x, y = (t.to(device) for t in next(iter(streams.train.batches(0, 0))))
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, spec).to(device)
    opt = build_optimizer(model, cfg.optim, cfg.optim.lr)
    clip: Optional[float] = cfg.train.grad_clip
    forward = torch.compile(model) if args.compile else model
    dtype = AUTOCAST.get(resolve_precision(Precision(args.precision), device.type == "cuda"))  # as the runner's
    scaler = torch.amp.GradScaler(device.type, enabled=dtype is torch.float16)

    def step() -> None:
        with torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext():
            loss = task.loss(forward(x), y)
        loss = scaler.scale(loss)
        loss.backward()
        if clip:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=False)

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(args.warmup):
        step()
    rates = []
    for _ in range(args.steps // args.log_every):
        sync()
        t0 = time.perf_counter()
        for _ in range(args.log_every):
            step()
        sync()
        rates.append(args.log_every * len(x) / (time.perf_counter() - t0))
    return rates


def runner(recipe: str, args: argparse.Namespace, extra: list[str]) -> list[float]:
    """Samples per second of the trainer on one rank, per log window after the warm-up."""
    steps = args.warmup + args.steps
    with tempfile.TemporaryDirectory() as tmp:
        cfg = run_config(recipe, args, f"train.max_steps={steps}", f"train.log_every_steps={args.log_every}",
                         "train.eval_every_steps=null", "train.eval_every_epochs=null", "checkpoint.every_steps=null",
                         "checkpoint.every_epochs=null", "train.progress=false", "resume=null", *extra)
        windows = train_windows(cfg, Path(tmp), args.warmup)
    return [r["samples_per_s"] for r in windows]


def flops_per_unit(cfg: Any) -> Optional[float]:
    """Training FLOPs per token of the GPT (nanoGPT's estimate: 6 per parameter for forward and
    backward, plus attention's 12·layers·width·context), None for another model."""
    if cfg.model["name"] != "gpt":
        return None
    spec = data_spec(cfg.data)
    n = sum(p.numel() for p in build_model(cfg.model, spec).parameters())
    return 6.0 * n + 12.0 * cfg.model["layers"] * cfg.model["width"] * units_per_sample(cfg)


def rate(windows: list[float]) -> float:
    """A measurement's rate: samples over the time of all its windows."""
    return len(windows) / sum(1 / w for w in windows)


def measure(name: str, args: argparse.Namespace) -> dict[str, Any]:
    recipe, unit, extra = TASKS[name]
    cfg = run_config(recipe, args, *extra)
    per = units_per_sample(cfg)
    bares, runs = [bare(cfg, args)], []
    for _ in range(args.rounds):
        runs.append(runner(recipe, args, extra))
        bares.append(bare(cfg, args))
    ratios = [rate(r) / ((rate(a) + rate(b)) / 2) for r, a, b in zip(runs, bares, bares[1:])]
    # the fastest windows of each side: what either reaches when the shared machine lets it
    best = max(w for r in runs for w in r) / max(w for b in bares for w in b)
    return {"recipe": recipe, "unit": unit, "batch": rank_batch(cfg), "per_sample": per,
            "bare": [rate(b) * per for b in bares], "runner": [rate(r) * per for r in runs], "ratios": ratios,
            "best_ratio": best, "best_runner": max(w for r in runs for w in r) * per,
            "best_bare": max(w for b in bares for w in b) * per, "flops_per_unit": flops_per_unit(cfg)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tasks", default="lm,mnist1d", help="comma-separated: lm, mnist1d")
    p.add_argument("--rounds", type=int, default=3, help="runner measurements, each between two bare ones")
    p.add_argument("--warmup", type=int, default=20, help="steps not timed")
    p.add_argument("--steps", type=int, default=100, help="timed steps")
    p.add_argument("--log-every", type=int, default=20, help="the runner's log window in steps")
    p.add_argument("--batch", type=int, default=None, help="per-rank batch (default: the recipe's)")
    p.add_argument("--threads", type=int, default=1, help="torch's intra-op threads, for both sides")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16", "fp16"),
                   help="train.precision for both sides (auto: bf16 on a GPU, fp32 on the CPU)")
    p.add_argument("--compile", action="store_true", help="torch.compile the forward on both sides")
    p.add_argument("--lm-recipe", default=TASKS["lm"][0], help="the language model's recipe (lm/shakespeare_gpu on a GPU)")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="the device's dense peak, for MFU")
    args = p.parse_args()
    if args.warmup % args.log_every or args.steps % args.log_every:
        p.error(f"--warmup {args.warmup} and --steps {args.steps} must be multiples of --log-every {args.log_every}")
    torch.set_num_threads(args.threads)
    TASKS["lm"] = (args.lm_recipe, *TASKS["lm"][1:])
    results = {name: measure(name, args) for name in args.tasks.split(",")}
    where = torch.cuda.get_device_name(0) if args.device == "cuda" else "CPU"
    print(f"\n{where}, {args.threads} thread(s), precision {args.precision}, compile {args.compile}, "
          f"{args.steps} timed steps after {args.warmup}, {args.rounds} rounds")
    print(f"{'task':<10} {'recipe':<24} {'batch':>5} {'unit':>8} {'bare /s':>10} {'runner /s':>10} {'runner/bare':>12}")
    summary: dict[str, Any] = {"device": where, "threads": args.threads, "steps": args.steps, "rounds": args.rounds,
                               "precision": args.precision, "compile": args.compile}
    for name, r in results.items():
        for i, ratio in enumerate(r["ratios"]):
            bare_mean = (r["bare"][i] + r["bare"][i + 1]) / 2
            print(f"{name:<10} {r['recipe']:<24} {r['batch']:>5} {r['unit']:>8} {bare_mean:>10.0f} "
                  f"{r['runner'][i]:>10.0f} {ratio:>11.3f}x")
        print(f"{name:<10} {'fastest windows':<24} {r['batch']:>5} {r['unit']:>8} {r['best_bare']:>10.0f} "
              f"{r['best_runner']:>10.0f} {r['best_ratio']:>11.3f}x")
        summary[f"runner_vs_bare_{name}"] = round(statistics.median(r["ratios"]), 3)
        summary[f"runner_vs_bare_fastest_{name}"] = round(r["best_ratio"], 3)
        summary[f"runner_{r['unit']}_per_s_{name}"] = round(statistics.mean(r["runner"]), 1)
        summary[f"bare_{r['unit']}_per_s_{name}"] = round(statistics.mean(r["bare"]), 1)
        if r["flops_per_unit"] and args.device == "cuda":
            for side in ("runner", "bare"):
                mfu = statistics.mean(r[side]) * r["flops_per_unit"] / (args.peak_tflops * 1e12)
                summary[f"mfu_{side}_{name}"] = round(mfu, 4)
            print(f"{name:<10} MFU runner {summary[f'mfu_runner_{name}']:.3f}, bare {summary[f'mfu_bare_{name}']:.3f} "
                  f"({r['flops_per_unit']:.3g} FLOPs per {r['unit'][:-1]}, peak {args.peak_tflops:g} TFLOP/s)")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
