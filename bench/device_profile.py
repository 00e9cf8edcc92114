#!/usr/bin/env python
"""A device profile of this CPU's compute for MNIST-1D's 1-D CNN: per-batch step times with their
spread and tail, for projections of runs that kept no time ledger (docs/projection.md, "Compute and
its tail").

    python bench/device_profile.py                              # batches 8-128, 1 thread: the file below
    python bench/device_profile.py --batches 8 16 --steps 200 --out /tmp/profile.yaml

Why a bench and not the runs' own wall_s: the published MNIST-1D tables (workers_cpu, the
head-to-heads) ran 4-64 ranks on two shared cores and kept no ledger, so their wall-clock holds
everyone's waits for a core. A projection needs what one worker's step costs alone: here, one
process, one torch thread (one core, as a rank would have on a real node), the model from the
project's builder, a fixed batch of MNIST-1D's shape (40 points, 1 channel, 10 classes; the values do
not change the time), the classification task's loss, the allreduce recipe's optimizer (SGD,
momentum 0.9, weight decay 5e-4). Each step is timed in two parts, as a profile splits it:
`before` (zero_grad, forward, loss, backward: what a gradient average waits for) and `after` (the
optimizer step). Data loading is left out: the tables' runs recorded a data wait under 0.1% of
their time (summary.json `data_wait_frac`).

Each part is timed in this thread's CPU time (`time.thread_time`; with one torch thread every
operation runs on it), not wall-clock: on a shared machine (here, table productions at nice 19 and
other jobs) the wall clock of a step holds the time it waited for a core, tens of milliseconds at
times, which a worker with a core of its own would not wait, and a max-of-64 draw would take that
wait for the tail of the compute. The wall-clock spread is recorded beside it (`spread_wall`), so
the difference is visible. What CPU time still holds: cache and memory-bandwidth interference from
the other work, and the kernel's own time on the thread. The batches are measured in interleaved
rounds (every batch a slice of steps per round), so that a change in the machine's load touches
every batch alike; the file records the load average before and after, the commit, the machine and
the command.

Writes a device file `projection.compute.device_profile` reads per batch (`batches: {B: {step_s,
samples_s, samples_source, after_fraction}}`), by default conf/cluster/device/cpu_mnist1d_cnn.yaml.
"""
from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import yaml  # noqa: E402

from core.machine import machine_record  # noqa: E402
from core.provenance import code_version  # noqa: E402
from core.spec import SignalSpec  # noqa: E402
from models import build_model  # noqa: E402

DEFAULT_OUT = REPO / "conf" / "cluster" / "device" / "cpu_mnist1d_cnn.yaml"
SPEC = SignalSpec(in_channels=1, length=40, num_classes=10)  # MNIST-1D's signals (data/sets/mnist1d.py)
MODEL = {"name": "mnist1d_cnn", "channels": 25}  # the tables' model=mnist1d_cnn at its default width


