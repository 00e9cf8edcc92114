"""Starting the ranks from cli.py through DeepSpeed's launcher (or torchrun), and watching them.

cli.py, when it is not itself a launched rank, re-executes itself through the launcher with the
run directory it resolved passed down (`hydra.run.dir=...`), so every rank writes into one run
directory. It picks a free master port (the default 29500 collides between concurrent runs),
sets OMP_NUM_THREADS per rank (DeepSpeed sets none on CPU), and then supervises:

- signals (Ctrl-C, SIGTERM, SLURM's warning signal) are passed to the ranks as SIGUSR1, which
  makes them checkpoint at an agreed step and exit 0; a second signal ends the job. A file
  `<run_dir>/stop_request` does the same on every node that watches the run (the SLURM script
  uses it: a signal through srun would reach the ranks twice);
- when the job fails, it names the rank that stopped first (ranks leave `logs/rank_<r>.pid`, and
  `logs/rank_<r>.error` when they die of an exception) and where its log is.

Three ways to start the ranks (docs/multinode.md):

- one machine: `--num_gpus nproc` on localhost;
- `launch.hostfile` with ssh: DeepSpeed's runner starts every node over pdsh; this process checks
  the hosts first (engine.remote), exports the environment through a DS_ENV_FILE, and signals
  the ranks of other hosts over ssh;
- `launch.hostfile` with `launch.no_ssh=true`: this process is one node (`launch.node_rank`);
  the same command runs on every node (slurm/syncopt.sbatch does that), and each watches and
  signals only its own ranks. Node 0 writes `logs/launch.json`; the others wait to see it,
  which proves the run directory is shared before any rank starts;
- `launch.network`: an emulated cluster on this machine (engine.launch.network builds it and
  removes it afterwards), each node's share started inside its namespace by DeepSpeed's per-node
  launcher, as the no-ssh way starts it on real nodes.
"""
from __future__ import annotations

import base64
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Optional

import torch

from core.errors import USER_ERROR_EXIT, UserError, report_user_errors
from core.run_files import wait_for_launch_record, write_launch_record
from core.rundir import SUPERVISED_ENV, RunDir
from engine.launch.config import Launcher, LaunchConfig, node_plan_of
from engine.launch.network import MASTER_PORT, EmulatedCluster
from engine.launch.node_group import node_group_command, node_launch_command
from engine.drivers.rank_watch import RankWatch, Stall
from engine.launch.remote import probe_hosts, write_deepspeed_env

REPO = Path(__file__).resolve().parents[2]


