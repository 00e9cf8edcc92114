"""Devices and backend: the one decision (`core.distenv.plan_devices`) cli.py and every rank take,
the line that announces GPU sharing, and the point-to-point staging plugins use on gloo groups
with CUDA tensors (its CPU side here; the CUDA side in the `gpu` tests)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from core.distenv import (USER_VISIBLE_DEVICES_ENV, DevicePlan, apply_user_visible_devices, plan_devices,
                          sharing_note)
from core.errors import UserError
from dist_algos.comm.p2p import staging_device
from engine.launch.commands import launcher_command, launcher_env
from engine.launch.config import load_launch_config
from tests.support.harness import compose, run_ranks

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("backend,ranks,gpus,local_rank,device,expected", [
    ("auto", 4, 0, 3, "auto", DevicePlan("gloo", None, False)),  # a CPU machine
    ("gloo", 4, 0, 0, "auto", DevicePlan("gloo", None, False)),
    ("auto", 4, 1, 3, "auto", DevicePlan("gloo", 0, True)),  # four ranks on one GPU
    ("auto", 4, 2, 3, "auto", DevicePlan("gloo", 1, True)),  # round-robin
    ("auto", 8, 8, 5, "auto", DevicePlan("nccl", 5, False)),  # a GPU per rank
    ("gloo", 8, 8, 5, "auto", DevicePlan("gloo", 5, False)),  # asked for: gloo on the GPUs
    ("nccl", 2, 2, 1, "auto", DevicePlan("nccl", 1, False)),
    ("auto", 4, 1, 2, "cpu", DevicePlan("gloo", None, False)),  # CPU ranks on a GPU machine
    ("auto", 1, 1, 0, "cuda", DevicePlan("nccl", 0, False)),
])
def test_plan_devices(backend: str, ranks: int, gpus: int, local_rank: int, device: str, expected: DevicePlan) -> None:
    assert plan_devices(backend, ranks, gpus, local_rank, device) == expected


@pytest.mark.parametrize("backend,ranks,gpus,device,fragments", [
    ("nccl", 4, 1, "auto", ["dist.backend=nccl with 4 ranks on a node of 1 GPU", "launch.nproc=1", "dist.backend=auto"]),
    ("nccl", 2, 0, "auto", ["dist.backend=nccl needs a GPU per rank", "no GPU is visible"]),
    ("nccl", 2, 2, "cpu", ["dist.backend=nccl needs a GPU per rank", "dist.device=cpu"]),
    ("auto", 1, 0, "cuda", ["dist.device=cuda but no GPU is visible"]),
])
def test_impossible_choices_are_one_line(backend: str, ranks: int, gpus: int, device: str,
                                         fragments: list[str]) -> None:
    with pytest.raises(UserError) as err:
        plan_devices(backend, ranks, gpus, 0, device)
    assert "\n" not in str(err.value) and all(f in str(err.value) for f in fragments), str(err.value)


def test_sharing_is_announced_once_by_preflight(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    from engine import plan as plan_module

    monkeypatch.setattr(plan_module, "visible_gpus", lambda: 1)
    config = compose(["launch.nproc=4", "dist.device=auto"])
    plan_module.announce_devices(config, 4)
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"syncopt: {sharing_note(4, 1)}"] and "gloo with CUDA tensors" in lines[0]
    with pytest.raises(UserError, match="dist.backend=nccl with 4 ranks"):
        plan_module.announce_devices(compose(["launch.nproc=4", "dist.backend=nccl", "dist.device=auto"]), 4)
    monkeypatch.setattr(plan_module, "visible_gpus", lambda: 4)
    plan_module.announce_devices(config, 4)  # a GPU each: nothing to say
    assert capsys.readouterr().err == ""


def test_a_refused_run_says_nothing_of_gpu_sharing(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
                                                 tmp_path: Any) -> None:
    """On a GPU machine the sharing line used to come before a later check's error, so a refused
    run printed two lines (found on an H100): it is now said only once every check has passed."""
    from tests.test_invalid_options import preflight_of
    from engine import plan as plan_module

    monkeypatch.setattr(plan_module, "visible_gpus", lambda: 1)
    with pytest.raises(UserError, match="cifar10"):
        preflight_of(["launch.nproc=4", "dist.device=auto", "data=cifar10", f"paths.data_root={tmp_path}/none"],
                     tmp_path / "run")
    assert capsys.readouterr().err == ""
    preflight_of(["launch.nproc=4", "dist.device=auto"], tmp_path / "run")
    assert "share 1 GPU(s)" in capsys.readouterr().err


@pytest.mark.parametrize("backend,device,expected", [
    ("gloo", "cpu", None),
    ("gloo", "cuda", "cpu"),  # gloo's send/recv read host memory only
    ("cpu:gloo,cuda:nccl", "cuda", None),
    ("cpu:gloo,cuda:nccl", "cpu", None),
    ("nccl", "cuda", None),
])
def test_staging_device(backend: str, device: str, expected: Any) -> None:
    got = staging_device(backend, torch.device(device))
    assert (got.type if got is not None else None) == expected


def _staged_exchange(rank: int, world: int) -> list[float]:
    """Both directions through a host buffer (what a CUDA tensor on a gloo group takes)."""
    from dist_algos.comm.p2p import irecv_via, isend_via

    host = torch.device("cpu")
    mine = torch.full((5,), float(rank + 1))
    theirs = torch.zeros(5)
    works = [isend_via(host, mine, 1 - rank), irecv_via(host, theirs, 1 - rank)]
    mine.fill_(-1.0)  # the send went from its own copy
    for work in works:
        work.wait()
    return theirs.tolist()


def test_staged_point_to_point_lands_in_the_target() -> None:
    assert run_ranks(_staged_exchange, 2, timeout=60) == [[2.0] * 5, [1.0] * 5]


@pytest.mark.parametrize("user", ["", "7", None])
def test_a_rank_takes_back_the_gpus_the_user_showed_cli_py(user: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """What cli.py passes its launcher (`launcher_env`) and what a rank does with it once the
    launcher has set CUDA_VISIBLE_DEVICES to the rank's slot (`apply_user_visible_devices`, its
    first act in engine/rank/entry.py): the user's value comes back, none for the CPU or the chosen
    GPUs; without one, the slot stands. The launch below shows DeepSpeed's launcher carries it."""
    if user is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", user)
    env = launcher_env(load_launch_config(compose(["launch.nproc=1"]).launch))
    for key in (USER_VISIBLE_DEVICES_ENV, "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(key, raising=False)
    if USER_VISIBLE_DEVICES_ENV in env:
        monkeypatch.setenv(USER_VISIBLE_DEVICES_ENV, env[USER_VISIBLE_DEVICES_ENV])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # DeepSpeed's launcher: slot 0 of localhost
    apply_user_visible_devices()
    assert os.environ["CUDA_VISIBLE_DEVICES"] == (user if user is not None else "0")


def test_the_ranks_see_the_gpus_the_user_showed_cli_py(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DeepSpeed's per-node launcher, run as cli.py runs it (`launcher_env`, `launcher_command`'s
    world_info), sets every rank's CUDA_VISIBLE_DEVICES to its slot ids; the rank gives itself back
    the user's, here none (this CPU machine's own setting: an empty value must survive the
    launcher). The other values are the test above, in-process: each launch starts DeepSpeed and
    torch again (about 11 s here, CI's 30 minutes)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    script = tmp_path / "record.py"
    script.write_text("import os, sys\n"
                      "from core.distenv import apply_user_visible_devices\n"
                      "slot = os.environ['CUDA_VISIBLE_DEVICES']\n"
                      "apply_user_visible_devices()\n"
                      "open(os.path.join(sys.argv[1], 'rank_' + os.environ['RANK']), 'w')"
                      ".write(slot + '|' + os.environ['CUDA_VISIBLE_DEVICES'])\n")
    cfg = load_launch_config(compose(["launch.nproc=1"]).launch)
    env = {**launcher_env(cfg), "DS_ACCELERATOR": "cpu",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    command = launcher_command(cfg, 29998, [])[:-1]  # DeepSpeed's launcher, without cli.py
    subprocess.run([*command, str(script), str(tmp_path)], env=env, check=True, timeout=120, capture_output=True)
    assert (tmp_path / "rank_0").read_text() == "0|"  # the launcher's slot, then the user's none
