"""The `ft` section: fault-tolerant mode on torchft, and what it refuses before launch."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from core.errors import UserError
from core.schema import Section, option


@dataclass
class FTConfig(Section):
    """`ft.*`. Off by default: the job is then exactly today's (one process group, DeepSpeed)."""

    enabled: bool = False
    lighthouse: Optional[str] = None  # host:port of a running lighthouse (a cluster's); None: cli.py starts one
    # a quorum (and a commit) needs at least this many replicas; None: a majority of them, so that a
    # replacement alone (or any minority) can never form a quorum of its own beside the survivors'
    min_replicas: Optional[int] = option(None, ge=1)
    max_restarts: int = option(3, ge=0)  # restarts of each replica by the supervisor before it gives up
    # None: derived per round (engine/ft/rank/rounds.py round_quorum_timeout): an hour, or 4x the wall-clock of
    # the period before the round if longer, so QSR's growing periods are always covered; a dead peer leaves
    # by the heartbeat timeout, so this bounds only a quorum that cannot form. A value is used as given
    # (a warning when a period outlasts it)
    quorum_timeout_s: Optional[float] = option(None, gt=0)
    join_timeout_s: float = option(1.0, gt=0)  # how long the lighthouse waits for stragglers before a quorum
    heartbeat_timeout_s: float = option(1.5, gt=0)  # a replica silent this long is out of the next quorum
    # a replica told to stop (a signal, a stop_request) stops at the next round the replicas agree on; if
    # that round's quorum has not formed this long after the replica reached it, no round can complete
    # (peers gone or stuck): it stops without it, with a checkpoint of what it holds
    stop_wait_s: float = option(30.0, gt=0)


#: torchft's Manager heartbeats the lighthouse every 100 ms (its default, which we keep); a replica
#: whose last beat is older than ft.heartbeat_timeout_s does not count as alive
MANAGER_HEARTBEAT_S = 0.1
#: ft.heartbeat_timeout_s must span this many beats, or live replicas drop out between two beats
HEARTBEATS_PER_TIMEOUT = 3


def quorum_size(ft: FTConfig, replicas: int) -> int:
    """The smallest quorum: `ft.min_replicas`, or a majority of the replicas."""
    return ft.min_replicas if ft.min_replicas is not None else replicas // 2 + 1


def check_ft(ft: FTConfig, algo_name: str, ft_refusal: str, launch: Any, algo_cfg: Any = None,
             replicas: Optional[int] = None) -> None:
    """One line for what fault-tolerant mode cannot do, before anything starts; `replicas`: how
    many the job starts (launch.nproc on every node), for the settings that can only wait."""
    if not ft.enabled:
        return
    if replicas is not None:
        check_quorum_settings(ft, replicas)
    if ft_refusal:
        raise UserError(f"ft.enabled=true does not work with algo={algo_name}: {ft_refusal}; "
                        "use algo=local_sgd, diloco, allreduce, easgd or powersgd, or ft.enabled=false")
    composed = [k for k in ("compress", "outer_compress") if getattr(algo_cfg, k, None)]
    composed += ["overlap_steps"] if getattr(algo_cfg, "overlap_steps", 0) else []
    if composed:
        raise UserError(f"ft.enabled=true has no fault-tolerant round for a compressed exchange (algo.{composed[0]} is "
                        "set): its error-feedback memory cannot be rolled back yet; drop it or use ft.enabled=false")
    if launch.network.emulated:
        raise UserError("ft.enabled=true does not run on launch.network's emulated nodes yet; emulate nodes with "
                        "network namespaces and launch.no_ssh=true per node, or drop launch.network")
    if str(launch.launcher) == "none":
        raise UserError("ft.enabled=true runs every rank as its own process; use launch.launcher=auto (the "
                        "default) or deepspeed (cli.py supervises the replicas itself) instead of launch.launcher=none")
    if ft.lighthouse is not None and ":" not in ft.lighthouse:
        raise UserError(f"ft.lighthouse={ft.lighthouse!r}: expected host:port of a running torchft lighthouse")


def check_quorum_settings(ft: FTConfig, replicas: int) -> None:
    """Settings under which the lighthouse can never form a quorum, or a round can only time out
    (its rules, torchft 0.2.0: a quorum needs ft.min_replicas healthy participants, more than half
    of the replicas heartbeating, and waits up to ft.join_timeout_s for heartbeating stragglers)."""
    shape = f"{replicas} replica(s) (launch.nproc on every node)"
    if ft.min_replicas is not None and ft.min_replicas > replicas:
        raise UserError(f"ft.min_replicas={ft.min_replicas} is more than the {shape} this job starts: no quorum can "
                        f"ever form and every replica would wait for one; use ft.min_replicas<={replicas} (null: a "
                        f"majority, {replicas // 2 + 1}) or launch.nproc>={ft.min_replicas}")
    if quorum_size(ft, replicas) == replicas and ft.max_restarts == 0 and replicas > 1:
        raise UserError(f"ft.min_replicas={quorum_size(ft, replicas)} (every one of the {shape}) with ft.max_restarts=0 "
                        "survives no failure: the first leaves a quorum that can never form again; lower "
                        f"ft.min_replicas (below {replicas}), raise ft.max_restarts, or use ft.enabled=false")
    floor = round(HEARTBEATS_PER_TIMEOUT * MANAGER_HEARTBEAT_S, 6)
    if ft.heartbeat_timeout_s < floor:
        raise UserError(f"ft.heartbeat_timeout_s={ft.heartbeat_timeout_s:g} is shorter than {HEARTBEATS_PER_TIMEOUT} of "
                        f"torchft's heartbeats ({MANAGER_HEARTBEAT_S:g} s apart): live replicas would count as dead "
                        f"between two beats and a quorum may never form; use ft.heartbeat_timeout_s>={floor:g}")
    if ft.quorum_timeout_s is not None and ft.quorum_timeout_s <= ft.join_timeout_s:
        raise UserError(f"ft.quorum_timeout_s={ft.quorum_timeout_s:g} is not longer than ft.join_timeout_s="
                        f"{ft.join_timeout_s:g}: the lighthouse waits that long for a straggler, so every round with "
                        "one would time out before its quorum forms; raise ft.quorum_timeout_s (or null: derived) or "
                        "lower ft.join_timeout_s")


#: what the supervisor tells each replica process (engine/ft/launch/supervisor.py)
REPLICA_ENV = "SYNCOPT_FT_REPLICA"  # "INDEX/COUNT"
LIGHTHOUSE_ENV = "SYNCOPT_FT_LIGHTHOUSE"  # host:port


@dataclass(frozen=True)
class Replica:
    """This process's place in a fault-tolerant job: replica `index` of `count`, each a world of
    one rank with its own TCP store (MASTER_ADDR:MASTER_PORT) on `host`."""

    index: int
    count: int
    host: str
    store_port: int
    lighthouse: str

    @staticmethod
    def from_env(env: dict[str, str]) -> Optional["Replica"]:
        if REPLICA_ENV not in env:
            return None
        index, count = (int(v) for v in env[REPLICA_ENV].split("/"))
        return Replica(index, count, env["MASTER_ADDR"], int(env["MASTER_PORT"]), env[LIGHTHOUSE_ENV])

    def run_dir_name(self) -> str:
        """Each replica writes a run directory of its own (checkpoints, metrics, summary) here."""
        return f"replicas/{self.index}"
