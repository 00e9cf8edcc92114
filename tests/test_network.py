"""launch.network: an emulated cluster on this machine (engine/launch/network.py).

- the emulation itself: namespaces, switch and tbf-shaped links appear, a transfer between two
  nodes takes what the configured bandwidth says while one inside a node (loopback) does not,
  and nothing remains afterwards;
- one real job through cli.py: a first launch is killed with -9 while its ranks train, which
  leaves its namespaces and ranks behind; the next launch removes them (their owner is dead), then
  runs 2 nodes x 2 ranks end to end, records the link in summary.json and metrics.jsonl, spends
  its communication time as the link says, and leaves nothing behind;
- bad input: one line, exit code 2, before anything is made.

The namespace tests need root and iproute2 and skip, with the reason, elsewhere.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.errors import UserError
from engine.launch import network
from engine.launch.network import EmulatedCluster, NetworkConfig, NetworkKind, namespaces, requirements_problem
from engine.launch.procs import alive as _alive
from tests.support.emulated_hosts import namespaces_usable
from tests.support.harness import compose
from tests.support.system_packages import require_system_packages

REPO = Path(__file__).resolve().parent.parent
PY = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv" / "bin" / "python").exists() else sys.executable
TIMEOUT = 420

# Receives N bytes on PORT and prints the seconds from the first byte to the last.
_RECEIVE = r"""
import socket, sys, time
n = int(sys.argv[1]); s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 5599)); s.listen(1); print("ready", flush=True); c, _ = s.accept(); got, t0 = 0, None
while got < n:
    got += len(c.recv(1 << 20)); t0 = t0 or time.perf_counter()
print(time.perf_counter() - t0, flush=True)
"""
_SEND = r"""
import socket, sys
c = socket.create_connection((sys.argv[1], 5599)); c.sendall(b"x" * int(sys.argv[2])); c.close()
"""


@pytest.fixture(scope="module")
def root_namespaces() -> None:
    reason = requirements_problem() or namespaces_usable()
    if reason:
        pytest.skip(reason)


def transfer_s(cluster: EmulatedCluster, src: int, dst: int, nbytes: int) -> float:
    """Seconds to move `nbytes` over TCP from node `src` to node `dst`."""
    recv = subprocess.Popen(cluster.prefix(dst) + [sys.executable, "-c", _RECEIVE, str(nbytes)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert recv.stdout.readline().strip() == "ready"
        subprocess.run(cluster.prefix(src) + [sys.executable, "-c", _SEND, cluster.addresses[dst], str(nbytes)],
                       check=True, timeout=60)
        return float(recv.communicate(timeout=60)[0])
    finally:
        recv.kill()


@pytest.mark.multinode
def test_links_are_shaped_and_nothing_remains(root_namespaces: None) -> None:
    cfg = NetworkConfig(kind=NetworkKind.emulated, nodes=2, bandwidth_mbit=20)
    with EmulatedCluster(cfg, ranks=4) as cluster:
        made = set(cluster.made)
        assert made == {cluster.switch, *cluster.names} and made <= set(namespaces())
        nbytes = 1_250_000  # 0.5 s at 20 Mbit/s
        across = transfer_s(cluster, 1, 0, nbytes)
        within = transfer_s(cluster, 0, 0, nbytes)  # a node's own address: its loopback
    assert 0.8 * 0.5 <= across <= 1.25 * 0.5, across
    assert within < 0.1, within
    assert not made & set(namespaces())


# ---- one job through cli.py ---------------------------------------------------------------------

JOB = ["model=small_cnn", "data=digits", "algo=allreduce", "train.progress=false", "train.log_every_steps=4",
       "train.eval_every_epochs=null", "checkpoint.every_epochs=null", "launch.omp_threads=1", "launch.nproc=4",
       "launch.network.kind=emulated", "launch.network.nodes=2", "launch.network.bandwidth_mbit=100"]


def owned_by(pid: int) -> list[str]:
    return [n for n in namespaces() if n.startswith(f"{network.PREFIX}-{pid}-")]


def rank_pids(run_dir: Path, world: int, procs: subprocess.Popen, timeout: float = TIMEOUT) -> list[int]:
    """The ranks' pids, once all of them have started."""
    files = [run_dir / "logs" / f"rank_{r}.pid" for r in range(world)]
    deadline = time.monotonic() + timeout
    while not all(f.exists() for f in files):
        assert procs.poll() is None, "the launcher ended before its ranks started"
        assert time.monotonic() < deadline, "the ranks did not start"
        time.sleep(0.2)
    return [int(f.read_text().split()[0]) for f in files]


