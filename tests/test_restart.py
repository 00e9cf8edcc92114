"""Restart-all (`launch.max_restarts`) and injected faults (`faults.*`): a killed rank's job comes
back by itself from its last checkpoint and ends where a straight run resumed there ends; a stall
is seen by the rank watch; a restart-all job killed as a whole resumes; bad values are one line."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from core.errors import UserError
from core.run_files import FaultLog, read_step
from core.rundir import RunDir
from engine.launch.restart import run_with_restarts
from engine.train.faults import FaultsConfig, fault_summary, mtbf_draw, parse_faults
from tests.support.cli_runs import REPO, error_line, run_cli, run_cli_here, start_cli
from tests.support.processes import wait_for
from tests.test_faults import newest_complete

QUIET = ["train.eval_every_epochs=null", "checkpoint.every_epochs=null", "train.progress=false"]
#: forked ranks (the restart loop is the same under either start; the launcher's restarts are the
#: restart-all and signal tests below)
WAGMA = ["algo=wagma", "algo.group_size=2", "algo.global_period=10", "algo.wait_avoiding=false", "launch.nproc=4",
         "launch.launcher=fork",
         "train.max_steps=40", "checkpoint.every_steps=10", "checkpoint.keep_last=10", *QUIET]


def models_at(run_dir: Path, step: int, world: int) -> list[dict[str, torch.Tensor]]:
    return [torch.load(run_dir / "checkpoints" / f"step_{step:08d}" / f"rank_{r}.pt", weights_only=True)["model"]
            for r in range(world)]


# ---- parsing and the restart loop, without launching ---------------------------------------------

@pytest.mark.parametrize("kill, stall, world, words", [
    (["1-30"], [], 4, ["faults.kill", "'1-30'", "RANK@STEP"]),
    (["4@30"], [], 4, ["rank 4", "4 ranks"]),
    (["1@0"], [], 4, ["at least 1"]),
    (["1@3", "1@3"], [], 4, ["1@3 is given twice"]),
    ([], ["1@30"], 2, ["faults.stall", "RANK@STEP:SECONDS"]),
])
def test_bad_fault_specs_are_one_line_naming_the_value(kill, stall, world, words) -> None:
    with pytest.raises(UserError) as err:
        parse_faults(FaultsConfig(kill=kill, stall=stall), world)
    assert all(w in str(err.value) for w in words), str(err.value)
    assert "\n" not in str(err.value)


def test_bad_fault_values_exit_2_before_launch(tmp_path: Path) -> None:
    for args, words in ((["faults.kill=[2@10]", "launch.nproc=2"], ["faults.kill", "rank 2"]),
                        (["faults.mtbf_s=-5"], ["faults.mtbf_s"]),
                        (["launch.max_restarts=1", "launch.launcher=none", "launch.nproc=1"],
                         ["launch.max_restarts=1", "launch.launcher=deepspeed"])):
        proc = run_cli_here([*args, f"hydra.run.dir={tmp_path / 'run'}"])
        assert proc.returncode == 2, proc.stderr[-2000:]
        line = error_line(proc)
        assert all(w in line for w in words), line
    assert not (tmp_path / "run" / "logs").exists(), "nothing may start on bad input"


def test_random_kills_are_seeded_and_each_attempt_draws_the_next() -> None:
    draws = [mtbf_draw(3, 60.0, 4, i) for i in range(50)]
    assert draws == [mtbf_draw(3, 60.0, 4, i) for i in range(50)]
    assert draws != [mtbf_draw(4, 60.0, 4, i) for i in range(50)]
    assert len(set(draws)) == 50 and {r for _, r in draws} == {0, 1, 2, 3}
    mean = sum(g for g, _ in draws) / len(draws)
    assert 30 < mean < 120, mean  # exponential gaps with mean 60 s (50 draws)


def _fake_attempts(run_dir: RunDir, codes: list[int], signal_at: int | None = None):
    """A launch that writes what ranks write (a log line, a heartbeat) and ends with the next code."""
    calls: list[int] = []

    def attempt(number: int, received: list[int]) -> int:
        calls.append(number)
        run_dir.logs.mkdir(parents=True, exist_ok=True)
        run_dir.rank_log(0).write_text(f"attempt {number}\n")
        run_dir.rank_progress(0).write_text(f"{10 * (number + 1)} 0\n")
        if signal_at == number:
            received.append(signal.SIGTERM)
        return codes[len(calls) - 1]

    return attempt, calls


def test_restart_loop_retries_failures_only_and_keeps_every_attempts_logs(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path / "run")
    attempt, calls = _fake_attempts(run_dir, [1, 1, 0])
    assert run_with_restarts(attempt, run_dir, max_restarts=3, restart_delay_s=0.0, fresh=True) == 0
    assert calls == [0, 1, 2]
    for k in (0, 1):
        assert (run_dir.logs / f"attempt_{k}" / "rank_0.log").read_text() == f"attempt {k}\n"
    assert run_dir.rank_log(0).read_text() == "attempt 2\n"
    events = FaultLog(run_dir).events()
    fails = [e for e in events if e["event"] == "failure"]
    assert [(f["attempt"], f["step"]) for f in fails] == [(0, 10), (1, 20)]
    assert [e["restart"] for e in events if e["event"] == "attempt"] == [False, True, True]
    # bad input (exit 2) and a job the user stopped are not retried; the budget is kept
    for codes, signal_at, want in (([2, 0], None, 2), ([1, 0], 0, 1), ([1, 1, 0], None, 1)):
        shutil.rmtree(run_dir.root)
        attempt, calls = _fake_attempts(run_dir, codes, signal_at)
        assert run_with_restarts(attempt, run_dir, max_restarts=1, restart_delay_s=0.0, fresh=True) == want
        assert len(calls) == (2 if codes == [1, 1, 0] else 1)


def test_fault_summary_counts_lost_steps_and_recovery_from_the_fault_to_the_resume() -> None:
    """Recovery starts when the fault fires (the kill at 110), not when the launching process
    recorded the failure (111): the detection and the other ranks' teardown are part of it."""
    events = [{"event": "attempt", "attempt": 0, "restart": False, "time": 100.0},
              {"event": "kill", "spec": "kill 1@25", "step": 25, "attempt": 0, "time": 110.0},
              {"event": "failure", "attempt": 0, "step": 25, "time": 111.0},
              {"event": "attempt", "attempt": 1, "restart": True, "time": 111.5},
              {"event": "resume", "attempt": 1, "step": 20, "time": 115.0},
              # attempt 1: a stall that thawed in time, then one the watch ended the attempt on
              {"event": "stall", "spec": "stall 0@30:1", "step": 30, "attempt": 1, "time": 117.0},
              {"event": "stall", "spec": "stall 1@34:60", "step": 34, "attempt": 1, "time": 119.0},
              {"event": "failure", "attempt": 1, "step": 34, "time": 131.0},
              {"event": "attempt", "attempt": 2, "restart": True, "time": 131.5},
              {"event": "resume", "attempt": 2, "step": 30, "time": 134.0},
              # attempt 2: a failure nothing injected (only its record's time is known)
              {"event": "failure", "attempt": 2, "step": 41, "time": 140.0},
              {"event": "attempt", "attempt": 3, "restart": True, "time": 140.5},
              {"event": "resume", "attempt": 3, "step": 40, "time": 142.0}]
    got = fault_summary(events, train_ranks=4, now=150.0)
    assert (got["failures"], got["restarts"], got["faults_injected"]) == (3, 3, 3)
    assert (got["steps_lost"], got["replica_steps_lost"]) == (5 + 4 + 1, 40)
    assert got["recover_s_each"] == [5.0, 15.0, 2.0] and got["recover_s"] == 22.0 and got["job_wall_s"] == 50.0


