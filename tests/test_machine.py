"""The machine record (core/machine.py): what summary.json and jobs.jsonl say a run ran on, and the
machine type that tells whether two runs can agree bit for bit."""
from __future__ import annotations

import json

from core import machine
from core.machine import machine_record, machine_type


def test_the_record_names_the_cpu_its_kernel_flags_and_torch_without_touching_cuda() -> None:
    import torch

    record = machine_record()
    assert record["cpu"] and record["arch"] and record["cores"] == __import__("os").cpu_count()
    assert set(record["cpu_flags"]) <= set(machine.KERNEL_FLAGS)
    assert record["torch"] == torch.__version__
    assert record["type"] == machine_type(record)
    assert not torch.cuda.is_initialized()  # a parent that forks ranks may call it
    json.dumps(record)  # it goes into summary.json as it is


def test_machines_that_compute_alike_share_a_type_and_others_do_not() -> None:
    base = {"cpu": "Intel(R) Xeon(R) Platinum 8375C", "cpu_flags": ["avx", "avx2", "avx512f"], "gpu": None,
            "torch": "2.14.1", "cores": 2, "gpu_driver": None}
    assert machine_type(base) == machine_type({**base, "cores": 64})  # the core count does not decide the arithmetic
    assert machine_type(base) != machine_type({**base, "cpu_flags": ["avx", "avx2"]})  # no AVX-512: other kernels
    assert machine_type(base) != machine_type({**base, "cpu": "AMD EPYC"})
    assert machine_type(base) != machine_type({**base, "gpu": "NVIDIA H100 80GB HBM3"})
    assert machine_type(base) != machine_type({**base, "torch": "2.13.0"})


def test_flags_are_read_from_cpuinfo(monkeypatch, tmp_path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Test CPU 9000\nflags\t\t: fpu sse4_2 avx avx2 fma\n\n"
                       "processor\t: 1\nmodel name\t: Test CPU 9000\nflags\t\t: fpu\n")
    real_open = open
    monkeypatch.setattr("builtins.open", lambda path, *a, **k: real_open(cpuinfo if path == "/proc/cpuinfo" else path,
                                                                        *a, **k))
    machine.machine_record.cache_clear()
    try:
        record = machine_record()
    finally:
        machine.machine_record.cache_clear()
    assert record["cpu"] == "Test CPU 9000" and record["cpu_flags"] == ["sse4_2", "avx", "avx2", "fma"]
