#!/usr/bin/env python
"""Throughput under load imbalance: WAGMA-SGD against allreduce, local SGD (H = tau) and D-PSGD.

    .venv/bin/python bench/imbalance.py                 # 4 and 8 ranks, settings A and B
    .venv/bin/python bench/imbalance.py --ranks 4 --steps 300

Every algorithm runs the real trainer (engine/rank/trainer.py, composed from conf/ exactly as cli.py
does) on gloo ranks on this machine, with the same tiny model, the same data and the same
injected delays (the runner's own injector, `train.imbalance.*`: the same seeded schedule of
which rank is delayed at which step, and the same fixed delay in milliseconds):

- setting A, random imbalance: every rank, independently each step, is delayed by 4x the median
  undelayed step time with probability 0.2 (the kind of imbalance uneven sample lengths cause);
- setting B, one persistently slow rank: rank 1 takes twice as long every step;
- setting 0, no injected delay: the reference that separates what a method gains from
  communicating less (or in the background) from what it gains by not waiting for stragglers.

The median undelayed step time c is measured first, per world size, by a short allreduce run in
which the injector calibrates itself (factor mode): c = its injected seconds / (4 x the steps it
delayed). The delay schedule of every setting is replayed here from the injector's seeds, which
gives the ideal ratio no method can beat with a staleness bound of tau: per tau-block, a
synchronous method needs sum over steps of the slowest rank's step time, a perfectly
wait-avoiding one the largest per-rank sum of own step times; ideal = sum of the former / sum
of the latter. Samples per second are the trainer's own (samples over the reporting rank's
training-loop time; runs end on a global sync so every rank has then done the same work).
Eval, checkpoints and the trainer's periodic stop-signal agreement (a global sync) are pushed
past the end of the run, the same for every algorithm.

Prints a table, then as its last line a JSON object: wagma_sps, allreduce_sps, local_sgd_sps,
dpsgd_sps (setting A, 4 ranks), wagma_vs_allreduce, ideal_vs_allreduce, wagma_vs_ideal, and
every measured row under "runs". local_sgd needs the local_sgd plugin (another branch): it is
skipped, with a note, where that is not registered. Timings on a loaded machine are noisy; all
ratios come from runs made in the same invocation.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dist_algos import list_algorithms  # noqa: E402
from engine.train.imbalance import ImbalanceConfig  # noqa: E402
from engine.train.imbalance import ImbalanceInjector  # noqa: E402
from tests.support.harness import run_ranks, train_in_rank  # noqa: E402

FACTOR, PROB = 4.0, 0.2  # setting A: 4x the median step time, probability 0.2 per rank per step
SLOW_RANK, SLOW_FACTOR = 1, 2.0  # setting B: rank 1 takes twice as long every step
SEED = 1234


def algo_overrides(name: str, tau: int, group_size: int) -> Optional[list[str]]:
    """The config of each compared algorithm, or None when it is not available here."""
    if name == "wagma":
        return ["algo=wagma", f"algo.group_size={group_size}", f"algo.global_period={tau}", "algo.wait_avoiding=true"]
    if name == "local_sgd":
        if "local_sgd" not in list_algorithms():
            return None
        return ["algo=local_sgd", "algo.sync_schedule=constant", f"algo.period={tau}"]
    return [f"algo={name}"]


def common_overrides(args: argparse.Namespace, steps: int) -> list[str]:
    never = 10 ** 9
    return ["model=small_cnn", f"model.width={args.width}", f"train.batch_size={args.batch_size}",
            f"train.max_steps={steps}", "train.eval_every_epochs=null", "train.eval_every_steps=null",
            "checkpoint.every_epochs=null", "checkpoint.keep_best=false", f"train.log_every_steps={never}",
            f"train.preempt_check_every={never}", "resume=null", "sched=constant", f"seed={args.seed}"]


def quiet_train_in_rank(rank: int, world: int, overrides: list[str], run_dir: str) -> Any:
    """The trainer on this rank, its end-of-run table kept off the bench's stdout."""
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        return train_in_rank(rank, world, overrides, run_dir)


def run(world: int, overrides: list[str], timeout: float, attempts: int = 2) -> dict[str, Any]:
    """One training run on `world` gloo ranks; the reporting rank's summary.json content.
    A run whose ranks fail to connect (a loopback port taken between choosing and binding it,
    on a busy machine) is started again once; any other failure still ends the bench."""
    for attempt in range(attempts):
        try:
            with tempfile.TemporaryDirectory(prefix="bench_imbalance_") as tmp:
                results = run_ranks(quiet_train_in_rank, world, overrides, tmp, timeout=timeout)
            return next(r for r in results if r is not None)
        except AssertionError as err:
            if attempt + 1 == attempts or "Connection" not in str(err):
                raise
            print(f"  (ranks failed to connect, starting the run again: {str(err).splitlines()[-1][:120]})",
                  file=sys.stderr, flush=True)
    raise AssertionError("unreachable")


