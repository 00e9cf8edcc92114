"""cli.py as a user runs it: bad input gives one line and exit code 2 before launching; real
multi-rank runs, forked (the default) and through torchrun, train the digits default."""
from __future__ import annotations

import json
import pickle
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.cli_runs import CLI, REPO, error_line, run_cli, run_cli_here


@pytest.mark.parametrize("args,fragment", [
    # names and types
    (["model.name=lenet"], "model.name='lenet'"),
    (["algo=gossip"], "algo/gossip"),
    (["data.name=mnist"], "data.name='mnist'"),
    (["train.epochs=ten"], "train.epochs"),
    (["optim.lr_max=1"], "optim.lr_max"),
    (["launch.launcher=mpirun"], "launch.launcher='mpirun' is not one of"),
    # ranges: optimizer, schedule, training, model, data, algorithm, runner
    (["optim.lr=-1"], "optim.lr=-1.0 must be > 0"),
    (["optim.momentum=1.5"], "optim.momentum=1.5 must be >= 0 and < 1"),
    (["optim=adamw", "optim.betas=[0.9,1.2]"], "optim.betas=[0.9, 1.2]"),
    (["sched=step", "sched.gamma=0"], "sched.gamma=0.0 must be > 0"),
    (["sched.warmup_epochs=-1"], "sched.warmup_epochs=-1.0 must be >= 0"),
    (["train.batch_size=0"], "train.batch_size=0 must be >= 1"),
    (["train.grad_clip=0"], "train.grad_clip=0.0 must be > 0"),
    (["model.width=0"], "model.width=0 must be >= 1"),
    (["model.dropout=1.5"], "model.dropout=1.5"),
    (["model=vit_small", "model.patch_size=3"], "cannot be built for 1x8x8 input"),
    (["data.num_workers=-1"], "data.num_workers=-1"),
    (["algo=local_sgd", "algo.period=0"], "algo.period=0"),
    (["algo=dgs", "algo.density=2"], "algo.density=2.0"),
    (["algo=wagma", "algo.group_size=3"], "algo.group_size=3"),
    (["dist.timeout_s=0"], "dist.timeout_s=0.0 must be > 0"),
    # no GPU: "needs a GPU per rank"; one (an H100): "NCCL cannot put two ranks on one GPU"
    (["dist.backend=nccl", "launch.nproc=2"], "dist.backend=nccl"),
    (["checkpoint.keep_last=0"], "checkpoint.keep_last=0"),
    # the world, the data on disk, checkpoints
    (["launch.nproc=0"], "launch.nproc=0"),
    (["launch.nproc=64", "train.batch_size=32"], "launch.nproc=64"),
    (["data=cifar10", "data.root=/nonexistent/cifar"], "/nonexistent/cifar"),
    (["resume=/nonexistent/run"], "resume=/nonexistent/run"),
    (["init_from=/nonexistent/run"], "init_from=/nonexistent/run: no complete checkpoint there"),
    (["launch.hostfile=/nonexistent/hosts"], "launch.hostfile=/nonexistent/hosts: cannot read it"),
    # each training rank's share of the data, decided in the plan as the ranks would split it (issue 87:
    # the first two were refused on the ranks, 12 s and 11 s in)
    (["data=shakespeare_char", "model=gpt", "data.context_length=100000000"],
     "has no window of data.context_length=100000000"),
    (["data.partition=classes", "data.classes_per_worker=20"], "data.classes_per_worker=20 is more than the 10 classes"),
    (["data=shakespeare_char", "model=gpt", "data.partition=source", "launch.nproc=64", "train.batch_size=1"],
     "deals 38 plays to 64 training ranks"),
    (["data=shakespeare_char", "model=gpt", "data.partition=source", "data.source_unit=role", "launch.nproc=2",
      "train.batch_size=1", "data.context_length=60000"], "data.context_length=60000 leaves no test window"),
    (["data=shakespeare_char", "model=gpt", "train.batch_size=5000"], "train.batch_size=5000 x 4 training ranks"),
    (["data.val_fraction=null", "data.val_count=1500"], "data.val_count=1500 leaves no training samples"),
    (["data.val_fraction=null", "data.val_per_class=141", "train.batch_size=2"],
     "data.val_per_class=141 takes all 136 training samples of a class"),
    (["data=mnist1d", "model=mnist1d_cnn", "data.partition=dirichlet", "data.dirichlet_alpha=0.001",
      "train.batch_size=900"], "left a training rank with fewer than 900 samples"),
])
def test_bad_input_is_one_line_before_launch(args: list[str], fragment: str, tmp_path: Path) -> None:
    """cli.py in this interpreter (tests/support/cli_runs.py): a refusal is decided before any
    process is started; the real process's exit is checked below."""
    run_dir = tmp_path / "run"
    proc = run_cli_here([*args, f"hydra.run.dir={run_dir}"])
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert fragment in error_line(proc)
    assert not (run_dir / "logs").exists(), "no rank may have been launched"
    assert not any(run_dir.iterdir()) if run_dir.exists() else True, "nothing may be written"


@pytest.mark.parametrize("args,fragment", [(["optim.lr=-1"], "optim.lr=-1.0 must be > 0"),
                                           (["algo=gossip"], "algo/gossip")])
def test_a_refusing_process_exits_2_with_one_line_within_seconds(args: list[str], fragment: str, cli_env: dict,
                                                                 tmp_path: Path) -> None:
    """The same refusals as a user's shell sees them: a schema check and a Hydra composition error."""
    run_dir = tmp_path / "run"
    start = time.monotonic()
    proc = run_cli([*args, f"hydra.run.dir={run_dir}"], cli_env, timeout=60)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert fragment in error_line(proc)
    assert time.monotonic() - start < 15
    assert not run_dir.exists() or not any(run_dir.iterdir()), "nothing may be written"


