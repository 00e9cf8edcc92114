"""The parameter-server plugin base: roles, channels, the worker's exchange, the server's life.

Ranks 0..S-1 (`algo.servers` = S) serve, ranks S.. train; the training set is sharded over the
workers only. Per step a worker turns its gradient into one push per server (the subclass's
`make_pushes`: dense for ASGD, a per-layer top-k for the sparse methods), sends them, waits for
the replies and applies them to its model: a worker's model changes only through the servers'
replies. No barrier between workers: each server applies pushes as they arrive (`server.py`).

Hyper-parameters come from the run's `optim` section as plain numbers (`TrainInfo.hyper`; the
local optimizer is never stepped): the learning rate is the scheduled one of the step
(`StepContext.lr`), weight decay and momentum are `optim.weight_decay` and `optim.momentum`, and
`train.grad_clip` clips this worker's gradient (global L2 norm, torch's rule) before the update is
formed. DGC has its own local clipping besides (`algo.clip_norm`). fp16 loss scaling is not
supported (use bf16 or fp32).

Transport (`wire.py`): every server-worker pair has its own process groups (created identically on
every rank), so the server's threads and the main threads' collectives (evaluation, checkpoint
barriers, the stop check, all on the default group) never share one. A server that dies makes its
workers' next receive fail (a closed connection at once on gloo, `dist.timeout_s` at worst) and
the worker exits with an error naming the server; a worker that dies is dropped by the server.

Evaluation is of the global model, on the serving ranks (each server contributes its shard, and
the first server the mean of the workers' latest BatchNorm statistics, which ride along with each
push to it). Checkpoints hold each server's shard and records, and each worker's memory.

At 64 workers (docs/workers.md): S servers (`algo.servers`, 1 in the recipes) serve 64 workers
on launch.nproc = 64 + S ranks (table=workers_cpu gives these rows `extra_ranks: 1`, so that they
train on as many workers as the others); a server applies pushes as they arrive, so a reply is
built on a model up to about 64 pushes newer than the one the gradient was taken at, and each
server's links carry every worker's pushes and replies. Every push is an update of its own
(`updates_per_worker`): `optim.scale_lr_with_batch` scales the rate by a worker's batch, not the
global batch (engine/plan.py), which at a constant global batch keeps the per-sample step as the
workers grow. Refused before launch: no rank left to
train (servers >= world); at set-up: more servers than the model's parameter tensors.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, ClassVar, Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from dist_algos.base import AlgoConfig, DistAlgorithm, HyperParams, RankLayout, Role, Scenario, StepContext, TrainInfo
from dist_algos.compress.sparse_feedback import clip_by_norm_
from dist_algos.comm.accounting import now
from dist_algos.comm.flat import FlatBuffer, flat_grads
from dist_algos.comm.pattern import CommOp, ParamLayout, PatternConfig
from dist_algos.param_server import wire
from dist_algos.param_server.layout import Shard, partition
from dist_algos.param_server.server import Server, ServerState
from dist_algos.param_server.traffic import exchange_pattern, resync_period
from core.errors import UserError
from core.schema import option

log = logging.getLogger("syncopt")

SERVING = ("async", "round_robin")
DOWNLINKS = ("model", "sparse")


@dataclass
class ParamServerConfig(AlgoConfig):
    servers: int = option(1, ge=1)  # ranks 0..servers-1 serve, the rest train
    # async: apply pushes as they arrive | round_robin: fixed worker order (reproducible)
    serving: str = option("async", choices=SERVING)
    value_dtype: str = option("float32", choices=wire.VALUE_DTYPES)  # the wire type of update values


@dataclass
class SparseConfig(ParamServerConfig):
    """Fields of the plugins that push a per-layer top-k (and may reply sparsely)."""

    density: float = option(0.01, gt=0, le=1)  # fraction of each layer's entries a worker pushes
    # sparse downlink: fraction replied per layer (null: the push's)
    reply_density: Optional[float] = option(None, gt=0, le=1)
    # sparse downlink: server versions between dense resyncs (null: 150 x workers)
    resync_period: Optional[int] = option(None, ge=1, hint="or null")


class ParameterServerLost(RuntimeError):
    """A worker's server stopped answering."""


