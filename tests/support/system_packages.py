"""Tests that need system packages (SLURM and munge, iproute2, an ssh client), which
`scripts/setup_env.sh --test` installs as root from the Debian registry.

Where they are missing, such a test fails as root, so that a missing install step fails CI and
not a user's machine, and skips otherwise. A machine that has no package registry at all (the
lent GPU machines: bench/gpu_session.sh sets the variable) says so with
SYNCOPT_TESTS_WITHOUT_SYSTEM_PACKAGES=1, and the tests skip, naming what is missing.
"""
from __future__ import annotations

import os
from typing import Optional

import pytest

WITHOUT_SYSTEM_PACKAGES = "SYNCOPT_TESTS_WITHOUT_SYSTEM_PACKAGES"


def require_system_packages(missing: Optional[str]) -> None:
    """Nothing when `missing` is None; else skip (not root, or a machine declared without a
    registry) or fail, with `missing` as the reason."""
    if missing is None:
        return
    if os.geteuid() != 0 or os.environ.get(WITHOUT_SYSTEM_PACKAGES):
        pytest.skip(missing)
    pytest.fail(f"{missing}; scripts/setup_env.sh --test installs it (or set {WITHOUT_SYSTEM_PACKAGES}=1 "
                "where no package registry is reachable)")
