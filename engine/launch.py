"""Starting the ranks from cli.py through DeepSpeed's launcher (or torchrun), and watching them.

cli.py, when it is not itself a launched rank, re-executes itself through the launcher with the
run directory it resolved passed down (`hydra.run.dir=...`), so every rank writes into one run
directory. It picks a free master port (the default 29500 collides between concurrent runs),
sets OMP_NUM_THREADS per rank (DeepSpeed sets none on CPU), and then supervises:

- signals (Ctrl-C, SIGTERM, SLURM's warning signal) are passed to the ranks as SIGUSR1, which
  makes them checkpoint at an agreed step and exit 0; a second signal ends the job;
- when the job fails, it names the rank that stopped first (ranks leave `logs/rank_<r>.pid`, and
  `logs/rank_<r>.error` when they die of an exception) and where its log is.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from engine.errors import USER_ERROR_EXIT
from engine.launch_config import LaunchConfig

REPO = Path(__file__).resolve().parent.parent


def free_port(addr: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr if addr not in ("localhost",) else "127.0.0.1", 0))
        return s.getsockname()[1]


def omp_threads(cfg: LaunchConfig) -> int:
    if cfg.omp_threads:
        return cfg.omp_threads
    return max(1, (os.cpu_count() or 1) // cfg.nproc)


def launcher_command(cfg: LaunchConfig, port: int, script_args: list[str]) -> list[str]:
    script = str(REPO / "cli.py")
    if cfg.launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={cfg.nproc}",
                f"--master_addr={cfg.master_addr}", f"--master_port={port}", script, *script_args]
    return [sys.executable, "-u", "-m", "deepspeed.launcher.runner", "--no_local_rank",
            "--log_level", cfg.log_level,
            "--master_addr", cfg.master_addr, "--master_port", str(port),
            "--num_gpus", str(cfg.nproc), script, *script_args]


def launcher_env(cfg: LaunchConfig) -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(omp_threads(cfg))
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("PYTHONPATH", str(REPO))
    return env


class RankWatch:
    """Follows the ranks' pid files to tell which rank stopped first when a job fails."""

    def __init__(self, run_dir: Path) -> None:
        self.logs = run_dir / "logs"
        self.host = os.uname().nodename
        self.pids: dict[int, int] = {}
        self.gone: list[int] = []  # ranks in the order their process disappeared

    def clear(self) -> None:
        for pattern in ("rank_*.pid", "rank_*.error"):
            for f in self.logs.glob(pattern):
                f.unlink(missing_ok=True)

    def poll(self) -> None:
        for f in self.logs.glob("rank_*.pid"):
            rank = int(f.stem.split("_")[1])
            if rank not in self.pids:
                try:
                    pid, host = f.read_text().split()
                except ValueError:
                    continue
                if host == self.host:
                    self.pids[rank] = int(pid)
        for rank, pid in self.pids.items():
            if rank not in self.gone and not _alive(pid):
                self.gone.append(rank)

    def signal_ranks(self, sig: int) -> int:
        sent = 0
        for rank, pid in self.pids.items():
            if rank not in self.gone:
                try:
                    os.kill(pid, sig)
                    sent += 1
                except ProcessLookupError:
                    pass
        return sent

    def failure_report(self, code: int) -> str:
        """Name the rank that caused the failure: a rank that vanished without leaving an error
        (killed, segfault) comes first; else the earliest error that is not merely a peer's
        connection dropping (which every survivor reports when one rank dies)."""
        errors = {int(f.stem.split("_")[1]): (f.stat().st_mtime, f.read_text().strip())
                  for f in self.logs.glob("rank_*.error")}
        silent = [r for r in self.gone if r not in errors]
        if silent:
            rank, why = silent[0], "its process ended without an error (killed or crashed)"
        elif errors:
            primary = {r: e for r, e in errors.items() if not _is_peer_loss(e[1])} or errors
            rank = min(primary, key=lambda r: primary[r][0])
            why = primary[rank][1]
        else:
            return f"the job failed (launcher exit code {code}); see {self.logs}"
        return (f"rank {rank} failed: {why}; the job was stopped (launcher exit code {code}); "
                f"log: {self.logs / f'rank_{rank}.log'}")


_PEER_LOSS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Timed out",
              "timed out", "Connection refused")


def _is_peer_loss(message: str) -> bool:
    return any(marker in message for marker in _PEER_LOSS)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead for our purpose
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except OSError:
        return False


def run_launcher(cmd: list[str], env: dict[str, str], run_dir: Path) -> int:
    """Run the launcher, forward stop signals to the ranks, and explain a failure in one line."""
    watch = RankWatch(run_dir)
    watch.clear()
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    received: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        received.append(signum)
        if len(received) == 1 and watch.signal_ranks(signal.SIGUSR1):
            print(f"syncopt: {signal.Signals(signum).name}: ranks will checkpoint and stop at the next "
                  "agreed step (signal again to stop at once)", file=sys.stderr, flush=True)
        else:
            os.killpg(proc.pid, signal.SIGTERM if len(received) < 3 else signal.SIGKILL)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    try:
        while proc.poll() is None:
            watch.poll()
            time.sleep(0.2)
        watch.poll()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    code = proc.returncode
    if code not in (0, USER_ERROR_EXIT):
        print(f"syncopt: error: {watch.failure_report(code)}", file=sys.stderr, flush=True)
    return code


def launch(cfg: LaunchConfig, run_dir: Path, overrides: list[str]) -> int:
    port = cfg.master_port or free_port(cfg.master_addr)
    args = [o for o in overrides if not o.startswith(("hydra.run.dir=", "hydra.output_subdir="))]
    args += [f"hydra.run.dir={run_dir}", "hydra.output_subdir=null"]
    return run_launcher(launcher_command(cfg, port, args), launcher_env(cfg), run_dir)


def stopped_message(run_dir: Path) -> Optional[str]:
    marker = run_dir / "stopped.json"
    if marker.exists():
        import json

        reason = json.loads(marker.read_text()).get("reason")
        return f"stopped early ({reason}) with a checkpoint; run the same command to continue"
    return None
