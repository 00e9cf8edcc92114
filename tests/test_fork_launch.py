"""`launch.launcher=fork`: the ranks forked from cli.py run the launcher's run, bit for bit, and
everything around them (the rank watch, stop signals, the run lock, resume) behaves as under
DeepSpeed's launcher (engine/launch/fork.py, docs/multinode.md)."""
from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from core.run_files import read_step
from engine.launch.fork import check_fork_safe, job_exit_code
from engine.launch.commands import forked_rank_env
from engine.launch.procs import alive
from tests.support.cli_runs import REPO, error_line, run_cli, run_cli_here, signal_cli_when, start_cli
from tests.support.harness import run_ranks, train_in_rank
from tests.support.processes import wait_for
from tests.test_faults import newest_complete
from tests.test_resume_registry import diff

# a short digits job: a final checkpoint and evaluation only; dist.device=cpu keeps a GPU machine's
# ranks on the CPU, where the two starts must agree to the last bit
SHORT = ["train.max_steps=12", "train.eval_every_epochs=null", "checkpoint.every_epochs=null", "train.progress=false",
         "dist.device=cpu"]
ALGOS = {
    "local_sgd": ["algo=local_sgd", "algo.period=4"],
    "wagma": ["algo=wagma", "algo.group_size=2", "algo.global_period=3", "algo.wait_avoiding=false"],
    "dgs": ["algo=dgs", "algo.serving=round_robin"],
}
FORK = ["launch.launcher=fork"]
LAUNCHER = ["launch.launcher=deepspeed"]  # (forked is the default on one machine: launch.launcher=auto)


def final_states(run_dir: Path, world: int) -> list[dict]:
    summary = json.loads((run_dir / "summary.json").read_text())
    step = summary["steps"]
    return [torch.load(run_dir / "checkpoints" / f"step_{step:08d}" / f"rank_{r}.pt", weights_only=True)
            for r in range(world)]


def assert_same_states(a: Path, b: Path, world: int) -> None:
    for rank, (x, y) in enumerate(zip(final_states(a, world), final_states(b, world))):
        d = diff(x, y)
        assert not d, f"rank {rank}: the final checkpoints of {a.name} and {b.name} differ at {d[:10]}"