@pytest.mark.multinode
@pytest.mark.slow
def test_kill9_leaves_nothing_after_the_next_start_which_runs_on_the_link(root_namespaces: None, cli_env: dict[str, str],
                                                                          tmp_path: Path) -> None:
    # the launch to kill: 2 nodes of one rank each (what is left behind is per node; more ranks
    # only start more interpreters, CI's 30 minutes)
    first = subprocess.Popen([PY, "cli.py", *JOB, "launch.nproc=2", "train.max_steps=400", "train.imbalance.delay_ms=100",
                              f"hydra.run.dir={tmp_path / 'killed'}"], cwd=REPO, env=cli_env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        orphans = rank_pids(tmp_path / "killed", 2, first)
        first.kill()  # SIGKILL to the launcher alone: no teardown runs
        first.wait(timeout=30)
        assert len(owned_by(first.pid)) == 3 and all(_alive(p) for p in orphans)

        steps = 8
        run_dir = tmp_path / "run"
        second = subprocess.run([PY, "cli.py", *JOB, f"train.max_steps={steps}", f"hydra.run.dir={run_dir}"],
                                cwd=REPO, env=cli_env, capture_output=True, text=True, timeout=TIMEOUT)
        assert second.returncode == 0, second.stderr[-3000:]
    finally:  # whatever happened: nothing of the first launch may outlive the test
        first.kill()
        first.wait(timeout=30)
        for name in owned_by(first.pid):
            network.remove_namespace(name)
    assert not owned_by(first.pid) and not any(_alive(p) for p in orphans)
    summary = json.loads((run_dir / "summary.json").read_text())
    link = {"nodes": 2, "bandwidth_mbit": 100.0, "latency_ms": 0.0, "jitter_ms": 0.0, "loss_pct": 0.0}
    assert summary["network"] == link
    assert json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0]) == {"kind": "run", "step": 0, "network": link}
    # A 4-rank ring across 2 nodes sends 2 (n-1)/n = 1.5 gradients over each node's uplink per step.
    per_rank_bytes = summary["comm_bytes"] / 4 / steps  # 1.5 x the gradient
    link_s = steps * per_rank_bytes * 8 / 100e6
    assert summary["comm_s"] >= 0.7 * link_s, (summary["comm_s"], link_s)


# ---- bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, message", [
    (["launch.network.kind=emulated", "launch.nproc=4", "launch.network.nodes=3"], "launch.network.nodes=3 must divide launch.nproc=4"),
    (["launch.network.kind=emulated", "launch.nproc=1"], "must divide launch.nproc=1"),
    (["launch.network.bandwidth_mbit=100"], "add launch.network.kind=emulated"),
    (["launch.network.kind=emulated", "launch.network.bandwidth_mbit=0"], "launch.network.bandwidth_mbit=0.0 must be > 0"),
    (["launch.network.kind=emulated", "launch.network.loss_pct=100"], "launch.network.loss_pct=100.0 must be >= 0 and < 100"),
    (["launch.network.kind=emulated", "launch.master_addr=10.0.0.1"], "launch.master_addr=10.0.0.1: with launch.network"),
    (["launch.network.kind=emulated", "launch.launcher=torchrun"], "cannot be combined with launch.launcher=torchrun"),
    (["launch.network.kind=wan"], "launch.network.kind='wan' is not one of none, emulated"),
])
def test_bad_settings_are_one_line(overrides: list[str], message: str) -> None:
    with pytest.raises(UserError, match=message.replace(".", r"\.").replace("(", r"\(")) as err:
        compose(overrides)
    assert "\n" not in str(err.value)


