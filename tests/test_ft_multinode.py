"""Fault-tolerant mode over two hosts (network namespaces, tests/support/emulated_hosts.py): one supervisor
per node started with launch.no_ssh=true (as slurm/syncopt.sbatch starts them), node 0 holding the
lighthouse on its own address, the nodes meeting in the shared run directory (engine/ft/launch/nodes.py).

One 2-host x 2-replica local SGD job, started over pdsh (which runs the per-node no-ssh command
on each host); a replica of node 1 is killed by pid mid-run. The job must exit 0; node 0's summary
counts the failure (node 1's record); the three survivors' rounds after the kill are committed with
three participants, across both hosts; the replacement heals from a live peer on either host (the
model it loaded is one a survivor sent) and the last rounds have all four again. Then the refusal
that stays (an emulated launch.network) and the nodes' records without processes.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.emulated_hosts import IFNAME, EmulatedHosts

pytest.importorskip("torchft")
pytestmark = pytest.mark.multinode

REPO = Path(__file__).resolve().parent.parent
PY = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv" / "bin" / "python").exists() else sys.executable
TIMEOUT = 300


def replica_step(run_dir: Path, index: int) -> int:
    try:
        return int((run_dir / f"replicas/{index}/logs/rank_0.progress").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return -1


def test_two_hosts_over_pdsh_a_killed_replica_heals_across_hosts_and_the_job_succeeds(
        hosts: EmulatedHosts, cli_env: dict, tmp_path: Path) -> None:
    """cli.py started once, on host 0: it checks both hosts and starts, through pdsh, the no-ssh
    command on each (what SLURM's srun starts on every node), so each host runs its own supervisor;
    node 0's command holds the run directory's lock. A replica of node 1 is killed mid-run: node 1
    restarts it, the survivors on both hosts go on, and the replacement heals from one of them."""
    env, args, run_dir = job(hosts, cli_env, tmp_path, ["train.max_steps=160", "train.imbalance.delay_ms=120"])
    env.update(hosts.start_sshd())
    start = time.monotonic()
    proc = hosts.popen(0, [PY, "cli.py", *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + TIMEOUT
    while replica_step(run_dir, 3) < 20:
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "replica 3 did not reach step 20"
        time.sleep(0.1)
    os.kill(int((run_dir / "logs/replica_3.pid").read_text()), signal.SIGKILL)
    killed_at = max(replica_step(run_dir, i) for i in range(3))
    out, _ = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, out[-3000:]
    # pdsh prefixes each line with its host: node 1 (the second host) restarted its own replica
    assert any(line.startswith(f"{hosts.addresses[1]}: ") and "replica 3 died (exit code -9); restarting it" in line
               for line in out.splitlines()), out[-3000:]
    # a supervisor ran on each host: both nodes' records, node 1's joined through node 0's launch record
    records = [json.loads((run_dir / f"logs/ft_node_{k}.json").read_text()) for k in (0, 1)]
    assert [sorted(r["replicas"]) for r in records] == [["0", "1"], ["2", "3"]], records
    launch = json.loads((run_dir / "logs/launch.json").read_text())
    assert launch["mode"] == "ft_no_ssh" and launch["master_addr"] == hosts.addresses[0], launch
    assert "1" in launch["tokens"], launch
    holder = int((run_dir / "run.lock").read_text().split()[0])
    assert holder != proc.pid  # node 0's command over ssh held it, not this launching process
    summary = json.loads((run_dir / "summary.json").read_text())
    ft = summary["ft"]
    assert ft["nodes"] == 2 and ft["replicas"] == 4, ft
    assert ft["failures"] == 1 and ft["restarts"] == {"0": 0, "1": 0, "2": 0, "3": 1}, ft
    assert ft["failure_log"][0]["replica"] == 3
    survivor = ft["per_replica"]["0"]
    # the survivors on both hosts went on: committed rounds with three participants after the kill
    assert [r for r in survivor["participants"] if r[0] >= killed_at and r[1] == 3 and r[2]], survivor["participants"]
    replacement = ft["per_replica"]["3"]
    sent = {tuple(s) for i in ("0", "1", "2") for s in ft["per_replica"][i]["sent_state"]}
    assert replacement["heals"] >= 1 and tuple(replacement["healed_state"][-1]) in sent, (replacement, sent)
    assert all(r[1] == 4 and r[2] for r in survivor["participants"][-2:]), survivor["participants"]
    assert summary["steps"] == 160 and summary["test_acc"] > 0.8, summary
    print(f"two hosts: killed at {killed_at}, healed at {replacement['healed_state'][-1][0]}, "
          f"{time.monotonic() - start:.1f} s")


def job(hosts: EmulatedHosts, cli_env: dict, tmp_path: Path, extra: list[str]) -> tuple[dict, list[str], Path]:
    """The environment, arguments and run directory of a 2-host x 2-replica local SGD job."""
    env = {**cli_env, "GLOO_SOCKET_IFNAME": IFNAME}  # the hosts share a hostname that resolves to 127.0.0.1
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"{a} slots=2\n" for a in hosts.addresses))
    run_dir = tmp_path / "run"
    return env, ["algo=local_sgd", "algo.period=4", "ft.enabled=true", *extra, "train.progress=false",
                 "launch.omp_threads=1", f"launch.hostfile={hostfile}", "launch.master_port=29631",
                 f"hydra.run.dir={run_dir}"], run_dir


@pytest.mark.parametrize("extra,says", [
    ({"network": "emulated"}, "launch.network's emulated nodes"),
], ids=["emulated_network"])
def test_what_fault_tolerant_mode_refuses_across_machines_is_one_line(extra: dict, says: str) -> None:
    from core.errors import UserError
    from engine.ft.config import FTConfig, check_ft
    from engine.launch.config import LaunchConfig
    from engine.launch.network import NetworkConfig, NetworkKind

    launch = LaunchConfig(hostfile=extra.get("hostfile"),
                          network=NetworkConfig(kind=NetworkKind(extra.get("network", "none")), nodes=2))
    with pytest.raises(UserError) as refused:
        check_ft(FTConfig(enabled=True), "local_sgd", "", launch)
    assert says in str(refused.value) and "\n" not in str(refused.value)
    for taken in (LaunchConfig(hostfile="h", no_ssh=True, node_rank=1), LaunchConfig(hostfile="h")):  # no_ssh, pdsh
        check_ft(FTConfig(enabled=True), "local_sgd", "", taken)


def _layout(node: int) -> Any:
    from engine.ft.launch.nodes import NodeLayout

    return NodeLayout(node, 3, 6, [2 * node, 2 * node + 1], f"10.0.0.{node + 1}", "10.0.0.1", 29500)


def test_nodes_see_each_others_replicas_an_ended_job_and_a_lost_node(tmp_path: Path) -> None:
    """engine/ft/launch/nodes.py without processes: node 0's view of nodes 1 and 2 through their records."""
    from core.rundir import RunDir
    from engine.ft.launch.nodes import NodeRecord, NodeWatch, write_node_record

    run_dir = RunDir(tmp_path)
    run_dir.logs.mkdir(parents=True)
    watch = NodeWatch(run_dir, _layout(0), stale_s=0.3, first_s=0.3)
    write_node_record(run_dir, NodeRecord(1, {"2": {"done": True, "exits": [0], "restarts": 0},
                                              "3": {"done": False, "exits": [-9], "restarts": 1}},
                                          failures=[{"replica": 3, "exit": -9}]))
    watch.poll()
    assert watch.remote_replicas() == {2: {"done": True, "exits": [0], "restarts": 0},
                                       3: {"done": False, "exits": [-9], "restarts": 1}}
    assert not watch.all_done() and watch.ended() is None and not watch.lost(1) and not watch.lost(2)
    time.sleep(0.4)  # node 2 never wrote a record (its machine never came up); node 1 went silent mid-run
    watch.poll()
    assert watch.lost(2) and watch.lost(1)
    assert watch.remote_replicas()[3]["done"]  # a lost node's replicas count as done, so the job can end
    assert watch.all_done()
    write_node_record(run_dir, NodeRecord(1, {"2": {"done": True, "exits": [0], "restarts": 0},
                                              "3": {"done": True, "exits": [-9, 0], "restarts": 1}},
                                          ended="lighthouse died", code=1))
    watch.poll()
    assert not watch.lost(1) and watch.ended().ended == "lighthouse died" and watch.ended().code == 1


def test_node_0_alone_gives_the_go_once_every_node_s_replicas_are_ready(tmp_path: Path) -> None:
    from core.rundir import RunDir
    from engine.ft.config import FTConfig
    from engine.ft.launch.supervisor import Supervisor
    from engine.launch.config import LaunchConfig

    run_dir = RunDir(tmp_path)
    run_dir.logs.mkdir(parents=True)
    sup = Supervisor(FTConfig(enabled=True), LaunchConfig(), run_dir, _layout(0), [])
    for i in range(5):
        (run_dir.logs / f"replica_{i}.ready").write_text("ready\n")
    assert not sup._ready_to_go()  # replica 5 (node 2) is not ready
    (run_dir.logs / "replica_5.ready").write_text("ready\n")
    assert sup._ready_to_go()


def test_a_node_never_joins_on_the_last_attempts_records(tmp_path: Path) -> None:
    """The race a resume across two hosts hit: node 1 started before node 0 had cleared the last
    attempt's files, read that attempt's launch record and its 'lighthouse died', and ended at
    once while node 0 waited for it. Now node 1 proceeds only on a launch record naming its own
    fresh join token, which node 0 writes after clearing the old files."""
    import threading

    from core.rundir import RunDir
    from engine.ft.launch.nodes import NodeRecord, clear_job_files, meet, write_node_record

    run_dir = RunDir(tmp_path)
    run_dir.logs.mkdir(parents=True)
    layout0, layout1 = _layout(0), _layout(1)
    layout0.nodes = layout1.nodes = 2
    record = {"mode": "ft_no_ssh", "nodes": 2}
    # the last attempt's leftovers: its launch record (node 1's old token) and node 0's 'ended'
    run_dir.launch_record.write_text(json.dumps({**record, "tokens": {"1": "old"}}))
    write_node_record(run_dir, NodeRecord(0, ended="lighthouse died", code=1))
    joined = threading.Event()
    node1 = threading.Thread(target=lambda: (meet(run_dir, layout1, record, wait_s=20), joined.set()))
    node1.start()
    time.sleep(0.6)
    assert not joined.is_set()  # the old record does not carry this attempt's token
    clear_job_files(run_dir, 2)  # node 0 starts: old records gone, then it meets
    assert not (run_dir.logs / "ft_node_0.json").exists()
    meet(run_dir, layout0, record, wait_s=20)
    node1.join(timeout=20)
    assert joined.is_set()
    seen = json.loads(run_dir.launch_record.read_text())
    assert seen["tokens"]["1"] == json.loads((run_dir.logs / "ft_join_1.json").read_text())["token"] != "old"
