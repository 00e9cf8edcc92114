"""torchft's Manager behind `dist_algos.machinery.ft_round.RoundAverager`: quorum, mean, commit, healing.

One Manager per replica (a replica group of one rank). Rounds are synchronous (`use_async_quorum`
off): the quorum is taken where the plugin synchronises, and a replica that is behind (a
replacement, or one restarted from an older checkpoint) heals right there from a live peer's
whole state (the trainer's `RankState.capture`), which the trainer loads between the quorum and
the all_reduce (`on_heal`). `init_sync` is off: every replica starts from the same seeded model (or its own
checkpoint), so equal steps need no healing. The Manager's server, its healing transport and the
lighthouse listen on the host the replicas' process groups use (`host`), not on every interface.
Every round is recorded: step, participants, committed, healed.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, Optional

import torch
import torchft.manager as tft_manager
from torchft import Manager, ProcessGroupGloo

from core.run_files import go_flag, ready_flag, wait_for
from dist_algos.machinery.ft_round import RoundAverager
from engine.ft.config import FTConfig, quorum_size
from engine.rank.ft_transport import TensorOnlyTransport

log = logging.getLogger("syncopt")
#: quorum wait when ft.quorum_timeout_s is null: longer than any period between rounds (torchft
#: advises about an hour for LocalSGD/DiLoCo); a dead peer is dropped by the heartbeat timeout and
#: a dead lighthouse by the supervisor, so this bounds only a quorum that can never form
DEFAULT_QUORUM_TIMEOUT_S = 3600.0
#: with ft.quorum_timeout_s null, a round's quorum wait also covers this many times the period that
#: led to it (measured on this replica: the seconds since its previous round began), so a schedule
#: whose periods grow (QSR's H = (beta / lr)^2 as the learning rate decays) is never cut short by a
#: fixed hour, even for a peer this many times slower
PERIOD_COVER = 4.0


def round_quorum_timeout(configured: Optional[float], period_s: float) -> tuple[float, str]:
    """The quorum wait for one round, and a warning ('' when none). `configured` is
    ft.quorum_timeout_s (None: derived); `period_s` the wall-clock of the period before this round."""
    if configured is None:
        return max(DEFAULT_QUORUM_TIMEOUT_S, PERIOD_COVER * period_s), ""
    if period_s > configured:
        return configured, (f"ft.quorum_timeout_s={configured:g} is shorter than the last period between rounds "
                            f"({period_s:.0f} s): a slower peer can miss a round's quorum; raise it or set it to "
                            "null (derived from the periods)")
    return configured, ""


@contextlib.contextmanager
def _manager_server_bound_to(host: str) -> Iterator[None]:
    """torchft's Manager starts its server on [::] (every interface); make it bind `host`."""
    original = tft_manager.ManagerServer

    def bound(**kwargs: Any) -> Any:
        port = kwargs["bind"].rsplit(":", 1)[-1]
        return original(**{**kwargs, "bind": f"{host}:{port}"})

    tft_manager.ManagerServer = bound  # type: ignore[assignment]
    try:
        yield
    finally:
        tft_manager.ManagerServer = original  # type: ignore[assignment]


def wait_at_start_gate(logs: Path, replica: int, timeout_s: float) -> None:
    """The replicas of a job start seconds apart (imports, data); the first rounds would form
    without the late ones, who would then heal at once. Each says it is ready (its Manager is up
    and heartbeating, so the lighthouse waits for it) and waits for the supervisor's go, given
    when all are ready. A replacement finds the go already there."""
    ready_flag(logs, replica).write_text("ready\n")
    go = go_flag(logs)
    wait_for(lambda: True if go.exists() else None, timeout_s, 0.05, None)  # past it: go on, the quorum waits