# ---- real runs ------------------------------------------------------------------------------------

def test_killed_wagma_rank_restarts_once_and_ends_as_a_straight_resumed_run(cli_env: dict, tmp_path: Path) -> None:
    """Rank 2 is SIGKILLed after step 25; the job re-launches itself from step 20 and finishes.
    A straight run resumed from a copy of that step-20 checkpoint ends with the same weights on
    every rank, and the kill did not fire again when step 25 came round a second time."""
    run_dir, ref_dir = tmp_path / "run", tmp_path / "ref"
    proc = run_cli([*WAGMA, "faults.kill=[2@25]", "launch.max_restarts=1", f"hydra.run.dir={run_dir}"], cli_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "restarting the whole job from its last complete checkpoint (restart 1 of 1)" in proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 40 and summary["resumed_from"] == 20
    assert (summary["failures"], summary["restarts"], summary["faults_injected"]) == (1, 1, 1)
    assert summary["steps_lost"] == 5 and summary["replica_steps_lost"] == 20 and summary["recover_s"] > 0
    assert summary["job_wall_s"] > summary["wall_s"]
    assert (run_dir / "logs" / "attempt_0" / "rank_2.log").is_file()
    assert any(json.loads(ln).get("kind") == "restart" for ln in (run_dir / "metrics.jsonl").read_text().splitlines())

    (ref_dir / "checkpoints").mkdir(parents=True)
    shutil.copytree(run_dir / "checkpoints" / "step_00000020", ref_dir / "checkpoints" / "step_00000020")
    ref = run_cli([*WAGMA, f"hydra.run.dir={ref_dir}"], cli_env)
    assert ref.returncode == 0, ref.stderr[-3000:]
    assert json.loads((ref_dir / "summary.json").read_text())["resumed_from"] == 20
    for got, want in zip(models_at(run_dir, 40, 4), models_at(ref_dir, 40, 4)):
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)


