#!/usr/bin/env python
"""What a GPU run of cli.py must do that the suite cannot check from inside one process: the
figures issue 24 asks for, each measured on real cli.py runs, as a user launches them.

    python bench/gpu_checks.py                      # every check, data generated under --dir
    python bench/gpu_checks.py --only shared,wall   # some of them

- `shared`: `launch.nproc=4` on one GPU runs local_sgd, wagma (its wait-avoiding thread on),
  dgs and diloco to completion, and the shared-GPU line is printed once per run.
- `wall`: ResNet-18 on CIFAR-format data (device pipeline, batch 512, bf16): summary.json's
  samples_per_s against the images trained between the first and the last training log line
  over the wall-clock between them (the lines' arrival in metrics.jsonl, polled every 5 ms);
  the MFU summary.json reports, with the FLOPs per sample and the peak it was computed from,
  for a check by hand.
- `lm_shared`: the character-level GPT at nanoGPT's GPU size (`recipe=lm/shakespeare_gpu`,
  bf16) with DiLoCo on 8 ranks sharing the one GPU, `--lm-steps` steps: completes, says the
  shared-GPU line once, and its validation loss and tokens/s.
- `workers`: a run with 14 torchvision loader workers: seconds from summary.json's writing to
  the process's exit.
- `dali_shared`: ResNet-50 at 224 px on generated JPEGs through DALI (14 loader threads, bf16),
  DiLoCo on 4 ranks sharing the GPU at a global batch of 256: completes, and the seconds from
  summary.json to the exit.
- `compile`: `train.compile=true` against eager on the same run (evaluation every epoch):
  how often torch.compile compiled (TORCH_LOGS=recompiles: every recompilation is a log line)
  and the images/s of each.

Prints one line per check and one JSON line at the end (the figures); exits 1 when a check fails.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.throughput import IMAGENET_CLASSES, write_cifar, write_imagenet  # noqa: E402  (the repository is on the path from here on)


def cli(args: list[str], run_dir: Path, env: dict[str, str] | None = None, timeout: float = 600,
        ) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(REPO / "cli.py"), *args, f"hydra.run.dir={run_dir}", "train.progress=false"]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def summary_of(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "summary.json").read_text())


def tail(proc: subprocess.CompletedProcess[str]) -> str:
    return (proc.stdout + proc.stderr)[-3000:]


def shared_run(name: str, args: list[str], run_dir: Path) -> dict[str, Any]:
    """cli.py with `args` on ranks sharing the GPU: completes, with its summary, and says the
    shared-GPU line exactly once."""
    t0 = time.perf_counter()
    proc = cli(args, run_dir)
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "share 1 GPU(s)" in ln]
    s = summary_of(run_dir) if (run_dir / "summary.json").exists() else {}
    out = {"ok": proc.returncode == 0 and bool(s) and len(lines) == 1, "exit": proc.returncode,
           "shared_lines": len(lines), "steps": s.get("steps"), "val_loss": s.get("val_loss"),
           "test_loss": s.get("test_loss"), "test_acc": s.get("test_acc"), "samples_per_s": s.get("samples_per_s"),
           "wall_s": round(time.perf_counter() - t0, 1)}
    print(f"{name}: {out}" + ("" if out["ok"] else f"\n{tail(proc)}"), flush=True)
    return out


def shared(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for algo in ("local_sgd", "wagma", "dgs", "diloco"):
        extra = ["algo.wait_avoiding=true"] if algo == "wagma" else []
        out[algo] = shared_run(f"shared {algo}", [f"algo={algo}", "launch.nproc=4", "train.epochs=4",
                                                  "dist.device=auto", *extra],
                               Path(args.dir) / "runs" / f"shared_{algo}")
    return out


def lm_shared(args: argparse.Namespace) -> dict[str, Any]:
    return shared_run("lm_shared diloco", [
        "recipe=lm/shakespeare_gpu", "algo=diloco", "launch.nproc=8", "dist.device=auto",
        f"train.max_steps={args.lm_steps}", f"train.eval_every_steps={args.lm_steps}", "checkpoint.every_steps=null",
        "data.eval_windows=64"], Path(args.dir) / "runs" / "lm_shared_diloco")


def cifar_args(args: argparse.Namespace, model: str = "resnet18") -> list[str]:
    root = Path(args.dir) / f"cifar_{args.train_images}"
    write_cifar(root, args.train_images, 1000)
    return ["data=cifar10", f"data.root={root}", f"model={model}", f"train.batch_size={args.batch}",
            f"data.eval_batch_size={args.batch}", "train.precision=bf16", "launch.nproc=1", "checkpoint.every_epochs=null"]


class MetricsWatch:
    """The wall-clock at which each training record appears in metrics.jsonl (polled)."""

    def __init__(self, path: Path) -> None:
        self.path, self.seen, self.stop = path, [], False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        done = 0
        while not self.stop:
            if self.path.exists():
                lines = self.path.read_text().splitlines()
                now = time.time()
                for ln in lines[done:]:
                    if ln.endswith("}"):
                        rec = json.loads(ln)
                        if rec.get("kind") == "train":
                            self.seen.append((now, rec["step"]))
                        done += 1
            time.sleep(0.005)

    def close(self) -> list[tuple[float, int]]:
        self.stop = True
        self.thread.join()
        return self.seen


def wall(args: argparse.Namespace) -> dict[str, Any]:
    run_dir = Path(args.dir) / "runs" / "wall"
    watch = MetricsWatch(run_dir / "metrics.jsonl")
    proc = cli(cifar_args(args) + ["data.pipeline=device", f"train.epochs={args.epochs}", "train.log_every_steps=5",
                                   "train.eval_every_epochs=null"], run_dir)
    seen = watch.close()
    if proc.returncode:
        print(f"wall: the run failed\n{tail(proc)}", flush=True)
        return {"ok": False}
    s = summary_of(run_dir)
    (t0, step0), (t1, step1) = seen[0], seen[-1]
    by_wall = (step1 - step0) * s["global_batch"] / (t1 - t0)
    ratio = s["samples_per_s"] / by_wall
    out = {"ok": abs(ratio - 1) <= 0.05, "summary_samples_per_s": round(s["samples_per_s"], 1),
           "wall_clock_samples_per_s": round(by_wall, 1), "ratio": round(ratio, 4), "steps": s["steps"],
           "log_lines": len(seen), "mfu": s.get("mfu"), "model_flops_per_sample": s.get("model_flops_per_sample"),
           "peak_flops_per_gpu": s.get("peak_flops_per_gpu"), "samples_per_s_per_gpu": s.get("samples_per_s_per_gpu"),
           "data_wait_frac": round(s["data_wait_frac"], 4), "train_s": s["train_s"], "wall_s": s["wall_s"]}
    print(f"wall: {out}", flush=True)
    return out


def exit_after_summary(name: str, args: list[str], run_dir: Path) -> dict[str, Any]:
    """cli.py with `args`: seconds from summary.json's writing to the process's exit (target 3 s:
    loader workers and ranks must not hold the job up), and the summary."""
    cmd = [sys.executable, str(REPO / "cli.py"), *args, f"hydra.run.dir={run_dir}", "train.progress=false"]
    t0 = time.perf_counter()
    # (the output goes to a file: a pipe nobody reads would fill and stall the ranks)
    with open(run_dir.parent / f"{run_dir.name}.out", "w+") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, text=True)
        summary = run_dir / "summary.json"
        written = None
        while proc.poll() is None:
            if written is None and summary.exists():
                written = time.time()
            time.sleep(0.01)
        ended = time.time()
        log.seek(0)
        output = log.read()
    if proc.returncode or written is None:
        print(f"{name}: the run failed (exit {proc.returncode})\n{output[-3000:]}", flush=True)
        return {"ok": False}
    s = summary_of(run_dir)
    out = {"ok": ended - written <= 3.0, "exit_after_summary_s": round(ended - written, 2), "steps": s.get("steps"),
           "samples_per_s": s.get("samples_per_s"), "data_wait_frac": s.get("data_wait_frac"),
           "wall_s": round(time.perf_counter() - t0, 1)}
    print(f"{name}: {out}", flush=True)
    return out


def workers(args: argparse.Namespace) -> dict[str, Any]:
    run_dir = Path(args.dir) / "runs" / "workers"
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    return exit_after_summary("workers", [*cifar_args(args, "resnet20"), "data.pipeline=torchvision",
                                          "data.num_workers=14", "train.epochs=1", "train.eval_every_epochs=1"],
                              run_dir)


def dali_shared(args: argparse.Namespace) -> dict[str, Any]:
    """ResNet-50 at 224 px through DALI, 14 loader threads, DiLoCo on 4 ranks sharing the GPU, a
    global batch of 256 (64 a rank: four ranks of 256 would not fit one 80 GB GPU), bf16."""
    root = Path(args.dir) / f"imagenet_{args.dali_images}"
    write_imagenet(root, args.dali_images, IMAGENET_CLASSES * 2, 14)
    run_dir = Path(args.dir) / "runs" / "dali_shared_diloco"
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    return exit_after_summary("dali_shared", [
        "data=imagenet", f"data.root={root}", "data.pipeline=dali", "data.num_workers=14", "data.val_per_class=1",
        f"model={args.dali_model}", "train.global_batch_size=256", "algo=diloco", "launch.nproc=4",
        "dist.device=auto", f"train.max_steps={args.dali_steps}", "train.eval_every_epochs=null",
        "checkpoint.every_epochs=null"], run_dir)


def compile_check(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode in ("eager", "compile"):
        run_dir = Path(args.dir) / "runs" / f"compile_{mode}"
        proc = cli(cifar_args(args) + ["data.pipeline=device", f"train.epochs={args.compile_epochs}",
                                       "train.log_every_steps=5", "train.eval_every_epochs=1", f"train.compile={mode == 'compile'}"],
                   run_dir, env={"TORCH_LOGS": "recompiles"}, timeout=900)
        if proc.returncode:
            print(f"compile {mode}: the run failed\n{tail(proc)}", flush=True)
            return {"ok": False}
        logs = "\n".join(p.read_text() for p in sorted((run_dir / "logs").glob("rank_*.log")))
        recompiles = len(re.findall(r"Recompiling function", proc.stdout + proc.stderr + logs))
        s = summary_of(run_dir)
        out[mode] = {"samples_per_s": round(s["samples_per_s"], 1), "warmup_s": s.get("warmup_s"), "recompilations": recompiles,
                     "train_s": s["train_s"], "wall_s": s["wall_s"], "epochs": s["epochs"]}
    out["compile_vs_eager"] = round(out["compile"]["samples_per_s"] / out["eager"]["samples_per_s"], 3)
    out["ok"] = out["compile"]["recompilations"] == 0
    print(f"compile: {out}", flush=True)
    return out


CHECKS = {"shared": shared, "lm_shared": lm_shared, "dali_shared": dali_shared, "wall": wall, "workers": workers, "compile": compile_check}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default=",".join(CHECKS), help=f"comma-separated, of {', '.join(CHECKS)}")
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--train-images", type=int, default=50000)
    p.add_argument("--epochs", type=int, default=10, help="of the `wall` run")
    p.add_argument("--compile-epochs", type=int, default=3, help="of each `compile` run (evaluated every epoch)")
    p.add_argument("--lm-steps", type=int, default=300, help="of the `lm_shared` run")
    p.add_argument("--dali-images", type=int, default=8192, help="generated training JPEGs of `dali_shared`")
    p.add_argument("--dali-steps", type=int, default=40, help="of the `dali_shared` run")
    p.add_argument("--dali-model", default="resnet50")
    p.add_argument("--dir", default="/tmp/syncopt_gpu_checks")
    args = p.parse_args()
    import torch

    results: dict[str, Any] = {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"}
    for name in args.only.split(","):
        results[name] = CHECKS[name](args)
    print(json.dumps(results))
    sys.exit(0 if all(r.get("ok", all(v.get("ok") for v in r.values() if isinstance(v, dict)))
                      for k, r in results.items() if k != "device") else 1)


if __name__ == "__main__":
    main()