class ParamServerAlgorithm(DistAlgorithm):
    ft_refusal = ("the parameter server holds the only copy of the model, which no live peer can heal from, and its "
                  "pushes and pulls are not rounds a quorum can retry; use launch.max_restarts")
    Config: ClassVar[type[AlgoConfig]] = ParamServerConfig
    updates_per_worker = True  # every push is applied on its own: lr scaling follows a worker's batch
    test_world_size = 3  # one server, two workers
    deterministic_overrides = {"serving": "round_robin"}
    deterministic_reason = ("asynchronous serving applies pushes in arrival order, which depends on timing; "
                            "round_robin applies the workers' pushes in a fixed rank order")
    # the server's layer shards and momentum over a CNN's parameters, and over a tiny GPT's
    test_scenarios = {"one_server": Scenario(), "lm_one_server": Scenario(task="language_model")}
    reference_exemption = ("a serving thread applies the workers' pushes while its main thread joins the trainer's "
                           "collectives, which plugin_trajectory's step loop cannot drive: tests/test_param_server.py "
                           "drives server and workers itself and compares with one-process SGD (one worker) and "
                           "with a replay of the recorded push order (delayed workers, two servers)")
    invalid_options = {"algo.servers=4": "needs at least one worker", "algo.serving=lifo": "algo.serving",
                       "optim=adamw": "use optim=sgd", "optim.nesterov=true": "optim.nesterov=false"}
    #: "model" or "sparse" for plugins whose downlink is part of the method; None: `algo.downlink`.
    fixed_downlink: ClassVar[Optional[str]] = None
    #: Why the method needs optim.momentum > 0 (checked on every rank at set-up), or "".
    momentum_required: ClassVar[str] = ""
    #: Attributes of the worker's memory tensors (residuals, momenta) made by `setup_worker`.
    memory: ClassVar[tuple[str, ...]] = ()
    #: Whether the push density changes with the step (then kept in `self.density`, logged, plotted).
    scheduled_density: ClassVar[bool] = False

    # ---- validation ---------------------------------------------------------------------------
    @classmethod
    def validate(cls, cfg: ParamServerConfig, world_size: int, local_size: int,
                 hyper: HyperParams) -> None:
        if world_size - cfg.servers < 1:
            raise UserError(f"algo={cfg.name} with algo.servers={cfg.servers} needs at least one worker: "
                            f"set launch.nproc to {cfg.servers + 1} or more (not {world_size})")
        cls._check_hyper(cfg, hyper)

    @classmethod
    def _check_hyper(cls, cfg: ParamServerConfig, hyper: HyperParams) -> None:
        if hyper.optimizer != "sgd":
            raise UserError(f"algo={cfg.name} computes its own SGD-type update: use optim=sgd (not "
                            f"{hyper.optimizer}); optim.momentum and optim.weight_decay are read from it")
        if hyper.nesterov:
            raise UserError(f"algo={cfg.name} has no Nesterov variant: set optim.nesterov=false")
        if cls.momentum_required and hyper.momentum <= 0:
            raise UserError(f"algo={cfg.name} needs optim.momentum > 0 ({cls.momentum_required})")

    @classmethod
    def layout(cls, cfg: ParamServerConfig, world_size: int) -> RankLayout:
        """Ranks 0..servers-1 serve (and evaluate the global model); the others train."""
        return RankLayout(train=tuple(range(cfg.servers, world_size)), evaluate=tuple(range(cfg.servers)))

    # ---- roles --------------------------------------------------------------------------------
    def server_ranks(self) -> list[int]:
        return list(range(self.cfg.servers))

    @property
    def downlink(self) -> str:
        return self.fixed_downlink or self.cfg.downlink

    @property
    def value_dtype(self) -> torch.dtype:
        return wire.VALUE_DTYPES[self.cfg.value_dtype]

    # ---- set-up -------------------------------------------------------------------------------
    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer, info: TrainInfo) -> None:
        super().setup(model, optimizer, info)
        self._read_hyper(info.hyper)
        params = [p for p in model.parameters() if p.requires_grad]
        flat = FlatBuffer(params)
        if len(flat.buffers) != 1:
            raise UserError(f"algo={self.cfg.name} needs all trainable parameters in one dtype on one device")
        self.flat = flat.buffers[0]
        self.shards = partition([p.numel() for p in params], self.server_ranks())
        self.bn_buffers = [b for b in model.buffers() if b.is_floating_point()]
        self.server: Optional[Server] = None
        self.bye_sent = False
        self.in_flight = False
        # worker-side records (also read by metrics on every rank)
        self.pushes = 0
        self.version = 0
        self.staleness = 0
        self.staleness_sum = 0
        self.staleness_max = 0
        channels = self._connect()
        if self.role() == Role.SERVER:
            shard = next(s for s in self.shards if s.server == self.ctx.rank)
            state = ServerState(shard, shard.of(self.flat), self.train_ranks(), self.downlink,
                                getattr(self.cfg, "reply_density", None),
                                self._resync_period(), self.value_dtype)
            self.server = Server(self.ctx.rank, state, channels, self.cfg.serving == "round_robin", self.comm)
            if not info.resuming:  # else after load_state_dict
                self.server.start()
        else:
            self.channels = channels
            self.grad = flat_grads(params).buffers[0]
            self.update = torch.empty_like(self.flat)  # reused every step (see `decayed_update`)
            self.setup_worker()

    def _resync_period(self) -> int:
        return resync_period(self.cfg, len(self.train_ranks()))

    # ---- the declared pattern -----------------------------------------------------------------
    @classmethod
    def comm_pattern(cls, rank: int, step: int, world: int, config: PatternConfig,
                     layout: ParamLayout) -> list[CommOp]:
        """A worker's push to every server and their replies; a server's threads' side of each
        worker's (`traffic.exchange_pattern`, which says what the run decides)."""
        downlink = cls.fixed_downlink or getattr(config.algo, "downlink", "model")
        return exchange_pattern(rank, step, world, config, layout, downlink, cls.push_density(config, step))

    @classmethod
    def push_density(cls, config: PatternConfig, step: int) -> Optional[float]:
        """The per-layer density of a worker's push at `step` (None: a dense push)."""
        return None

    def _read_hyper(self, hyper: HyperParams) -> None:
        """Weight decay, momentum, the peak LR and the gradient clip, from the run's optim section
        (these plugins compute their own update; the local optimizer is never stepped)."""
        self.weight_decay = hyper.weight_decay
        self.momentum = hyper.momentum
        self.peak_lr = hyper.peak_lr
        self.grad_clip = hyper.grad_clip

    def _connect(self) -> dict[int, wire.Channel]:
        """A gloo control group and a data group per (server, worker) pair, made on every rank in
        the same order; returns this rank's channels by peer."""
        channels: dict[int, wire.Channel] = {}
        me = self.ctx.rank
        for server in self.server_ranks():
            for worker in self.train_ranks():
                control = self.ctx.new_group([server, worker], backend="gloo")
                data = control if self.ctx.backend == "gloo" else self.ctx.new_group([server, worker])
                if me in (server, worker):
                    peer = worker if me == server else server
                    channels[peer] = wire.Channel(peer, control, data, self.ctx.device)
        self.server_group = self.ctx.new_group(self.server_ranks()) if self.cfg.servers > 1 else None
        return channels

    # ---- the worker ---------------------------------------------------------------------------
    def setup_worker(self) -> None:
        """Create the worker's memory tensors (residuals, momenta)."""

    def make_pushes(self, ctx: StepContext) -> list[wire.Message]:
        """One push per shard (in `self.shards` order) from `self.grad` and `self.flat`."""
        raise NotImplementedError  # abstract: every registered subclass defines its push

    def decayed_update(self, lr: float) -> torch.Tensor:
        """lr x (g + wd w) in the persistent `self.update` (no model-sized allocation per step;
        valid until the next call, which is safe since `_exchange` waits for every send)."""
        torch.add(self.grad, self.flat, alpha=self.weight_decay, out=self.update)
        return self.update.mul_(lr)

    def worker_state(self) -> dict[str, Any]:
        """The worker's memory tensors named in `memory`, which a resume must restore exactly
        (an error-feedback residual reset to zero would silently change the run)."""
        return {name: getattr(self, name).clone() for name in self.memory}

    def load_worker_state(self, state: dict[str, Any]) -> None:
        for name in self.memory:
            getattr(self, name).copy_(state[name])

    def step(self, ctx: StepContext) -> None:
        with torch.no_grad():
            if self.grad_clip:
                clip_by_norm_(self.grad, self.grad_clip)
            pushes = self.make_pushes(ctx)
            if self.bn_buffers:
                pushes[0].buffers = torch.cat([b.detach().reshape(-1).float() for b in self.bn_buffers])
            replies = self._exchange(ctx.step, pushes)
            for shard, reply in zip(self.shards, replies):
                self._apply_reply(shard, reply)

    def _exchange(self, step: int, pushes: list[wire.Message]) -> list[wire.Message]:
        server = self.shards[0].server
        self.in_flight = True
        try:
            with self.comm.timed():
                issued, pending = now(), []
                for shard, push in zip(self.shards, pushes):
                    server = shard.server
                    pending.append(self.channels[server].post(push))
                for shard, push, works in zip(self.shards, pushes, pending):
                    server = shard.server
                    for work in works:
                        work.wait()
                    self.comm.record(wire.push_op(push.nbytes, shard.server, True), issued, now())
                replies = []
                for shard in self.shards:
                    server, issued = shard.server, now()
                    replies.append(self.channels[server].recv(shard.numel))
                    self.comm.record(wire.pull_op(replies[-1].nbytes, shard.server, True), issued, now())
        except RuntimeError as err:
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise ParameterServerLost(f"worker rank {self.ctx.rank}: parameter server rank {server} stopped "
                                      f"answering at step {step} ({first})") from err
        self.in_flight = False
        self.comm.add(syncs=1)
        self.pushes += 1
        self.version = replies[0].version
        self.staleness = max(r.staleness for r in replies)
        self.staleness_sum += self.staleness
        self.staleness_max = max(self.staleness_max, self.staleness)
        return replies

    def _apply_reply(self, shard: Shard, reply: wire.Message) -> None:
        mine = shard.of(self.flat)
        if reply.kind == wire.Kind.MODEL:
            mine.copy_(reply.values)
        elif reply.kind == wire.Kind.SPARSE:
            mine.index_add_(0, reply.indices.long(), reply.values.to(mine.dtype))
        else:
            raise wire.ProtocolError(f"server rank {shard.server} replied with a {reply.kind.name} message")

    def _say_bye(self) -> None:
        if self.bye_sent or self.in_flight or self.role() != Role.WORKER:
            return
        self.bye_sent = True
        for shard in self.shards:
            self.channels[shard.server].send(wire.Message(wire.Kind.BYE))

    # ---- evaluation, end ----------------------------------------------------------------------
    def eval_model(self, model: nn.Module) -> Optional[nn.Module]:
        """The global model (on the serving ranks): each server's shard, the mean BN statistics."""
        if self.server is None:
            return None
        state = self.server.state
        with self.server.lock:
            state.shard.of(self.flat).copy_(state.global_model)
            stats = state.mean_buffers()
        if self.bn_buffers:
            own = torch.cat([b.detach().reshape(-1).float() for b in self.bn_buffers])
            stats = own if stats is None else stats.to(own.device)
        if self.server_group is not None:
            for shard in self.shards:
                dist.broadcast(shard.of(self.flat), src=shard.server, group=self.server_group)
            if stats is not None:
                dist.broadcast(stats, src=self.server_ranks()[0], group=self.server_group)
        if stats is not None:
            offset = 0
            for buf in self.bn_buffers:
                buf.copy_(stats[offset:offset + buf.numel()].view_as(buf))
                offset += buf.numel()
        return model

    def finalize(self, model: nn.Module) -> None:
        if self.server is not None:
            self.server.join()
            stats = self.server.state.worker_stats()
            log.info("parameter server rank %d: %d versions, %d resyncs; staleness mean/max per worker: %s",
                     self.ctx.rank, self.server.state.version, self.server.state.resyncs,
                     ", ".join(f"rank {r['rank']} {r['staleness_mean']:.2f}/{r['staleness_max']}" for r in stats))
            if self.server.dropped:
                names = ", ".join(f"rank {w} ({why})" for w, why in sorted(self.server.dropped.items()))
                log.warning("parameter server rank %d finished without worker(s) %s", self.ctx.rank, names)
        else:
            self._say_bye()

    def close(self) -> None:
        if getattr(self, "server", None) is not None:
            self.server.stop(timeout=min(self.ctx.timeout_s, 10.0))
        elif hasattr(self, "channels"):
            try:
                self._say_bye()
            except RuntimeError:
                pass  # the server is gone already; nothing to tell it

    # ---- state --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        if self.server is not None:
            with self.server.lock:
                return {"server": self.server.state.state_dict()}
        return {"worker": {"pushes": self.pushes, "version": self.version, "staleness": self.staleness,
                           "staleness_sum": self.staleness_sum, "staleness_max": self.staleness_max,
                           **self.worker_state()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.server is not None:
            if "server" not in state:
                raise UserError("the checkpoint holds a worker's state for a serving rank; resume=null starts fresh")
            with self.server.lock:
                self.server.state.load_state_dict(state["server"])
            self.server.start()
            return
        mine = state["worker"]
        for key in ("pushes", "version", "staleness", "staleness_sum", "staleness_max"):
            setattr(self, key, int(mine[key]))
        self.load_worker_state(mine)

    # ---- reporting ----------------------------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        if self.server is not None:
            return {"version": self.server.state.version}
        out = {"version": self.version, "staleness": self.staleness,
               "staleness_mean": self.staleness_sum / max(self.pushes, 1), "staleness_max": self.staleness_max}
        if self.scheduled_density:
            out["density"] = self.density
        return out

    def plot_keys(self) -> list[str]:
        return ["staleness", "density"] if self.scheduled_density else ["staleness"]

    def summary(self) -> dict[str, Any]:
        if self.server is not None:
            with self.server.lock:
                state = self.server.state
                return {"role": "server", "rank": self.ctx.rank, "version": state.version, "resyncs": state.resyncs,
                        "workers": state.worker_stats(),
                        "dropped": {str(w): why for w, why in self.server.dropped.items()}}
        return {"role": "worker", "rank": self.ctx.rank, "pushes": self.pushes,
                "staleness_mean": self.staleness_sum / max(self.pushes, 1), "staleness_max": self.staleness_max}

    @classmethod
    def merge_summaries(cls, per_rank: list[dict[str, Any]]) -> dict[str, Any]:
        """Versions, resyncs and per-worker staleness and bytes, from the servers' records."""
        servers = [s for s in per_rank if s.get("role") == "server"]
        if not servers:
            return {}
        per_worker: dict[str, dict[str, Any]] = {}
        for srv in servers:
            for rec in srv["workers"]:
                agg = per_worker.setdefault(str(rec["rank"]), {"pushes": 0, "staleness_sum": 0.0, "staleness_max": 0,
                                                               "bytes_in": 0, "bytes_out": 0})
                agg["pushes"] = max(agg["pushes"], rec["pushes"])
                agg["staleness_sum"] += rec["staleness_mean"] * rec["pushes"] / len(servers)
                agg["staleness_max"] = max(agg["staleness_max"], rec["staleness_max"])
                agg["bytes_in"] += rec["bytes_in"]
                agg["bytes_out"] += rec["bytes_out"]
        total_pushes = sum(a["pushes"] for a in per_worker.values())
        for agg in per_worker.values():
            agg["staleness_mean"] = agg.pop("staleness_sum") / max(agg["pushes"], 1)
        dropped = {w: why for srv in servers for w, why in srv["dropped"].items()}
        bytes_total = sum(a["bytes_in"] + a["bytes_out"] for a in per_worker.values())
        return {"server_versions": [s["version"] for s in servers], "resyncs": sum(s["resyncs"] for s in servers),
                "staleness_mean": sum(a["staleness_mean"] * a["pushes"] for a in per_worker.values())
                / max(total_pushes, 1),
                "staleness_max": max((a["staleness_max"] for a in per_worker.values()), default=0),
                "bytes_per_update": bytes_total / max(sum(s["version"] for s in servers), 1),
                "per_worker": per_worker, "dropped_workers": dropped}