def free_port(addr: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((addr if addr not in ("localhost",) else "127.0.0.1", 0))
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
    """Threads per rank: launch.omp_threads, else the node's cores divided among its ranks."""
    if cfg.omp_threads:
        return cfg.omp_threads
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
    return env


def _job_manager_signal() -> Optional[tuple[int, Callable[[int, Optional[FrameType]], Any]]]:
    """submitit's preemption signal and its handler, when this process runs under submitit.

    submitit (Hydra's SLURM launcher) requeues the job from its handler of SIGUSR2 (or
    SUBMITIT_PREEMPT_SIGNAL); SLURM sends that signal to every process of the job step. We let the
    ranks ignore it, turn it into a checkpoint-and-stop, and call submitit's handler once the
    ranks have stopped, so the requeued job resumes from that checkpoint.
    """
    name = os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")
    sig = getattr(signal, f"SIG{name}", None)
    if sig is None or sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        return None
    handler = signal.getsignal(sig)
    return (sig, handler) if callable(handler) else None


def run_launcher(cmd: list[str], env: dict[str, str], run_dir: RunDir | Path, watch: Optional[RankWatch] = None,
                 stall_s: Optional[float] = None, received: Optional[list[int]] = None) -> int:
    """Run the launcher, forward stop signals to the ranks, and explain a failure in one line.

    The first stop signal (or a new stop_request file) is delivered as SIGUSR1 as soon as every
    rank is ready for it; a second one terminates the launcher's process group, a third kills it.
    A rank whose heartbeat is silent for `stall_s` seconds ends the job at once, named with its
    step (its peers would otherwise wait in a collective until dist.timeout_s and then blame
    nobody). Once every rank has recorded a clean exit the job is over, whatever the launcher's
    own polling still takes. `received`: the stop signals that arrived are appended to it (a job
    the user stopped is not restarted).
    """
    run_dir = RunDir.of(run_dir)
    watch = watch or RankWatch(run_dir)
    watch.clear()
    manager = _job_manager_signal()

    def child_setup() -> None:
        if manager is not None:  # the ranks must not die of the job manager's signal
            signal.signal(manager[0], signal.SIG_IGN)

    proc = subprocess.Popen(cmd, env=env, start_new_session=True,
                            preexec_fn=child_setup if manager is not None else None)
    received = [] if received is None else received
    pending = [False]  # a stop to deliver once the ranks are ready

    def on_signal(signum: int, frame: Optional[FrameType]) -> None:
        received.append(signum)
        if len(received) == 1:
            pending[0] = True
            print(f"syncopt: {signal.Signals(signum).name}: ranks will checkpoint and stop at the next "
                  "agreed step (signal again to stop at once)", file=sys.stderr, flush=True)
        else:
            os.killpg(proc.pid, signal.SIGTERM if len(received) < 3 else signal.SIGKILL)

    handled = [signal.SIGINT, signal.SIGTERM, signal.SIGUSR1] + ([manager[0]] if manager else [])
    previous = {s: signal.signal(s, on_signal) for s in handled}
    stall: Optional[Stall] = None
    code: Optional[int] = None
    try:
        while proc.poll() is None:
            watch.poll()
            if watch.stop_requested() and not received:
                on_signal(signal.SIGUSR1, None)
            if pending[0] and watch.ready():
                pending[0] = False
                watch.signal_ranks(signal.SIGUSR1)
            stalls = watch.stalls(stall_s) if stall_s else []
            if stalls:
                stall = stalls[0]
                _end_group(proc)
                watch.signal_ranks(signal.SIGKILL)
                code = 1
                break
            codes = watch.exit_codes()
            if codes is not None and not any(codes.values()):
                time.sleep(0.3)  # the launcher's own clean exit, if it is quick
                if proc.poll() is None:
                    _end_group(proc)
                code = 0
                break
            time.sleep(0.2)
        watch.poll()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    code = proc.returncode if code is None else code
    if stall is not None:
        print(f"syncopt: error: {stall.describe()}; the job was stopped; log: "
              f"{watch.run_dir.rank_log(stall.rank)}", file=sys.stderr, flush=True)
    elif code == USER_ERROR_EXIT:
        print(f"syncopt: error: {watch.user_error()}", file=sys.stderr, flush=True)
    elif code != 0:
        print(f"syncopt: error: {watch.failure_report(code)}", file=sys.stderr, flush=True)
    if manager is not None and manager[0] in received and code == 0:
        manager[1](manager[0], None)  # submitit: save the submission and requeue (exits)
    return code


def _end_group(proc: subprocess.Popen) -> None:
    """Kill the launcher and everything it started (its own session), and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


# ---- one launch ---------------------------------------------------------------------------------

@dataclass
class _Plan:
    """One launch: the launcher command, its environment, and the watch over the ranks it owns."""

    cmd: list[str]
    env: dict[str, str]
    watch: RankWatch


def _script_args(run_dir: RunDir, overrides: list[str]) -> list[str]:
    args = [o for o in overrides if not o.startswith(("hydra.run.dir=", "hydra.output_subdir="))]
    return args + [f"hydra.run.dir={run_dir.root}", "hydra.output_subdir=null"]


def _local_plan(cfg: LaunchConfig, run_dir: RunDir | Path, args: list[str]) -> _Plan:
    if cfg.master_port is not None and port_in_use(cfg.master_port):
        raise UserError(f"launch.master_port={cfg.master_port} is in use on this machine; "
                        "pick another port or leave it null")
    port = cfg.master_port or free_port(cfg.master_addr)
    return _Plan(launcher_command(cfg, port, args), launcher_env(cfg),
                 RankWatch(run_dir, local_ranks=set(range(cfg.nproc))))


def _pdsh_plan(cfg: LaunchConfig, run_dir: RunDir | Path, args: list[str]) -> _Plan:
    plan = node_plan_of(cfg)
    token = secrets.token_hex(8)
    master_addr = cfg.master_addr or plan.hosts[0]
    write_launch_record(run_dir, {"mode": "pdsh", "token": token, "hosts": list(plan.hosts),
                            "ranks_per_node": plan.ranks_per_node, "master_addr": master_addr,
                            "launched_from": socket.gethostname(), "time": time.time()})
    reports = probe_hosts(list(plan.hosts), sys.executable, run_dir, token, cfg.master_port, cfg.ssh_port)
    port = cfg.master_port or reports[0].free_port
    # Nodes may differ in cores; one exported value must fit the smallest.
    env = launcher_env(cfg, plan.ranks_per_node, min(r.cpus for r in reports))
    ds_env = run_dir.deepspeed_env
    write_deepspeed_env(ds_env, env, ["OMP_NUM_THREADS", SUPERVISED_ENV, *cfg.export_env])
    env["DS_ENV_FILE"] = str(ds_env)
    remote = {h: plan.ranks_of(i) for i, h in enumerate(plan.hosts)}
    watch = RankWatch(run_dir, local_ranks=set(), remote=remote, ssh_port=cfg.ssh_port)
    return _Plan(multi_node_command(cfg, master_addr, port, args), env, watch)


def _no_ssh_plan(cfg: LaunchConfig, run_dir: RunDir | Path, args: list[str]) -> _Plan:
    run_dir = RunDir.of(run_dir)
    plan = node_plan_of(cfg)
    master_addr = cfg.master_addr or plan.hosts[0]
    record = {"mode": "no_ssh", "hosts": list(plan.hosts), "ranks_per_node": plan.ranks_per_node,
              "master_addr": master_addr, "master_port": cfg.master_port}
    if cfg.node_rank == 0:
        if port_in_use(cfg.master_port):
            raise UserError(f"launch.master_port={cfg.master_port} is in use on node 0 "
                            f"({socket.gethostname()}); pick another port (the same on every node)")
        write_launch_record(run_dir, {**record, "node": socket.gethostname(), "time": time.time()})
    else:
        wait_for_launch_record(run_dir, record, cfg.node_wait_s)
    env = launcher_env(cfg, plan.ranks_per_node)
    watch = RankWatch(run_dir, local_ranks=set(plan.ranks_of(cfg.node_rank)))
    return _Plan(multi_node_command(cfg, master_addr, cfg.master_port, args), env, watch)


def _emulated_plan(cfg: LaunchConfig, run_dir: RunDir, args: list[str], cluster: EmulatedCluster) -> _Plan:
    """launch.network: node i's share of the ranks started by DeepSpeed's per-node launcher inside
    node i's namespace, as `--no_ssh --node_rank i` starts them on real nodes; all nodes share
    this machine's cores."""
    cmds = [cluster.prefix(i) + node_launch_command(str(cfg.log_level), cluster.world_info(), i, cluster.master_addr,
                                                    MASTER_PORT, args)
            for i in range(cluster.nodes)]
    env = {**launcher_env(cfg, cfg.nproc), **cluster.env()}
    return _Plan(node_group_command(cmds), env, RankWatch(run_dir, local_ranks=set(range(cfg.nproc))))


def launch(cfg: LaunchConfig, run_dir: RunDir | Path, overrides: list[str], stall_s: Optional[float] = None,
           received: Optional[list[int]] = None) -> int:
    """Start the job's ranks (or this node's share of them) and supervise them; the exit code.
    `stall_s`: how long a rank's heartbeat may be silent before the job is ended (None: never);
    `received`: collects the stop signals that arrived (see `run_launcher`)."""
    run_dir = RunDir.of(run_dir)
    args = _script_args(run_dir, overrides)
    # launch.network: built here, removed when the launch ends however it ends (engine.launch.network)
    network = EmulatedCluster(cfg.network, cfg.nproc) if cfg.network.emulated else nullcontext()
    with report_user_errors(), network as cluster:
        if cluster is not None:
            plan = _emulated_plan(cfg, run_dir, args, cluster)
        elif not cfg.hostfile:
            plan = _local_plan(cfg, run_dir, args)
        elif cfg.no_ssh:
            plan = _no_ssh_plan(cfg, run_dir, args)
        else:
            plan = _pdsh_plan(cfg, run_dir, args)
        return run_launcher(plan.cmd, plan.env, run_dir, plan.watch, stall_s, received)


def stall_after_s(timeout_s: float) -> float:
    """How long a rank's heartbeat may be silent before the job is ended: half the collective
    timeout (its peers fail at the full timeout anyway), and never under 10 s, so that a rank
    busy in one long call that holds the interpreter (pickling a big checkpoint) is not taken
    for a stopped one."""
    return max(10.0, timeout_s / 2)