def replay(world: int, steps: int, cfg: ImbalanceConfig, undelayed_s: float) -> list[list[float]]:
    """The delays (seconds) the trainer's injector adds on each rank at each step: the same
    seeded draws, one per step, as `ImbalanceInjector.inject` makes."""
    out = []
    for rank in range(world):
        injector = ImbalanceInjector(cfg, rank)
        delays = []
        for step in range(steps):
            injector.observe(undelayed_s)
            delays.append(injector.delay_for(step))
        out.append(delays)
    return out


def calibrate(world: int, args: argparse.Namespace) -> float:
    """The median undelayed step time c, as the runner's injector measures it over its first
    steps (in synchronous training, so with every rank computing at once): a short allreduce
    run in factor mode delays FACTOR x c at every hit after calibration; c = seconds / (FACTOR x hits)."""
    steps = args.calibration_steps
    cfg = ImbalanceConfig(factor=FACTOR, prob=PROB, seed=SEED)
    injector = [f"train.imbalance.factor={FACTOR}", f"train.imbalance.prob={PROB}", f"train.imbalance.seed={SEED}"]
    summary = run(world, common_overrides(args, steps) + ["algo=allreduce", *injector], args.timeout)
    schedule = replay(world, steps, cfg, 1.0)
    per_rank = [injected / (FACTOR * hits) for injected, hits in
                zip(summary["imbalance_s"], (sum(d > 0 for d in delays) for delays in schedule)) if hits]
    return statistics.median(per_rank)


def settings(world: int, c: float) -> dict[str, tuple[ImbalanceConfig, list[str]]]:
    delay_a = round(FACTOR * c * 1000, 3)
    delay_b = round((SLOW_FACTOR - 1) * c * 1000, 3)
    a = ImbalanceConfig(delay_ms=delay_a, prob=PROB, seed=SEED)
    b = ImbalanceConfig(ranks=[SLOW_RANK], delay_ms=delay_b, prob=1.0, seed=SEED)
    none = ImbalanceConfig(delay_ms=0.0, prob=0.0, seed=SEED)
    return {
        "0": (none, ["train.imbalance.delay_ms=0", "train.imbalance.factor=0"]),
        "A": (a, [f"train.imbalance.delay_ms={delay_a}", f"train.imbalance.prob={PROB}",
                  f"train.imbalance.seed={SEED}", "train.imbalance.ranks=null"]),
        "B": (b, [f"train.imbalance.delay_ms={delay_b}", "train.imbalance.prob=1.0",
                  f"train.imbalance.seed={SEED}", f"train.imbalance.ranks=[{SLOW_RANK}]"]),
    }


def check_delays(summary: dict[str, Any], schedule: list[list[float]], what: str) -> None:
    """The run injected exactly the replayed schedule (so every algorithm got the same delays)."""
    for rank, injected in enumerate(summary["imbalance_s"]):
        if abs(injected - sum(schedule[rank])) > 0.002:
            raise RuntimeError(f"{what}: rank {rank} injected {injected:.3f} s, the replayed schedule "
                               f"says {sum(schedule[rank]):.3f} s")


