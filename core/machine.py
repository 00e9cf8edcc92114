"""The machine a run ran on: summary.json's and jobs.jsonl's `machine` record.

Why: a result here is bit-reproducible only on the same kind of machine. Float reductions take
other paths on another CPU's vector units (oneDNN and the BLAS pick kernels by the instruction
set), so two runs of one commit, one config and one seed on an AVX-512 and an AVX2 host differ in
the last bits and then in the trajectory. A paired comparison (tables/compare.py) is exact only
when both sides ran on one machine type; the record makes a mixed pair visible instead of silent.

`machine_type` is what must match for runs to be comparable bit for bit: the CPU model, the
instruction-set flags that choose kernels, the GPU model, and the torch version; core counts and
drivers are recorded beside it but do not change the arithmetic of a run with fixed thread counts.
Nothing here initialises CUDA (a parent that forks ranks must not): the GPU is read through
nvidia-smi when it is there.
"""
from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import subprocess
from typing import Any

#: the CPU flags that choose numeric kernels (x86 vector extensions, FMA, AMX; Arm's SVE/ASIMD)
KERNEL_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve", "sve2")


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ({} where there is none)."""
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip().lower(), value.strip())
    return fields


def _gpus() -> list[dict[str, str]]:
    """Each GPU's name and driver from nvidia-smi, without touching CUDA ([] where there is none)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in out.splitlines():
        name, _, driver = line.partition(",")
        if name.strip():
            gpus.append({"name": name.strip(), "driver": driver.strip()})
    return gpus


@functools.lru_cache(maxsize=1)
def machine_record() -> dict[str, Any]:
    """What this machine is, as summary.json and jobs.jsonl record it (read once per process)."""
    import torch  # (the record names the torch the run computed with)

    info = _cpuinfo()
    flags = set((info.get("flags") or info.get("features") or "").split())
    gpus = _gpus()
    record: dict[str, Any] = {
        "cpu": info.get("model name") or info.get("cpu model") or platform.processor() or platform.machine(),
        "cpu_flags": [f for f in KERNEL_FLAGS if f in flags],
        "cores": os.cpu_count(),
        "arch": platform.machine(),
        "gpu": gpus[0]["name"] if gpus else None,
        "gpus": len(gpus),
        "gpu_driver": gpus[0]["driver"] if gpus else None,
        "torch": torch.__version__,
    }
    record["type"] = machine_type(record)
    return record


def machine_type(record: dict[str, Any]) -> str:
    """A short name of what decides a run's arithmetic (module doc): equal for two machines whose
    runs agree bit for bit, different where they need not."""
    key = "|".join([str(record.get("cpu")), ",".join(record.get("cpu_flags") or []), str(record.get("gpu")),
                    str(record.get("torch"))])
    return hashlib.sha256(key.encode()).hexdigest()[:12]
