"""slurm/syncopt.sbatch on a real (single-node, throw-away) SLURM cluster, and its 2-node commands.

- A job submitted with the script runs cli.py through srun; the time-limit warning (what
  `--signal=B:USR1@...` sends, here sent at once with `scancel --batch --signal=USR1`) makes the
  ranks checkpoint and stop, the job requeues itself, runs again under the same id and resumes
  from that checkpoint to the end.
- A `-m` sweep with `hydra/launcher=slurm` (Hydra's submitit launcher) runs its point as a SLURM
  job; submitit's preemption/time-limit signal (USR2, sent to every process of the job) makes
  cli.py have the ranks checkpoint, then submitit requeues the job and it resumes.
- For a 2-node allocation (the script's dry run), every node gets the same hostfile, master
  address (the first node) and port, and its own node rank.
"""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.slurm_cluster import SlurmCluster, slurm_usable
from tests.support.system_packages import require_system_packages

pytestmark = pytest.mark.multinode

REPO = Path(__file__).resolve().parent.parent
SBATCH = str(REPO / "slurm" / "syncopt.sbatch")
STEPS = 12
JOB = ["model=small_cnn", "data=digits", f"train.max_steps={STEPS}", "train.progress=false",
       "train.log_every_steps=4", "train.preempt_check_every=2", "checkpoint.every_steps=4",
       "checkpoint.every_epochs=null", "train.eval_every_epochs=null", "train.imbalance.delay_ms=200",
       "launch.omp_threads=1"]  # slowed down so that a stop sent at the start comes before the end


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    require_system_packages(slurm_usable())  # root but not installed: the README's test command installs it
    made = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        yield made
    finally:
        made.close()


def wait_for_ranks(run_dir: Path, cluster: SlurmCluster, job: str, world: int = 2) -> None:
    pid_files = [run_dir / "logs" / f"rank_{r}.pid" for r in range(world)]
    deadline = time.monotonic() + 400
    while not all(p.exists() for p in pid_files):
        assert time.monotonic() < deadline, f"the ranks of job {job} did not start"
        state = cluster.job_field(job, "JobState")  # None: scontrol did not answer this time (a loaded slurmctld)
        assert state in ("PENDING", "RUNNING", "CONFIGURING", None), f"job {job} is {state} before its ranks started"
        time.sleep(0.5)