#: rank 1 killed after step 15, checkpoints every 10 steps, the run's first evaluation at step 15;
#: the ranks forked (the restart loop and the fault log are the same under either start)
LOSS = ["launch.nproc=2", "launch.launcher=fork", "train.max_steps=30", "checkpoint.every_steps=10", "checkpoint.every_epochs=null",
        "train.eval_every_steps=15", "train.eval_every_epochs=null", "faults.kill=[1@15]", "launch.max_restarts=1",
        "faults.restart_delay_s=0.5", "train.progress=false"]


# allreduce (issue 37's rows) and a periodic method whose checkpoints fall between its rounds;
# DiLoCo's inner steps are the same case as local SGD's period, so not run again (CI's 30 minutes)
@pytest.mark.parametrize("algo", [["algo=allreduce"], ["algo=local_sgd", "algo.period=4"]],
                         ids=["allreduce", "local_sgd"])
def test_a_kill_between_checkpoints_loses_the_steps_since_the_one_before(algo: list[str], cli_env: dict,
                                                                          tmp_path: Path) -> None:
    """A kill at step 15 with checkpoints at 10 and 20 costs steps 11-15 on both ranks, whatever
    the plugin. Step 15 is also an evaluation, the run's first and so a new best, whose checkpoint
    used to be written before the fault fired: the job resumed at 15 and counted 0 steps lost
    (faults_cpu's allreduce rows, issue 37). Recovery is timed from the kill, not from the
    launching process's failure record, which comes after the other rank has been ended."""
    run_dir = tmp_path / "run"
    proc = run_cli([*algo, *LOSS, f"hydra.run.dir={run_dir}"], cli_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from"] == 10 and summary["steps"] == 30, summary
    assert (summary["failures"], summary["restarts"], summary["faults_injected"]) == (1, 1, 1)
    assert (summary["steps_lost"], summary["replica_steps_lost"]) == (5, 10), summary
    events = FaultLog(run_dir).events()
    kill, failure, resume = (next(e for e in events if e["event"] == kind) for kind in ("kill", "failure", "resume"))
    assert (kill["rank"], kill["step"], failure["step"], resume["step"]) == (1, 15, 15, 10)
    assert summary["recover_s_each"] == [round(resume["time"] - kill["time"], 3)]
    assert summary["recover_s"] > round(resume["time"] - failure["time"], 3) and summary["recover_s"] >= 0.5


def test_injected_stall_is_named_by_the_rank_watch(cli_env: dict, tmp_path: Path) -> None:
    """faults.stall freezes the rank's whole process (its heartbeat too): the watch ends the job
    within dist.timeout_s, naming the rank, the step and the stopped state, as after SIGSTOP."""
    run_dir = tmp_path / "run"
    # steps slowed to 0.3 s so that a heartbeat (every 2 s) has reported a step before the stall;
    # forked ranks (the rank watch is cli.py's, whichever start; CI's 30 minutes)
    proc = run_cli(["launch.nproc=2", "launch.launcher=fork", "train.max_steps=200", "dist.timeout_s=20",
                    "faults.stall=[1@15:120]", "train.imbalance.delay_ms=300", *QUIET, f"hydra.run.dir={run_dir}"],
                   cli_env, timeout=240)
    assert proc.returncode == 1, proc.stderr[-2000:]
    line = error_line(proc)
    assert "rank 1 stopped making progress at step" in line and "stopped state" in line, line
    assert 0 < int(line.split("at step ")[1].split(":")[0]) <= 15, line  # a heartbeat's step, up to the stall's
    assert [e["event"] for e in FaultLog(run_dir).events()].count("stall") == 1


def test_restart_all_job_killed_as_a_whole_resumes_from_its_checkpoint(cli_env: dict, tmp_path: Path) -> None:
    """A restart-all job (one automatic restart behind it) is killed with its supervisor; the same
    command continues from the newest checkpoint, and the fault that fired does not fire again."""
    run_dir = tmp_path / "run"
    # forked ranks: restart-all is cli.py's loop, whichever start (CI's 30 minutes)
    args = ["launch.nproc=2", "launch.launcher=fork", "train.max_steps=100000", "checkpoint.every_steps=10",
            "faults.kill=[1@15]", "launch.max_restarts=1", "train.log_every_steps=5", *QUIET,
            f"hydra.run.dir={run_dir}"]
    proc = start_cli(args, cli_env)
    try:
        wait_for(lambda: any(e["event"] == "resume" for e in FaultLog(run_dir).events())
                 and (read_step(run_dir / "logs" / "rank_0.progress") or 0) > 32, 300, "the restarted job to pass step 30")
    finally:  # as a machine's power cut would: the supervisor and every rank at once
        proc.kill()
        for pid_file in (run_dir / "logs").glob("rank_*.pid"):
            try:
                os.kill(int(pid_file.read_text().split()[0]), signal.SIGKILL)
            except (ProcessLookupError, ValueError, OSError):
                pass
        proc.communicate()
    last = newest_complete(run_dir)
    assert last is not None and last.step >= 30
    again = run_cli([*args, f"train.max_steps={last.step + 10}"], cli_env)
    assert again.returncode == 0, again.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from"] == last.step and summary["steps"] == last.step + 10
    assert summary["faults_injected"] == 1 and summary["failures"] == 1 and summary["restarts"] == 1


_MTBF_CHILD = """
import sys, time
from pathlib import Path
from core.rundir import RunDir
from engine.train.faults import FaultInjector, FaultsConfig
inj = FaultInjector(FaultsConfig(mtbf_s=0.05, seed=1), rank=0, world_size=1, run_dir=RunDir(Path(sys.argv[1])))
inj.start(step=0, resumed=False, reporting=False)
for step in range(1, 2000):
    time.sleep(0.01)
    inj.after_step(step)
print("survived")
"""


def test_random_kill_is_a_real_sigkill_and_the_next_attempt_draws_the_next_gap(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path / "run")
    run_dir.logs.mkdir(parents=True)
    for attempt in range(2):
        proc = subprocess.run([sys.executable, "-c", _MTBF_CHILD, str(run_dir.root)], cwd=REPO, capture_output=True,
                              text=True, timeout=120, env={**os.environ, "SYNCOPT_ATTEMPT": str(attempt)})
        assert proc.returncode == -signal.SIGKILL and "survived" not in proc.stdout, proc.stderr[-2000:]
    kills = [e for e in FaultLog(run_dir).events() if e["event"] == "kill"]
    assert [(k["kind"], k["spec"], k["attempt"]) for k in kills] == [("mtbf", "mtbf #0", 0), ("mtbf", "mtbf #1", 1)]
    assert [k["gap_s"] for k in kills] == [round(mtbf_draw(1, 0.05, 1, i)[0], 3) for i in range(2)]


# ---- stop signals and restart-all's attempts (issue 37) -------------------------------------------
#: a first signal while the launching process waits out faults.restart_delay_s: no further attempt,
#: the job ends within this (its polls are 0.1 s apart; the rest is the interpreter's exit)
BETWEEN_BOUND_S = 5.0
#: a second signal during an attempt: the launcher's process group ended, every rank with it
AT_ONCE_BOUND_S = 10.0
STEADY = ["launch.nproc=2", "train.max_steps=100000", "checkpoint.every_steps=5", "faults.kill=[1@7]",
          "launch.max_restarts=1", "train.imbalance.delay_ms=60", *QUIET]


def test_a_signal_between_restart_all_attempts_starts_no_further_attempt(cli_env: dict, tmp_path: Path) -> None:
    """Rank 1 killed at step 7 (a checkpoint at 5); during the 60 s restart delay a SIGTERM ends the job within
    BETWEEN_BOUND_S without starting attempt 1, and nothing of the job is left (checked by pid)."""
    from tests.support.processes import alive_of_job, signal_and_wait

    run_dir = tmp_path / "run"
    # forked ranks: the wait between attempts is cli.py's loop, whichever start (the launcher's
    # process group is the next test's; CI's 30 minutes)
    proc = start_cli([*STEADY, "launch.launcher=fork", "faults.restart_delay_s=60", f"hydra.run.dir={run_dir}"],
                     cli_env)
    try:
        wait_for(lambda: any(e["event"] == "failure" for e in FaultLog(run_dir).events()) or proc.poll() is not None,
                 240, "attempt 0's failure")
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        took, err = signal_and_wait(proc, [signal.SIGTERM])
    finally:
        if proc.poll() is None:
            proc.kill()
    assert took <= BETWEEN_BOUND_S, (took, err[-3000:])
    assert proc.returncode != 0 and "SIGTERM between attempts: no further attempt" in err, err[-3000:]
    assert [e["event"] for e in FaultLog(run_dir).events()].count("attempt") == 1
    assert newest_complete(run_dir) is not None  # the checkpoint a later run resumes from
    left = alive_of_job(run_dir, [proc.pid])
    assert not left, left


def test_a_second_signal_during_a_restarted_attempt_ends_every_rank_at_once(cli_env: dict, tmp_path: Path) -> None:
    """Attempt 1 (after the kill at step 7) training; SIGINT twice (no agreed stop can come first:
    train.preempt_check_every is beyond the run): the job ends within AT_ONCE_BOUND_S and no rank,
    launcher or supervisor of either attempt is left (checked by pid)."""
    from tests.support.processes import alive_of_job, signal_and_wait

    run_dir = tmp_path / "run"
    proc = start_cli([*STEADY, "train.preempt_check_every=100000", f"hydra.run.dir={run_dir}"], cli_env)
    try:
        wait_for(lambda: (any(e["event"] == "resume" for e in FaultLog(run_dir).events())
                          and (read_step(run_dir / "logs" / "rank_0.progress") or 0) >= 9) or proc.poll() is not None,
                 240, "attempt 1 to train")
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        took, err = signal_and_wait(proc, [signal.SIGINT, signal.SIGINT], gap_s=0.3)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert took <= AT_ONCE_BOUND_S, (took, err[-3000:])
    assert proc.returncode != 0 and not (run_dir / "summary.json").exists(), err[-3000:]
    assert [e["event"] for e in FaultLog(run_dir).events()].count("attempt") == 2
    left = alive_of_job(run_dir, [proc.pid])
    assert not left, left
