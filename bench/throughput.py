#!/usr/bin/env python
"""Images per second of a model's bare compute against the runner's training path, and of the
device-resident loader against torchvision's, on CIFAR-format or ImageNet-format data.

    python bench/throughput.py                          # resnet20, batch 512, this machine's device
    python bench/throughput.py --model resnet18 --steps 20 --workers 8
    python bench/throughput.py --data imagenet --pipelines dali --model resnet50 --batch 256 \
        --train-images 12800 --workers 14 --steps 30     # DALI's runner at 224 px

In one run, on the same device (a GPU when one is visible), in fresh processes; what is compared
is measured in turns in one process, so that a change in a shared machine's load touches both:

- loaders alone: images/s of the torchvision pipeline's training stream (`--workers` loader
  processes, PIL padded crop + flip per sample) and of the device pipeline's (the set on the
  device, crops and flips batched there; torch's threads = `--workers`), over the epochs after
  the first, their epochs alternating;
- the compute ceiling: the project's model builder, synthetic tensors already on the device,
  SGD with momentum, the run's precision and layout (bf16 autocast and channels_last on a GPU),
  measured before and after each runner (the runner is compared with their mean; the spread
  between them says how much the machine's load moved);
- the runner: the real trainer (one rank, allreduce) on each pipeline, images/s over its log
  windows after `--warmup` steps (training time as the summary counts it: the device
  synchronised at window edges, evaluation and checkpoints excluded).

Prints a table, then one JSON line with `device_vs_torchvision_loader` (when both loaders are
measured) and `runner_vs_ceiling_<pipeline>`. The data set is generated once into --dir: random
pixels in CIFAR-10's pickle layout, or for `--data imagenet` an ImageFolder of JPEGs of 300-500 px
whose content (smooth colour noise plus grain, `tests.support.datagen.natural_image`) compresses to about
a photograph's size, so that decoding costs about what ImageNet's does.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import multiprocessing as mp
import pickle
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from core.distenv import init_distributed  # noqa: E402  (the repository is on the path from here on)
from core.rundir import RunDir  # noqa: E402
from core.spec import ImageSpec  # noqa: E402
from data import DATASETS, DataRequest, build_data  # noqa: E402
from engine.config import load_run_config, register_schemas  # noqa: E402
from engine.plan import build_plan  # noqa: E402
from engine.rank.trainer import Trainer  # noqa: E402
from engine.report.metrics import read_metrics  # noqa: E402
from models import build_model  # noqa: E402

PIPELINES = ("torchvision", "device")
IMAGENET_CLASSES = 100  # class folders of the generated ImageFolder (the model keeps ImageNet's 1,000 outputs)


def write_cifar(root: Path, n_train: int, n_test: int) -> None:
    """CIFAR-10's python-pickle batches of random pixels (what the pipelines read is the layout)."""
    import numpy as np

    cifar = DATASETS.get("cifar10")
    folder = root / cifar.folder
    if (folder / "done").exists():
        return
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    per_file = n_train // len(cifar.train_files)
    for name, n in [(f, per_file) for f in cifar.train_files] + [(cifar.test_files[0], n_test)]:
        batch = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                 b"labels": rng.integers(0, 10, n).tolist()}
        (folder / name).write_bytes(pickle.dumps(batch))
    (folder / "done").touch()


def _imagenet_chunk(job: tuple[str, str, int, int]) -> None:
    from PIL import Image

    sys.path.insert(0, str(REPO))
    from tests.support.datagen import natural_image

    folder, split, start, stop = job
    import numpy as np

    for i in range(start, stop):
        rng = np.random.default_rng(i)
        h, w = (int(v) for v in rng.integers(300, 501, 2))
        path = Path(folder) / split / f"class_{i % IMAGENET_CLASSES:03d}" / f"img_{i:06d}.jpg"
        Image.fromarray(natural_image(rng, h, w)).save(path, quality=90)


def write_imagenet(root: Path, n_train: int, n_val: int, workers: int) -> None:
    """An ImageFolder (root/train/<class>/*.jpg, root/val/...) of generated JPEGs, in parallel."""
    if (root / "done").exists():
        return
    for split in ("train", "val"):
        for c in range(IMAGENET_CLASSES):
            (root / split / f"class_{c:03d}").mkdir(parents=True, exist_ok=True)
    step = 256
    jobs = [(str(root), "train", a, min(a + step, n_train)) for a in range(0, n_train, step)]
    jobs += [(str(root), "val", a, min(a + step, n_train + n_val)) for a in range(n_train, n_train + n_val, step)]
    with mp.get_context("spawn").Pool(max(workers, 1)) as pool:
        pool.map(_imagenet_chunk, jobs)
    (root / "done").touch()


