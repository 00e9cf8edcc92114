"""A fault-tolerant job that can only wait is refused, one whose quorum can no longer form ends, and
stop signals end one leaving no process behind (docs/fault_tolerance.md, "Refusals" and "Stopping").

- Refusals: every setting under which torchft's lighthouse can never form a quorum (or a round
  can only time out) is one line before launch; the reported command among them, as cli.py runs it.
- A replica's rounds (ManagerRounds on a real lighthouse, replicas in threads): a stop pending on a
  replica whose quorum cannot form gives the round up within ft.stop_wait_s; the supervisor's
  quorum-lost flag at once; a stop pending on one participant of a round stops them all after it.
- Real jobs through cli.py, each checked by pid afterwards (tests/support/processes.py: every pid
  the job recorded, their process groups, anything naming the run directory): a quorum lost at
  run time (two replicas of three killed with ft.max_restarts=0) ends the job with the survivor's
  checkpoint within QUORUM_LOST_BOUND_S; a first signal while no round can complete ends it within
  ft.stop_wait_s + STOP_SLACK_S with a checkpoint; a second signal kills everything within
  AT_ONCE_BOUND_S.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from core.errors import UserError
from engine.ft.config import FTConfig, check_ft
from engine.launch.config import LaunchConfig
from tests.support.cli_runs import run_cli_here, start_cli
from tests.support.processes import alive_of_job, signal_and_wait, wait_for

pytest.importorskip("torchft")

#: from the last replica's give-up to the job's end: the survivor reaches its next round (a period
#: of 4 steps here), gives it up at once on the supervisor's flag, checkpoints and exits
QUORUM_LOST_BOUND_S = 20.0
#: beyond ft.stop_wait_s, for a stop while no round can complete: a checkpoint, the exit, the
#: supervisor's polls, on a loaded 2-core machine
STOP_SLACK_S = 15.0
#: a second signal: every process killed and reaped
AT_ONCE_BOUND_S = 5.0


# ---- refusals: preflight only ---------------------------------------------------------------------
@pytest.mark.parametrize("settings, replicas, words", [
    ({"min_replicas": 5}, 3, ["ft.min_replicas=5", "3 replica(s)", "no quorum can ever form", "launch.nproc>=5"]),
    ({"max_restarts": 0}, 2, ["ft.min_replicas=2", "ft.max_restarts=0", "survives no failure"]),
    ({"min_replicas": 3, "max_restarts": 0}, 3, ["ft.min_replicas=3", "every one of the 3"]),
    ({"heartbeat_timeout_s": 0.05}, 3, ["ft.heartbeat_timeout_s=0.05", "ft.heartbeat_timeout_s>=0.3"]),
    ({"quorum_timeout_s": 1.0}, 3, ["ft.quorum_timeout_s=1", "ft.join_timeout_s=1", "straggler"]),
    ({"quorum_timeout_s": 5.0, "join_timeout_s": 10.0}, 3, ["ft.quorum_timeout_s=5", "ft.join_timeout_s=10"]),
], ids=["min_above_replicas", "all_needed_no_restarts_default", "all_needed_no_restarts",
        "heartbeat_below_beats", "quorum_not_above_join", "quorum_below_join"])
def test_settings_that_can_only_wait_are_refused_in_one_line(settings: dict, replicas: int,
                                                             words: list[str]) -> None:
    with pytest.raises(UserError) as err:
        check_ft(FTConfig(enabled=True, **settings), "local_sgd", "", LaunchConfig(), replicas=replicas)
    line = str(err.value)
    assert all(w in line for w in words) and "\n" not in line, line


@pytest.mark.parametrize("settings, replicas", [
    ({}, 3), ({}, 2), ({"max_restarts": 0}, 3), ({"min_replicas": 1, "max_restarts": 0}, 2),
    ({"max_restarts": 0}, 1), ({"heartbeat_timeout_s": 0.3}, 3), ({"quorum_timeout_s": 1.5}, 3),
    ({"min_replicas": 3}, 3),
])
def test_settings_that_can_form_a_quorum_are_taken(settings: dict, replicas: int) -> None:
    check_ft(FTConfig(enabled=True, **settings), "local_sgd", "", LaunchConfig(), replicas=replicas)


def test_the_reported_command_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """The command of issue 37 once started a lighthouse and three replicas that waited an hour
    for a quorum of five; now it is one line and exit code 2, with nothing started (cli.py run in
    this process: what it refuses is decided before any launch)."""
    run_dir = tmp_path / "run"
    proc = run_cli_here(["algo=local_sgd", "ft.enabled=true", "launch.nproc=3", "ft.min_replicas=5",
                         f"hydra.run.dir={run_dir}"])
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("syncopt: error:")]
    assert len(lines) == 1 and "ft.min_replicas=5" in lines[0] and "launch.nproc>=5" in lines[0], proc.stderr
    assert not (run_dir / "logs").exists() and not (run_dir / "replicas").exists()


# ---- a replica's rounds, in threads, on a real lighthouse -----------------------------------------
class _Replica:
    """One ManagerRounds with its own TCP store and a tensor standing for its model."""

    def __init__(self, index: int, count: int, house: Any, cfg: FTConfig, logs: Path) -> None:
        from torch.distributed import TCPStore

        from engine.launch.commands import free_port
        from engine.ft.rank.rounds import ManagerRounds

        port = free_port()
        self.store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
        self.model = torch.full((8,), float(index + 1))
        self.rounds = ManagerRounds(cfg, index, count, "127.0.0.1", port, house.address, 10.0,
                                    lambda: {"model": {"w": self.model}}, lambda state: None, lambda: 7, gate=logs)

    def round(self) -> tuple[bool, float]:
        """begin, mean, commit (restoring on a failed round, as local SGD does); (committed, seconds in begin)."""
        started = time.monotonic()
        self.rounds.begin()
        waited = time.monotonic() - started
        before = self.model.clone()
        self.rounds.average_([self.model])
        committed = self.rounds.commit()
        if not committed:
            self.model.copy_(before)
        return committed, waited


def _lighthouse(tmp_path: Path, cfg: FTConfig, min_replicas: int) -> Any:
    from core.run_files import go_flag
    from engine.ft.launch.lighthouse import Lighthouse

    house = Lighthouse.start("127.0.0.1", cfg, tmp_path / "lighthouse.log", min_replicas=min_replicas)
    go_flag(tmp_path).write_text("go\n")  # the start gate: nobody to wait for
    return house


def test_a_stopping_replica_gives_up_a_quorum_that_cannot_form(tmp_path: Path) -> None:
    """Alone against a quorum of two: with a stop pending it waits ft.stop_wait_s (from when the
    stop came, here after it reached the round) and gives the round up: nothing averaged, not
    committed, one participant, and why it stops. With the supervisor's quorum-lost flag it gives
    it up at once, stop or not."""
    from core.run_files import quorum_lost_flag

    # a given-up round leaves torchft's quorum request running in its executor's thread until
    # its timeout; a short one ends it within seconds instead of the derived hour, which the
    # interpreter would wait out at exit (concurrent.futures joins its threads)
    cfg = FTConfig(enabled=True, stop_wait_s=1.0, quorum_timeout_s=5.0)
    house = _lighthouse(tmp_path, cfg, min_replicas=2)
    try:
        lone = _Replica(0, 2, house, cfg, tmp_path)
        pending = threading.Event()
        lone.rounds.stop_pending = pending.is_set
        threading.Timer(0.3, pending.set).start()
        committed, waited = lone.round()
        assert not committed and lone.model.tolist() == [1.0] * 8 and lone.rounds.participants == 1
        # given up by the stop rule, not by the quorum's own timeout (the upper bound is that, not a
        # wall-clock target, so a loaded machine's scheduling delay is not a failure)
        assert cfg.stop_wait_s + 0.3 <= waited < cfg.quorum_timeout_s, waited
        assert lone.rounds.stop_note == "no round could complete within ft.stop_wait_s=1"
        assert lone.rounds.record[-1][1:3] == [1, False]
    finally:
        house.stop()
        lone.rounds.close()
    # (a lighthouse of its own: the given-up request above counts as a participant until its
    # heartbeats are ft.heartbeat_timeout_s old, and would make a quorum of two with this one)
    house = _lighthouse(tmp_path, cfg, min_replicas=2)
    try:
        other = _Replica(0, 2, house, cfg, tmp_path)
        threading.Timer(0.3, lambda: quorum_lost_flag(tmp_path).write_text("{}\n")).start()
        committed, waited = other.round()
        assert not committed and 0.3 <= waited <= 1.3, waited
        assert "the quorum can no longer form" in (other.rounds.stop_note or "")
    finally:
        house.stop()
        other.rounds.close()


def test_a_stop_pending_on_one_participant_stops_every_participant_after_the_round(tmp_path: Path) -> None:
    """The stop element rides in the round's mean: a round without a stop pending stops nobody;
    one where only replica 0 has it stops both, each after the same committed round."""
    cfg = FTConfig(enabled=True)
    house = _lighthouse(tmp_path, cfg, min_replicas=2)
    try:
        replicas = [_Replica(i, 2, house, cfg, tmp_path) for i in range(2)]
        notes: dict[int, list[Any]] = {0: [], 1: []}
        pending = [threading.Event(), threading.Event()]
        for replica, event in zip(replicas, pending):
            replica.rounds.stop_pending = event.is_set

        def two_rounds(i: int) -> None:
            for k in range(2):
                if k == 1 and i == 0:
                    pending[0].set()  # between the rounds, on replica 0 only
                committed, _ = replicas[i].round()
                notes[i].append((committed, replicas[i].rounds.stop_note, replicas[i].model[0].item()))

        threads = [threading.Thread(target=two_rounds, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert notes[0] == notes[1] == [(True, None, 1.5), (True, "", 1.5)], notes
    finally:
        house.stop()
        for replica in replicas:
            replica.rounds.close()


# ---- real jobs ------------------------------------------------------------------------------------

def _step(run_dir: Path, index: int) -> int:
    try:
        return int((run_dir / f"replicas/{index}/logs/rank_0.progress").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return -1


def _no_process_left(run_dir: Path, job: subprocess.Popen) -> None:
    """Nothing of the job lives: checked by pid (its records, their groups, its run directory)."""
    left = alive_of_job(run_dir, [job.pid])
    assert not left, left
    assert (run_dir / "logs/ft_processes_0.jsonl").read_text().count('"role": "lighthouse"') == 1


def _newest_step(replica_dir: Path) -> int:
    from engine.checkpoint.files import complete_checkpoints

    found = complete_checkpoints(replica_dir)
    return found[0].step if found else -1


def test_a_quorum_that_can_no_longer_form_ends_the_job_with_the_survivors_checkpoint(cli_env: dict,
                                                                                      tmp_path: Path) -> None:
    """Three replicas (a quorum needs two), no restarts: replica 1 killed at step 12, replica 2 at
    24. Replica 0 would wait for a quorum for an hour; the job ends within QUORUM_LOST_BOUND_S of
    the second death, exit 1, one line naming replicas 1 and 2 and ft.min_replicas=2, replica 0's
    checkpoint of the step it stopped at, ft_ended.json saying so, and no process left."""
    run_dir = tmp_path / "run"
    job = start_cli(["algo=local_sgd", "algo.period=4", "ft.enabled=true", "launch.nproc=3", "ft.max_restarts=0",
                  "faults.kill=[1@12,2@24]", "train.max_steps=400", "train.imbalance.delay_ms=60",
                  f"hydra.run.dir={run_dir}"], cli_env)
    _, err = job.communicate(timeout=400)
    ended = time.time()
    assert job.returncode == 1, err[-3000:]
    lines = [ln for ln in err.splitlines() if "quorum can no longer form" in ln]
    assert len(lines) == 1, err[-3000:]
    assert "replica(s) 1, 2 are gone" in lines[0] and "ft.min_replicas=2" in lines[0], lines[0]
    died = [e for e in map(json.loads, (run_dir / "replicas/2/logs/faults.jsonl").read_text().splitlines())
            if e["event"] == "kill"]
    assert len(died) == 1 and ended - died[0]["time"] <= QUORUM_LOST_BOUND_S, (ended - died[0]["time"], died)
    print(f"quorum lost: job ended {ended - died[0]['time']:.1f} s after replica 2's kill")
    stopped = json.loads((run_dir / "replicas/0/stopped.json").read_text())
    assert "the quorum can no longer form" in stopped["reason"], stopped
    saved = _newest_step(run_dir / "replicas/0")
    assert saved >= 24 and f"replica 0 at step {saved}" in lines[0], (saved, lines[0])
    record = json.loads((run_dir / "ft_ended.json").read_text())["ft"]
    assert record["ended"] == "quorum lost" and record["quorum_lost"]["gone"] == [1, 2]
    assert record["quorum_lost"]["checkpoints"] == {"0": saved} and record["quorum_lost"]["stopped"] == [0]
    assert not (run_dir / "summary.json").exists()
    _no_process_left(run_dir, job)


def test_a_first_signal_while_no_round_can_complete_stops_within_stop_wait_s(cli_env: dict,
                                                                              tmp_path: Path) -> None:
    """Two replicas, both needed for a quorum: replica 1 is killed and cli.py gets SIGTERM at once.
    Replica 0's next round can never form (its peer is gone, a replacement is ended before it
    trains); it gives it up ft.stop_wait_s after reaching it and checkpoints. The job exits 0 as a
    stopped one, within ft.stop_wait_s + STOP_SLACK_S of the signal, and no process is left."""
    run_dir = tmp_path / "run"
    wait_s = 3.0
    job = start_cli(["algo=local_sgd", "algo.period=4", "ft.enabled=true", "launch.nproc=2", f"ft.stop_wait_s={wait_s}",
                  "dist.timeout_s=20", "train.max_steps=400", "train.imbalance.delay_ms=60",
                  f"hydra.run.dir={run_dir}"], cli_env)
    wait_for(lambda: min(_step(run_dir, i) for i in (0, 1)) >= 12 or job.poll() is not None, 150, "step 12")
    assert job.poll() is None, job.communicate()[1][-3000:]
    os.kill(int((run_dir / "logs/replica_1.pid").read_text()), signal.SIGKILL)
    took, err = signal_and_wait(job, [signal.SIGTERM], timeout=120)
    assert job.returncode == 0, err[-3000:]
    assert took <= wait_s + STOP_SLACK_S, (took, err[-3000:])
    print(f"first signal, no round possible: job ended {took:.1f} s after it (ft.stop_wait_s={wait_s:g})")
    assert "SIGTERM: every replica checkpoints and stops" in err and "stopped early" in err, err[-3000:]
    stopped = json.loads((run_dir / "replicas/0/stopped.json").read_text())
    assert stopped["reason"] == f"signal SIGUSR1: no round could complete within ft.stop_wait_s={wait_s:g}", stopped
    assert (run_dir / "stopped.json").exists() and not (run_dir / "summary.json").exists()
    assert _newest_step(run_dir / "replicas/0") >= 12
    _no_process_left(run_dir, job)


def test_a_second_signal_kills_every_process_of_the_job_at_once(cli_env: dict, tmp_path: Path) -> None:
    """Two replicas training; SIGINT, then SIGINT again: the supervisor kills the replicas' and
    the lighthouse's process groups at once and exits 130 within AT_ONCE_BOUND_S; nothing is left.
    Rounds every 100 steps (about 6 s apart at 60 ms a step): the first signal's agreed stop must
    still be pending when the second arrives (with a round every 4 steps it could complete within
    the 0.5 s between them, and the job then ended cleanly with 0 before the second signal)."""
    run_dir = tmp_path / "run"
    job = start_cli(["algo=local_sgd", "algo.period=100", "ft.enabled=true", "launch.nproc=2", "train.max_steps=400",
                  "train.imbalance.delay_ms=60", f"hydra.run.dir={run_dir}"], cli_env)
    wait_for(lambda: min(_step(run_dir, i) for i in (0, 1)) >= 8 or job.poll() is not None, 150, "step 8")
    assert job.poll() is None, job.communicate()[1][-3000:]
    took, err = signal_and_wait(job, [signal.SIGINT, signal.SIGINT], gap_s=0.5)
    assert job.returncode == 128 + signal.SIGINT, err[-3000:]
    assert took <= AT_ONCE_BOUND_S, took
    print(f"second signal: job ended {took:.2f} s after it")
    assert "second SIGINT: stopped at once" in err, err[-3000:]
    _no_process_left(run_dir, job)
