"""What the time ledger costs: the default job with `report.ledger=false` against `true`.

Issue 86 asks the ledger to cost at most 2% of a step. Two measurements:

- `pairs`: the default job (digits, small CNN, allreduce, 4 gloo ranks, 300 steps) run through
  cli.py with the ledger off and on, in alternating pairs (off first, then on first, ...), so a
  machine that slows down or speeds up burdens both alike. A run's step time is its summary's
  `train_s` (the training loop, evaluation and checkpoints excluded: the ledger's files are
  written at checkpoints) over its steps; each pair gives on / off, and the median of the pairs
  is the figure. Both runs of a pair must reach the same test accuracy and loss to the last
  digit (the ledger only reads clocks), which is printed too.
- `direct`: what recording itself takes per step, timed in one process on the default job's
  shape (a step's five compute segments, the optimizer's wrapper and its one bucket's all_reduce
  record), as a share of the pairs' median step time: the part of the ratio that is the ledger's
  and not the machine's noise.

    .venv/bin/python bench/ledger_overhead.py [--pairs 5] [--steps 300]

The last line printed is a JSON object for scripts: `ratio` (median on / off), `pair_ratios`,
`step_ms_off`, `direct_us_per_step`, `direct_share`, `same_results`.
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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from core.rundir import RunDir  # noqa: E402
from dist_algos.comm.accounting import CommStats, allreduce_op  # noqa: E402
from dist_algos.comm.pattern import ParamLayout  # noqa: E402
from engine.report.ledger_writer import (DATA_WAIT, FORWARD_BACKWARD, OPTIMIZER, PLUGIN, RankLedger,  # noqa: E402
                                         ReportConfig)


def run(ledger: bool, steps: int, out: Path) -> dict[str, Any]:
    """One default job; its summary."""
    cmd = [sys.executable, "cli.py", f"hydra.run.dir={out}", "train.progress=false",
           f"report.ledger={str(ledger).lower()}"]
    if steps:
        cmd.append(f"train.max_steps={steps}")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"ledger_overhead: {' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads((out / "summary.json").read_text())


def step_s(summary: dict[str, Any]) -> float:
    return summary["train_s"] / summary["steps"]


def direct(repeats: int = 20000) -> float:
    """Microseconds of recording per step of the default job's shape."""
    with tempfile.TemporaryDirectory() as tmp:
        ledger = RankLedger(ReportConfig(ledger=True), RunDir(Path(tmp)), 0, 4, 4, repeats, 10, ParamLayout((10,)))
        stats = CommStats()
        stats.log = ledger
        optimizer = ledger.timed(OPTIMIZER, lambda: None)
        op = allreduce_op(605_608, 4, bucket=0)
        now = time.perf_counter
        start = now()
        for step in range(repeats):
            t0 = now()
            ledger.begin_step(step)
            ledger.segment(DATA_WAIT, t0, now())
            t1 = now()
            ledger.segment(FORWARD_BACKWARD, t1, now())
            stats.record(op, t1, now(), t1)
            stats.add(syncs=1)
            optimizer()
            ledger.segment(PLUGIN, t1, now())
        return (now() - start) / repeats * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=0, help="train.max_steps (0: the default job's 30 epochs)")
    args = parser.parse_args()
    ratios, offs, same = [], [], True
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            order = (False, True) if i % 2 == 0 else (True, False)
            got = {on: run(on, args.steps, Path(tmp) / f"{i}_{on}") for on in order}
            ratio = step_s(got[True]) / step_s(got[False])
            equal = all(got[True][k] == got[False][k] for k in ("test_acc", "test_loss"))
            same &= equal
            ratios.append(ratio)
            offs.append(step_s(got[False]))
            print(f"pair {i + 1}: off {step_s(got[False]) * 1e3:.2f} ms/step, on {step_s(got[True]) * 1e3:.2f} "
                  f"ms/step, on/off {ratio:.4f}; test_acc {got[False]['test_acc']} / {got[True]['test_acc']}, "
                  f"test_loss {got[False]['test_loss']} / {got[True]['test_loss']}", flush=True)
    step_ms = statistics.median(offs) * 1e3
    micro = direct()
    result = {"ratio": round(statistics.median(ratios), 4), "pair_ratios": [round(r, 4) for r in ratios],
              "step_ms_off": round(step_ms, 3), "direct_us_per_step": round(micro, 2),
              "direct_share": round(micro / 1e3 / step_ms, 5), "same_results": same}
    print(f"median on/off {result['ratio']} over {args.pairs} pairs; recording itself {micro:.1f} us a step "
          f"= {100 * result['direct_share']:.3f}% of a {step_ms:.2f} ms step; results equal: {same}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
