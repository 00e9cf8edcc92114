"""Multi-node launches for real, across two emulated hosts (network namespaces, tests/support/emulated_hosts.py).

One 2-host x 2-rank job on gloo, started through DeepSpeed's multi-node runner both ways cli.py
offers, must end exactly where the same 4-rank job on one host ends (summary.json's test
accuracy, every rank's final parameters). It runs in two legs, the second resuming the first's
per-rank checkpoints and started the other way:

- pdsh over ssh (an sshd per host, throw-away keys): cli.py started once, on the first host,
  stopped by SIGTERM, which it forwards to the ranks on both hosts over ssh;
- `launch.no_ssh=true`: cli.py started on each host with its node rank (a scheduler's per-node
  start), resuming to the end.

The stop is sent as soon as the ranks exist; cli.py holds it until every rank has its handler
installed, and the ranks stop together at the next agreed step (every 2 steps). Steps are slowed
down (train.imbalance.delay_ms, which changes no number) so that this comes before the end even
on a loaded machine. (A no-ssh launch stopped by a `stop_request` file, what slurm/syncopt.sbatch
writes at the time-limit warning, is tests/test_multinode_slurm.py's requeued job.)
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.support.emulated_hosts import IFNAME, EmulatedHosts

pytestmark = pytest.mark.multinode

REPO = Path(__file__).resolve().parent.parent
PY = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv" / "bin" / "python").exists() else sys.executable
STEPS = 12
JOB = ["model=small_cnn", "data=digits", "algo=allreduce", f"train.max_steps={STEPS}", "train.progress=false",
       "train.log_every_steps=4", "train.preempt_check_every=2", "checkpoint.every_steps=4",
       "checkpoint.every_epochs=null", "train.eval_every_epochs=null", "train.imbalance.delay_ms=200",
       "launch.omp_threads=1"]
TIMEOUT = 420


@pytest.fixture(scope="module")
def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "HYDRA_FULL_ERROR")}
    env["GLOO_SOCKET_IFNAME"] = IFNAME  # the hosts share a hostname that resolves to 127.0.0.1
    env["CUDA_VISIBLE_DEVICES"] = ""  # CPU ranks, as the one-host reference
    return env


@pytest.fixture(scope="module")
def one_host(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reference: the same job (the real trainer, the same config) on 4 gloo ranks on this
    machine's loopback, uninterrupted."""
    from tests.support.harness import run_ranks, train_in_rank

    run_dir = tmp_path_factory.mktemp("one_host")
    run_ranks(train_in_rank, 4, JOB, str(run_dir), timeout=TIMEOUT, env={"LOCAL_SIZE": "4"})
    return run_dir


def hostfile(tmp: Path, hosts: EmulatedHosts) -> Path:
    path = tmp / "hostfile"
    path.write_text("# two emulated hosts\n" + "".join(f"{a} slots=2\n" for a in hosts.addresses))
    return path


def final_state(run_dir: Path) -> tuple[float, list[dict[str, torch.Tensor]]]:
    summary = json.loads((run_dir / "summary.json").read_text())
    last = max((run_dir / "checkpoints").glob("step_*"))
    assert last.name == f"step_{STEPS:08d}"
    models = [torch.load(last / f"rank_{r}.pt", map_location="cpu", weights_only=True)["model"] for r in range(4)]
    return summary["test_acc"], models


def assert_same_run(run_dir: Path, reference: Path) -> None:
    acc, models = final_state(run_dir)
    ref_acc, ref_models = final_state(reference)
    assert json.loads((run_dir / "summary.json").read_text())["world_size"] == 4
    assert acc == ref_acc
    for rank, (mine, ref) in enumerate(zip(models, ref_models)):
        for name in ref:
            torch.testing.assert_close(mine[name], ref[name], rtol=0, atol=1e-6,
                                       msg=lambda m, n=name, r=rank: f"rank {r} {n}: {m}")


def wait_for_ranks(run_dir: Path, procs: list[subprocess.Popen], world: int = 4) -> None:
    """Until every rank has written its pid file (so the launching processes watch the run)."""
    deadline = time.monotonic() + TIMEOUT
    while not all((run_dir / "logs" / f"rank_{r}.pid").exists() for r in range(world)):
        assert all(p.poll() is None for p in procs), "a launcher ended before its ranks started"
        assert time.monotonic() < deadline, "the ranks did not start"
        time.sleep(0.2)


def finish(procs: list[subprocess.Popen]) -> None:
    """Wait for the launching processes, each checked for exit code 0 (its stderr shown if not)."""
    for node, proc in enumerate(procs):
        _, err = proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == 0, f"launcher {node} (exit {proc.returncode}): {err[-3000:]}"


def stopped_step(run_dir: Path) -> int:
    """The step at which a signalled run stopped: its newest checkpoint (written then, or just
    before by the periodic schedule)."""
    assert json.loads((run_dir / "stopped.json").read_text())["reason"].startswith("signal")
    assert not (run_dir / "summary.json").exists()
    newest = max((run_dir / "checkpoints").glob("step_*"))
    manifest = json.loads((newest / "manifest.json").read_text())
    assert manifest["world_size"] == 4
    assert manifest["step"] % 2 == 0 and manifest["step"] < STEPS  # an agreed step, before the end
    return manifest["step"]


def test_two_hosts_stopped_over_pdsh_and_resumed_per_host_equal_one_host(
        hosts: EmulatedHosts, base_env: dict[str, str], one_host: Path, tmp_path: Path) -> None:
    """One run in two legs: pdsh over ssh stopped by SIGTERM, then `launch.no_ssh=true` (one cli.py
    per host) resuming that checkpoint to the end. Both ways of starting, a stop that reaches the
    ranks on both hosts, and a resume across the two (a job moved from ssh to a scheduler's
    per-node start), in one run. (Two legs, not three with a second stop: CI's 30 minutes.)"""
    env = {**base_env, **hosts.start_sshd()}
    run_dir = tmp_path / "run"
    args = [*JOB, f"launch.hostfile={hostfile(tmp_path, hosts)}", f"hydra.run.dir={run_dir}"]

    first = hosts.popen(0, [PY, "cli.py", *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True)
    wait_for_ranks(run_dir, [first])
    first.send_signal(signal.SIGTERM)
    out, _ = first.communicate(timeout=TIMEOUT)
    assert first.returncode == 0, out[-3000:]
    stopped = stopped_step(run_dir)
    # pdsh prefixes each line with the host it came from: both hosts ran their share
    for addr in hosts.addresses:
        assert f"{addr}: " in out, out[-3000:]
    exported = (run_dir / "logs" / "deepspeed_env").read_text()
    assert f"GLOO_SOCKET_IFNAME={IFNAME}" in exported and "OMP_NUM_THREADS=1" in exported

    second = [hosts.popen(node, [PY, "cli.py", *args, "launch.no_ssh=true", "launch.master_port=29617",
                                 f"launch.node_rank={node}"], cwd=REPO, env=base_env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for node in (0, 1)]
    finish(second)
    assert json.loads((run_dir / "summary.json").read_text())["resumed_from"] == stopped
    assert_same_run(run_dir, one_host)
