"""`launch.launcher=auto`, the default (engine/launch/start.py): one machine's ranks are forked from
cli.py; what forking cannot carry goes through DeepSpeed's launcher; a cli.py that has touched
CUDA never forks; and the run records which start it got."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import engine.launch.start as start
from core.errors import UserError
from engine.launch.config import Launcher, LaunchConfig
from engine.launch.network import NetworkConfig, NetworkKind
from engine.launch.start import choose_start
from tests.support.cli_runs import REPO, error_line, run_cli_here


def auto(**fields: object) -> LaunchConfig:
    return LaunchConfig(**{"launcher": Launcher.auto, "nproc": 4, **fields})


@pytest.mark.parametrize("launch, ft, supervised, expected", [
    (auto(), False, False, Launcher.fork),  # one machine
    (auto(nproc=1), False, False, Launcher.none),  # one rank nothing supervises: trained in cli.py
    (auto(nproc=1), False, True, Launcher.fork),  # ... one that faults or restarts must outlive
    (auto(hostfile="hosts"), False, False, Launcher.deepspeed),  # several machines
    (auto(network=NetworkConfig(kind=NetworkKind.emulated)), False, False, Launcher.deepspeed),
    (auto(), True, False, Launcher.deepspeed),  # fault-tolerant mode's supervisor
    (auto(launcher=Launcher.deepspeed), False, False, Launcher.deepspeed),  # an explicit one as given
    (auto(launcher=Launcher.torchrun), False, False, Launcher.torchrun),
])
def test_auto_forks_on_one_machine_and_launches_what_forking_cannot_carry(
        launch: LaunchConfig, ft: bool, supervised: bool, expected: Launcher, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(start, "fork_blocker", lambda: None)  # (a pytest worker may run threads of its own)
    chosen = choose_start(launch, ft, supervised)
    assert chosen.launcher == expected and chosen.note is None, chosen


def test_a_cli_that_has_initialised_cuda_starts_the_launcher_with_one_line(monkeypatch: pytest.MonkeyPatch,
                                                                          capsys: pytest.CaptureFixture) -> None:
    """A planted early CUDA touch: auto does not fork (a forked child cannot use CUDA), and says why."""
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    chosen = choose_start(auto(), False, False)
    assert chosen.launcher == Launcher.deepspeed and "CUDA is initialised" in (chosen.note or ""), chosen
    start.announce(chosen)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("syncopt: note:") and "DeepSpeed's launcher" in lines[0], lines


def test_a_cli_running_another_thread_starts_the_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread's locks would stay held in forked children: auto launches instead (an explicit fork
    is checked again at the fork itself, engine/launch/fork.py's check_fork_safe)."""
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait, name="busy-worker")
    worker.start()
    try:
        chosen = choose_start(auto(), False, False)
    finally:
        stop.set()
        worker.join()
    assert chosen.launcher == Launcher.deepspeed and "thread" in (chosen.note or ""), chosen


def test_an_explicit_fork_after_cuda_is_initialised_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Path) -> None:
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(UserError, match="CUDA is initialised"):
        choose_start(auto(launcher=Launcher.fork), False, False)
    run_dir = tmp_path / "run"
    threads = torch.get_num_threads()
    proc = run_cli_here(["launch.launcher=fork", "launch.nproc=2", f"hydra.run.dir={run_dir}"])
    assert proc.returncode == 2 and "CUDA is initialised" in error_line(proc), proc.stderr[-2000:]
    assert not run_dir.exists() or not any(run_dir.iterdir()), "nothing may be written"
    assert torch.get_num_threads() == threads, "a refused run gives its process its thread count back"


# cli.py's default job, short, on a machine made to look like a GPU machine to NVML (one GPU; the ranks
# told to use the CPU): every call that would initialise CUDA in cli.py is recorded, and so is torch's
# own flag, at the moment cli.py forks; the forked processes get torch's functions back
CUDA_PROBE = """
import json, os, runpy, sys
import torch
out = sys.argv.pop(1)
touched = []
real = {"lazy_init": torch.cuda._lazy_init, "count": torch._C._cuda_getDeviceCount, "nvml": torch.cuda._device_count_nvml}
def recorder(name, fn):
    def call(*args, **kwargs):
        touched.append(name)
        return fn(*args, **kwargs)
    return call
torch.cuda._lazy_init = recorder("torch.cuda._lazy_init", real["lazy_init"])
torch._C._cuda_getDeviceCount = recorder("torch._C._cuda_getDeviceCount (initialises the driver)", real["count"])
torch.cuda._device_count_nvml = lambda: 1
real_fork, seen = os.fork, []
def fork():
    if not seen:
        seen.append({"cuda_initialized": torch.cuda.is_initialized(), "touched": list(touched)})
        with open(out, "w") as fh:
            json.dump(seen[0], fh)
    pid = real_fork()
    if pid == 0:
        torch.cuda._lazy_init, torch._C._cuda_getDeviceCount = real["lazy_init"], real["count"]
        torch.cuda._device_count_nvml = real["nvml"]
    return pid
os.fork = fork
sys.argv = ["cli.py", *sys.argv[1:]]
runpy.run_path("cli.py", run_name="__main__")
"""


def test_the_default_job_forks_before_anything_touches_cuda_and_records_its_start(cli_env: dict,
                                                                                  tmp_path: Path) -> None:
    """The default start on one machine is the fork, and cli.py reaches it without initialising
    CUDA or asking the CUDA runtime anything (NVML only): a GPU machine's forked ranks could not use
    CUDA otherwise. The run's config.yaml says how it was started."""
    seen, run_dir = tmp_path / "seen.json", tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", CUDA_PROBE, str(seen), "launch.nproc=2", "dist.device=cpu",
                           "train.max_steps=2", "train.eval_every_epochs=null", "checkpoint.every_epochs=null",
                           "train.progress=false", f"hydra.run.dir={run_dir}"],
                          capture_output=True, text=True, env=cli_env, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(seen.read_text()) == {"cuda_initialized": False, "touched": []}
    assert OmegaConf.load(run_dir / "config.yaml").launch.launcher == "fork"
    assert json.loads((run_dir / "summary.json").read_text())["world_size"] == 2
