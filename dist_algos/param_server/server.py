"""The serving side: the global model shard, the per-worker records, and the serving threads.

`ServerState` is the logic (no transport): apply one push to the global model, count the version,
measure the pushing worker's staleness, and build that worker's reply, either the dense model
(`downlink=model`: ASGD and the one-way baselines) or DGS's sparse reply (`downlink=sparse`): the
per-layer top-k (`reply_density`, or the push's own density when that is null) of what that
worker is missing, global - synced - sent_w in the paper's terms (sent_w: what it has been sent
since the last dense resync; its copy is synced + sent_w). The server keeps that difference
itself, missing_w, updated sparsely (each push is subtracted from every worker's missing_w,
each reply from its own), so a reply costs a top-k, not three passes over the model. Every
`resync_period` versions synced := global and each worker's next reply is that model, densely,
with missing_w restarted from it. The server has no optimizer state of its own: pushes are
already updates (lr, momentum and weight decay applied on the worker), as in the reference code.

`Server` runs one thread per worker, each blocked on that worker's channel, so pushes are received
concurrently and applied as they arrive, one at a time under one lock (`Turns`); in the
`round_robin` mode the workers are applied in a fixed rank order instead, one push each per round,
which makes a run reproducible (the exact-resume test). A worker whose connection fails is dropped
(its thread ends, the turn moves on) and the others are served as before.

The caller must hold `Server.lock` around anything that reads the state while threads run
(`state_dict`, the evaluation's snapshot); the trainer takes those at step boundaries when every
worker is waiting (see Trainer._quiesce), so the lock only guards against a bug, not a race.
"""
from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from typing import Any, Optional

import torch

from dist_algos.comm.accounting import CommStats, now
from dist_algos.compress.topk import topk_per_layer
from dist_algos.param_server import wire
from dist_algos.param_server.layout import Shard
from core.errors import UserError

log = logging.getLogger("syncopt")