def run_ok(args: list[str], env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    proc = run_cli(args, env, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


# WAGMA: collectives on its own schedule (its groups are sub-process groups every rank makes: two
# groups of 2, 4 ranks); dgs: a parameter server, whose serving thread the fork must start in each
# rank afresh (the server and two workers whose pushes it serves in turn, 3 ranks); local SGD
# below, with the resume across the two starts (its averaging is the world-wide all-reduce that
# allreduce uses every step, so allreduce is not a third pair of runs: CI's 30 minutes)
@pytest.mark.parametrize("algo, world", [("wagma", 4), ("dgs", 3)])
def test_fork_and_launcher_give_bit_identical_final_states(algo: str, world: int, cli_env: dict,
                                                           tmp_path: Path) -> None:
    assert_same_runs([*SHORT, *ALGOS[algo], f"launch.nproc={world}"], world, cli_env, tmp_path)


def test_local_sgd_stopped_under_the_launcher_and_resumed_forked_ends_as_the_forked_run(cli_env: dict,
                                                                                        tmp_path: Path) -> None:
    """Local SGD's periodic averaging: a run stopped at step 5 under DeepSpeed's launcher (after its
    first averaging, at step 4) and resumed with forked ranks ends, rank by rank, in the final state
    of the run forked from the start. The checkpoint is one format whichever start wrote it, and, as
    resume is exact (tests/test_resume_registry.py), the launcher's first five steps are the forked
    run's. (Two ranks, and no third run under the launcher alone: CI's 30 minutes.)"""
    args = [*SHORT, *ALGOS["local_sgd"], "launch.nproc=2"]
    run_ok([*args, *FORK, f"hydra.run.dir={tmp_path / 'fork'}"], cli_env)
    run_dir = tmp_path / "launcher_then_fork"
    run_ok([*args, *LAUNCHER, "train.stop_after=5", f"hydra.run.dir={run_dir}"], cli_env)
    assert newest_complete(run_dir).step == 5
    run_ok([*args, *FORK, f"hydra.run.dir={run_dir}"], cli_env)
    assert json.loads((run_dir / "summary.json").read_text())["resumed_from"] == 5
    assert_same_states(tmp_path / "fork", run_dir, 2)


def test_sixteen_forked_ranks_end_as_sixteen_ranks_the_harness_starts(cli_env: dict, tmp_path: Path) -> None:
    """At 16 ranks (gloo's mesh of 120 connections, the batch split 16 ways, two-digit rank
    numbers), local SGD's periodic averaging: the forked ranks end, rank by rank, in the state and
    with the summary that the same run reaches on 16 ranks the test harness starts (forkserver
    children calling the trainer; tests/support/harness.py). Not against DeepSpeed's launcher,
    whose 16 new interpreters cost about 160 s of CPU, a tenth of CI's 30 minutes on two cores:
    the two starts are shown equal at 4 ranks above."""
    args = ["train.max_steps=6", *SHORT[1:], *ALGOS["local_sgd"], "launch.nproc=16", "train.batch_size=16"]
    forked, harness = tmp_path / "fork", tmp_path / "harness"
    run_ok([*args, *FORK, f"hydra.run.dir={forked}"], cli_env)
    run_ranks(train_in_rank, 16, args, str(harness), timeout=300)
    assert_same_results(forked, harness, 16)


def assert_same_runs(args: list[str], world: int, cli_env: dict, tmp_path: Path) -> None:
    launched = run_ok([*args, *LAUNCHER, f"hydra.run.dir={tmp_path / 'launcher'}"], cli_env)
    output = launched.stdout + launched.stderr
    assert "[WARNING]" not in output and "Unable to find hostfile" not in output, "DeepSpeed must stay quiet"
    run_ok([*args, *FORK, f"hydra.run.dir={tmp_path / 'fork'}"], cli_env)
    assert_same_results(tmp_path / "launcher", tmp_path / "fork", world)


def assert_same_results(a_dir: Path, b_dir: Path, world: int) -> None:
    """Two runs of one job: the same final checkpoint on every rank, the same test figures and bytes sent."""
    assert_same_states(a_dir, b_dir, world)
    a, b = (json.loads((d / "summary.json").read_text()) for d in (a_dir, b_dir))
    assert (a["test_acc"], a["test_loss"], a["comm_bytes"]) == (b["test_acc"], b["test_loss"], b["comm_bytes"])


# cli.py's training run in one process, after the preparation forking does: what the rank imported
RANK_IMPORTS_PROBE = """
import json, runpy, sys
import engine.rank.entry as entry
from engine.launch.fork import import_rank_modules
trained = entry.main
def probed(cfg, run_dir):
    import_rank_modules()
    before = set(sys.modules)
    code = trained(cfg, run_dir)
    print("IMPORTED " + json.dumps(sorted(set(sys.modules) - before)), flush=True)
    return code
entry.main = probed
sys.argv = ["cli.py", *sys.argv[1:]]
runpy.run_path("cli.py", run_name="__main__")
"""


def test_a_rank_finds_torch_imported_before_the_fork(cli_env: dict, tmp_path: Path) -> None:
    """What a rank imports after the fork is imported once per rank, in pages of its own: torch.optim's
    optimizer imports torch._dynamo (sympy, FSDP, ...) lazily, which cost 64 forked ranks about 1
    CPU s each, most of their start-up. cli.py imports it before forking (`import_rank_modules`); a
    rank trained in cli.py's process after the same preparation imports nothing more of torch but
    what saving a checkpoint needs."""
    args = ["launch.launcher=none", "launch.nproc=1", "train.max_steps=2", "train.progress=false",
            f"hydra.run.dir={tmp_path / 'run'}"]
    proc = subprocess.run([sys.executable, "-c", RANK_IMPORTS_PROBE, *args], capture_output=True, text=True,
                          env=cli_env, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    imported = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("IMPORTED "))[9:])
    heavy = [m for m in imported if m.split(".")[0] in ("torch", "sympy", "triton")]
    assert "torch._dynamo" not in imported and len(heavy) < 10, heavy


LONG = ["train.max_steps=100000", "train.eval_every_epochs=null", "checkpoint.every_steps=20",
        "checkpoint.every_epochs=null", "train.progress=false", "launch.nproc=4", *FORK]


def pid_of(run_dir: Path, rank: int) -> int:
    return int((run_dir / "logs" / f"rank_{rank}.pid").read_text().split()[0])


def test_a_killed_forked_rank_is_named_with_its_log(cli_env: dict, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = start_cli([*LONG, f"hydra.run.dir={run_dir}"], cli_env)
    try:
        wait_for(lambda: (m := newest_complete(run_dir)) is not None and m.step >= 20, 240, "a checkpoint")
        os.kill(pid_of(run_dir, 2), signal.SIGKILL)
        _, stderr = proc.communicate(timeout=90)
    finally:
        proc.kill()
    # (the survivors log their lost peer, with its traceback, as under the launcher)
    line = next(ln for ln in stderr.splitlines() if ln.startswith("syncopt: error:"))
    # as under DeepSpeed's launcher: the rank, why, the launcher's exit code (sys.exit(-9)) and the log
    assert proc.returncode == 247, stderr[-2000:]
    assert ("rank 2 failed: its process ended without an error (killed or crashed)" in line
            and "launcher exit code 247" in line and f"log: {run_dir / 'logs' / 'rank_2.log'}" in line), line
    assert not any(alive(pid_of(run_dir, r)) for r in range(4)), "the other ranks must be gone with the job"


def test_the_leader_exits_with_the_killed_ranks_code_when_a_peer_is_reaped_first() -> None:
    """A rank killed with -9 makes its peers fail with 'connection reset' at once; when the leader
    reaps a peer's exit 1 first (a loaded machine), the job's code is still the kill's, -9 (247),
    as the rank watch names the killed rank; with no signal among the ended, the first code."""
    def child(code: int) -> int:
        pid = os.fork()
        if pid == 0:
            os._exit(code)
        return pid

    peer = child(1)
    killed = os.fork()
    if killed == 0:
        signal.pause()
        os._exit(0)
    os.kill(killed, signal.SIGKILL)
    os.waitpid(peer, 0)  # the peer is reaped first, the killed rank is left for `job_exit_code`
    time.sleep(0.2)
    assert job_exit_code(1, {killed}) == -9
    other = child(3)
    time.sleep(0.2)
    assert job_exit_code(1, {other}) == 1


def test_forked_ranks_do_not_hold_the_run_lock(cli_env: dict, tmp_path: Path) -> None:
    """A busy directory is refused naming the running cli.py; once that cli.py is killed (-9), its
    forked ranks, which go on as launched ones would, do not keep the lock: a new run is refused
    naming them as live ranks, and is taken once they are gone."""
    run_dir = tmp_path / "run"
    args = [*LONG, "launch.nproc=2", f"hydra.run.dir={run_dir}"]
    first = start_cli(args, cli_env)
    pids: list[int] = []
    try:
        wait_for(lambda: (read_step(run_dir / "logs" / "rank_1.progress") or 0) > 0, 240, "training to start")
        second = run_cli_here(args)  # refused by the run lock, before any launch
        assert second.returncode == 2 and f"pid {first.pid}" in error_line(second), second.stderr[-2000:]
        pids = [pid_of(run_dir, r) for r in range(2)]
        first.kill()
        first.wait()
        third = run_cli_here(args)
        line = error_line(third)
        assert third.returncode == 2 and "ranks of an earlier run are still running there" in line, line
        assert all(str(p) in line for p in pids), line
    finally:
        first.kill()
        for pid in pids:
            try:
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_forked_rank_has_the_environment_deepspeeds_launcher_gives(tmp_path: Path) -> None:
    """DeepSpeed's per-node launcher's own code starts a script that records each rank's variables;
    `forked_rank_env` must give the same ones."""
    script = tmp_path / "record.py"
    script.write_text("import json, os, sys\n"
                      f"keys = {sorted(forked_rank_env(3, '127.0.0.1', 29999, 0))!r}\n"
                      "open(os.path.join(sys.argv[1], 'rank_' + os.environ['RANK'] + '.json'), 'w').write("
                      "json.dumps({k: os.environ.get(k) for k in keys}))\n")
    world = base64.urlsafe_b64encode(json.dumps({"localhost": [0, 1, 2]}).encode()).decode()
    # (the repository before what PYTHONPATH holds: on the GPU machine, the carried packages)
    env = {**os.environ, "DS_ACCELERATOR": "cpu",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    subprocess.run([sys.executable, "-m", "deepspeed.launcher.launch", f"--world_info={world}",
                    "--master_addr=127.0.0.1", "--master_port=29999", "--no_local_rank", "--log_level=error",
                    str(script), str(tmp_path)], env=env, check=True, timeout=120, capture_output=True)
    for rank in range(3):
        seen = json.loads((tmp_path / f"rank_{rank}.json").read_text())
        assert seen == forked_rank_env(3, "127.0.0.1", 29999, rank), rank


def test_forking_from_a_threaded_process_is_refused() -> None:
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait, name="busy-worker")
    worker.start()
    try:
        with pytest.raises(RuntimeError, match="busy-worker"):
            check_fork_safe()
    finally:
        stop.set()
        worker.join()


@pytest.mark.parametrize("args, words", [
    (["launch.launcher=fork", "launch.hostfile=hosts"], ["launch.hostfile", "launch.launcher=deepspeed", "not fork"]),
    (["launch.launcher=fork", "launch.network.kind=emulated"], ["cannot be combined with launch.launcher=fork"]),
    (["launch.launcher=fork", "++ft.enabled=true", "algo=local_sgd"], ["launch.launcher=fork", "ft.enabled=true"]),
])
def test_what_fork_cannot_do_is_one_line(args: list[str], words: list[str], tmp_path: Path) -> None:
    proc = run_cli_here([*args, f"hydra.run.dir={tmp_path / 'run'}"])  # refused before anything forks
    assert proc.returncode == 2, proc.stderr[-2000:]
    line = error_line(proc)
    assert all(w in line for w in words), line


# A forked leader and its ranks, started from a process whose Python handlers for the stop signals
# are installed (as `run_launcher` installs them before it starts the ranks): each rank records
# its SIGUSR1 disposition as it starts, and whether /proc says it catches SIGUSR1 then
DISPOSITION_PROBE = """
import json, os, signal, sys
from engine.launch.fork import ForkedRanks
from engine.launch.remote import catches
out = sys.argv[1]
def body():
    seen = {"usr1_default": signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL,
            "catches_usr1": catches(os.getpid(), signal.SIGUSR1),
            "leader_catches_usr1": catches(os.getppid(), signal.SIGUSR1)}
    with open(os.path.join(out, "rank_" + os.environ["RANK"] + ".json"), "w") as fh:
        fh.write(json.dumps(seen))
    return 0
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
    signal.signal(s, lambda signum, frame: print("launcher's handler ran in", os.getpid(), flush=True))
sys.exit(ForkedRanks(2, "127.0.0.1", 29998, dict(os.environ), body).wait())
"""


def test_a_forked_rank_starts_with_sigusr1_at_its_default_not_the_launchers_handler(cli_env: dict,
                                                                                      tmp_path: Path) -> None:
    """A fork inherits Python's signal handlers, an exec does not: a forked rank would start with
    cli.py's SIGUSR1 handler, which /proc reports as caught, so the rank watch took the rank as
    ready for a stop before the rank had its own handler, and a stop in the first seconds of a
    forked launch was printed by that inherited copy and lost (the run went on to its end). The
    leader and its ranks start as a new interpreter would: SIGUSR1 at its default."""
    proc = subprocess.run([sys.executable, "-c", DISPOSITION_PROBE, str(tmp_path)], capture_output=True, text=True,
                          env=cli_env, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for rank in range(2):
        seen = json.loads((tmp_path / f"rank_{rank}.json").read_text())
        assert seen == {"usr1_default": True, "catches_usr1": False, "leader_catches_usr1": False}, (rank, seen)


def test_a_stop_in_a_forked_launchs_first_moments_checkpoints_and_stops(cli_env: dict, tmp_path: Path) -> None:
    """SIGUSR1 to cli.py as soon as its ranks exist, before they can take it: cli.py holds it until
    every rank has its own handler, then the ranks checkpoint at their next agreed step and stop
    (stopped.json), instead of running to their end (scripts/produce_tables.sh's `pause`, 2 s
    into an 8-rank forked run, was lost so)."""
    run_dir = tmp_path / "run"
    args = ["train.max_steps=2000", "train.eval_every_epochs=null", "checkpoint.every_epochs=null",
            "train.progress=false", "launch.nproc=2", *FORK, f"hydra.run.dir={run_dir}"]
    code, stderr = signal_cli_when(args, cli_env, (run_dir / "logs" / "rank_0.pid").exists, "the first rank to start",
                                   signal.SIGUSR1)
    assert code == 0, stderr[-2000:]
    stopped = newest_complete(run_dir)
    assert (run_dir / "stopped.json").exists() and not (run_dir / "summary.json").exists(), stderr[-2000:]
    assert stopped is not None and stopped.step < 2000 and stopped.extra["reason"] == "signal", stopped
