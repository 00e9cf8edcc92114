"""The multi-node launch's parts that need no second host: hostfile reading against DeepSpeed's own
parser, the flags handed to DeepSpeed, the environment file, bad input as one line, and how the
launching process watches and signals ranks (stop requests held until a rank can take them)."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from core.errors import UserError
from core.run_files import wait_for_launch_record as _wait_for_node0
from engine.launch.plans import no_ssh_plan as _no_ssh_plan
from engine.launch.loop import run_launcher
from engine.launch.rank_watch import RankWatch
from engine.launch.commands import multi_node_command
from engine.launch.config import load_launch_config
from engine.launch.hostfile import node_plan, read_hostfile, select_hosts
from engine.launch.remote import exported_env, probe_hosts, write_deepspeed_env
from tests.support.system_packages import require_system_packages

pytestmark = pytest.mark.multinode

REPO = Path(__file__).resolve().parent.parent

HOSTFILES = {
    "plain": "a slots=4\nb slots=4\n",
    "comments": "# cluster\n\n  a slots=2  \nb slots=2 # two GPUs\n",
    "trailing text": "a slots=2x\n",
    "missing slots": "a slots=2\nb\n",
    "typo": "a slot=2\n",
    "duplicate": "a slots=2\na slots=2\n",
    "empty": "# nothing\n",
}
FILTERS = [("", "", -1), ("a", "", -1), ("a:0,2@b:1", "", -1), ("", "b", -1), ("", "a:1@b:0,3", -1),
           ("", "", 1), ("c", "", -1), ("a:7", "", -1), ("", "a@b", -1)]


def ds_select(pool: dict[str, int], include: str, exclude: str, num_nodes: int) -> object:
    from deepspeed.launcher.runner import apply_num_nodes_and_gpus, parse_inclusion_exclusion

    try:
        active = parse_inclusion_exclusion(pool, include, exclude)
        return {h: list(s) for h, s in apply_num_nodes_and_gpus(active, num_nodes, -1).items()} or "error"
    except (ValueError, AssertionError):
        return "error"


@pytest.mark.parametrize("name", sorted(HOSTFILES))
def test_hostfile_accepts_and_rejects_what_deepspeed_does(name: str, tmp_path: Path) -> None:
    from deepspeed.launcher.runner import _parse_hostfile

    text = HOSTFILES[name]
    try:
        expected: object = dict(_parse_hostfile(text.splitlines(keepends=True)))
    except ValueError:
        expected = "error"
    path = tmp_path / "hostfile"
    path.write_text(text)
    try:
        got: object = dict(read_hostfile(path))
    except UserError as err:
        got = "error"
        assert "\n" not in str(err) and str(path) in str(err)
    assert got == expected


def test_include_exclude_num_nodes_select_what_deepspeed_selects() -> None:
    pool = {"a": 4, "b": 4}
    for include, exclude, num_nodes in FILTERS:
        expected = ds_select(dict(pool), include, exclude, num_nodes)
        try:
            plan = select_hosts(pool, include or None, exclude or None, num_nodes if num_nodes > 0 else None)
            got: object = {h: list(s) for h, s in zip(plan.hosts, plan.slots)}
        except UserError:
            got = "error"
        assert got == expected, (include, exclude, num_nodes)


def test_plan_numbers_ranks_host_by_host(tmp_path: Path) -> None:
    path = tmp_path / "hostfile"
    path.write_text("a slots=4\nb slots=4\nc slots=4\n")
    plan = node_plan(path, include="b:1,3@c:0,2")
    assert plan.hosts == ("b", "c") and plan.world_size == 4 and plan.ranks_per_node == 2
    assert plan.ranks_of(0) == [0, 1] and plan.ranks_of(1) == [2, 3]


@pytest.mark.parametrize("overrides, hostfile, message", [
    ({"nproc": 4}, "a slots=2\nb slots=2\n", "launch.nproc=4 but host a has 2 slots"),
    ({}, "a slots=4\nb slots=2\n", "different numbers of slots (a: 4, b: 2)"),
    ({"include": "a:0,1@b:0"}, "a slots=2\nb slots=2\n", "different numbers of slots (a: 2, b: 1)"),
    ({}, "a slots=2\nb slot=2\n", "line 2: 'b slot=2' is not 'HOST slots=N'"),
    ({"include": "c"}, "a slots=2\n", "launch.include=c: host 'c' is not in the hostfile"),
    ({"include": "a", "exclude": "b"}, "a slots=2\n", "launch.include and launch.exclude exclude each other"),
    ({"num_nodes": 1, "include": "a"}, "a slots=2\n", "launch.num_nodes cannot be combined"),
    ({"no_ssh": True, "master_port": 29600}, "a slots=2\n", "launch.no_ssh=true needs launch.node_rank"),
    ({"no_ssh": True, "node_rank": 0}, "a slots=2\n", "needs launch.master_port=PORT"),
    ({"no_ssh": True, "node_rank": 2, "master_port": 29600}, "a slots=2\nb slots=2\n",
     "launch.node_rank=2 but launch.hostfile="),
    ({"node_rank": 1}, "a slots=2\n", "launch.node_rank=1 is only used with launch.no_ssh=true"),
    ({"launcher": "torchrun"}, "a slots=2\n", "use launch.launcher=deepspeed"),
])
def test_bad_launch_input_is_one_line(overrides: dict, hostfile: str, message: str, tmp_path: Path) -> None:
    from engine.launch.config import launch_shape

    path = tmp_path / "hostfile"
    path.write_text(hostfile)
    with pytest.raises(UserError) as err:
        launch_shape(load_launch_config({"hostfile": str(path), **overrides}))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_multi_node_options_need_a_hostfile() -> None:
    with pytest.raises(UserError, match=r"launch.include=a needs launch.hostfile=PATH"):
        load_launch_config({"include": "a"})


def test_deepspeed_flags(tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("a slots=2\nb slots=2\n")
    pdsh = multi_node_command(load_launch_config({"hostfile": str(hostfile), "include": "a@b", "ssh_port": 2222}),
                              "a", 29511, ["x=1"])
    assert pdsh[1:4] == ["-u", "-m", "deepspeed.launcher.runner"]
    joined = " ".join(pdsh)
    for flag in ("--no_local_rank", f"--hostfile {hostfile}", "--include a@b", "--master_addr a",
                 "--master_port 29511", "--ssh_port 2222", "--no_ssh_check", "--force_multi"):
        assert flag in joined
    assert pdsh[-2:] == [str(REPO / "cli.py"), "x=1"] and "--no_ssh" not in pdsh
    cfg = load_launch_config({"hostfile": str(hostfile), "no_ssh": True, "node_rank": 1, "master_port": 29511,
                              "num_nodes": 2})
    no_ssh = " ".join(multi_node_command(cfg, "a", 29511, []))
    assert "--no_ssh --node_rank 1" in no_ssh and "--num_nodes 2" in no_ssh and "--force_multi" not in no_ssh
    # DeepSpeed's runner parses them as meant
    from deepspeed.launcher.runner import parse_args

    args = parse_args(multi_node_command(cfg, "a", 29511, ["x=1"])[4:])
    assert (args.hostfile, args.no_ssh, args.node_rank, args.num_nodes, args.master_port, args.user_args) == \
        (str(hostfile), True, 1, 2, 29511, ["x=1"])


def test_one_rank_per_gpu_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert load_launch_config({}).nproc == 8
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert load_launch_config({}).nproc == 4  # a CPU machine
    assert load_launch_config({"nproc": 2}).nproc == 2


def test_environment_reaches_the_remote_shell_literally(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Values go through DeepSpeed's export quoting and one remote shell (what pdsh runs)."""
    from deepspeed.launcher.multinode_runner import PDSHRunner

    monkeypatch.chdir(tmp_path)
    (tmp_path / ".deepspeed_env").write_text("NCCL_IB_HCA=mlx5_0\n")  # the user's own file wins
    env = {"OMP_NUM_THREADS": "3", "GLOO_SOCKET_IFNAME": "eth1", "NCCL_IB_HCA": "mlx5_9",
           "SYNCOPT_DATA": "/data/with space/$HOME`x`\"q\"\\", "UNRELATED": "1", "TORCH_MULTI": "a\nb"}
    path = tmp_path / "logs" / "deepspeed_env"
    write_deepspeed_env(path, env, ["OMP_NUM_THREADS", "GLOO_", "NCCL_", "SYNCOPT_", "TORCH_"])
    lines = path.read_text().splitlines()
    assert all("=" in ln for ln in lines) and not any(ln.startswith(("UNRELATED", "TORCH_")) for ln in lines)

    class Args:
        user_args: list[str] = []

    runner = PDSHRunner.__new__(PDSHRunner)
    runner.exports = {}
    for line in lines:  # as deepspeed.launcher.runner.main reads DS_ENV_FILE
        key, val = line.split("=", maxsplit=1)
        runner.add_export(key, val)
    exports = "".join(f"export {k}={v}; " for k, v in runner.exports.items())
    out = subprocess.run(["sh", "-c", exports + "env"], capture_output=True, text=True, env={}).stdout
    seen = dict(ln.split("=", 1) for ln in out.splitlines() if "=" in ln)
    assert seen["OMP_NUM_THREADS"] == "3" and seen["GLOO_SOCKET_IFNAME"] == "eth1"
    assert seen["SYNCOPT_DATA"] == env["SYNCOPT_DATA"]
    assert seen["NCCL_IB_HCA"] == "mlx5_0"
    assert exported_env({"GLOO_X": "1", "GLOOX": "2"}, ["GLOO_"]) == {"GLOO_X": "1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_host_is_one_line_before_launch(tmp_path: Path) -> None:
    """Nothing listens on that port of the loopback: ssh is refused, cli.py names the host."""
    require_system_packages(None if shutil.which("ssh") else "no ssh client (openssh-client) is installed")
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("127.0.0.1 slots=2\n")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    out = subprocess.run([sys.executable, "cli.py", f"launch.hostfile={hostfile}", f"launch.ssh_port={_free_port()}",
                          "train.max_steps=2", f"hydra.run.dir={tmp_path}/run"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("syncopt: error: host 127.0.0.1 is not reachable over passwordless ssh")
    assert not (tmp_path / "run" / "logs" / "rank_0.pid").exists()


def test_a_machine_without_an_ssh_client_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found on the GPU machine, which has no ssh: every host's probe raised FileNotFoundError and
    cli.py ended in a traceback with exit 1. Now the probe names the missing client and the fix."""
    monkeypatch.setenv("PATH", str(tmp_path))  # (nothing on it)
    with pytest.raises(UserError, match=r"needs an ssh client \(ssh\) on PATH.*launch.no_ssh=true"):
        probe_hosts(["127.0.0.1", "10.0.0.2"], sys.executable, tmp_path, "token", None)


def test_probe_names_a_host_without_this_python_and_a_busy_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks of engine.launch.remote on what ssh returns (a stand-in `ssh` runs the command here)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "ssh").write_text("#!/bin/sh\nwhile [ $# -gt 1 ]; do shift; done\nexec sh -c \"$1\"\n")
    (fake / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "logs" / "launch.json").write_text('{"token": "t1"}')
    with pytest.raises(UserError, match=r"host a has no /nonexistent/python: the .venv must be at the same path"):
        probe_hosts(["a"], "/nonexistent/python", run_dir, "t1", None)
    with pytest.raises(UserError, match=r"host a does not see the run directory"):
        probe_hosts(["a"], sys.executable, run_dir, "other-token", None)
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(UserError, match=rf"launch.master_port={port} is in use on host a"):
            probe_hosts(["a", "b"], sys.executable, run_dir, "t1", port)
    reports = probe_hosts(["a", "b"], sys.executable, run_dir, "t1", None)
    assert reports[0].free_port and reports[0].cpus >= 1 and reports[1].free_port is None


def test_no_ssh_node0_refuses_a_busy_port_and_other_nodes_wait_for_it(tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("a slots=1\nb slots=1\n")
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cfg = load_launch_config({"hostfile": str(hostfile), "no_ssh": True, "node_rank": 0, "master_port": port})
        with pytest.raises(UserError, match=rf"launch.master_port={port} is in use on node 0"):
            _no_ssh_plan(cfg, tmp_path / "run", [])
    with pytest.raises(UserError, match=r"node 0 did not write .*launch.json.* storage every node shares"):
        _wait_for_node0(tmp_path / "elsewhere", {"master_port": port}, wait_s=0.3)


def test_rank_watch_owns_only_its_ranks_when_hosts_share_a_name(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    host = os.uname().nodename
    for rank in range(4):
        (logs / f"rank_{rank}.pid").write_text(f"{os.getpid()} {host}\n")
        (logs / f"rank_{rank}.error").write_text("old\n")
    node1 = RankWatch(tmp_path, local_ranks={2, 3})
    node1.clear()
    assert sorted(p.name for p in logs.iterdir()) == ["rank_0.error", "rank_0.pid", "rank_1.error", "rank_1.pid"]
    for rank in (2, 3):
        (logs / f"rank_{rank}.pid").write_text(f"{os.getpid()} {host}\n")
    node1.poll()
    assert sorted(node1.pids) == [2, 3]


RANK = r"""
import os, signal, sys, time
logs = sys.argv[1]
with open(os.path.join(logs, "rank_0.pid"), "w") as fh:
    fh.write(f"{os.getpid()} {os.uname().nodename}\n")
time.sleep(1.5)  # setting up: SIGUSR1 would kill this process now
got = []
signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))
deadline = time.time() + 30
while not got and time.time() < deadline:
    time.sleep(0.05)
open(os.path.join(logs, "got"), "w").write("yes" if got else "no")
"""


def test_stop_request_waits_until_the_rank_can_take_it(tmp_path: Path) -> None:
    """A stop_request that comes while the rank is still setting up is delivered once the rank
    has its SIGUSR1 handler, instead of killing it (SIGUSR1's default action)."""
    logs = tmp_path / "logs"
    logs.mkdir()

    def request() -> None:
        deadline = time.monotonic() + 30
        while not (logs / "rank_0.pid").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # the launcher has seen the rank, which has no handler yet
        (tmp_path / "stop_request").touch()

    helper = threading.Thread(target=request)
    helper.start()
    code = run_launcher([sys.executable, "-c", RANK, str(logs)], dict(os.environ), tmp_path,
                        RankWatch(tmp_path, local_ranks={0}))
    helper.join()
    assert code == 0
    assert (logs / "got").read_text() == "yes"


def test_no_ssh_needs_an_explicit_run_directory(tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("a slots=2\n")
    out = subprocess.run([sys.executable, str(REPO / "cli.py"), f"launch.hostfile={hostfile}", "launch.no_ssh=true",
                          "launch.node_rank=0", "launch.master_port=29633"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300,
                         env={k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")})
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "syncopt: error: launch.no_ssh=true: give hydra.run.dir=PATH, the same on every node "
        "(on storage they share), so that all nodes write one run"]
