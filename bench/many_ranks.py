#!/usr/bin/env python
"""Start-up of many ranks on one machine: DeepSpeed's launcher against `launch.launcher=fork`.

    python bench/many_ranks.py                                  # digits: fork at 16, 64; launcher at 16, 32
    python bench/many_ranks.py --fork 16 64 --launcher 8 16
    python bench/many_ranks.py --fork 128 --launcher --batch 8       # 128 ranks of digits
    python bench/many_ranks.py --job mnist1d --fork 16 64 --launcher 16

One run, both starts, the same job: the default digits job (`--job digits`, the default: small
CNN, batch 16 per rank, allreduce, a few steps, no evaluation but the final one) or the MNIST-1D
job (`--job mnist1d`: data=mnist1d model=mnist1d_cnn on 60,000 training and 10,000 test samples,
batch 16 per rank). Each point is a fresh `python cli.py ...` in its own run directory; what is measured:

- **start-up**: from the moment cli.py is started to the first `train` line of metrics.jsonl,
  which the reporting rank writes once step 1 is done (`train.log_every_steps=1`). Under
  allreduce that step ends only when every rank has reduced its first gradients, so it is the
  time to *every* rank's first step. Polled every 20 ms;
- **CPU to the first step**: user + system seconds of cli.py and every process under it (the
  launcher or the group leader, the ranks, what they have reaped) from /proc/<pid>/stat when the
  first step is seen: the figure the machine's other load moves least;
- **job**: cli.py's whole wall-clock (start-up, the steps, the final evaluation and checkpoint);
- **memory**, sampled once after the first step from /proc/<pid>/smaps_rollup of every rank (its
  pid file) and of cli.py (and, forked, the group leader): per rank its USS (private pages: what
  one more rank costs) and PSS (its share of everything it maps), and the whole job's PSS;
- **limits**: the most open file descriptors of a rank, TCP sockets on this machine
  (/proc/net/tcp: both ends of every loopback connection, gloo's full mesh among them), the load
  average before the point.

A launcher point that would take too long can be left out: the launcher's start-up is close to
linear in the ranks (each rank an interpreter that composes, imports and plans: seconds of CPU
on two shared cores), so its figure at the largest fork point is extrapolated from the measured
ones by a least-squares line and printed as such, never as a measurement. Prints a table, the
ratios launcher / fork at equal ranks, and one JSON line with every figure. The machine's other
load moves every figure; the load average is printed beside each.

Bytecode: where PYTHONDONTWRITEBYTECODE is set (this development machine) every launched rank
compiles the project's and its libraries' modules from source, a cost a user's machine does not
have. `--bytecode cached` (the default) lets every process of both starts use a bytecode cache of
this run's own (PYTHONPYCACHEPREFIX), filled before the first point by a forked 2-rank run of the
job and an import of DeepSpeed's launcher; `--bytecode env` keeps the environment's setting.

Memory: a launched rank of the MNIST-1D job generates the 70,000 samples itself (about 0.7 GB at
its peak), so the launcher at 32 ranks of it needs more than this machine's 24 GB; launcher points
of that job above 16 are refused here (the digits job's ranks take about 0.4 GB each).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from engine.launch.procs import descendants  # noqa: E402  (the repository is on the path from here on)

JOBS = {
    "mnist1d": ["data=mnist1d", "model=mnist1d_cnn", "data.num_samples=70000", "data.test_fraction=0.142857142857",
                "data.val_fraction=0"],
    "digits": [],
}
COMMON = ["algo=allreduce", "train.log_every_steps=1", "train.eval_every_epochs=null",
          "train.eval_every_steps=null", "checkpoint.every_epochs=null", "checkpoint.every_steps=null",
          "train.progress=false", "dist.device=cpu"]


def smaps(pid: int) -> Optional[dict[str, int]]:
    """kB of Pss and of private pages (USS) of a process; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    kb = {line.split(":")[0]: int(line.split()[1]) for line in text.splitlines()[1:] if line.split()[-1] == "kB"}
    return {"pss": kb.get("Pss", 0), "uss": kb.get("Private_Clean", 0) + kb.get("Private_Dirty", 0)}


def rank_pids(run_dir: Path) -> list[int]:
    pids = []
    for f in sorted((run_dir / "logs").glob("rank_*.pid")):
        try:
            pids.append(int(f.read_text().split()[0]))
        except (OSError, ValueError, IndexError):
            pass
    return pids


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds the processes have used, with their children that they have
    reaped (cutime, cstime): at the first step every rank is alive, so this is the job's CPU to it."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime (fields 14-17)
    return total / os.sysconf("SC_CLK_TCK")


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def tcp_sockets() -> int:
    count = 0
    for name in ("tcp", "tcp6"):
        try:
            count += len(Path(f"/proc/net/{name}").read_text().splitlines()) - 1
        except OSError:
            pass
    return count


