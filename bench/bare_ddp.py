"""The default job written as a bare PyTorch DDP script: what `python cli.py` costs without the runner.

`python cli.py` (digits, small BN CNN, allreduce, 4 gloo ranks, 30 epochs) is timed against this
file by bench/startup.py. To make that ratio mean something, this script does the same work and
nothing else, in plain torch and numpy (no Hydra, no project import, so none of the runner's
start-up is paid here):

- data: scikit-learn's bundled digits file read with numpy (as data/sets/digits.py reads it), the
  same seeded 80/20 split and normalisation, the same stratified 10% validation carve-out
  (data/split.py), the same per-epoch shards (data/sampler.py: one permutation of the training
  part seeded by (seed, epoch), strided over the ranks), 32 samples per rank and step;
- model: models/small_cnn's layers at its defaults (width 32, BatchNorm), built after
  `torch.manual_seed(0)` (bench/startup.py checks the two initialisations are equal);
- optimizer and schedule: SGD lr 0.1, momentum 0.9, weight decay 5e-4, cosine over the run's steps;
- gradients averaged by torch's DistributedDataParallel (the allreduce plugin reproduces it);
- every 5 epochs and at the end: validation and test loss and accuracy, each rank evaluating its
  contiguous slice, sums all_reduced (engine/train/evaluation.py's scheme);
- every epoch: each rank saves its own checkpoint file (model, optimizer, step, RNG), rank 0 a
  manifest after a barrier; the newest two and the best (validation accuracy) are kept;
- threads: the machine's cores divided among the ranks, as cli.py's launcher sets them.

    .venv/bin/python bench/bare_ddp.py --out DIR [--nproc 4] [--max-steps N]

`--nproc 1` trains in this process (no spawn): bench/startup.py's import profile of a rank uses it.
The last line printed is a JSON object: test and validation accuracy and loss, steps, wall seconds.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

SEED, SPLIT_SEED = 0, 0
TEST_FRACTION, VAL_FRACTION = 0.2, 0.1
EPOCHS, BATCH, EVAL_BATCH = 30, 32, 360
LR, MOMENTUM, WEIGHT_DECAY = 0.1, 0.9, 5e-4
EVAL_EVERY_EPOCHS, KEEP_LAST = 5, 2
_EPOCH_STRIDE = 1_000_003  # data/sampler.py's (seed, epoch) spacing


# ---- data ----------------------------------------------------------------------------------------

def read_digits() -> tuple[np.ndarray, np.ndarray]:
    """(pixels 1797x64, labels) from the csv.gz file scikit-learn ships, without importing it."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("bare_ddp: scikit-learn (which carries the digits file) is not installed")
    table = np.loadtxt(Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz", delimiter=",")
    return table[:, :-1], table[:, -1].astype(np.int64)


def validation_part(labels: np.ndarray) -> np.ndarray:
    """Sorted indices of the stratified validation samples: 10% of the training file, each class
    its share by largest remainder, members drawn with numpy's generator seeded [split_seed, 7]."""
    classes, counts = np.unique(labels, return_counts=True)
    total = round(VAL_FRACTION * len(labels))
    want = total * counts / counts.sum()
    take = np.floor(want).astype(np.int64)
    take[np.argsort(-(want - take), kind="stable")[:total - int(take.sum())]] += 1
    rng = np.random.default_rng([SPLIT_SEED, 7])
    chosen = [np.flatnonzero(labels == c)[rng.permutation(int(n))[:k]]
              for c, n, k in zip(classes, counts, np.minimum(take, counts))]
    return np.sort(np.concatenate(chosen))


def load_data() -> dict[str, torch.Tensor]:
    pixels, labels = read_digits()
    x = torch.from_numpy(pixels.astype(np.float32)).reshape(-1, 1, 8, 8) / 16.0
    y = torch.from_numpy(labels)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(SPLIT_SEED))
    n_train = len(x) - math.ceil(len(x) * TEST_FRACTION)
    train, test = perm[:n_train], perm[n_train:]
    x = (x - x[train].mean()) / x[train].std()
    x_file, y_file = x[train].contiguous(), y[train].contiguous()
    val = validation_part(y_file.numpy())
    keep = np.ones(len(y_file), dtype=bool)
    keep[val] = False
    val_t = torch.as_tensor(val)
    return {"x": x_file, "y": y_file, "train_idx": torch.as_tensor(np.flatnonzero(keep)),
            "x_val": x_file[val_t], "y_val": y_file[val_t], "x_test": x[test].contiguous(), "y_test": y[test].contiguous()}


def epoch_order(train_idx: torch.Tensor, epoch: int, rank: int, world: int) -> torch.Tensor:
    """This rank's samples of the epoch: one seeded permutation of the training part, strided."""
    gen = torch.Generator().manual_seed((SEED * _EPOCH_STRIDE + epoch) % (2**63))
    perm = torch.randperm(len(train_idx), generator=gen)
    per_rank = len(train_idx) // world
    return train_idx[perm[:per_rank * world].view(per_rank, world).t()[rank]]


# ---- model ---------------------------------------------------------------------------------------

