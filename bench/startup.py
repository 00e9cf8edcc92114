"""The default job end to end against the same work in bare PyTorch DDP, and what a rank imports.

Two measurements, both of what a user pays for the runner on the default job (digits, small CNN,
allreduce, 4 gloo ranks; bench/bare_ddp.py is the same work without the runner):

- `pairs` (default): three commands timed end to end (process start to exit) in rounds: the
  default start, `python cli.py hydra.run.dir=TMP` (launch.launcher=auto: the ranks forked from
  cli.py on one machine), DeepSpeed's launcher, `python cli.py launch.launcher=deepspeed
  hydra.run.dir=TMP`, and `python bench/bare_ddp.py --out TMP`. Each round runs the three in an
  order rotated by one from the round before, so that a machine that slows down or speeds up
  during the run burdens each alike; each round gives default / bare, launcher / bare and
  default / launcher, and the median of each over the rounds is the figure (target: default /
  bare <= 1.0). Every run's test accuracy and loss are printed beside the times, a check that
  each did the whole job (the two starts give the same run, to the last digit).
- `imports`: one rank of each, a world of one, profiled with `python -X importtime` up to the end
  of its first step (the runner's rank is stopped there by `faults.kill=[0@1]`, the bare one by
  `--max-steps 1`), a few times each; the modules the runner's rank imports and the bare one does
  not, by package (the project's own by subpackage), with the milliseconds of their own import
  time (median over the repeats): what the runner adds to the start of every rank. Modules both
  import (torch, and torch._dynamo behind every optimizer's first call) cost both alike.

    .venv/bin/python bench/startup.py [pairs] [--pairs 4] [--bytecode cached|env]
    .venv/bin/python bench/startup.py imports [--repeats 3] [--top 40] [--bytecode cached|env]

Bytecode: with PYTHONDONTWRITEBYTECODE set (as on the shared development machine) nothing is
cached and every process compiles every module it imports from source: the runner's ~150 modules
in the launching process and in each rank (about a second each on a loaded 2-core machine), the
bare script's one file. `--bytecode cached` (the default) times both with Python's cache on, as a
user's machine has it, in a cache tree of this run's own; `--bytecode env` leaves the environment's
setting (both for `pairs` and `imports`).

The last line printed is a JSON object for scripts. Timings on a shared machine are noisy: the
ratio of a pair is more stable than either time, and the median of pairs more than one pair.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable

sys.path.insert(0, str(REPO))
from bench.bare_ddp import small_cnn as bare_cnn  # noqa: E402
from models.small_cnn import small_cnn  # noqa: E402
PROJECT = ("cli", "core", "data", "models", "dist_algos", "engine", "bare_ddp")


# ---- end to end ----------------------------------------------------------------------------------

def timed(cmd: list[str], out: Path, summary: Path) -> tuple[float, float, float]:
    """(wall seconds of the command, its run's test accuracy, its test loss)."""
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=_env())
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"startup: {' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result = json.loads(summary.read_text())
    return wall, float(result["test_acc"]), float(result["test_loss"])


#: where both commands keep Python's compiled bytecode (None: as the environment says)
PYCACHE: list[str] = []


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = ""  # the default job on a GPU machine would use the GPUs; bare uses the CPU
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    if PYCACHE:  # bytecode cached as on a user's machine, in a tree of its own (nothing written beside the sources)
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = PYCACHE[0]
    return env


#: the three commands of a round: the default start, DeepSpeed's launcher, the bare script
COMMANDS = {
    "default": lambda out: [PY, "cli.py", f"hydra.run.dir={out}"],
    "launcher": lambda out: [PY, "cli.py", "launch.launcher=deepspeed", f"hydra.run.dir={out}"],
    "bare": lambda out: [PY, "bench/bare_ddp.py", "--out", str(out)],
}
#: the ratios reported, each the median over rounds of (numerator's time / denominator's)
RATIOS = (("default", "bare"), ("launcher", "bare"), ("default", "launcher"))


def pairs(n: int, bytecode: str) -> dict[str, Any]:
    """`n` rounds of the three commands (module docstring); the median ratios."""
    check_same_model()
    kinds = list(COMMANDS)
    rows = []
    with tempfile.TemporaryDirectory(prefix="syncopt-startup-") as tmp:
        if bytecode == "cached":
            PYCACHE.append(str(Path(tmp) / "pycache"))
            for kind in kinds:  # fills the cache (DeepSpeed's launcher has modules of its own); not timed
                out = Path(tmp) / f"warm_{kind}"
                timed(COMMANDS[kind](out), out, out / "summary.json")
        for i in range(n):
            order = kinds[i % len(kinds):] + kinds[:i % len(kinds)]
            runs: dict[str, tuple[float, float, float]] = {}
            for kind in order:
                out = Path(tmp) / f"{kind}_{i}"
                runs[kind] = timed(COMMANDS[kind](out), out, out / "summary.json")
            row: dict[str, Any] = {"order": order}
            for kind, (wall, acc, loss) in runs.items():
                row.update({f"{kind}_s": round(wall, 2), f"{kind}_test_acc": acc, f"{kind}_test_loss": loss})
            for a, b in RATIOS:
                row[f"{a}/{b}"] = round(runs[a][0] / runs[b][0], 3)
            rows.append(row)
            print(f"round {i + 1}/{n} ({' '.join(order)}): "
                  + "  ".join(f"{k} {runs[k][0]:6.2f} s (test_acc {runs[k][1]:.4f}, loss {runs[k][2]:.6f})" for k in kinds)
                  + "  " + "  ".join(f"{a}/{b} {row[f'{a}/{b}']:.3f}" for a, b in RATIOS), flush=True)
    medians = {f"{a}/{b}": round(statistics.median(r[f"{a}/{b}"] for r in rows), 3) for a, b in RATIOS}
    times = {k: round(statistics.median(r[f"{k}_s"] for r in rows), 2) for k in kinds}
    print(f"medians of {n} rounds: " + ", ".join(f"{k} {v:.3f}" for k, v in medians.items())
          + "  (times: " + ", ".join(f"{k} {v:.2f} s" for k, v in times.items()) + ")")
    return {"bench": "startup", "bytecode": bytecode, "rounds": rows, "median_ratios": medians, "median_s": times}