class ServerState:
    """One server's shard of the global model and its records of each worker."""

    def __init__(self, shard: Shard, initial: torch.Tensor, workers: Sequence[int], downlink: str,
                 reply_density: Optional[float], resync_period: int, value_dtype: torch.dtype) -> None:
        self.shard = shard
        self.workers = list(workers)
        self.downlink = downlink
        self.reply_density = reply_density
        self.resync_period = resync_period
        self.value_dtype = value_dtype
        n = len(self.workers)
        self.global_model = initial.detach().clone()
        self.version = 0
        self.resyncs = 0
        self.resync_version = 0
        sparse = downlink == "sparse"
        self.synced: Optional[torch.Tensor] = self.global_model.clone() if sparse else None
        # global minus each worker's copy (its copy: synced + what it has been sent since)
        self.missing: list[Optional[torch.Tensor]] = [torch.zeros_like(self.global_model) if sparse else None
                                                      for _ in range(n)]
        self.needs_full = [False] * n
        self.synced_version = [0] * n  # the version each worker's copy reflects
        self.pushes = [0] * n
        self.staleness_sum = [0] * n
        self.staleness_max = [0] * n
        self.bytes_in = [0] * n
        self.bytes_out = [0] * n
        self.buffers: list[Optional[torch.Tensor]] = [None] * n  # each worker's latest BN statistics

    # ---- one push -----------------------------------------------------------------------------
    def apply(self, worker: int, push: wire.Message) -> wire.Message:
        """Apply `push` from rank `worker` and return its reply (the caller holds the lock)."""
        i = self.workers.index(worker)
        staleness = self.version - self.synced_version[i]
        values = push.values.to(self.global_model.dtype)
        if push.kind == wire.Kind.DENSE:
            for target in [self.global_model, *self.missing]:
                if target is not None:
                    target.sub_(values)
        elif push.kind == wire.Kind.SPARSE:
            idx = push.indices.long()
            for target in [self.global_model, *self.missing]:
                if target is not None:
                    target.index_add_(0, idx, values, alpha=-1)
        else:
            raise wire.ProtocolError(f"worker rank {worker} pushed a {push.kind.name} message")
        if push.buffers is not None:
            self.buffers[i] = push.buffers
        self.version += 1
        if self.synced is not None and self.version % self.resync_period == 0:
            self._resync()
        reply = self._reply(i, self.reply_density or push.density or 1.0)
        reply.version, reply.staleness = self.version, staleness
        self.pushes[i] += 1
        self.staleness_sum[i] += staleness
        self.staleness_max[i] = max(self.staleness_max[i], staleness)
        self.bytes_in[i] += push.nbytes
        self.bytes_out[i] += reply.nbytes
        return reply

    def _resync(self) -> None:
        self.synced.copy_(self.global_model)
        self.needs_full = [True] * len(self.workers)
        self.resyncs += 1
        self.resync_version = self.version

    def _reply(self, i: int, density: float) -> wire.Message:
        if self.synced is None:  # dense downlink: the model itself (float32: it replaces the copy)
            self.synced_version[i] = self.version
            return wire.Message(wire.Kind.MODEL, values=self.global_model.clone())
        if self.needs_full[i]:
            self.needs_full[i] = False
            torch.sub(self.global_model, self.synced, out=self.missing[i])
            self.synced_version[i] = self.resync_version
            return wire.Message(wire.Kind.MODEL, values=self.synced.clone())
        idx = topk_per_layer(self.missing[i], self.shard.sizes, density)
        reply = wire.sparse(idx, self.missing[i][idx], self.value_dtype, density=density)
        # what the worker will add, after rounding to the wire's dtype, it no longer misses
        self.missing[i].index_add_(0, idx, reply.values.to(self.global_model.dtype), alpha=-1)
        self.synced_version[i] = self.version
        return reply

    def held(self, worker: int) -> torch.Tensor:
        """What a worker's copy of this shard is, by the server's records (sparse downlink)."""
        return self.global_model - self.missing[self.workers.index(worker)]

    # ---- evaluation ---------------------------------------------------------------------------
    def mean_buffers(self) -> Optional[torch.Tensor]:
        """The global model's BatchNorm statistics: the mean of the workers' latest."""
        got = [b for b in self.buffers if b is not None]
        if not got:
            return None
        return torch.stack(got).mean(0)

    # ---- records ------------------------------------------------------------------------------
    def worker_stats(self) -> list[dict[str, Any]]:
        return [{"rank": w, "pushes": self.pushes[i],
                 "staleness_mean": self.staleness_sum[i] / max(self.pushes[i], 1),
                 "staleness_max": self.staleness_max[i], "bytes_in": self.bytes_in[i],
                 "bytes_out": self.bytes_out[i]} for i, w in enumerate(self.workers)]

    def state_dict(self) -> dict[str, Any]:
        def copy(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
            return None if t is None else t.detach().clone()

        return {"version": self.version, "resyncs": self.resyncs, "resync_version": self.resync_version,
                "global_model": copy(self.global_model), "synced": copy(self.synced),
                "missing": [copy(t) for t in self.missing], "needs_full": list(self.needs_full),
                "synced_version": list(self.synced_version), "pushes": list(self.pushes),
                "staleness_sum": list(self.staleness_sum), "staleness_max": list(self.staleness_max),
                "bytes_in": list(self.bytes_in), "bytes_out": list(self.bytes_out),
                "buffers": [copy(t) for t in self.buffers]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["global_model"].shape != self.global_model.shape or len(state["pushes"]) != len(self.workers) \
                or (state["synced"] is None) != (self.synced is None):
            raise UserError("the checkpoint's parameter-server state does not fit this run (another model, "
                            "algo.servers or downlink); resume=null starts fresh")
        dev = self.global_model.device
        self.global_model.copy_(state["global_model"])
        if self.synced is not None:
            self.synced.copy_(state["synced"])
            for mine, saved in zip(self.missing, state["missing"]):
                mine.copy_(saved)
        for key in ("version", "resyncs", "resync_version"):
            setattr(self, key, int(state[key]))
        for key in ("needs_full", "synced_version", "pushes", "staleness_sum", "staleness_max",
                    "bytes_in", "bytes_out"):
            setattr(self, key, list(state[key]))
        self.buffers = [None if b is None else b.to(dev) for b in state["buffers"]]


class Turns:
    """Who may apply a push next. `async`: whoever holds the lock first. `round_robin`: the
    workers in rank order, one push each per round, skipping those that have left."""

    def __init__(self, workers: Sequence[int], ordered: bool) -> None:
        self.cond = threading.Condition()
        self.order = sorted(workers)
        self.ordered = ordered
        self.active = set(workers)
        self.position = 0
        self.stopping = False

    def _current(self) -> Optional[int]:
        n = len(self.order)
        for step in range(n):
            worker = self.order[(self.position + step) % n]
            if worker in self.active:
                return worker
        return None

    @contextlib.contextmanager
    def turn(self, worker: int) -> Iterator[None]:
        with self.cond:
            if self.ordered:
                self.cond.wait_for(lambda: self.stopping or self._current() == worker)
                if self.stopping:
                    raise RuntimeError("the server is stopping")
            yield
            self.position = (self.order.index(worker) + 1) % len(self.order)
            self.cond.notify_all()

    def leave(self, worker: int) -> None:
        with self.cond:
            self.active.discard(worker)
            self.cond.notify_all()

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()


class Server:
    """Serves every worker from its own thread; see the module docstring."""

    def __init__(self, rank: int, state: ServerState, channels: dict[int, wire.Channel], ordered: bool,
                 comm: CommStats) -> None:
        self.rank = rank
        self.state = state
        self.channels = channels
        self.turns = Turns(list(channels), ordered)
        self.comm = comm
        self.dropped: dict[int, str] = {}
        self.threads: list[threading.Thread] = []

    @property
    def lock(self) -> threading.Condition:
        return self.turns.cond

    def start(self) -> None:
        for worker in self.channels:
            thread = threading.Thread(target=self._serve, args=(worker,), name=wire.serving_thread(worker), daemon=True)
            thread.start()
            self.threads.append(thread)

    def _serve(self, worker: int) -> None:
        channel = self.channels[worker]
        if channel.device.type == "cuda":  # the current device is per thread; NCCL ops use it
            torch.cuda.set_device(channel.device)
        try:
            while True:
                push = channel.recv(self.state.shard.numel, timeout=wire.IDLE_WAIT)
                if push.kind == wire.Kind.BYE:
                    return
                arrived = now()
                with self.turns.turn(worker):
                    reply = self.state.apply(worker, push)
                    # counted before sending: a worker that has its reply finds the records final;
                    # logged at arrival and as handed to the wire (each transfer's own time is
                    # on the worker's side of the ledger)
                    built = now()
                    self.comm.record(wire.push_op(push.nbytes, worker, False), arrived, arrived)
                    self.comm.record(wire.pull_op(reply.nbytes, worker, False), built, built, syncs=1)
                channel.send(reply)
        except Exception as err:  # a failed worker must not take the server down
            if not self.turns.stopping:
                reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
                self.dropped[worker] = reason
                log.warning("parameter server rank %d: dropped worker rank %d at version %d (%s); "
                            "serving the others", self.rank, worker, self.state.version, reason)
        finally:
            self.turns.leave(worker)

    def join(self) -> None:
        """Wait until every worker has said goodbye or been dropped."""
        for thread in self.threads:
            thread.join()

    def stop(self, timeout: float) -> None:
        """Stop serving (on every exit path): waits `timeout` s for the threads, which end when
        their workers say goodbye or disconnect; stragglers are daemons."""
        self.turns.stop()
        for thread in self.threads:
            thread.join(timeout)