class Stepper:
    """One worker's training step at one batch, timed in its two parts."""

    def __init__(self, batch: int, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.model = build_model(dict(MODEL), SPEC)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
        self.x = torch.randn(batch, SPEC.in_channels, SPEC.length, generator=gen)
        self.y = torch.randint(0, SPEC.num_classes, (batch,), generator=gen)

    def step(self) -> tuple[float, float, float]:
        """(before, after) in this thread's CPU seconds, and the step's wall-clock seconds."""
        w0, t0 = time.perf_counter(), time.thread_time()
        self.opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(self.model(self.x).float(), self.y)
        loss.backward()
        t1 = time.thread_time()
        self.opt.step()
        t2, w1 = time.thread_time(), time.perf_counter()
        return t1 - t0, t2 - t1, w1 - w0


def measure(batches: list[int], steps: int, rounds: int, warmup: int) -> dict[int, np.ndarray]:
    """(steps, 3) seconds (before, after, wall) per batch, in `rounds` interleaved rounds."""
    steppers = {b: Stepper(b, seed=b) for b in batches}
    for stepper in steppers.values():
        for _ in range(warmup):
            stepper.step()
    found: dict[int, list[tuple[float, float, float]]] = {b: [] for b in batches}
    per_round = -(-steps // rounds)
    for _ in range(rounds):
        for b, stepper in steppers.items():
            found[b] += [stepper.step() for _ in range(min(per_round, steps - len(found[b])))]
    return {b: np.asarray(v) for b, v in found.items()}


def spread(totals: np.ndarray) -> dict[str, float]:
    """The step time's distribution in a few numbers (what the tail of a max-of-P draw rests on)."""
    q = np.quantile(totals, [0.1, 0.5, 0.9, 0.99])
    return {"p10_s": round(float(q[0]), 6), "median_s": round(float(q[1]), 6), "p90_s": round(float(q[2]), 6),
            "p99_s": round(float(q[3]), 6), "max_s": round(float(totals.max()), 6),
            "mean_s": round(float(totals.mean()), 6)}


def document(samples: dict[int, np.ndarray], context: dict[str, Any]) -> dict[str, Any]:
    """The device file's content (module doc)."""
    where = (f"bench/device_profile.py at {context['commit']}{' (dirty tree)' if context['dirty'] else ''} on "
             f"{context['date']}: {context['cpu']}, {context['cores']} cores, 1 torch thread, one process, each "
             f"step in the thread's CPU time (time.thread_time: waits for a core left out); load average "
             f"{context['load_before']:.2f} before and {context['load_after']:.2f} after "
             f"({context['shared']}); command: {context['command']}")
    batches = {}
    for b, steps in samples.items():
        totals = steps[:, :2].sum(axis=1)
        median = float(np.median(totals))
        batches[b] = {
            "step_s": {"value": round(median, 6), "source": f"median of {len(totals)} measured steps at batch {b}, "
                                                            f"in CPU time; " + where},
            "after_fraction": round(float(np.median(steps[:, 1])) / median, 4),
            "spread": spread(totals),
            "spread_wall": spread(steps[:, 2]),
            "samples_source": where,
            "samples_s": [round(float(t), 6) for t in totals],
        }
    return {"device": f"this CPU ({context['cpu']}), one core (1 torch thread)",
            "model": "mnist1d_cnn (channels 25, 5,210 parameters) on MNIST-1D's 40-point signals; cross-entropy; "
                     "SGD with momentum 0.9 and weight decay 5e-4; forward, backward and the optimizer step; no "
                     "data loading",
            "machine": {k: context[k] for k in ("cpu", "cores", "torch", "commit", "date")},
            "batches": batches}


HEADER = """# A device profile: this CPU's compute for MNIST-1D's 1-D CNN, per batch (bench/device_profile.py).
# Per batch: the median step (step_s), the share of a step after its communication (the optimizer
# step: after_fraction), the distribution (spread) and every measured step (samples_s, the tail a
# projection draws from), all in the thread's CPU time; spread_wall: the same steps by the wall clock
# (on a shared machine, with the waits for a core). What a projection from it says is "this CPU's
# compute", one core per worker, not a GPU's; the sources say how busy the machine was.
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/device_profile.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 16, 32, 64, 128])
    parser.add_argument("--steps", type=int, default=1000, help="measured steps per batch")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds the steps are split into")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # one core per worker; and thread_time sees only this thread
    machine, version = machine_record(), code_version()
    before = os.getloadavg()[0]
    samples = measure(sorted(set(args.batches)), args.steps, args.rounds, args.warmup)
    after = os.getloadavg()[0]
    shared = ("other work ran beside the bench: a load average above 1" if max(before, after) > 1
              else "the machine otherwise idle")
    command = "python bench/device_profile.py " + " ".join(argv if argv is not None else sys.argv[1:])
    context = {"commit": version.short, "dirty": bool(version.dirty),
               "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               "cpu": str(machine["cpu"]), "cores": machine["cores"], "torch": str(machine["torch"]),
               "load_before": before, "load_after": after, "shared": shared, "command": command.strip()}
    doc = document(samples, context)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(HEADER + yaml.safe_dump(doc, sort_keys=False, width=200))
    for b, entry in doc["batches"].items():
        s = entry["spread"]
        print(f"batch {b:>4}: median {s['median_s'] * 1e3:.3f} ms (p90 {s['p90_s'] * 1e3:.3f}, p99 "
              f"{s['p99_s'] * 1e3:.3f}, max {s['max_s'] * 1e3:.3f}); after {entry['after_fraction']:.1%}")
    print(f"load average {before:.2f} -> {after:.2f}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
