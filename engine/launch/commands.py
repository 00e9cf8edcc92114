"""The launch commands: what the launching side (engine/launch/: the loop and its plans; the
engine/ft/launch/: the fault-tolerant supervisor, its launch over ssh, the lighthouse) build and start.

- ports: a free port to listen on, and whether a given one is taken (`free_port`, `port_in_use`);
- thread settings: the cores this process may use and the OMP threads per rank (DeepSpeed sets
  none on the CPU), and the environment every launched rank gets (`cores`, `omp_threads`,
  `launcher_env`);
- command lines: cli.py's arguments for a launched process (`script_args`), DeepSpeed's (or
  torchrun's) single-machine launch (`launcher_command`) and its multi-node runner
  (`multi_node_command`);
- a forked rank's place (`forked_rank_env`): what DeepSpeed's per-node launcher puts in the
  environment of rank r on one machine, which `launch.launcher=fork` sets in the forked process.

Nothing here starts a process or watches one; that is engine/launch/loop.py's loop.
"""
from __future__ import annotations

import base64
import json
import os
import random
import socket
import sys
from pathlib import Path
from typing import Optional

import torch

from core.distenv import user_visible_devices_env
from core.rundir import SUPERVISED_ENV, RunDir
from engine.launch.config import Launcher, LaunchConfig

REPO = Path(__file__).resolve().parents[2]


#: where `free_port` looks first: below Linux's default ephemeral range (32768-60999)
LISTEN_PORTS = (20000, 32767)


def free_port(addr: str = "127.0.0.1") -> int:
    """A port that `addr` can listen on now, for a TCP store or a lighthouse that binds it later.

    Not one the kernel hands out (bind to port 0): that comes from the ephemeral range, from
    which every outgoing connection on the machine also takes its local port. Between this
    check and the bind, seconds later in another process, gloo's connections of any other job
    on the machine could take it (EADDRINUSE at rank 0's store, seen with two test workers
    running jobs side by side). A random port below that range is free of those; where none of
    a few tries can be bound, the kernel's choice is the fallback."""
    host = addr if addr not in ("localhost",) else "127.0.0.1"
    draw = random.SystemRandom()  # not the seeded `random`: two seeded processes would draw alike
    low, high = LISTEN_PORTS
    for _ in range(20):
        port = draw.randint(low, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> bool:
    """Whether a TCP port cannot be bound on this machine (any address), as the TCP store would."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return True
    return False


def cores() -> int:
    """Cores this process may run on (SLURM's and taskset's limits included)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def omp_threads(cfg: LaunchConfig, ranks_here: Optional[int] = None, cpus: Optional[int] = None) -> int:
    """Threads per rank: launch.omp_threads; else OMP_NUM_THREADS where the shell set it (a whole
    number, as torchrun keeps it); else the node's cores divided among its ranks.

    Why the shell's value counts: whoever set it knows this job's share of the machine, which the
    core count does not. Several jobs side by side on one machine (a test suite on 12 workers of a
    16-core GPU host, a scheduler packing jobs) would each take every core for its ranks otherwise,
    and run several times slower than alone."""
    if cfg.omp_threads:
        return cfg.omp_threads
    given = os.environ.get("OMP_NUM_THREADS", "").strip()
    if given.isdigit() and int(given) >= 1:
        return int(given)
    return max(1, (cpus or cores()) // (ranks_here or cfg.nproc or 1))


def launcher_command(cfg: LaunchConfig, port: int, script_args: list[str]) -> list[str]:
    """The single-machine command (launch.nproc ranks on localhost)."""
    script = str(REPO / "cli.py")
    if cfg.launcher == Launcher.torchrun:
        return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={cfg.nproc}",
                f"--master_addr={cfg.master_addr}", f"--master_port={port}", script, *script_args]
    # DeepSpeed's per-node launcher, which its runner would exec for one machine anyway: going
    # straight to it saves the runner's Python start-up and DeepSpeed import (seconds on a small
    # machine) and its "Unable to find hostfile" warning.
    world = base64.urlsafe_b64encode(json.dumps({"localhost": list(range(cfg.nproc or 1))}).encode()).decode()
    return [sys.executable, "-u", "-m", "deepspeed.launcher.launch", f"--world_info={world}",
            f"--master_addr={cfg.master_addr}", f"--master_port={port}", "--no_local_rank",
            f"--log_level={cfg.log_level}", script, *script_args]


def multi_node_command(cfg: LaunchConfig, master_addr: str, port: int, script_args: list[str]) -> list[str]:
    """DeepSpeed's multi-node runner on the hostfile: over pdsh, or this node's part (no_ssh).

    `--no_ssh_check`: the hosts were checked already, with the ssh options pdsh uses (DeepSpeed's
    own check ignores them and looks at the first host only). `--force_multi`: a hostfile with
    one host still runs on that host, not on this machine.
    """
    cmd = [sys.executable, "-u", "-m", "deepspeed.launcher.runner", "--no_local_rank",
           "--log_level", str(cfg.log_level), "--hostfile", str(Path(cfg.hostfile).resolve()),
           "--master_addr", master_addr, "--master_port", str(port)]
    for key in ("include", "exclude", "num_nodes"):
        if getattr(cfg, key) is not None:
            cmd += [f"--{key}", str(getattr(cfg, key))]
    if cfg.no_ssh:
        cmd += ["--no_ssh", "--node_rank", str(cfg.node_rank)]
    else:
        cmd += ["--no_ssh_check", "--force_multi"]
        if cfg.ssh_port is not None:
            cmd += ["--ssh_port", str(cfg.ssh_port)]
    return cmd + [str(REPO / "cli.py"), *script_args]


def launcher_env(cfg: LaunchConfig, ranks_here: Optional[int] = None, cpus: Optional[int] = None) -> dict[str, str]:
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(omp_threads(cfg, ranks_here, cpus))
    env["PYTHONUNBUFFERED"] = "1"
    env[SUPERVISED_ENV] = "1"  # this process reports the ranks' one-line errors (engine/rank/entry.py)
    if not torch.cuda.is_available():  # else DeepSpeed warns "Setting accelerator to CPU" in every process
        env.setdefault("DS_ACCELERATOR", "cpu")
    env.setdefault("PYTHONPATH", str(REPO))
    env.update(user_visible_devices_env())  # (the launcher overrides CUDA_VISIBLE_DEVICES: core/distenv.py)
    return env


def forked_rank_env(nproc: int, master_addr: str, port: int, rank: int) -> dict[str, str]:
    """The variables DeepSpeed's per-node launcher (deepspeed.launcher.launch) sets for rank `rank`
    of a one-machine job of `nproc` ranks, on top of `launcher_env`'s: a forked rank gets exactly
    these, so that it takes its place, device and thread count as a launched one does (tests
    compare the two against DeepSpeed's own code)."""
    return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, range(nproc))), "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(port), "WORLD_SIZE": str(nproc), "CROSS_RANK": "0", "CROSS_SIZE": "1",
            "LOCAL_SIZE": str(nproc), "RANK": str(rank), "LOCAL_RANK": str(rank)}


def script_args(run_dir: RunDir, overrides: list[str]) -> list[str]:
    """cli.py's arguments for the processes a launch starts: the user's overrides, with the run
    directory this process resolved (every rank and replica writes into that one)."""
    args = [o for o in overrides if not o.startswith(("hydra.run.dir=", "hydra.output_subdir="))]
    return args + [f"hydra.run.dir={run_dir.root}", "hydra.output_subdir=null"]
