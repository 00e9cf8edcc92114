"""Threads per rank (`engine.launch.commands.omp_threads`): launch.omp_threads, else the shell's
OMP_NUM_THREADS, else the node's cores divided among its ranks. The shell's value is kept because
jobs side by side on one machine otherwise each size their ranks for all of it: the fifth GPU
session's suite, 12 workers on 16 cores, gave every 4-rank job 4 threads per rank, and three
multi-process tests ran 3-7 times slower than alone (docs/gpu.md)."""
from __future__ import annotations

import os

import pytest

from engine.launch.commands import launcher_env, omp_threads
from engine.launch.config import LaunchConfig, load_launch_config
from tests.support.harness import compose


def _launch(*overrides: str) -> LaunchConfig:
    return load_launch_config(compose(list(overrides)).launch)


@pytest.mark.parametrize("shell,kept", [
    (None, None),  # nothing set: the node's cores / its ranks
    ("3", 3),  # the shell's share of the machine is kept
    (" 2 ", 2),
    ("4,2", None),  # OpenMP's nested form is not one count: ignored
    ("0", None),  # not a thread count: ignored
    ("", None),
])
def test_the_shells_thread_count_is_kept_else_cores_over_ranks(shell: str | None, kept: int | None,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    if shell is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", shell)
    cfg = _launch("launch.nproc=4")
    assert omp_threads(cfg, cpus=16) == (kept or 16 // 4)
    # every launch path takes its ranks' value from here: one machine, and pdsh's smallest node
    assert launcher_env(cfg, cpus=16)["OMP_NUM_THREADS"] == str(kept or 16 // 4)
    assert launcher_env(cfg, ranks_here=2, cpus=6)["OMP_NUM_THREADS"] == str(kept or 6 // 2)


def test_launch_omp_threads_overrides_the_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert omp_threads(_launch("launch.nproc=4", "launch.omp_threads=5"), cpus=16) == 5


def test_the_suite_runs_its_cli_ranks_single_threaded_on_any_machine() -> None:
    """conftest.py sets OMP_NUM_THREADS=1 (unless the caller set one) for every cli.py run a test
    starts; on a 16-core machine a 2-rank job would otherwise run 8 threads per rank."""
    assert os.environ.get("OMP_NUM_THREADS", "").strip().isdigit()
    assert omp_threads(_launch("launch.nproc=2"), cpus=16) == int(os.environ["OMP_NUM_THREADS"])
