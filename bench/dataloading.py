#!/usr/bin/env python
"""Images per second of the torchvision, FFCV and DALI pipelines on the same JPEG ImageFolder.

    python bench/dataloading.py                      # 3000 images, 300-500 px, crop 160, 2 workers
    python bench/dataloading.py --images 5000 --crop 192 --workers 4

Each pipeline is the real training stream (`data.build_data`, ImageNet config: RandomResizedCrop
+ flip + normalise to float32), built in its own fresh process with the same number of loader
workers (torchvision: processes; FFCV and DALI: threads) and one torch thread for the consumer.
The first epoch (worker start-up, FFCV's JIT compilation, DALI's pipeline build, a cold page
cache) is reported apart; images/s are over the epochs after it. The data set is generated once
(smooth noise with grain, so JPEGs are photograph-sized) and cached in --dir with its `.beton`
(written by `data.prepare` with the ImageNet config's settings: longest side 500, half the images
JPEG at quality 90). Prints a table, then one JSON line.
"""
from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import multiprocessing as mp
import shutil
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from core.errors import UserError  # noqa: E402  (the repository is on the path from here on)
from data import DataRequest, build_data, load_data_config  # noqa: E402
from data.prepare import prepare  # noqa: E402
from data.prepared_files import check_prepared  # noqa: E402
from engine.config import register_schemas  # noqa: E402
from tests.support import datagen  # noqa: E402

PIPELINES = ("torchvision", "ffcv", "dali")


def data_config(args: argparse.Namespace, pipeline: str) -> Any:
    """The `data` section a user's run would have, from conf/ and these overrides."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    register_schemas()  # the typed schema and the data sets' options, which conf/config.yaml names
    overrides = ["data=imagenet", f"data.root={args.dir}", f"data.pipeline={pipeline}",
                 f"data.image_size={args.crop}", f"data.num_workers={args.workers}", "data.num_classes=10"]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides)
    OmegaConf.resolve(cfg)
    return load_data_config(cfg.data)


def make_data(args: argparse.Namespace) -> None:
    """The ImageFolder (generated again when the generator changes) and its .beton (written
    when missing or stale)."""
    root = Path(args.dir)
    version = hashlib.sha256(inspect.getsource(datagen).encode()).hexdigest()[:12]
    done = root / f"generated_{version}"
    if not done.exists():
        print(f"generating {args.images} JPEGs in {root} ...", flush=True)
        shutil.rmtree(root, ignore_errors=True)
        datagen.write_imagefolder(root, num_classes=10, n_train=args.images, n_val=10,
                                  sizes=(args.min_side, args.max_side), natural=True, seed=1, quality=90)
        done.touch()
    try:
        check_prepared(data_config(args, "ffcv"))
    except UserError:
        prepare([data_config(args, "ffcv")], force=True)


def measure(pipeline: str, args: argparse.Namespace, out: Any) -> None:
    """In a fresh process: first-epoch seconds, then images/s over the following epochs."""
    import torch

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    train, _ = build_data(data_config(args, pipeline),
                          DataRequest(args.batch_size, args.batch_size, seed=0, shard=0, num_shards=1,
                                      eval_shard=0, eval_num_shards=1))
    per_epoch = train.steps_per_epoch * args.batch_size
    for _ in train.batches(0):
        pass
    first = time.perf_counter() - t0
    t1 = time.perf_counter()
    for epoch in range(1, 1 + args.epochs):
        for x, _ in train.batches(epoch):
            assert x.shape[-1] == args.crop and x.dtype == torch.float32
    out.put({"pipeline": pipeline, "first_epoch_s": first,
             "ips": per_epoch * args.epochs / (time.perf_counter() - t1)})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--images", type=int, default=3000)
    p.add_argument("--min-side", type=int, default=300)
    p.add_argument("--max-side", type=int, default=500)
    p.add_argument("--crop", type=int, default=160, help="RandomResizedCrop size")
    p.add_argument("--workers", type=int, default=2, help="loader processes/threads, the same for all")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--epochs", type=int, default=2, help="timed epochs after the first")
    p.add_argument("--dir", default="/tmp/syncopt_bench", help="where the generated data set is cached")
    args = p.parse_args()
    args.dir = str(Path(args.dir) / f"imagefolder_{args.images}_{args.min_side}_{args.max_side}")
    make_data(args)
    ctx = mp.get_context("spawn")  # fresh processes: no loader threads next to a fork
    results = {}
    for pipeline in PIPELINES:
        queue = ctx.Queue()
        proc = ctx.Process(target=measure, args=(pipeline, args, queue))
        proc.start()
        results[pipeline] = queue.get(timeout=1800)
        proc.join()
    base = results["torchvision"]["ips"]
    print(f"\n{args.images} JPEGs {args.min_side}-{args.max_side} px, RandomResizedCrop {args.crop} + flip + "
          f"normalise, batch {args.batch_size}, {args.workers} workers each")
    print(f"{'pipeline':<12} {'first epoch s':>14} {'images/s':>10} {'vs torchvision':>15}")
    for name, r in results.items():
        print(f"{name:<12} {r['first_epoch_s']:>14.1f} {r['ips']:>10.0f} {r['ips'] / base:>14.2f}x")
    summary = {f"{n}_ips": round(r["ips"], 1) for n, r in results.items()}
    summary.update({f"{n}_first_epoch_s": round(r["first_epoch_s"], 2) for n, r in results.items()})
    summary.update(ffcv_vs_torchvision=round(results["ffcv"]["ips"] / base, 3),
                   dali_vs_torchvision=round(results["dali"]["ips"] / base, 3),
                   images=args.images, crop=args.crop, workers=args.workers, batch_size=args.batch_size)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