def check_same_model() -> None:
    """bare_ddp's network is models/small_cnn at its defaults: the same tensors from the same seed."""
    torch.manual_seed(0)
    ours = small_cnn(1, 8, 10).state_dict()
    torch.manual_seed(0)
    bare = bare_cnn().state_dict()
    same = ours.keys() == bare.keys() and all(torch.equal(ours[k], bare[k]) for k in ours)
    if not same:
        sys.exit("startup: bench/bare_ddp.py's network is no longer models/small_cnn at its defaults")


# ---- imports -------------------------------------------------------------------------------------

_LINE = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|\s*(\S+)")


def import_profile(cmd: list[str], env: dict[str, str]) -> dict[str, int]:
    """Microseconds of each module's own import time in the process `cmd` starts."""
    proc = subprocess.run([PY, "-X", "importtime", *cmd], cwd=REPO, capture_output=True, text=True, env=env)
    spent = {match[3]: int(match[1]) for match in _LINE.finditer(proc.stderr)}
    if not spent:
        sys.exit(f"startup: no import profile from {' '.join(cmd)}:\n{proc.stderr[-2000:]}")
    return spent


def group_of(module: str) -> str:
    """A third-party package by its top-level name; the project's own modules by their package."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] in PROJECT and len(parts) > 2 else parts[0]


def imports(repeats: int, top: int, bytecode: str) -> dict[str, Any]:
    """What one rank of the runner imports that the bare rank does not (median over `repeats`
    profiles of each, after one that fills the bytecode cache), by package; and both ranks'
    total import time."""
    runner_runs, bare_runs = [], []
    with tempfile.TemporaryDirectory(prefix="syncopt-imports-") as tmp:
        if bytecode == "cached":
            PYCACHE.append(str(Path(tmp) / "pycache"))
        for i in range(repeats + 1):
            rank_env = {**_env(), "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_SIZE": "1",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "OMP_NUM_THREADS": "1"}
            # the runner's rank dies (SIGKILL) once it has finished step 1: what it imported until then
            runner_runs.append(import_profile(["cli.py", f"hydra.run.dir={tmp}/runner_{i}", "faults.kill=[0@1]"],
                                              rank_env))
            bare_runs.append(import_profile(["bench/bare_ddp.py", "--nproc", "1", "--max-steps", "1",
                                             "--out", f"{tmp}/bare_{i}"], {**_env(), "OMP_NUM_THREADS": "1"}))
    runner_runs, bare_runs = runner_runs[1:], bare_runs[1:]  # the first filled the cache
    bare_modules = set().union(*bare_runs)
    per_run = [Counter() for _ in runner_runs]
    counts: Counter = Counter()
    for run, grouped in zip(runner_runs, per_run):
        for module, us in run.items():
            if module not in bare_modules:
                grouped[group_of(module)] += us
    for module in set().union(*runner_runs) - bare_modules:
        counts[group_of(module)] += 1
    groups = sorted(counts, key=lambda g: -statistics.median(r[g] for r in per_run))
    rows = [{"package": g, "ms": round(statistics.median(r[g] for r in per_run) / 1000, 1), "modules": counts[g]}
            for g in groups]
    print(f"imported by a runner rank before its first step, not by the bare rank (median of {repeats}):")
    print(f"{'package':32s} {'ms':>8s} {'modules':>8s}")
    for r in rows[:top]:
        print(f"{r['package']:32s} {r['ms']:8.1f} {r['modules']:8d}")
    added = statistics.median(sum(r.values()) for r in per_run) / 1000
    total_r = statistics.median(sum(r.values()) for r in runner_runs) / 1000
    total_b = statistics.median(sum(r.values()) for r in bare_runs) / 1000
    print(f"{'runner-only, all':32s} {added:8.1f}")
    print(f"all imports: runner rank {total_r:.1f} ms, bare rank {total_b:.1f} ms (medians)")
    return {"bench": "imports", "bytecode": bytecode, "repeats": repeats, "runner_ms": round(total_r, 1), "bare_ms": round(total_b, 1),
            "runner_only_ms": round(added, 1), "rows": rows[:top]}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", nargs="?", choices=("pairs", "imports"), default="pairs")
    parser.add_argument("--pairs", type=int, default=4, help="rounds of the three runs, in rotated order (pairs)")
    parser.add_argument("--bytecode", choices=("cached", "env"), default="cached",
                        help="cached = Python's bytecode cache on for both (a cache of the run's own, "
                             "filled by one untimed run of each); env = as this environment has it")
    parser.add_argument("--top", type=int, default=40, help="packages shown (imports)")
    parser.add_argument("--repeats", type=int, default=3, help="profiles of each rank (imports)")
    args = parser.parse_args()
    result = pairs(args.pairs, args.bytecode) if args.what == "pairs" else imports(args.repeats, args.top, args.bytecode)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
