"""torchft's lighthouse (the quorum service), started by cli.py on node 0 for a fault-tolerant job.

It runs as its own process (torchft's `torchft_lighthouse`, a Rust server), bound to the host
the replicas' process groups use, not to every interface, so that the supervisor can tell when it
dies and end the job with one line naming it (a resume then continues from the checkpoints).
A cluster that runs its own lighthouse gives `ft.lighthouse=HOST:PORT` and none is started.
"""
from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from core.errors import UserError
from engine.ft.config import FTConfig
from engine.launch.commands import free_port, port_in_use


def lighthouse_binary() -> str:
    beside = Path(sys.executable).parent / "torchft_lighthouse"
    found = str(beside) if beside.exists() else shutil.which("torchft_lighthouse")
    if not found:
        raise UserError("ft.enabled=true needs torchft's torchft_lighthouse (pip install torchft==0.2.0, "
                        "scripts/setup_env.sh) or ft.lighthouse=HOST:PORT of a running one")
    return found


class Lighthouse:
    def __init__(self, host: str, port: int, proc: subprocess.Popen, log: Path) -> None:
        self.host, self.port, self.proc, self.log = host, port, proc, log

    @property
    def address(self) -> str:
        return f"http://{self.host}:{self.port}"

    @staticmethod
    def start(host: str, cfg: FTConfig, log: Path, min_replicas: int, port: Optional[int] = None,
              wait_s: float = 30.0, started: Optional[Callable[[subprocess.Popen], None]] = None) -> "Lighthouse":
        """Start it on `port` of `host` (None: a free one) and wait until it accepts connections.
        Several nodes give the port every node was told (launch.master_port), so it must be free.
        `started` is told of the process as soon as it exists (the job's record of its processes)."""
        if port is not None and port_in_use(port):
            raise UserError(f"launch.master_port={port} is in use on node 0 ({host}), where the torchft lighthouse "
                            "of this fault-tolerant job listens; pick another port (the same on every node)")
        port = port or free_port(host)
        cmd = [lighthouse_binary(), "--bind", f"{host}:{port}", "--min_replicas", str(min_replicas),
               "--join_timeout_ms", str(int(cfg.join_timeout_s * 1000)),
               "--heartbeat_timeout_ms", str(int(cfg.heartbeat_timeout_s * 1000)), "--quorum_tick_ms", "50"]
        log.parent.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(cmd, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)
        if started is not None:
            started(proc)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise UserError(f"torchft lighthouse on {host}:{port} exited at start (code {proc.returncode}); "
                                f"see {log}")
            try:
                socket.create_connection((host, port), timeout=0.5).close()
                (log.parent / "lighthouse.pid").write_text(f"{proc.pid}\n")
                return Lighthouse(host, port, proc, log)
            except OSError:
                time.sleep(0.05)
        proc.kill()
        proc.wait()
        raise UserError(f"torchft lighthouse on {host}:{port} did not start within {wait_s:.0f} s; see {log}")

    def dead(self) -> Optional[int]:
        """Its exit code once it has died (None while it runs)."""
        return self.proc.poll()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