def test_sbatch_job_requeues_at_time_limit_warning_and_resumes(cluster: SlurmCluster, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    env = {k: v for k, v in cluster.env.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    # one rank on the node: the script's srun, DeepSpeed's no-ssh launch, the warning, the requeue
    # and the resume are the same for any count (ranks stopping together at an agreed step are
    # tests/test_multinode.py's, across two hosts; CI's 30 minutes)
    env.update(SYNCOPT_RANKS_PER_NODE="1", SYNCOPT_PYTHON=sys.executable)
    out = subprocess.run(["sbatch", "--parsable", "--nodes=1", "--time=20", f"--output={tmp_path}/job-%j.out",
                          SBATCH, *JOB, f"hydra.run.dir={run_dir}"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip().split(";")[0]
    log = tmp_path / f"job-{job}.out"

    # The warning is sent once the ranks exist; cli.py delivers it when they can take it.
    wait_for_ranks(run_dir, cluster, job, world=1)
    warned = cluster.run("scancel", "--batch", "--signal=USR1", job)
    assert warned.returncode == 0, warned.stderr

    assert cluster.wait_job(job, timeout=500) == "COMPLETED", log.read_text()[-3000:]
    text = log.read_text()
    assert "requeueing job" in text, text[-3000:]
    assert cluster.job_field(job, "Restarts") == "1"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["world_size"] == 1
    # stopped at an agreed step (every 2) after the warning, resumed from there
    assert summary["resumed_from"] in range(2, STEPS, 2)
    assert f"resuming from {run_dir}/checkpoints/step_{summary['resumed_from']:08d}" in text


def submitted_jobs(sweep: Path) -> list[str]:
    """SLURM job ids submitit has filed under the sweep: its folders named by the id alone.

    submitit first writes its pickled submission under a random hex name, which can begin with a
    digit (CI once took '802de3...pkl' for a job id), so only a folder named like a job id counts:
    digits, with an array task's '_index' where the sweep was submitted as an array.
    """
    folder = sweep / ".submitit"
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and re.fullmatch(r"\d+(_\d+)?", p.name))


def test_submitit_sweep_runs_on_slurm_and_resumes_after_preemption(cluster: SlurmCluster, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    env = {k: v for k, v in cluster.env.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    # the ranks forked from cli.py: what is tested is submitit's signal reaching them, the requeue
    # and the resume (the sbatch job above runs DeepSpeed's launcher under srun; CI's 30 minutes)
    proc = subprocess.Popen([sys.executable, "cli.py", "-m", "hydra/launcher=slurm", f"hydra.sweep.dir={sweep}",
                             "hydra.launcher.timeout_min=20", *JOB, "launch.nproc=2", "launch.launcher=fork",
                             "seed=0"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (jobs := submitted_jobs(sweep)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-3000:]
            time.sleep(0.5)
        job = jobs[0]
        wait_for_ranks(sweep / "0", cluster, job)
        assert cluster.run("scancel", "--signal=USR2", job).returncode == 0
        out, _ = proc.communicate(timeout=500)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    assert cluster.job_field(job, "Restarts") == "1"
    summary = json.loads((sweep / "0" / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["resumed_from"] in range(2, STEPS, 2)


def test_sbatch_commands_for_two_nodes(cluster: SlurmCluster, tmp_path: Path) -> None:
    """The multi-node part of the script, on the commands it generates for a 2-node allocation."""
    env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_NAME": "sweep",
           "SLURM_SUBMIT_DIR": str(REPO), "SLURM_GPUS_ON_NODE": "8", "SLURM_CPUS_ON_NODE": "64",
           "SYNCOPT_DRY_RUN": "1", "SYNCOPT_PYTHON": sys.executable}
    env_run = {k: v for k, v in cluster.env.items() if not k.startswith(("SLURM_JOB", "SYNCOPT_"))}
    out = subprocess.run(["bash", SBATCH, "algo=allreduce", "train.epochs=2", f"hydra.run.dir={tmp_path}/run"],
                         env={**env_run, **env}, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "run" / "hostfile").read_text() == "gpu07 slots=8\ngpu08 slots=8\n"
    srun = re.search(r"^srun: (.*)$", out.stdout, re.M).group(1).split()
    assert "--ntasks-per-node=1" in srun and "--nodes=2" in srun and "--gpus-per-node=8" in srun
    assert "--cpus-per-task=64" in srun
    commands = {}
    for node in ("gpu07", "gpu08"):
        line = re.search(rf"^{node}: (.*)$", out.stdout, re.M).group(1)
        commands[node] = shlex.split(line)
    port = 20000 + (4242 * 7) % 30000
    for rank, node in enumerate(("gpu07", "gpu08")):
        cmd = commands[node]
        assert cmd[:2] == [sys.executable, str(REPO / "cli.py")]
        assert cmd[-1] == f"launch.node_rank={rank}"
        for expected in (f"launch.hostfile={tmp_path}/run/hostfile", "launch.no_ssh=true",
                         "launch.master_addr=gpu07", f"launch.master_port={port}", "launch.nproc=8",
                         "algo=allreduce", "train.epochs=2", f"hydra.run.dir={tmp_path}/run"):
            assert expected in cmd, (expected, cmd)
    # every node runs the same command but for its rank
    assert commands["gpu07"][:-1] == commands["gpu08"][:-1]
    assert "--kill-on-bad-exit=1" in srun  # a failed node ends the job ...
    ft = subprocess.run(["bash", SBATCH, "algo=local_sgd", "ft.enabled=true", f"hydra.run.dir={tmp_path}/ft"],
                        env={**env_run, **env}, capture_output=True, text=True, timeout=60)
    assert ft.returncode == 0, ft.stderr
    # ... except in fault-tolerant mode, where the other nodes' supervisors go on without it
    assert "--kill-on-bad-exit=0" in re.search(r"^srun: (.*)$", ft.stdout, re.M).group(1).split()

    restarted = subprocess.run(["bash", SBATCH, "algo=allreduce", f"hydra.run.dir={tmp_path}/run"],
                               env={**env_run, **env, "SLURM_RESTART_COUNT": "1"}, capture_output=True,
                               text=True, timeout=60)
    assert f"launch.master_port={port + 1}" in restarted.stdout
