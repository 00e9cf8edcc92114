#!/usr/bin/env python
"""A device profile of this CPU's compute for a table's model (MNIST-1D's 1-D CNN, or the
character-level GPT of the LM tables): per-batch step times with their spread and tail, for
projections of runs whose own measured compute cannot be used (docs/projection.md, "Compute and its
tail"; `table.project.compute=device`).

    python bench/device_profile.py                              # the CNN, batches 8-128, 1 thread: its file below
    python bench/device_profile.py --model gpt                  # the GPT, batches 1-8: cpu_gpt_char.yaml
    python bench/device_profile.py --batches 8 16 --steps 200 --out /tmp/profile.yaml

Why a bench and not the runs' own wall_s or ledger: the CPU tables ran 4-64 ranks on two shared
cores (the frontier tables 8), so their wall-clock, and the compute their ledgers timed, hold
everyone's waits for a core. A projection needs what one worker's step costs alone: here, one
process, one torch thread (one core, as a rank would have on a real node), the model from the
project's builder, a fixed batch of the task's shape (the values do not change the time), the task's
loss and the runs' optimizer. `--model` picks the workload:

- `mnist1d_cnn`: the tables' model=mnist1d_cnn at its default width on MNIST-1D's signals (40 points,
  1 channel, 10 classes), cross-entropy, the allreduce recipe's optimizer (SGD, momentum 0.9, weight
  decay 5e-4); its file is conf/cluster/device/cpu_mnist1d_cnn.yaml;
- `gpt`: the model, data spec, optimizer and gradient clipping composed from `recipe=lm/shakespeare_cpu`
  by the project's config code (the recipe every LM table's row builds on, so the bench cannot drift
  from it): the 4-layer GPT on 64-character windows of the Shakespeare corpus's vocabulary, the
  next-character cross-entropy of the language-model task, AdamW, gradients clipped at the recipe's
  norm; batches are windows (the frontier's worker holds 2); its file is
  conf/cluster/device/cpu_gpt_char.yaml.

Each step is timed in two parts, as a profile splits it: `before` (zero_grad, forward, loss,
backward: what a gradient average waits for) and `after` (the optimizer step, with the clipping where
the recipe clips, as the trainer's optimizer step does). Data loading is left out: the MNIST-1D
tables' runs recorded a data wait under 0.1% of their time (summary.json `data_wait_frac`), and the
text's windows are cut on the device.

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
samples_s, samples_source, after_fraction}}`), by default the model's file named above.
"""
from __future__ import annotations

import argparse
import datetime
import functools
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import yaml  # noqa: E402

from core.machine import machine_record  # noqa: E402
from core.provenance import code_version  # noqa: E402
from core.spec import SignalSpec  # noqa: E402
from core.task import task_for  # noqa: E402
from data import data_spec  # noqa: E402
from engine.config import load_run_config, register_schemas  # noqa: E402
from engine.train.optim import build_optimizer  # noqa: E402
from models import build_model  # noqa: E402

DEVICE_DIR = REPO / "conf" / "cluster" / "device"
DEFAULT_OUT = DEVICE_DIR / "cpu_mnist1d_cnn.yaml"
SPEC = SignalSpec(in_channels=1, length=40, num_classes=10)  # MNIST-1D's signals (data/sets/mnist1d.py)
MODEL = {"name": "mnist1d_cnn", "channels": 25}  # the tables' model=mnist1d_cnn at its default width
GPT_RECIPE = "lm/shakespeare_cpu"  # what every LM table's row composes its model, data and optimizer from


@dataclass
class Parts:
    """What one worker's step is made of: the model, its optimizer, a fixed batch, the loss of the
    model's output, and the norm the gradients are clipped at before the optimizer step (None: no clip)."""

    model: torch.nn.Module
    opt: torch.optim.Optimizer
    x: torch.Tensor
    y: torch.Tensor
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    clip: Optional[float] = None