def first_step_seen(metrics: Path) -> bool:
    try:
        with open(metrics) as fh:
            return any(json.loads(line).get("kind") == "train" for line in fh if line.strip())
    except (OSError, ValueError):
        return False


def job_env(out: Path, bytecode: str) -> dict[str, str]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    if bytecode == "cached":
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(out / "pycache")
    return env


def warm_cache(job: str, out: Path, env: dict[str, str]) -> None:
    """Fill the bytecode cache with what a rank and DeepSpeed's launcher import."""
    subprocess.run([sys.executable, "-c", "import deepspeed.launcher.launch"], env=env, cwd=REPO,
                   capture_output=True, check=False)
    subprocess.run([sys.executable, str(REPO / "cli.py"), *JOBS[job], *COMMON, "train.max_steps=1", "launch.nproc=2",
                    "launch.launcher=fork", f"hydra.run.dir={out / 'warm'}"], env=env, cwd=REPO, capture_output=True,
                   check=False)


def measure(start: str, nproc: int, job: str, steps: int, batch: int, out: Path, timeout_s: float,
            env: dict[str, str]) -> dict[str, Any]:
    """One point: cli.py with `nproc` ranks under `start` (deepspeed | fork)."""
    run_dir = out / f"{start}_{nproc}"
    args = [*JOBS[job], *COMMON, f"train.batch_size={batch}", f"train.max_steps={steps}", f"launch.nproc={nproc}",
            f"launch.launcher={start}",
            f"hydra.run.dir={run_dir}"]
    load = os.getloadavg()[0]
    log = open(out / f"{start}_{nproc}.log", "w")
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, str(REPO / "cli.py"), *args], cwd=REPO, env=env, stdout=log,
                            stderr=subprocess.STDOUT)
    first: Optional[float] = None
    memory: dict[str, Any] = {}
    while proc.poll() is None and time.monotonic() - t0 < timeout_s:
        if first is None and first_step_seen(run_dir / "metrics.jsonl"):
            first = time.monotonic() - t0
            cpu = cpu_seconds([proc.pid, *descendants(proc.pid)])
            memory = {"startup_cpu_s": round(cpu, 1), **sample_memory(proc.pid, run_dir)}
        time.sleep(0.02)
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    job_s = time.monotonic() - t0
    log.close()
    ok = proc.returncode == 0 and (run_dir / "summary.json").exists()
    return {"start": start, "nproc": nproc, "ok": ok, "code": proc.returncode, "startup_s": first,
            "job_s": round(job_s, 2), "load_before": round(load, 2), **memory,
            "log": str(out / f"{start}_{nproc}.log")}


