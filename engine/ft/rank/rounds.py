"""torchft's Manager behind `dist_algos.comm.round_averager.RoundAverager`: quorum, mean, commit, healing.

One Manager per replica (a replica group of one rank). Rounds are synchronous (`use_async_quorum`
off): the quorum is taken where the plugin synchronises, and a replica that is behind (a
replacement, or one restarted from an older checkpoint) heals right there from a live peer's
whole state (the trainer's `RankState.capture`), which the trainer loads between the quorum and
the all_reduce (`on_heal`). `init_sync` is off: every replica starts from the same seeded model (or its own
checkpoint), so equal steps need no healing. The Manager's server, its healing transport and the
lighthouse listen on the host the replicas' process groups use (`host`), not on every interface.
Every round is recorded: step, participants, committed, healed.

Stopping. Replicas are worlds of one, so a stop signal cannot be agreed by the trainer's usual
collective; it is agreed in the rounds instead: each round's first mean carries one more element,
1 where the replica has a stop pending, and a committed round whose mean of it is positive stops
every participant after that step (`stop_note`), so all of them checkpoint the same step. A round
that cannot complete must not hold a stopping replica for the quorum's hour: the quorum is awaited
in a helper thread while this thread watches, and is given up (the round then fails, rolled back
as any failed round, and the replica stops) once a stop has been pending for `ft.stop_wait_s`, or
at once when the supervisor has written that the quorum can no longer form
(`core.run_files.quorum_lost_flag`).
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, Optional

import torch
import torchft.manager as tft_manager
from torchft import Manager, ProcessGroupGloo

from core.run_files import go_flag, quorum_lost_flag, ready_flag, wait_for
from dist_algos.comm.round_averager import RoundAverager
from engine.ft.config import FTConfig, quorum_size
from engine.ft.rank.transport import TensorOnlyTransport

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
#: how often a replica waiting for a quorum looks for a stop (its signal, the supervisor's flag)
QUORUM_POLL_S = 0.1


class RoundAbandoned(RuntimeError):
    """A heal that arrived after its replica had given the round up (it is stopping): not loaded."""


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
        # stopping (see the module doc): the trainer sets `stop_pending` to its stop signal's state
        self.stop_pending: Callable[[], bool] = lambda: False
        self.stop_note: Optional[str] = None  # set when the replicas stop: why ("" for a stop agreed in a round)
        self._stop_wait_s, self._logs = cfg.stop_wait_s, gate
        self._lock = threading.Lock()  # the abandoning thread against a heal arriving at the same moment
        self._abandoned = self._loading = False
        self._flag = torch.zeros(1)  # this round's stop element, averaged with the round's first mean
        self._flag_sent = False
        self._closed = False
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
        with self._lock:
            if self._abandoned:  # (the quorum formed after this replica gave it up: it is stopping)
                raise RoundAbandoned("the round was given up before its heal arrived")
            self._loading = True
        started = time.perf_counter()
        self._on_heal(state)
        self._healed = True
        self.received.append([self._trainer_step(), model_digest(self._own_state()["model"])])  # as loaded
        self.heal_seconds.append(time.perf_counter() - started)
        log.warning("healed from a live peer: now at step %d", self._trainer_step())

    # ---- RoundAverager ----------------------------------------------------------------------
    def begin(self) -> None:
        self._healed = self._abandoned = self._loading = self._flag_sent = False
        now = time.perf_counter()
        period_s = now - self._round_start if self._round_start else 0.0
        self._round_start = now
        quorum_s, warning = round_quorum_timeout(self._configured_quorum_s, period_s)
        if warning and not self._warned_quorum:
            log.warning(warning)
            self._warned_quorum = True
        self._await_quorum(timedelta(seconds=quorum_s))

    def _quorum_lost(self) -> bool:
        return self._logs is not None and quorum_lost_flag(self._logs).exists()

    def _await_quorum(self, timeout: timedelta) -> None:
        """torchft's quorum (and a heal) in a helper thread; this thread, which hears the stop
        signal, gives the round up when a stop has been pending for ft.stop_wait_s since it got
        here, or at once when the supervisor says the quorum can no longer form."""
        if self._quorum_lost() and self._abandon("the quorum can no longer form (fewer replicas than ft.min_replicas)"):
            return
        failed: list[BaseException] = []

        def quorum() -> None:
            try:
                self.manager.start_quorum(timeout=timeout)
            except BaseException as err:  # noqa: BLE001 - handed to the waiting thread
                failed.append(err)

        helper = threading.Thread(target=quorum, name="syncopt-quorum", daemon=True)
        helper.start()
        stop_seen: Optional[float] = None
        while True:
            helper.join(QUORUM_POLL_S)
            if not helper.is_alive():
                break
            why = ""
            if self._quorum_lost():
                why = "the quorum can no longer form (fewer replicas than ft.min_replicas)"
            elif self.stop_pending():
                stop_seen = stop_seen if stop_seen is not None else time.monotonic()
                if time.monotonic() - stop_seen >= self._stop_wait_s:
                    why = f"no round could complete within ft.stop_wait_s={self._stop_wait_s:g}"
            if why and self._abandon(why):
                return
        if failed:
            raise failed[0]

    def _abandon(self, why: str) -> bool:
        """Give this round up (it fails: average_ does nothing, commit says no) and stop after it;
        False when a heal has already begun (the quorum formed: the round goes on)."""
        with self._lock:
            if self._loading:
                return False
            self._abandoned = True
        self.stop_note = why
        log.warning("round at step %d given up: %s; this replica checkpoints and stops", self.step, why)
        # its request stays with the lighthouse, which would count it in a quorum for a peer arriving
        # now while this replica never takes part: end the Manager (its heartbeats stop, so it drops
        # out after ft.heartbeat_timeout_s); what the checkpoint reads of it is plain counters
        self.close()
        return True

    def average_(self, tensors: Sequence[torch.Tensor]) -> None:
        if self._abandoned:
            return  # (commit says no: the caller restores what it had)
        flag: list[torch.Tensor] = []
        if not self._flag_sent:  # the round's first mean carries the stop element (same count on every replica)
            self._flag.fill_(1.0 if self.stop_pending() else 0.0)
            flag, self._flag_sent = [self._flag], True
        works = [self.manager.allreduce(t) for t in [*tensors, *flag]]
        for work in works:
            work.wait()

    def commit(self) -> bool:
        committed = False if self._abandoned else bool(self.manager.should_commit())
        self.record.append([self.step, self.participants, committed, self._healed,
                            round(time.perf_counter() - self._round_start, 4)])
        if committed and self._flag_sent and float(self._flag.item()) > 0 and self.stop_note is None:
            self.stop_note = ""  # a participant had a stop pending: every participant stops after this step
        if not committed:
            log.warning("round at step %d was not committed (%d participants): rolled back",
                        self.step, self.participants)
        return committed

    @property
    def participants(self) -> int:
        return 1 if self._abandoned else int(self.manager.num_participants())

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
        if not self._closed:
            self._closed = True
            self.manager.shutdown(wait=False)
