"""Every compressor of `dist_algos.compress` on a ResNet-50-sized gradient (25,557,032 floats in
torchvision's ResNet-50 parameter shapes): encode + decode time on this CPU, bytes on the wire,
and the break-even bandwidth against a dense ring all_reduce among K = 8 workers.

Per step a worker running a dense ring all_reduce sends 2 (K - 1) / K x 4N bytes and adds the
reduced chunks (measured here: the baseline's own CPU cost, `dense_add_s`, one add of N floats).
With a compressor it spends `codec_s` (one encode, plus one decode for a summable payload or K
decodes for a gathered one: every worker decodes every payload) and sends its collective's bytes
(`dist_algos.comm.accounting`: all_reduce of the payload when summable, all_gather otherwise). At link
bandwidth B the two cost dense_bytes / B + dense_add_s and compressed_bytes / B + codec_s, so
the compressor wins below

    B* = (dense_bytes - compressed_bytes) / (codec_s - dense_add_s)

(bytes per second; "always" when the codec is cheaper than the dense add, "never" when it sends
no fewer bytes). Baseline and candidates are timed in the same run, interleaved repeat by repeat,
medians shown; the last line is a JSON object.

    .venv/bin/python bench/compression.py [--workers 8] [--repeats 3] [--numel 0 (ResNet-50)]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from dist_algos.comm.accounting import allgather_bytes, allreduce_bytes  # noqa: E402
from dist_algos.compress import build_chain  # noqa: E402
from dist_algos.compress.contract import Combine, EncodeContext  # noqa: E402

CHAINS = [["topk:0.01"], ["topk_global:0.01"], ["randomk:0.01"], ["threshold:2.5"], ["qsgd:4:512"], ["terngrad"],
          ["sign"], ["signmv"], ["natural"], ["fp16"], ["bf16"], ["int8:256"], ["fp8:256"], ["quant:2"],
          ["dct_topk:64:32"], ["chunk_topk:64:32"], ["chunk_topk:64:32", "binquant:2:6"],
          ["topk:0.01", "quant:2"], ["randomk:0.01", "fp16"], ["lowrank:4"]]


def resnet50_shapes() -> list[tuple[int, ...]]:
    try:
        from torchvision.models import resnet50
    except ImportError:  # an approximation: one 25.6M-float matrix split into 2048-column rows
        return [(12479, 2048), (41512,)]
    with torch.device("meta"):
        return [tuple(p.shape) for p in resnet50().parameters()]


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def gbit(bytes_per_s: float) -> float:
    return bytes_per_s * 8 / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--numel", type=int, default=0, help="a flat vector of this size instead of ResNet-50")
    parser.add_argument("--only", default="", help="comma-separated chain specs to run (stage+stage)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # one worker's core; the table is per core
    shapes = [(args.numel,)] if args.numel else resnet50_shapes()
    sizes = [int(torch.Size(s).numel()) for s in shapes]
    n = sum(sizes)
    x = torch.randn(n, generator=torch.Generator().manual_seed(0))
    other = torch.randn(n, generator=torch.Generator().manual_seed(1))
    k = args.workers
    dense_bytes = allreduce_bytes(4 * n, k)
    chains = [c for c in CHAINS if not args.only or "+".join(c) in args.only.split(",")]
    compressors = {"+".join(c): build_chain(c) for c in chains}
    times: dict[str, list[float]] = {name: [] for name in ["dense_add", *compressors]}
    wire: dict[str, int] = {}
    ctx = EncodeContext(sizes, step=1, rank=0, shapes=shapes)
    try:
        from tqdm import tqdm
        bar = tqdm(total=args.repeats * (len(compressors) + 1), desc="compression bench", file=sys.stderr)
    except ImportError:
        bar = None
    for _ in range(args.repeats):
        buf = x.clone()
        times["dense_add"].append(timed(lambda: buf.add_(other)))
        if bar:
            bar.update()
        for name, comp in compressors.items():
            decodes = 1 if comp.combine == Combine.SUM else k

            def codec() -> None:
                payload = comp.encode(x, ctx)
                wire[name] = payload.wire_bytes
                for _ in range(decodes):
                    comp.decode(payload)

            times[name].append(timed(codec))
            if bar:
                bar.update()
    if bar:
        bar.close()
    add_s = statistics.median(times["dense_add"])
    rows = []
    for name, comp in compressors.items():
        codec_s = statistics.median(times[name])
        sent = allreduce_bytes(wire[name], k) if comp.combine == Combine.SUM else allgather_bytes(wire[name], k)
        saved = dense_bytes - sent
        if saved <= 0:
            breakeven: Any = "never"
        elif codec_s <= add_s:
            breakeven = "always"
        else:
            breakeven = round(gbit(saved / (codec_s - add_s)), 4)
        rows.append({"compressor": name, "combine": comp.combine.value, "codec_s": round(codec_s, 4),
                     "wire_bytes": wire[name], "sent_bytes": sent, "ratio": round(dense_bytes / max(1, sent), 2),
                     "breakeven_gbit_s": breakeven})
    try:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"{n:,} floats, ring all_reduce among {k} workers: dense sends {dense_bytes / 1e6:.1f} MB, "
                            f"its add takes {add_s * 1e3:.1f} ms")
        for col in ["compressor", "combine", "encode+decode s", "payload MB", "sent MB", "x fewer", "break-even Gbit/s"]:
            table.add_column(col, justify="left" if col in ("compressor", "combine") else "right")
        for r in rows:
            table.add_row(r["compressor"], r["combine"], f"{r['codec_s']:.3f}", f"{r['wire_bytes'] / 1e6:.2f}",
                          f"{r['sent_bytes'] / 1e6:.2f}", f"{r['ratio']:.1f}", str(r["breakeven_gbit_s"]))
        Console(width=150).print(table)
    except ImportError:
        for r in rows:
            print(r)
    print(json.dumps({"numel": n, "workers": k, "dense_bytes": dense_bytes, "dense_add_s": round(add_s, 5),
                      "threads": 1, "rows": rows}))


if __name__ == "__main__":
    main()