def test_a_warm_up_longer_than_the_run_is_one_warning_line(cli_env: dict, tmp_path: Path) -> None:
    proc = run_cli(["launch.launcher=none", "launch.nproc=1", "train.max_steps=3", "sched.warmup_epochs=100",
                    "train.progress=false", f"hydra.run.dir={tmp_path / 'run'}"], cli_env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    warnings = [ln for ln in proc.stderr.splitlines() if ln.startswith("syncopt: warning:")]
    assert len(warnings) == 1 and "never reaches optim.lr=0.1" in warnings[0], proc.stderr[-2000:]


def write_cifar(root: Path, n: int = 64, garbage: bool = False) -> None:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    import numpy as np

    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        payload = b"not a pickle" if garbage else pickle.dumps(
            {b"data": rng.integers(0, 255, (n, 3072), dtype=np.uint8), b"labels": list(rng.integers(0, 10, n))})
        (folder / name).write_bytes(payload)


def test_malformed_data_set_fails_on_the_ranks_with_one_line(cli_env: dict, tmp_path: Path) -> None:
    write_cifar(tmp_path / "cifar", garbage=True)
    # forked ranks: a rank's error file reaches cli.py's one line alike under either start
    proc = run_cli(["data=cifar10", f"data.root={tmp_path / 'cifar'}", "model=resnet20", "launch.nproc=2",
                    "launch.launcher=fork", f"hydra.run.dir={tmp_path / 'run'}"], cli_env, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "is not a CIFAR batch file" in error_line(proc)


def test_default_job_four_ranks_forked(cli_env: dict, tmp_path: Path) -> None:
    """The README's main job: digits, small CNN, allreduce, 4 gloo ranks, forked from cli.py (the
    default start on one machine, launch.launcher=auto; tests/test_fork_launch.py runs DeepSpeed's
    launcher against it)."""
    run_dir = tmp_path / "run"
    start = time.monotonic()
    proc = run_cli([f"hydra.run.dir={run_dir}"], cli_env)
    elapsed = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 4 and summary["algo"] == "allreduce"
    assert summary["test_acc"] >= 0.97, summary
    assert summary["syncs"] == summary["steps"] and summary["comm_bytes"] > 0
    for name in ("config.yaml", "metrics.jsonl", "curves.png"):
        assert (run_dir / name).is_file(), name
    records = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert {"step", "epoch", "lr", "loss", "acc", "samples_per_s", "comm_bytes", "comm_s", "syncs"} <= set(train[-1])
    assert train[-1]["loss"] < train[0]["loss"]
    assert "test accuracy" in proc.stdout  # the one-screen summary
    output = proc.stdout + proc.stderr
    assert "[WARNING]" not in output and "syncopt: note:" not in output, "a forked start says nothing"
    assert "launcher: fork" in (run_dir / "config.yaml").read_text()
    print(f"default job: {elapsed:.1f} s, test_acc {summary['test_acc']:.4f}")


def test_a_run_with_loader_workers_ends_within_3_s_of_its_summary(cli_env: dict, tmp_path: Path) -> None:
    """Loader workers (training and evaluation) are shut down with the run, not left for the
    interpreter's exit to join one by one."""
    from tests.support.datagen import write_cifar as write_cifar_set

    write_cifar_set(tmp_path / "cifar", n_train=128, n_test=32)
    cmd = [sys.executable, CLI, "data=cifar10", f"data.root={tmp_path / 'cifar'}", "model=resnet20", "model.width=4",
           "launch.nproc=2", "train.epochs=2", "train.batch_size=16", "data.num_workers=4", "train.progress=false",
           f"hydra.run.dir={tmp_path / 'run'}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=cli_env, cwd=REPO)
    summary_at = None
    assert proc.stdout is not None
    for line in proc.stdout:
        if "run directory" in line:
            summary_at = time.monotonic()
    proc.wait(timeout=300)
    ended = time.monotonic()
    assert proc.returncode == 0 and summary_at is not None
    assert ended - summary_at < 3.0, f"the run ended {ended - summary_at:.1f} s after its summary"


def test_two_ranks_through_torchrun_with_wandb_offline(cli_env: dict, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    env = dict(cli_env, WANDB_MODE="offline")
    proc = run_cli(["launch.launcher=torchrun", "launch.nproc=2", "train.epochs=3", "logger=wandb",
                    f"hydra.run.dir={run_dir}"], env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["test_acc"] > 0.8
    run_id = (run_dir / "wandb_id.txt").read_text().strip()
    assert any(run_id in p.name for p in (run_dir / "wandb").iterdir()), "offline wandb run not written"


def test_multirun_gives_one_run_directory_per_job(cli_env: dict, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    proc = run_cli(["-m", "launch.launcher=none", "launch.nproc=1", "train.max_steps=5",
                    "optim.lr=0.05,0.1", f"hydra.sweep.dir={sweep}"], cli_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lrs = sorted(json.loads((sweep / str(i) / "summary.json").read_text())["peak_lr"] for i in range(2))
    assert lrs == [0.05, 0.1]


def test_help_names_the_tool_and_only_runnable_recipes(cli_env: dict) -> None:
    proc = run_cli(["--help"], cli_env, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = proc.stdout
    assert text.startswith("syncopt") and "powered by Hydra" not in text
    assert "recipe=qsr/cpu_qsr" in text and "cpu_lsgd_p4" in text and "wagma_cpu" in text
    listed = text.split("Recipes (", 1)[1]
    for partial in ("_cpu_base", "cpu_common", "cifar10_common", "imagenet_common", "cpu_digits", "_schema"):
        assert partial not in listed, partial