def ideal_ratio(delays: list[list[float]], c: float, tau: int) -> float:
    """Synchronous time / ideal bounded-staleness time for this delay schedule (see module doc)."""
    steps = len(delays[0])
    synchronous = sum(max(c + d[t] for d in delays) for t in range(steps))
    ideal = 0.0
    for start in range(0, steps, tau):
        ideal += max(sum(c + d[t] for t in range(start, min(start + tau, steps))) for d in delays)
    return synchronous / ideal


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[4, 8], help="world sizes (default 4 8)")
    parser.add_argument("--steps", type=int, default=200, help="training steps per run (a multiple of tau)")
    parser.add_argument("--tau", type=int, default=10, help="WAGMA's global period and local SGD's H")
    parser.add_argument("--group-size", type=int, default=2, help="WAGMA's group size")
    parser.add_argument("--width", type=int, default=32, help="small_cnn width (the tiny model)")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--algos", nargs="+", default=["allreduce", "wagma", "local_sgd", "dpsgd"])
    parser.add_argument("--settings", nargs="+", default=["0", "A", "B"], choices=["0", "A", "B"])
    parser.add_argument("--calibration-steps", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per run before it counts as hung")
    args = parser.parse_args()
    if args.steps % args.tau:
        parser.error(f"--steps={args.steps} must be a multiple of --tau={args.tau} (runs end on a global sync)")
    if "allreduce" not in args.algos:
        args.algos.insert(0, "allreduce")

    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    ideal: dict[tuple[int, str], float] = {}
    t_start = time.perf_counter()
    cores = os.cpu_count() or 1
    for world in args.ranks:
        if world > cores:
            notes.append(f"{world} ranks on {cores} cores: ranks that compute at the same time share cores, so "
                         "a rank's compute gets faster while others sleep; the ideal bound assumes independent "
                         "ranks and is then not a hard limit")
        c = calibrate(world, args)
        print(f"[{world} ranks] median undelayed step time c = {c * 1000:.2f} ms", file=sys.stderr, flush=True)
        for name, (cfg, overrides) in settings(world, c).items():
            if name not in args.settings:
                continue
            schedule = replay(world, args.steps, cfg, c)
            ideal[(world, name)] = ideal_ratio(schedule, c, args.tau)
            for algo in args.algos:
                extra = algo_overrides(algo, args.tau, args.group_size)
                if extra is None:
                    note = f"{algo}: not registered in this checkout, skipped"
                    if note not in notes:
                        notes.append(note)
                    continue
                summary = run(world, common_overrides(args, args.steps) + extra + overrides, args.timeout)
                check_delays(summary, schedule, f"{world} ranks, setting {name}, {algo}")
                row = {"ranks": world, "setting": name, "algo": algo, "sps": summary["samples_per_s"],
                       "train_s": summary["train_s"], "comm_s": summary["comm_s"],
                       "injected_s": round(sum(summary["imbalance_s"]), 3), "c_ms": round(c * 1000, 3)}
                stats = summary.get("algo_stats") or {}
                if "staleness_max" in stats:
                    row["staleness_max"] = stats["staleness_max"]
                    row["staleness_mean"] = round(stats["staleness_mean"], 3)
                    row["wait_global_s_max"] = max(stats["wait_global_s"])
                rows.append(row)
                print(f"  {world} ranks, setting {name}, {algo}: {row['sps']:.0f} samples/s",
                      file=sys.stderr, flush=True)

    def sps(world: int, setting: str, algo: str) -> Optional[float]:
        return next((r["sps"] for r in rows if (r["ranks"], r["setting"], r["algo"]) == (world, setting, algo)), None)

    for r in rows:
        base = sps(r["ranks"], r["setting"], "allreduce")
        r["vs_allreduce"] = round(r["sps"] / base, 3) if base else None
        bound = ideal[(r["ranks"], r["setting"])]
        r["vs_ideal"] = round(r["vs_allreduce"] / bound, 3) if r["vs_allreduce"] else None
    print_table(rows, ideal)
    for note in notes:
        print(f"note: {note}")
    world = 4 if 4 in args.ranks else args.ranks[0]
    headline: dict[str, Any] = {f"{a}_sps": sps(world, "A", a) for a in ("wagma", "allreduce", "local_sgd", "dpsgd")}
    wa, ar = headline["wagma_sps"], headline["allreduce_sps"]
    bound = ideal.get((world, "A"))
    headline.update(ranks=world, setting="A", wagma_vs_allreduce=round(wa / ar, 3) if wa and ar else None,
                    ideal_vs_allreduce=round(bound, 3) if bound else None)
    headline["wagma_vs_ideal"] = (round(headline["wagma_vs_allreduce"] / bound, 3)
                                  if headline["wagma_vs_allreduce"] and bound else None)
    headline.update(ideal={f"{w}_{s}": round(v, 3) for (w, s), v in ideal.items()}, notes=notes, runs=rows,
                    bench_s=round(time.perf_counter() - t_start, 1))
    print(json.dumps(headline))


def print_table(rows: list[dict[str, Any]], ideal: dict[tuple[int, str], float]) -> None:
    header = f"{'ranks':>5} {'set':>3} {'algorithm':<10} {'samples/s':>10} {'vs allreduce':>12} {'ideal':>6} " \
             f"{'of ideal':>8} {'train s':>8} {'comm s':>7} {'staleness max/mean':>18}"
    print(header)
    print("-" * len(header))
    for r in rows:
        stale = f"{r['staleness_max']}/{r['staleness_mean']:.2f}" if "staleness_max" in r else ""
        print(f"{r['ranks']:>5} {r['setting']:>3} {r['algo']:<10} {r['sps']:>10.0f} {r['vs_allreduce']:>11.2f}x "
              f"{ideal[(r['ranks'], r['setting'])]:>5.2f}x {r['vs_ideal']:>7.0%} {r['train_s']:>8.2f} "
              f"{r['comm_s']:>7.2f} {stale:>18}")
    print("setting 0: no delay; A: every rank delayed by 4x the median step time with probability 0.2 per "
          "step; B: rank 1 twice as slow every step. ideal: the best a method with staleness <= tau can do "
          "against waiting for stragglers (communication time not counted).")


if __name__ == "__main__":
    main()