def small_cnn(width: int = 32, num_classes: int = 10) -> nn.Module:
    """models/small_cnn at its defaults for 1x8x8 inputs: two conv-BN-ReLU blocks, a max-pool, two linears."""
    return nn.Sequential(
        nn.Conv2d(1, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
        nn.Conv2d(width, 2 * width, 3, padding=1, bias=False), nn.BatchNorm2d(2 * width), nn.ReLU(inplace=True),
        nn.MaxPool2d(2), nn.Flatten(), nn.Identity(),
        nn.Linear(2 * width * 4 * 4, 4 * width), nn.ReLU(inplace=True), nn.Linear(4 * width, num_classes))


# ---- one rank ------------------------------------------------------------------------------------

def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, rank: int, world: int) -> tuple[float, float]:
    """(mean loss, accuracy) over all of x: this rank's contiguous slice, the sums all_reduced."""
    lo, hi = len(x) * rank // world, len(x) * (rank + 1) // world
    model.eval()
    sums = torch.zeros(3, dtype=torch.float64)
    with torch.no_grad():
        for i in range(lo, hi, EVAL_BATCH):
            xb, yb = x[i:min(i + EVAL_BATCH, hi)], y[i:min(i + EVAL_BATCH, hi)]
            logits = model(xb)
            sums += torch.tensor([F.cross_entropy(logits, yb, reduction="sum").item(),
                                  (logits.argmax(1) == yb).sum().item(), len(yb)], dtype=torch.float64)
    model.train()
    if world > 1:
        dist.all_reduce(sums)
    return float(sums[0] / sums[2]), float(sums[1] / sums[2])


def save_checkpoint(out: Path, step: int, rank: int, world: int, model: nn.Module, opt: torch.optim.Optimizer,
                    best_step: int) -> None:
    """Every rank's own file, then (after all have written) rank 0's manifest and the pruning."""
    where = out / "checkpoints" / f"step_{step:08d}"
    where.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step,
                "rng": torch.get_rng_state()}, where / f"rank_{rank}.pt")
    if world > 1:
        dist.barrier()
    if rank == 0:
        (where / "manifest.json").write_text(json.dumps({"step": step, "world_size": world}))
        done = sorted(p for p in (out / "checkpoints").iterdir() if (p / "manifest.json").exists())
        for old in done[:-KEEP_LAST]:
            if old.name != f"step_{best_step:08d}":
                shutil.rmtree(old, ignore_errors=True)


def train(rank: int, world: int, out: str, port: int, max_steps: int | None) -> dict[str, Any]:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    if world > 1:
        os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
        dist.init_process_group("gloo", rank=rank, world_size=world)
    root = Path(out)
    data = load_data()
    torch.manual_seed(SEED)  # the same initial model on every rank (DDP also broadcasts rank 0's)
    model = small_cnn()
    net = DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    steps_per_epoch = (len(data["train_idx"]) // world) // BATCH
    total = max_steps or EPOCHS * steps_per_epoch
    started, step, best = time.perf_counter(), 0, (-1.0, 0)
    for epoch in range(EPOCHS):
        order = epoch_order(data["train_idx"], epoch, rank, world)
        for b in range(steps_per_epoch):
            if step == total:
                break
            for group in opt.param_groups:
                group["lr"] = LR * 0.5 * (1 + math.cos(math.pi * step / total))
            sel = order[b * BATCH:(b + 1) * BATCH]
            loss = F.cross_entropy(net(data["x"][sel]), data["y"][sel])
            opt.zero_grad(set_to_none=False)
            loss.backward()
            opt.step()
            step += 1
            if rank == 0 and step % 10 == 0:
                print(f"step {step}: loss {loss.item():.4f}", flush=True)
        last = step == total
        if (epoch + 1) % EVAL_EVERY_EPOCHS == 0 or last:
            val_loss, val_acc = evaluate(model, data["x_val"], data["y_val"], rank, world)
            test_loss, test_acc = evaluate(model, data["x_test"], data["y_test"], rank, world)
            best = max(best, (val_acc, step), key=lambda b: b[0])
            if rank == 0:
                print(f"step {step}: val_acc {val_acc:.4f} test_acc {test_acc:.4f}", flush=True)
        save_checkpoint(root, step, rank, world, model, opt, best[1])
        if last:
            break
    result = {"test_acc": test_acc, "test_loss": test_loss, "val_acc": val_acc, "val_loss": val_loss,
              "steps": step, "train_s": round(time.perf_counter() - started, 3)}
    if rank == 0:
        (root / "summary.json").write_text(json.dumps(result))
    if world > 1:
        dist.destroy_process_group()
    return result


def _rank(rank: int, world: int, out: str, port: int, max_steps: int | None) -> None:
    train(rank, world, out, port, max_steps)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="run directory (checkpoints, summary.json)")
    parser.add_argument("--nproc", type=int, default=4, help="gloo ranks (1: train in this process)")
    parser.add_argument("--max-steps", type=int, default=None, help="stop after this many steps (default: 30 epochs)")
    args = parser.parse_args()
    started = time.perf_counter()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.nproc)))
    if args.nproc == 1:
        train(0, 1, args.out, 0, args.max_steps)
    else:
        mp.spawn(_rank, args=(args.nproc, args.out, free_port(), args.max_steps), nprocs=args.nproc)
    summary = json.loads((Path(args.out) / "summary.json").read_text())
    print(json.dumps({**summary, "wall_s": round(time.perf_counter() - started, 3)}))


if __name__ == "__main__":
    main()