def cnn_parts(batch: int, seed: int) -> Parts:
    """MNIST-1D's CNN: the tables' model, the allreduce recipe's SGD, a batch of signals."""
    gen = torch.Generator().manual_seed(seed)
    model = build_model(dict(MODEL), SPEC)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    x = torch.randn(batch, SPEC.in_channels, SPEC.length, generator=gen)
    y = torch.randint(0, SPEC.num_classes, (batch,), generator=gen)
    return Parts(model, opt, x, y, lambda out, target: F.cross_entropy(out.float(), target))


@functools.lru_cache(maxsize=1)
def gpt_config() -> Any:
    """The LM recipe's run config, composed as cli.py composes it (on the CPU, as the tables ran);
    composed once for every batch."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_schemas()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return load_run_config(compose(config_name="config", overrides=[f"recipe={GPT_RECIPE}", "dist.device=cpu"]))


def gpt_parts(batch: int, seed: int) -> Parts:
    """The character-level GPT: the recipe's model, optimizer and clipping, `batch` windows of the
    corpus's vocabulary, the language-model task's next-character loss."""
    cfg = gpt_config()
    spec = data_spec(cfg.data)
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = build_model(cfg.model, spec)
    x = torch.randint(0, spec.vocab_size, (batch, spec.context_length), generator=gen)
    y = torch.randint(0, spec.vocab_size, (batch, spec.context_length), generator=gen)
    return Parts(model, build_optimizer(model, cfg.optim, cfg.optim.lr), x, y, task_for(spec).loss, cfg.train.grad_clip)


def gpt_words() -> str:
    """The GPT workload in words, read from the composed recipe (what the file's `model` says)."""
    cfg = gpt_config()
    spec = data_spec(cfg.data)
    m, o = cfg.model, cfg.optim
    params = sum(p.numel() for p in build_model(m, spec).parameters())
    return (f"gpt of recipe={GPT_RECIPE} ({m['layers']} layers, {m['heads']} heads, width {m['width']}, dropout "
            f"{m['dropout']}, {params:,} parameters) on {spec.context_length}-character windows of "
            f"{spec.vocab_size} symbols; batch = windows per worker; next-character cross-entropy; AdamW (lr "
            f"{o.lr:g}, betas {list(o.betas)}, weight decay {o.weight_decay:g}) with gradients clipped at norm "
            f"{cfg.train.grad_clip:g} (in `after`); fp32; forward, backward and the optimizer step; no data loading")


@dataclass(frozen=True)
class Workload:
    """One `--model` choice: how its step is built, its default batches and file, and its words."""

    parts: Callable[[int, int], Parts]
    batches: tuple[int, ...]
    out: Path
    header: str
    words: Callable[[], str]


class Stepper:
    """One worker's training step at one batch, timed in its two parts."""

    def __init__(self, parts: Parts) -> None:
        self.parts = parts

    def step(self) -> tuple[float, float, float]:
        """(before, after) in this thread's CPU seconds, and the step's wall-clock seconds."""
        p = self.parts
        w0, t0 = time.perf_counter(), time.thread_time()
        p.opt.zero_grad(set_to_none=True)
        loss = p.loss(p.model(p.x), p.y)
        loss.backward()
        t1 = time.thread_time()
        if p.clip:
            torch.nn.utils.clip_grad_norm_(p.model.parameters(), p.clip)
        p.opt.step()
        t2, w1 = time.thread_time(), time.perf_counter()
        return t1 - t0, t2 - t1, w1 - w0


def measure(workload: Workload, batches: list[int], steps: int, rounds: int,
            warmup: int) -> dict[int, np.ndarray]:
    """(steps, 3) seconds (before, after, wall) per batch, in `rounds` interleaved rounds."""
    steppers = {b: Stepper(workload.parts(b, b)) for b in batches}
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


def document(samples: dict[int, np.ndarray], context: dict[str, Any], model: str) -> dict[str, Any]:
    """The device file's content (module doc); `model`: the workload in words."""
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
            "model": model,
            "machine": {k: context[k] for k in ("cpu", "cores", "torch", "commit", "date")},
            "batches": batches}