def sample_memory(cli_pid: int, run_dir: Path) -> dict[str, Any]:
    ranks = [m for m in (smaps(p) for p in rank_pids(run_dir)) if m is not None]
    rank_set = set(rank_pids(run_dir))  # the rest: cli.py, the launcher or the group leader
    others = [m for m in (smaps(p) for p in [cli_pid, *descendants(cli_pid)] if p not in rank_set) if m is not None]
    fds = max((open_fds(p) for p in rank_pids(run_dir)), default=None)
    if not ranks:
        return {}
    uss = sorted(m["uss"] for m in ranks)
    pss = sorted(m["pss"] for m in ranks)
    return {"rank_uss_mb": round(uss[len(uss) // 2] / 1024, 1), "rank_pss_mb": round(pss[len(pss) // 2] / 1024, 1),
            "job_pss_mb": round((sum(pss) + sum(m["pss"] for m in others)) / 1024, 1),
            "rank_fds_max": fds, "tcp_sockets": tcp_sockets()}


def extrapolate(points: list[tuple[int, float]], n: int) -> Optional[float]:
    """A least-squares line through (ranks, seconds), read at n; None with fewer than two points."""
    if len(points) < 2:
        return None
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my + slope * (n - mx)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fork", type=int, nargs="*", default=[16, 64], help="ranks under launch.launcher=fork")
    parser.add_argument("--launcher", type=int, nargs="*", default=[16, 32], help="ranks under DeepSpeed's launcher")
    parser.add_argument("--job", choices=sorted(JOBS), default="digits")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=16,
                        help="per rank (digits has 1,293 training samples: 128 ranks need a batch of 10 or less)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds one point may take")
    parser.add_argument("--dir", type=Path, default=None, help="where the runs go (default: a temporary folder)")
    parser.add_argument("--bytecode", choices=("cached", "env"), default="cached")
    args = parser.parse_args()
    if args.job == "mnist1d" and any(n > 16 for n in args.launcher):
        parser.error("--launcher above 16 ranks of the MNIST-1D job needs more memory than this machine has "
                     "(each launched rank generates the set: ~0.7 GB); use --job digits or fewer ranks")
    out = args.dir or Path(tempfile.mkdtemp(prefix="syncopt-many-ranks-"))
    out.mkdir(parents=True, exist_ok=True)
    env = job_env(out, args.bytecode)
    if args.bytecode == "cached":
        warm_cache(args.job, out, env)
    order = sorted({("deepspeed", n) for n in args.launcher} | {("fork", n) for n in args.fork}, key=lambda p: (p[1], p[0]))
    results = []
    for start, n in order:  # by ranks, both starts side by side, so that they see similar load
        r = measure(start, n, args.job, args.steps, args.batch, out, args.timeout, env)
        results.append(r)
        print(f"{start:9s} {n:4d} ranks: start-up {fmt(r['startup_s'])} s, job {r['job_s']:.1f} s, "
              f"CPU to the first step {fmt(r.get('startup_cpu_s'))} s"
              f"{'' if r['ok'] else ' FAILED (see ' + r['log'] + ')'}", flush=True)
    print()
    print(f"{args.job} job, {args.steps} steps of allreduce, batch {args.batch} per rank; {os.cpu_count()} cores; bytecode "
          f"{args.bytecode}; runs in {out}")
    print(f"{'start':9s} {'ranks':>5s} {'start-up s':>10s} {'job s':>7s} {'CPU s':>6s} {'USS/rank MB':>11s} {'PSS/rank MB':>11s} "
          f"{'job PSS MB':>10s} {'fds':>6s} {'tcp':>6s} {'load':>5s}")
    for r in results:
        print(f"{r['start']:9s} {r['nproc']:5d} {fmt(r['startup_s']):>10s} {r['job_s']:7.1f} {fmt(r.get('startup_cpu_s')):>6s} {fmt(r.get('rank_uss_mb')):>11s} "
              f"{fmt(r.get('rank_pss_mb')):>11s} {fmt(r.get('job_pss_mb')):>10s} {fmt(r.get('rank_fds_max')):>6s} "
              f"{fmt(r.get('tcp_sockets')):>6s} {r['load_before']:5.2f}")
    launched = [(r["nproc"], r["startup_s"]) for r in results if r["start"] == "deepspeed" and r["ok"] and r["startup_s"]]
    forked = {r["nproc"]: r["startup_s"] for r in results if r["start"] == "fork" and r["ok"] and r["startup_s"]}
    ratios, estimates = {}, {}
    print()
    for n, s in sorted(forked.items()):
        measured = dict(launched).get(n)
        if measured is not None:
            ratios[n] = measured / s
            print(f"{n:4d} ranks: launcher {measured:.1f} s / fork {s:.1f} s = {ratios[n]:.1f}x (both measured); "
                  f"{same_result(out / f'deepspeed_{n}', out / f'fork_{n}')}")
        else:
            guess = extrapolate(launched, n)
            if guess is not None:
                estimates[n] = guess
                print(f"{n:4d} ranks: launcher ~{guess:.0f} s (EXTRAPOLATED from {[p[0] for p in launched]} ranks) "
                      f"/ fork {s:.1f} s = ~{guess / s:.0f}x")
    print(json.dumps({"job": args.job, "bytecode": args.bytecode, "results": results, "launcher_over_fork": ratios,
                      "launcher_extrapolated_s": estimates}))


def same_result(launched: Path, forked: Path) -> str:
    """Whether the two starts of the same job ended on the same test loss, accuracy and bytes sent
    (the suite checks the final states bit for bit at 4 ranks, tests/test_fork_launch.py; this
    is the same check, summarised, at every rank count both starts ran)."""
    try:
        a, b = (json.loads((d / "summary.json").read_text()) for d in (launched, forked))
    except (OSError, ValueError):
        return "results not compared (a summary is missing)"
    keys = ("test_loss", "test_acc", "comm_bytes")
    if all(a.get(k) == b.get(k) for k in keys):
        return "the same test loss, accuracy and bytes sent"
    return "RESULTS DIFFER: " + ", ".join(f"{k} {a.get(k)} vs {b.get(k)}" for k in keys if a.get(k) != b.get(k))


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.1f}" if isinstance(value, float) else str(value)


if __name__ == "__main__":
    main()
