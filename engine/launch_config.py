"""The `launch` config section: how cli.py starts the ranks when it is not itself one."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from engine.errors import UserError

LAUNCHERS = ("deepspeed", "torchrun", "none")


@dataclass
class LaunchConfig:
    launcher: str = "deepspeed"  # deepspeed | torchrun | none (train in this process)
    nproc: int = 4  # ranks per node
    master_addr: str = "127.0.0.1"
    master_port: Optional[int] = None  # None: a free port is picked
    omp_threads: Optional[int] = None  # None: cores / nproc on CPU
    log_level: str = "warning"  # DeepSpeed launcher's own logging (info shows every spawn)


def load_launch_config(node: Any) -> LaunchConfig:
    from engine.config import typed_section

    launch = typed_section(LaunchConfig, node, "launch")
    if launch.launcher not in LAUNCHERS:
        raise UserError(f"launch.launcher={launch.launcher!r} is not one of {', '.join(LAUNCHERS)}")
    if launch.nproc < 1:
        raise UserError(f"launch.nproc={launch.nproc} must be at least 1 (ranks on this machine)")
    if launch.omp_threads is not None and launch.omp_threads < 1:
        raise UserError(f"launch.omp_threads={launch.omp_threads} must be at least 1 (or null)")
    if launch.master_port is not None and not 1024 <= launch.master_port <= 65535:
        raise UserError(f"launch.master_port={launch.master_port} must be in 1024..65535 (or null)")
    return launch