HEADER = """# A device profile: this CPU's compute for MNIST-1D's 1-D CNN, per batch (bench/device_profile.py).
# Per batch: the median step (step_s), the share of a step after its communication (the optimizer
# step: after_fraction), the distribution (spread) and every measured step (samples_s, the tail a
# projection draws from), all in the thread's CPU time; spread_wall: the same steps by the wall clock
# (on a shared machine, with the waits for a core). What a projection from it says is "this CPU's
# compute", one core per worker, not a GPU's; the sources say how busy the machine was.
"""
GPT_HEADER = """# A device profile: this CPU's compute for the character-level GPT of the LM tables
# (recipe=lm/shakespeare_cpu), per batch of 64-character windows (bench/device_profile.py --model gpt).
# Per batch: the median step (step_s), the share of a step after its communication (gradient clipping
# and the AdamW step: after_fraction), the distribution (spread) and every measured step (samples_s, the
# tail a projection draws from), all in the thread's CPU time; spread_wall: the same steps by the wall
# clock (on a shared machine, with the waits for a core). What a projection from it says is "this
# CPU's compute", one core per worker, not a GPU's; the sources say how busy the machine was.
"""
CNN_WORDS = ("mnist1d_cnn (channels 25, 5,210 parameters) on MNIST-1D's 40-point signals; cross-entropy; SGD with "
             "momentum 0.9 and weight decay 5e-4; forward, backward and the optimizer step; no data loading")
WORKLOADS = {
    "mnist1d_cnn": Workload(cnn_parts, (8, 16, 32, 64, 128), DEFAULT_OUT, HEADER, lambda: CNN_WORDS),
    "gpt": Workload(gpt_parts, (1, 2, 4, 8), DEVICE_DIR / "cpu_gpt_char.yaml", GPT_HEADER, gpt_words),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/device_profile.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(WORKLOADS), default="mnist1d_cnn",
                        help="the workload (module doc); sets the default batches and file")
    parser.add_argument("--batches", type=int, nargs="+", default=None,
                        help="per-worker batches (default: 8-128 for the CNN, 1-8 windows for the GPT)")
    parser.add_argument("--steps", type=int, default=1000, help="measured steps per batch")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds the steps are split into")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--out", type=Path, default=None, help="the device file (default: the model's, module doc)")
    args = parser.parse_args(argv)
    workload = WORKLOADS[args.model]
    out: Path = args.out or workload.out
    torch.set_num_threads(1)  # one core per worker; and thread_time sees only this thread
    machine, version = machine_record(), code_version()
    before = os.getloadavg()[0]
    samples = measure(workload, sorted(set(args.batches or workload.batches)), args.steps, args.rounds, args.warmup)
    after = os.getloadavg()[0]
    shared = ("other work ran beside the bench: a load average above 1" if max(before, after) > 1
              else "the machine otherwise idle")
    command = "python bench/device_profile.py " + " ".join(argv if argv is not None else sys.argv[1:])
    context = {"commit": version.short, "dirty": bool(version.dirty),
               "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
               "cpu": str(machine["cpu"]), "cores": machine["cores"], "torch": str(machine["torch"]),
               "load_before": before, "load_after": after, "shared": shared, "command": command.strip()}
    doc = document(samples, context, workload.words())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(workload.header + yaml.safe_dump(doc, sort_keys=False, width=200))
    for b, entry in doc["batches"].items():
        s = entry["spread"]
        print(f"batch {b:>4}: median {s['median_s'] * 1e3:.3f} ms (p90 {s['p90_s'] * 1e3:.3f}, p99 "
              f"{s['p99_s'] * 1e3:.3f}, max {s['max_s'] * 1e3:.3f}); after {entry['after_fraction']:.1%}")
    print(f"load average {before:.2f} -> {after:.2f}; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
