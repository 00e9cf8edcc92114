"""scripts/produce_tables.sh pause: the run it finds stops, even when asked in its first seconds."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "produce_tables.sh"

# A stand-in for a table's run: named by hydra.run.dir as the runner's launch is, it takes its
# RankWatch stamp only after the first stop_request has been written (the race: a launch whose
# stamp comes after `pause`'s first touch takes that request as stale), then ends once a request
# newer than its stamp arrives, or after 60 s without one.
FAKE_RUN = """
import sys, time
begun = time.time_ns()
from pathlib import Path
from engine.launch.rank_watch import RankWatch
run = Path(sys.argv[1].split("=", 1)[1])
request = run / "stop_request"
while not (request.exists() and request.stat().st_mtime_ns >= begun):
    time.sleep(0.05)
watch = RankWatch(run)
end = time.time() + 60
while time.time() < end:
    if watch.stop_requested():
        (run / "stopped").write_text("requested")
        sys.exit(0)
    time.sleep(0.1)
sys.exit(1)
"""


SLEEPER = "import time; time.sleep(60)"


def test_pause_stops_a_run_that_takes_its_stamp_after_the_first_request(tmp_path: Path) -> None:
    tables = tmp_path / "tables"
    run = tables / "head_to_head" / "runs" / "row" / "seed_0"
    run.mkdir(parents=True)
    # the runner's log line pause reads to find the run in progress
    (tables / "head_to_head.log").write_text(f"[tune 1/2] row lr=0.1 seed 0: running ({run})\n")
    fake = subprocess.Popen([sys.executable, "-c", FAKE_RUN, f"hydra.run.dir={run}"], cwd=REPO)
    # this chain's loop, which pause ends, and another TABLES_DIR's, which it must leave alone
    loops = {d: subprocess.Popen([sys.executable, "-c", SLEEPER, "produce_tables.sh", "loop", str(d)])
             for d in (tables, tmp_path / "tables2")}
    try:
        time.sleep(0.5)  # the stand-in is up: pause finds it by its command line
        env = {**os.environ, "TABLES_DIR": str(tables)}
        paused = subprocess.run(["timeout", "30", "bash", str(SCRIPT), "pause"], env=env,
                                capture_output=True, text=True)
        assert paused.returncode == 0, paused.stdout + paused.stderr
        assert f"asked {run} to checkpoint and stop" in paused.stdout
        assert paused.stdout.strip().endswith("paused")
        assert fake.wait(timeout=10) == 0
        assert (run / "stopped").read_text() == "requested"
        assert (tables / "paused").exists()  # a later start is told the chain was paused
        assert loops[tables].wait(timeout=5) != 0
        assert loops[tmp_path / "tables2"].poll() is None
    finally:
        for proc in [fake, *loops.values()]:
            if proc.poll() is None:
                proc.kill()