def run_config(args: argparse.Namespace, pipeline: str, *more: str) -> Any:
    from hydra import compose, initialize_config_dir

    register_schemas()
    overrides = [f"data={args.dataset}", f"data.root={args.data}", f"data.pipeline={pipeline}",
                 f"data.num_workers={args.workers}", f"model={args.model}", f"train.batch_size={args.batch}",
                 f"data.eval_batch_size={args.batch}", *more]
    if args.dataset == "imagenet":  # one image per class for validation: the bench trains only
        overrides += ["data.val_per_class=1"]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return load_run_config(compose(config_name="config", overrides=overrides))


def _device() -> Any:
    import torch

    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def loaders(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Both loaders in one process, their timed epochs alternating (torchvision, device,
    torchvision, ...), so that a change in the machine's load touches both alike."""
    import torch

    torch.set_num_threads(args.workers)  # the device pipeline's threads; torchvision's are its workers
    device = _device()
    request = DataRequest(args.batch, args.batch, seed=0, shard=0, num_shards=1, eval_shard=0, eval_num_shards=1,
                          device=device)
    streams = {name: build_data(run_config(args, name).data, request)[0] for name in PIPELINES}
    out: dict[str, dict[str, float]] = {}
    for name, train in streams.items():
        t0 = time.perf_counter()
        for _ in train.batches(0):
            pass
        _sync(device)
        out[name] = {"first_epoch_s": time.perf_counter() - t0, "seconds": 0.0}
    for epoch in range(1, 1 + args.epochs):
        for name, train in streams.items():
            t0 = time.perf_counter()
            for x, _ in train.batches(epoch):
                assert x.shape[-1] == 32 and x.dtype == torch.float32 and x.device == device
            _sync(device)
            out[name]["seconds"] += time.perf_counter() - t0
    for name, train in streams.items():
        out[name]["ips"] = train.steps_per_epoch * args.batch * args.epochs / out[name].pop("seconds")
        getattr(train, "close", lambda: None)()
    return out


def ceiling(args: argparse.Namespace) -> dict[str, float]:
    """The bare loop: synthetic tensors on the device, the project's model, SGD; bf16 autocast
    and channels_last on a GPU (what the runner's auto settings choose there)."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(args.workers)
    device = _device()
    gpu = device.type == "cuda"
    fmt = torch.channels_last if gpu else torch.contiguous_format
    spec = DATASETS.get(args.dataset)
    size, classes = args.image_size or spec.image_size, spec.num_classes
    model = build_model({"name": args.model}, ImageSpec(3, size, classes)).to(device, memory_format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(args.batch, 3, size, size, device=device).contiguous(memory_format=fmt)
    y = torch.randint(0, classes, (args.batch,), device=device)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if gpu else contextlib.nullcontext()

    def step() -> None:
        with autocast:
            loss = F.cross_entropy(model(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)

    for _ in range(args.warmup):
        step()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    _sync(device)
    return {"ips": args.steps * args.batch / (time.perf_counter() - t0)}


def train_windows(cfg: Any, run_dir: Path, warmup: int) -> list[dict]:
    """Run the real trainer on one rank in this process (no launcher: what is timed is the step,
    not start-up) and return its training log windows after the first `warmup` steps."""
    rd = RunDir(run_dir)
    plan = build_plan(cfg, rd, 1, 1)
    ctx = init_distributed(cfg.dist.backend, cfg.dist.timeout_s, cfg.dist.device)
    with contextlib.redirect_stdout(io.StringIO()):  # the run's own summary table
        Trainer(plan, ctx).run()
    return [r for r in read_metrics(rd.metrics) if r["kind"] == "train" and r["step"] > warmup]


def runner(pipeline: str, args: argparse.Namespace) -> dict[str, float]:
    """The trainer on one rank; images/s over its log windows after the warm-up steps."""
    import torch

    torch.set_num_threads(args.workers)
    steps = args.warmup + args.steps
    with tempfile.TemporaryDirectory() as tmp:
        cfg = run_config(args, pipeline, f"train.max_steps={steps}", f"train.log_every_steps={args.log_every}",
                         "train.eval_every_epochs=null", "checkpoint.every_epochs=null", "train.progress=false",
                         "launch.launcher=none", "launch.nproc=1", "resume=null", "algo=allreduce",
                         *([f"data.image_size={args.image_size}"] if args.image_size else []))
        windows = train_windows(cfg, Path(tmp), args.warmup)
    images = args.log_every * args.batch  # per window: --warmup and --steps are multiples of --log-every
    seconds = sum(images / r["samples_per_s"] for r in windows)
    wait = sum(r["data_wait_frac"] * images / r["samples_per_s"] for r in windows)
    return {"ips": len(windows) * images / seconds, "data_wait_frac": wait / seconds}


def training(pipeline: str, args: argparse.Namespace) -> dict[str, float]:
    """The ceiling, the runner on `pipeline`, the ceiling again, in one process: the runner is
    compared with the mean of the ceilings around it (the machine's load may change meanwhile)."""
    before = ceiling(args)["ips"]
    run = runner(pipeline, args)
    after = ceiling(args)["ips"]
    return {**run, "ceiling_ips": (before + after) / 2, "ceiling_spread": abs(before - after) / max(before, after)}


def _child(kind: str, pipeline: str, args: argparse.Namespace, out: Any) -> None:
    out.put(loaders(args) if kind == "loaders" else training(pipeline, args))


def in_fresh_process(kind: str, pipeline: str, args: argparse.Namespace) -> dict[str, float]:
    ctx = mp.get_context("spawn")  # no loader workers or CUDA context shared between measurements
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(kind, pipeline, args, queue))
    proc.start()
    while True:  # a child that dies puts nothing: do not wait for it forever
        try:
            result = queue.get(timeout=5)
            break
        except Exception:
            if not proc.is_alive():
                raise SystemExit(f"the {kind} {pipeline} measurement failed (exit code {proc.exitcode})") from None
    proc.join()
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", dest="dataset", default="cifar10", choices=("cifar10", "imagenet"))
    p.add_argument("--pipelines", default=None,
                   help="comma-separated; default torchvision,device on CIFAR and torchvision,dali on ImageNet")
    p.add_argument("--image-size", type=int, default=None, help="the data set's own (32, 224) unless set")
    p.add_argument("--model", default="resnet20")
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--train-images", type=int, default=10240)
    p.add_argument("--workers", type=int, default=2, help="torchvision loader processes; torch threads otherwise")
    p.add_argument("--epochs", type=int, default=2, help="timed loader epochs after the first")
    p.add_argument("--warmup", type=int, default=2, help="compute steps not timed")
    p.add_argument("--steps", type=int, default=4, help="timed compute steps")
    p.add_argument("--log-every", type=int, default=1,
                   help="the runner's log window in steps (its clock synchronises the device at each edge)")
    p.add_argument("--dir", default="/tmp/syncopt_bench", help="where the generated data set is cached")
    args = p.parse_args()
    if args.warmup % args.log_every or args.steps % args.log_every:
        p.error(f"--warmup {args.warmup} and --steps {args.steps} must be multiples of --log-every {args.log_every}")
    pipelines = (args.pipelines or ("torchvision,device" if args.dataset == "cifar10" else "torchvision,dali")).split(",")
    if args.dataset == "cifar10":
        args.data = str(Path(args.dir) / f"cifar_{args.train_images}")
        write_cifar(Path(args.data), args.train_images, args.batch)
    else:
        args.data = str(Path(args.dir) / f"imagenet_{args.train_images}")
        write_imagenet(Path(args.data), args.train_images, IMAGENET_CLASSES * 2, args.workers)
    read = in_fresh_process("loaders", "", args) if set(PIPELINES) <= set(pipelines) else {}
    runs = {name: in_fresh_process("training", name, args) for name in pipelines}
    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    form = "CIFAR" if args.dataset == "cifar10" else "ImageNet"
    print(f"\n{args.model}, batch {args.batch}, {form}-format data ({args.train_images} images), device: {device}, "
          f"{args.workers} workers/threads")
    if read:
        base = read["torchvision"]["ips"]
        print(f"{'loader':<14} {'first epoch s':>14} {'images/s':>10} {'vs torchvision':>15}")
        for name, r in read.items():
            print(f"{name:<14} {r['first_epoch_s']:>14.2f} {r['ips']:>10.0f} {r['ips'] / base:>14.2f}x")
    print(f"{'training':<20} {'images/s':>10} {'ceiling':>9} {'spread':>7} {'vs ceiling':>11} {'data wait':>10}")
    for name, r in runs.items():
        print(f"{'runner ' + name:<20} {r['ips']:>10.1f} {r['ceiling_ips']:>9.1f} {r['ceiling_spread']:>6.0%} "
              f"{r['ips'] / r['ceiling_ips']:>10.2f}x {r['data_wait_frac']:>9.1%}")
    summary: dict[str, Any] = {"device": device, "model": args.model, "batch": args.batch, "data": args.dataset,
                               "image_size": args.image_size or DATASETS.get(args.dataset).image_size}
    summary.update({f"{n}_loader_ips": round(r["ips"], 1) for n, r in read.items()})
    if read:
        summary["device_vs_torchvision_loader"] = round(read["device"]["ips"] / base, 3)
    summary.update({f"runner_ips_{n}": round(r["ips"], 1) for n, r in runs.items()})
    summary.update({f"ceiling_ips_{n}": round(r["ceiling_ips"], 1) for n, r in runs.items()})
    summary.update({f"runner_vs_ceiling_{n}": round(r["ips"] / r["ceiling_ips"], 3) for n, r in runs.items()})
    summary.update({f"data_wait_frac_{n}": round(r["data_wait_frac"], 4) for n, r in runs.items()})
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