def test_missing_root_or_tools_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert requirements_problem().startswith("needs root")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool == "tc" else f"/usr/sbin/{tool}")
    assert requirements_problem().startswith("needs iproute2's tc on PATH")


def test_cli_without_tc_stops_before_anything_starts(cli_env: dict[str, str], tmp_path: Path) -> None:
    if os.geteuid() == 0:  # (as another user the refusal is "needs root", whatever is installed)
        require_system_packages(None if shutil.which("ip") else "iproute2's ip is not installed")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if shutil.which("ip"):
        (bin_dir / "ip").symlink_to(shutil.which("ip"))
    run_dir = tmp_path / "run"
    out = subprocess.run([PY, "cli.py", *JOB, "train.max_steps=2", f"hydra.run.dir={run_dir}"], cwd=REPO,
                         env={**cli_env, "PATH": str(bin_dir)}, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    errors = [ln for ln in out.stderr.splitlines() if "syncopt: error" in ln]
    expected = "needs root" if os.geteuid() != 0 else "needs iproute2's tc on PATH"
    assert len(errors) == 1 and expected in errors[0], out.stderr[-2000:]
    assert not (run_dir / "logs").exists()


def test_node_launch_is_what_deepspeeds_runner_runs_with_no_ssh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each emulated node runs DeepSpeed's per-node launcher as its runner would for
    `--no_ssh --node_rank N`: the same encoding of the hosts, arguments its parser takes."""
    from deepspeed.launcher import launch as ds_launch
    from deepspeed.launcher.runner import encode_world_info as ds_encode

    from engine.launch.node_group import encode_world_info, node_launch_command

    cluster = EmulatedCluster(NetworkConfig(kind=NetworkKind.emulated, nodes=2), ranks=4)
    world = cluster.world_info()
    assert world == {"10.77.0.1": [0, 1], "10.77.0.2": [0, 1]}
    assert encode_world_info(world) == ds_encode(world)
    cmd = node_launch_command("warning", world, 1, cluster.master_addr, 29500, ["algo=allreduce"])
    assert cmd[1:4] == ["-u", "-m", "deepspeed.launcher.launch"]
    monkeypatch.setattr(sys, "argv", ["launch.py", *cmd[4:]])  # its parser reads sys.argv
    args = ds_launch.parse_args()
    assert (args.node_rank, args.master_addr, args.master_port, args.no_local_rank) == (1, "10.77.0.1", 29500, True)
    assert args.training_script.endswith("cli.py") and args.training_script_args == ["algo=allreduce"]


def test_a_link_is_tbf_with_netem_inside_split_over_two_hops(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tc commands of one hop (this machine's kernel may lack netem, so they are checked as
    commands): the rate in a token bucket, half the delay and jitter and the per-hop loss that
    makes the node-to-node path lose loss_pct, in a netem inside it."""
    issued: list[tuple[str, ...]] = []
    monkeypatch.setattr(network, "_tc", lambda ns, *args: issued.append((ns, *args)) or subprocess.CompletedProcess(args, 0))
    cfg = NetworkConfig(kind=NetworkKind.emulated, nodes=2, bandwidth_mbit=100, latency_ms=10, jitter_ms=2, loss_pct=1)
    EmulatedCluster(cfg, ranks=2)._shape("ns", "dev")
    (tbf, netem) = issued
    assert tbf[:8] == ("ns", "qdisc", "add", "dev", "dev", "root", "handle", "1:") and tbf[8:11] == ("tbf", "rate", "100mbit")
    assert netem[5:7] == ("parent", "1:1") and netem[9:13] == ("netem", "delay", "5ms", "1ms")
    hop = float(netem[14].rstrip("%"))
    assert netem[13] == "loss" and (1 - hop / 100) ** 2 == pytest.approx(0.99)
    issued.clear()
    EmulatedCluster(NetworkConfig(kind=NetworkKind.emulated, bandwidth_mbit=20), ranks=2)._shape("ns", "dev")
    assert len(issued) == 1  # bandwidth alone: no netem needed
