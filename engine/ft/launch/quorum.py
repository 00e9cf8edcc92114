"""When the replicas still running can no longer train: a quorum that can no longer form, and
replicas outrun by the finished ones.

Both rules read every replica of the job (this node's from its processes, the other nodes' from
their records: `{index: {"done", "exits", "restarts"}}`), so every node's supervisor reaches the
same judgement and acts on its own replicas only.

- A lost quorum: the replicas still running (or being restarted) are fewer than ft.min_replicas
  and none has finished: every other replica used its ft.max_restarts (or its node was lost), so
  no quorum can form again and the survivors would wait in theirs for as long as
  ft.quorum_timeout_s allows (an hour). The supervisor ends the job instead: the survivors
  checkpoint what they hold and stop.
- The outrun: every other replica has finished, and those still running are too few to form a
  quorum and short of the finished ones' last step. They can never heal or train again (seen: a
  replica killed near the end, whose replacement started after the survivors had finished,
  waited for a quorum until ft.quorum_timeout_s), so they are stopped; the job's result is the
  finished replicas'.
"""
from __future__ import annotations

import time
from typing import Any, Optional

from core.run_files import read_step
from core.rundir import RunDir
from engine.ft.config import FTConfig
from engine.ft.launch.replicas import final_step, replica_dir

#: seconds a replica left behind must stay at one step before it is stopped: five heartbeats, so
#: that one finishing its last steps is never taken for it
OUTRUN_S = 10.0

#: every replica of the job: index -> {"done", "exits", "restarts"}
States = dict[int, dict[str, Any]]


def finished_cleanly(state: dict[str, Any]) -> bool:
    return bool(state["exits"]) and state["exits"][-1] == 0


def quorum_lost(states: States, ft: FTConfig, count: int, need: int) -> Optional[dict[str, Any]]:
    """Why no quorum of `need` can form any more (the record `logs/ft_quorum_lost` and
    ft_ended.json carry), or None while one still can, or while another node's replicas are not
    known yet."""
    if len(states) < count:
        return None
    live = sorted(i for i, st in states.items() if not st["done"])
    if not live or len(live) >= need or any(finished_cleanly(st) for st in states.values()):
        return None
    gone = sorted(i for i, st in states.items() if st["done"])
    return {"gone": gone, "live": live, "min_replicas": need, "replicas": count,
            "max_restarts": ft.max_restarts, "time": time.time()}


class OutrunRule:
    """Which running replicas the finished ones left behind. A heartbeat lags by up to a beat, so
    a replica counts as left behind only when its step has not moved for OUTRUN_S."""

    def __init__(self, run_dir: RunDir, count: int, need: int) -> None:
        self.run_dir, self.count, self.need = run_dir, count, need
        self._behind: dict[int, tuple[Optional[int], float]] = {}  # replica -> (its step, since when)

    def left_behind(self, states: States, running: list[int]) -> Optional[tuple[int, list[tuple[int, Optional[int]]]]]:
        """The finished replicas' last step and the running replicas (index, step) to stop now;
        None while none is to be stopped. `running`: the replicas whose process lives (another
        node's: not done)."""
        finished = [i for i, st in states.items() if st["done"] and finished_cleanly(st)]
        if not running or not finished or len(running) >= self.need:
            return None
        if any(not states.get(i, {}).get("done", False) for i in range(self.count) if i not in running):
            return None  # a replica is being restarted: it may still make up a quorum
        final = max(final_step(self.run_dir, i) for i in finished)
        behind = [(i, read_step(replica_dir(self.run_dir, i).rank_progress(0))) for i in running]
        # unknown (no heartbeat: starting, or ending, which removes it), at the last step or with
        # its summary written: ending or not yet judgeable, not left behind
        if final < 0 or any(step is None or step >= final or replica_dir(self.run_dir, i).summary.exists()
                            for i, step in behind):
            self._behind.clear()
            return None
        now = time.monotonic()
        for index, step in behind:
            if self._behind.get(index, (None, 0.0))[0] != step:
                self._behind[index] = (step, now)
        if any(now - self._behind[index][1] < OUTRUN_S for index, _ in behind):
            return None
        return final, behind