def model_digest(model_state: dict[str, torch.Tensor]) -> str:
    """sha256 over a model state's tensors in key order (the same bytes give the same digest)."""
    digest = hashlib.sha256()
    for key in sorted(model_state):
        digest.update(key.encode())
        digest.update(model_state[key].detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


class ManagerRounds(RoundAverager):
    def __init__(self, cfg: FTConfig, replica: int, replicas: int, host: str, store_port: int, lighthouse: str,
                 timeout_s: float, state_dict: Callable[[], dict[str, Any]],
                 on_heal: Callable[[dict[str, Any]], None], trainer_step: Callable[[], int],
                 gate: Optional[Path] = None) -> None:
        self._on_heal, self._trainer_step, self._own_state = on_heal, trainer_step, state_dict
        self._healed = False
        self.record: list[list[Any]] = []  # [step, participants, committed, healed, seconds]
        self.heal_seconds: list[float] = []
        # sha256 of the model state this replica sent to a healing peer / loaded when it healed,
        # with the trainer step: a heal delivered exactly what the peer had (tests compare them)
        self.sent: list[list[Any]] = []
        self.received: list[list[Any]] = []

        def send_state() -> dict[str, Any]:
            state = state_dict()
            self.sent.append([trainer_step(), model_digest(state["model"])])
            return state
        timeout = timedelta(seconds=timeout_s)
        quorum = timedelta(seconds=cfg.quorum_timeout_s or DEFAULT_QUORUM_TIMEOUT_S)
        with _manager_server_bound_to(host):
            self.manager = Manager(
                pg=ProcessGroupGloo(timeout=timeout), load_state_dict=self._load, state_dict=send_state,
                min_replica_size=quorum_size(cfg, replicas), use_async_quorum=False, timeout=timeout,
                quorum_timeout=quorum, connect_timeout=timeout, rank=0, world_size=1, store_addr=host,
                store_port=store_port, lighthouse_addr=lighthouse, replica_id=f"replica_{replica}",
                hostname=host, checkpoint_transport=TensorOnlyTransport(host, timeout), init_sync=False)
        self._round_start = 0.0
        self._configured_quorum_s = cfg.quorum_timeout_s
        self._warned_quorum = False
        if gate is not None:
            wait_at_start_gate(gate, replica, quorum.total_seconds())


    def _load(self, state: dict[str, Any]) -> None:
        started = time.perf_counter()
        self._on_heal(state)
        self._healed = True
        self.received.append([self._trainer_step(), model_digest(self._own_state()["model"])])  # as loaded
        self.heal_seconds.append(time.perf_counter() - started)
        log.warning("healed from a live peer: now at step %d", self._trainer_step())

    # ---- RoundAverager ----------------------------------------------------------------------
    def begin(self) -> None:
        self._healed = False
        now = time.perf_counter()
        period_s = now - self._round_start if self._round_start else 0.0
        self._round_start = now
        quorum_s, warning = round_quorum_timeout(self._configured_quorum_s, period_s)
        if warning and not self._warned_quorum:
            log.warning(warning)
            self._warned_quorum = True
        self.manager.start_quorum(timeout=timedelta(seconds=quorum_s))

    def average_(self, tensors: Sequence[torch.Tensor]) -> None:
        works = [self.manager.allreduce(t) for t in tensors]
        for work in works:
            work.wait()

    def commit(self) -> bool:
        committed = bool(self.manager.should_commit())
        self.record.append([self.step, self.participants, committed, self._healed,
                            round(time.perf_counter() - self._round_start, 4)])
        if not committed:
            log.warning("round at step %d was not committed (%d participants): rolled back",
                        self.step, self.participants)
        return committed

    @property
    def participants(self) -> int:
        return int(self.manager.num_participants())

    @property
    def healed(self) -> bool:
        return self._healed

    @property
    def step(self) -> int:
        return self._trainer_step()

    # ---- checkpoint and summary -------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The Manager's step (commits so far) and this replica's round record, for checkpoints."""
        return {"manager": dict(self.manager.state_dict()), "record": [list(r) for r in self.record],
                "heal_seconds": list(self.heal_seconds)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.manager.load_state_dict(state["manager"])
        self.record = [list(r) for r in state["record"]]
        self.heal_seconds = [float(s) for s in state["heal_seconds"]]

    def summary(self) -> dict[str, Any]:
        committed = [r for r in self.record if r[2]]
        return {"rounds": len(self.record), "committed": len(committed),
                "failed": len(self.record) - len(committed), "heals": len(self.heal_seconds),
                "heal_s": [round(s, 4) for s in self.heal_seconds],
                "participants": [[r[0], r[1], r[2]] for r in self.record],
                "sent_state": self.sent, "healed_state": self.received}

    def close(self) -> None:
        self.manager.shutdown(wait=False)
