"""Surviving kills, preemption, damaged checkpoints and incompatible resumes."""
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

from core.run_files import read_step
from engine.checkpoint import files as ckpt
from tests.support.harness import free_port, run_ranks, train_in_rank
from tests.support.cli_runs import CLI, REPO, error_line, run_cli, run_cli_here, signal_cli_when, start_cli
from tests.support.processes import wait_for

#: two ranks under DeepSpeed's launcher: the survivor of a kill must be ended and the dead one named
#: (more ranks only start more interpreters: CI's 30 minutes)
LONG = ["train.max_steps=100000", "train.eval_every_epochs=null", "checkpoint.every_steps=20",
        "checkpoint.every_epochs=null", "train.progress=false", "launch.nproc=2"]


def newest_complete(run_dir: Path) -> ckpt.Manifest | None:
    found = ckpt.complete_checkpoints(run_dir)
    return found[0] if found else None


def test_kill_9_of_a_worker_ends_the_job_naming_it_and_resume_continues(cli_env: dict, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = start_cli([*LONG, "launch.launcher=deepspeed", f"hydra.run.dir={run_dir}"], cli_env)
    try:
        wait_for(lambda: (m := newest_complete(run_dir)) is not None and m.step >= 40, 240, "two checkpoints")
        pid = int((run_dir / "logs" / "rank_1.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        _, stderr = proc.communicate(timeout=90)
        assert time.monotonic() - killed_at < 60, "the job must end within 60 s of a rank's death"
    finally:
        proc.kill()
    assert proc.returncode != 0
    assert "rank 1 failed" in stderr, stderr[-2000:]
    last = newest_complete(run_dir)
    assert last is not None and all(last.verify_rank(r) for r in range(2)), "last checkpoint damaged"
    # the same command resumes from it (bounded to finish quickly; its ranks forked, not launched
    # again, for CI's 30 minutes: a resume reads the checkpoint whichever start, and
    # tests/test_fork_launch.py resumes a launcher's checkpoint forked to the same state)
    again = run_cli([*LONG, f"train.max_steps={last.step + 10}", "launch.launcher=fork", f"hydra.run.dir={run_dir}"],
                    cli_env)
    assert again.returncode == 0, again.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from"] == last.step and summary["steps"] == last.step + 10


def test_a_stopped_rank_is_named_with_its_step_within_the_timeout(cli_env: dict, tmp_path: Path) -> None:
    """SIGSTOP freezes a rank without ending it: its peers would wait in a collective until
    dist.timeout_s and then blame nobody. The job must end within dist.timeout_s + 15 s naming
    that rank and the step it stopped at."""
    run_dir, timeout_s = tmp_path / "run", 20
    # forked ranks: the rank watch is cli.py's, whichever start (CI's 30 minutes)
    proc = start_cli(["train.max_steps=100000", "train.eval_every_epochs=null", "checkpoint.every_epochs=null",
                      "train.progress=false", "launch.nproc=2", "launch.launcher=fork", f"dist.timeout_s={timeout_s}",
                      f"hydra.run.dir={run_dir}"], cli_env)
    pid = None
    try:
        wait_for(lambda: (read_step(run_dir / "logs" / "rank_1.progress") or 0) > 0, 240, "training to start")
        pid = int((run_dir / "logs" / "rank_1.pid").read_text().split()[0])
        os.kill(pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        _, stderr = proc.communicate(timeout=timeout_s + 60)
        took = time.monotonic() - stopped_at
    finally:
        proc.kill()
        if pid is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert proc.returncode == 1, stderr[-2000:]
    line = error_line(subprocess.CompletedProcess([], 1, "", stderr))
    assert "rank 1 stopped making progress at step" in line and "stopped state" in line, line
    assert took < timeout_s + 15, f"the job ended {took:.0f} s after the stop"


def test_a_second_run_in_a_busy_directory_refuses_and_the_first_is_unaffected(cli_env: dict, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # forked ranks (the run lock is cli.py's, whichever start): 150 steps of 60 ms outlast the
    # refusal, which cli.py decides in this process within a second or two
    args = ["train.max_steps=150", "train.imbalance.delay_ms=60", "train.eval_every_epochs=null", "checkpoint.every_epochs=null",
            "train.progress=false", "launch.nproc=2", "launch.launcher=fork", f"hydra.run.dir={run_dir}"]
    first = start_cli(args, cli_env)
    try:
        wait_for(lambda: (read_step(run_dir / "logs" / "rank_0.progress") or 0) > 0, 240, "training to start")
        hydra_record = (run_dir / ".hydra" / "overrides.yaml").read_text()
        second = run_cli_here([*args, "optim.lr=0.05"])  # refused by the run lock, before any launch
        assert second.returncode == 2, second.stderr[-2000:]
        line = error_line(second)
        assert "is in use by another run" in line and f"pid {first.pid}" in line, line
        assert (run_dir / ".hydra" / "overrides.yaml").read_text() == hydra_record, "the first run's record changed"
        _, stderr = first.communicate(timeout=240)
    finally:
        first.kill()
    assert first.returncode == 0, stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 150 and summary["peak_lr"] == 0.1
    # a lock record left by a run that is gone is taken over
    stale = tmp_path / "stale"
    stale.mkdir()
    (stale / "run.lock").write_text("999999 elsewhere 0\n")
    again = run_cli(["train.max_steps=5", "launch.launcher=none", "launch.nproc=1", f"hydra.run.dir={stale}"],
                    cli_env, timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]
    assert (stale / "run.lock").read_text().split()[0] != "999999"


def test_sigterm_checkpoints_and_exits_zero_then_same_command_finishes(cli_env: dict, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # forked ranks: the launcher's loop hears the signal either way (tests/test_multinode.py stops
    # DeepSpeed's runner across two hosts, tests/test_restart.py its per-node launcher)
    args = ["train.max_steps=200", "train.eval_every_epochs=null", "checkpoint.every_epochs=null",
            "train.progress=false", "launch.nproc=2", "launch.launcher=fork", f"hydra.run.dir={run_dir}"]
    code, stderr = signal_cli_when(
        args, cli_env, lambda: (run_dir / "metrics.jsonl").exists() and (run_dir / "metrics.jsonl").stat().st_size > 0,
        "training to start", signal.SIGTERM)
    assert code == 0, stderr[-2000:]
    stopped = newest_complete(run_dir)
    assert stopped is not None and 0 < stopped.step < 200 and stopped.extra["reason"] == "signal"
    assert "run the same command to continue" in stderr
    again = run_cli(args, cli_env)
    assert again.returncode == 0, again.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 200 and summary["resumed_from"] == stopped.step


def corrupt_then_resume(rank: int, world: int, tmp: str) -> tuple[int | None, int]:
    base = ["train.max_steps=30", "checkpoint.every_steps=10", "checkpoint.every_epochs=null",
            "checkpoint.keep_last=3", "model.width=8"]
    train_in_rank(rank, world, base + ["train.stop_after=20"], tmp)
    import torch.distributed as dist

    dist.barrier()
    if rank == 0:  # flip bytes in rank 1's newest file
        path = Path(tmp) / "checkpoints" / "step_00000020" / "rank_1.pt"
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    dist.barrier()
    summary = train_in_rank(rank, world, base, tmp)
    return (summary or {}).get("resumed_from"), rank


def test_corrupted_checkpoint_falls_back_to_the_previous_one(tmp_path: Path) -> None:
    results = run_ranks(corrupt_then_resume, 2, str(tmp_path))
    assert results[0][0] == 10, "should resume from step 10 after step 20 failed its sha256"
    log = (tmp_path / "metrics.jsonl").read_text()
    assert json.loads(log.splitlines()[-1])["step"] == 30


def test_wrong_world_size_is_refused_before_launch(cli_env: dict, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # the checkpoint to refuse (forked ranks: the launcher is not what is tested here)
    first = run_cli(["launch.nproc=2", "launch.launcher=fork", "train.max_steps=12", "train.stop_after=6",
                     f"hydra.run.dir={run_dir}"], cli_env)
    assert first.returncode == 0, first.stderr[-2000:]
    second = run_cli_here(["launch.nproc=4", "train.max_steps=12", f"hydra.run.dir={run_dir}"])  # refused before launch
    assert second.returncode == 2
    line = error_line(second)
    assert "world_size=2" in line and "world_size=4" in line and "resume=null" in line
    # and nothing already written was touched
    assert newest_complete(run_dir).step == 6


def test_weights_only_loading_refuses_pickled_objects(tmp_path: Path) -> None:
    path = tmp_path / "rank_0.pt"
    torch.save({"model": {}, "evil": object()}, path)
    with pytest.raises(Exception):
        ckpt.load_rank_file(path)


def init_from_scenario(rank: int, world: int, tmp: str) -> tuple[torch.Tensor, torch.Tensor]:
    from engine.rank.trainer import Trainer
    from tests.support.harness import plan_in_rank

    train_in_rank(rank, world, ["train.max_steps=8", "model.width=8"], f"{tmp}/source")
    plan, ctx = plan_in_rank(["train.max_steps=8", "model.width=8", f"init_from={tmp}/source"], f"{tmp}/new")
    trainer = Trainer(plan, ctx)
    trainer.restore()
    source = torch.load(Path(tmp) / "source/checkpoints/step_00000008/rank_0.pt", weights_only=True)["model"]
    got = torch.cat([v.reshape(-1).float() for v in trainer.model.state_dict().values()])
    want = torch.cat([v.reshape(-1).float() for v in source.values()])
    return got, want


def test_init_from_takes_only_the_model(tmp_path: Path) -> None:
    got, want = run_ranks(init_from_scenario, 1, str(tmp_path))[0]
    assert torch.equal(got, want)
    assert not (tmp_path / "new" / "checkpoints").exists() or not ckpt.complete_checkpoints(tmp_path / "new")


def test_ranks_started_by_hand_agree_on_one_run_directory(cli_env: dict, tmp_path: Path) -> None:
    """`torchrun ... cli.py` directly: each rank resolves ${now:} itself; rank 0's directory wins."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}", CLI,
           "train.max_steps=6", "train.progress=false", f"hydra.run.dir={tmp_path}/run_" + "${now:%H%M%S%f}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(cli_env, OMP_NUM_THREADS="1"),
                          cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = [p for p in tmp_path.iterdir() if p.name.startswith("run_")]
    assert len(runs) == 1 and (runs[0] / "summary.json").is_file(), [p.name for p in runs]
    assert json.loads((runs[0] / "summary.json").read_text())["world_size"] == 2
