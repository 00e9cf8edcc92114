"""Shared fixtures. Multi-process tests spawn gloo ranks on the CPU (tests/harness.py)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "multinode: runs across emulated hosts (network namespaces)")
    config.addinivalue_line("markers", "slow: takes more than ~30 s")


@pytest.fixture
def cli_env() -> dict[str, str]:
    """Environment for running cli.py as a user would, quiet and single-threaded per rank."""
    env = dict(os.environ)
    env.pop("HYDRA_FULL_ERROR", None)
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        env.pop(var, None)
    return env
