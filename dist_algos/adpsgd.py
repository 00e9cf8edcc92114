"""AD-PSGD: asynchronous decentralized parallel SGD (Lian, Zhang, Zhang, Liu; ICML 2018), a
WAGMA baseline.

Workers average their models in pairs, atomically and without a global clock, while they keep
computing. Deadlock-free pairing needs a bipartite graph: even ranks are *active* (they start
an exchange), odd ranks *passive* (they serve one exchange at a time); the partner at step t
is `dist_algos.schedules.groups.bipartite_partner` (a perfect matching per step, cycling over
every active/passive pair), as the authors' MPI baseline pairs even with odd ranks.

- `asynchronous=true` (default): a communication thread per rank on a gloo group of its own.
  The training thread never waits: each step it applies the averaging corrections received so
  far, publishes its model (a copy, under a lock) and takes its local step. The active rank's
  thread then exchanges the latest published model with its partner for that step (at most
  one exchange per own step, the newest when it fell behind); the passive rank's thread
  answers any active rank's request with its latest published model plus the corrections still
  pending, so that several requests between two of its steps are successive pairwise averages.
  Both add half the difference, (x_partner - x_sent) / 2, to a pending correction, so the local
  steps taken meanwhile are kept and every exchange conserves the sum of the two models exactly. Only
  trainable weights are exchanged. At the end each active rank sends STOP to every passive
  rank, which ends their threads without a pending receive.
- `asynchronous=false`: the same pairs synchronously, x = (x + x_partner) / 2 then the local
  step with the gradient taken before averaging (deterministic; the reference-equivalence and
  exact-resume tests use it).

Evaluation uses the average over all ranks (a copy); `finalize` applies what is pending and
makes that average every rank's model.

At 64 workers (docs/workers.md): 32 active and 32 passive ranks; each step is a perfect matching
between them, cycling over all 32 x 32 active-passive pairs, so a worker meets the same partner
every 32 steps and its model spreads as over a bipartite gossip graph. An odd world is refused
before launch in one line.
"""
from __future__ import annotations

import dataclasses
import datetime
import threading
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from dist_algos import register_algorithm
from dist_algos.comm import p2p
from dist_algos.comm.accounting import CommStats, now
from dist_algos.comm.pattern import MAIN, CommOp, OpKind, ParamLayout, PatternConfig, pair
from dist_algos.base import AlgoConfig, DistAlgorithm, HyperParams, Scenario, StepContext, TrainInfo
from dist_algos.consensus.average import average_model_, average_model_copy
from dist_algos.comm.flat import FlatBuffer
from dist_algos.schedules.groups import bipartite_partner
from core.distenv import DistContext
from core.errors import UserError

REQUEST, STOP = 0, 1
HEADER, MODEL_TO_PASSIVE, MODEL_TO_ACTIVE = 0, 1, 2  # message tags
IDLE_TIMEOUT = datetime.timedelta(days=7)  # a passive rank may wait long for the next request
THREAD = "adpsgd-comm"  # the communication thread's name (the time ledger's `thread`)


def pair_ops(nbytes: int, partner: int, active: bool, thread: str = MAIN) -> list[CommOp]:
    """One pairwise average's messages in issue order: the active rank sends its model, then
    receives its partner's; the passive rank the other way round (synchronous mode: both send
    first). On the thread, nothing the training thread waits for."""
    send = CommOp(OpKind.SEND, pair(partner), 2, nbytes, nbytes, thread == MAIN, thread)
    recv = CommOp(OpKind.RECV, pair(partner), 2, nbytes, 0, thread == MAIN, thread, recv_bytes=nbytes)
    return [send, recv] if active else [recv, send]


def record_exchange(comm: CommStats, nbytes: int, partner: int, active: bool, issued: float,
                    thread: str = MAIN) -> None:
    completed = now()
    for op in pair_ops(nbytes, partner, active, thread):
        comm.record(op, issued, completed)
    comm.add(syncs=1)


@dataclass
class AdpsgdConfig(AlgoConfig):
    name: str = "adpsgd"
    asynchronous: bool = True  # false: synchronous pairwise averages (deterministic)


class PairwiseAverager:
    """One rank's communication thread in asynchronous mode (see the module docstring)."""

    def __init__(self, buffers: list[torch.Tensor], rank: int, world: int, group: Any, algo: "Adpsgd") -> None:
        self.rank, self.world, self.group, self.algo = rank, world, group, algo
        self.active = rank % 2 == 0
        self._published = [b.detach().clone() for b in buffers]
        self._pending = [torch.zeros_like(b) for b in buffers]
        self._sent = [torch.empty_like(b) for b in buffers]
        self._received = [torch.empty_like(b) for b in buffers]
        self._cv = threading.Condition()
        self._version = -1
        self._served = -1  # the newest own step an exchange was made for (active ranks)
        self._stopping = False
        self.error: Optional[BaseException] = None
        self.exchanges = 0
        self._thread = threading.Thread(target=self._run_active if self.active else self._run_passive,
                                        name=THREAD, daemon=True)
        self._thread.start()

    def publish(self, step: int, buffers: list[torch.Tensor]) -> None:
        """Apply the corrections received so far, then publish the model (training thread)."""
        with self._cv:
            if self.error is not None:
                raise RuntimeError(f"AD-PSGD communication thread failed: {self.error!r}") from self.error
            for b, pending, pub in zip(buffers, self._pending, self._published):
                b.add_(pending)
                pending.zero_()
                pub.copy_(b)
            self._version = step
            self._cv.notify_all()

    def drain(self, buffers: list[torch.Tensor]) -> None:
        with self._cv:
            for b, pending in zip(buffers, self._pending):
                b.add_(pending)
                pending.zero_()

    def close(self, timeout_s: float) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        self._thread.join(timeout_s)

    def _snapshot(self) -> None:
        """x_sent := the model as this rank's exchanges so far have left it: the published model plus
        the corrections not yet applied. A passive rank may answer several active ranks between two
        of its own steps; each must meet the result of the one before, so that they are successive
        pairwise averages (the paper's atomic averaging). Answering each with the published model
        alone moved it by k/2 of the differences after k requests, beyond the average from k = 3 on:
        at 64 workers sharing two cores, NaN within 40 steps."""
        for s, p, pending in zip(self._sent, self._published, self._pending):
            torch.add(p, pending, out=s)

    def _correct(self) -> None:
        """pending += (x_partner - x_sent) / 2, under the lock."""
        with self._cv:
            for pending, received, sent in zip(self._pending, self._received, self._sent):
                pending.add_(received.sub_(sent).div_(2))
            self.exchanges += 1

    def _run_active(self) -> None:
        try:
            while True:
                with self._cv:
                    self._cv.wait_for(lambda: self._stopping or self._version > self._served)
                    if self._version <= self._served:
                        break
                    step = self._version
                    self._snapshot()
                partner = bipartite_partner(self.rank, self.world, step)
                issued = now()
                with self.algo.comm.timed():
                    dist.send(torch.tensor([REQUEST, step]), dst=partner, group=self.group, tag=HEADER)
                    works = [p2p.isend(s, dst=partner, group=self.group, tag=MODEL_TO_PASSIVE) for s in self._sent]
                    works += [p2p.irecv(r, src=partner, group=self.group, tag=MODEL_TO_ACTIVE) for r in self._received]
                    for w in works:
                        w.wait()
                record_exchange(self.algo.comm, self._nbytes(), partner, True, issued, THREAD)
                self._correct()
                self._served = step
        except BaseException as err:
            self.error = err
        finally:
            try:
                for passive in range(1, self.world, 2):
                    dist.send(torch.tensor([STOP, -1]), dst=passive, group=self.group, tag=HEADER)
            except Exception:  # the group is gone after an error elsewhere
                pass

    def _run_passive(self) -> None:
        header = torch.zeros(2, dtype=torch.int64)
        stops = 0
        try:
            while stops < (self.world + 1) // 2:
                src = dist.recv(header, src=None, group=self.group, tag=HEADER)
                if int(header[0]) == STOP:
                    stops += 1
                    continue
                issued = now()
                with self.algo.comm.timed():
                    works = [p2p.irecv(r, src=src, group=self.group, tag=MODEL_TO_PASSIVE) for r in self._received]
                    with self._cv:
                        self._snapshot()
                    works += [p2p.isend(s, dst=src, group=self.group, tag=MODEL_TO_ACTIVE) for s in self._sent]
                    for w in works:
                        w.wait()
                record_exchange(self.algo.comm, self._nbytes(), src, False, issued, THREAD)
                self._correct()
        except BaseException as err:
            self.error = err

    def _nbytes(self) -> int:
        return sum(s.numel() * s.element_size() for s in self._sent)


@register_algorithm("adpsgd")
class Adpsgd(DistAlgorithm):
    ft_refusal = "asynchronous gossip pairs fixed ranks, not an average over whoever is alive"
    Config = AdpsgdConfig
    test_world_size = 4
    deterministic_overrides = {"asynchronous": False}
    deterministic_reason = ("asynchronous pairwise averaging meets whatever model the partner has published "
                            "at that moment; the synchronous mode averages the same pairs deterministically")
    test_scenarios = {"pairs": Scenario()}
    reference = "tests.support.references:ADPSGD"
    invalid_options = {"launch.nproc=3": "needs an even number of workers"}

    cfg: AdpsgdConfig

    @classmethod
    def validate(cls, cfg: AdpsgdConfig, world_size: int, local_size: int,
                 hyper: HyperParams) -> None:
        if world_size > 1 and world_size % 2:
            raise UserError(f"adpsgd pairs even (active) with odd (passive) ranks and needs an even number "
                            f"of workers; got {world_size}: change launch.nproc")

    def __init__(self, cfg: AdpsgdConfig, ctx: DistContext) -> None:
        super().__init__(cfg, ctx)
        self.averager: Optional[PairwiseAverager] = None
        self.averages = 0

    def setup(self, model: nn.Module, optimizer: torch.optim.Optimizer, info: TrainInfo) -> None:
        super().setup(model, optimizer, info)
        self.weights = FlatBuffer([p for p in model.parameters() if p.requires_grad])
        self.received = [torch.empty_like(b) for b in self.weights]
        world = self.ctx.world_size
        if world > 1:
            if self.cfg.asynchronous:
                group = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
                self.averager = PairwiseAverager(list(self.weights), self.ctx.rank, world, group, self)
            else:
                self.group = self.ctx.new_group(list(range(world)))

    def step(self, ctx: StepContext) -> None:
        if self.averager is not None:
            self.averager.publish(ctx.step, list(self.weights))
        elif self.ctx.world_size > 1:
            self._average_with(bipartite_partner(self.ctx.rank, self.ctx.world_size, ctx.step))
        ctx.optimizer_step()

    def _average_with(self, partner: int) -> None:
        issued = now()
        with self.comm.timed():
            works = []
            for buf, recv in zip(self.weights, self.received):
                works += [p2p.isend(buf, dst=partner, group=self.group),
                          p2p.irecv(recv, src=partner, group=self.group)]
            for w in works:
                w.wait()
        record_exchange(self.comm, self.weights.nbytes, partner, True, issued)
        for buf, recv in zip(self.weights, self.received):
            buf.add_(recv).div_(2)
        self.averages += 1

    @classmethod
    def comm_pattern(cls, rank: int, step: int, world: int, config: PatternConfig,
                     layout: ParamLayout) -> list[CommOp]:
        """Every step the model to and from the step's bipartite partner (`pair_ops`).
        Asynchronous: on the communication thread, an active rank's exchange for this step is
        skipped when its thread fell behind (it serves the newest step only), and a passive rank
        answers whichever active rank asks next, so each is data-dependent; the request header
        (16 bytes) and STOP messages are not counted."""
        if world <= 1 or step >= config.total_steps:
            return []
        partner, nbytes = bipartite_partner(rank, world, step), layout.total_bytes
        if not config.algo.asynchronous:
            return pair_ops(nbytes, partner, True)
        return [dataclasses.replace(op, data_dependent=True) for op in pair_ops(nbytes, partner, rank % 2 == 0, THREAD)]

    def eval_model(self, model: nn.Module) -> nn.Module:
        return average_model_copy(model, self.ctx.world_size)

    def finalize(self, model: nn.Module) -> None:
        if self.averager is not None:
            self.averager.close(self.ctx.timeout_s)
            self.averager.drain(list(self.weights))
        average_model_(model, self.ctx.world_size)

    def close(self) -> None:
        if self.averager is not None:
            self.averager.close(self.ctx.timeout_s)

    def state_dict(self) -> dict[str, Any]:
        return {"averages": self.averages}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.averages = int(state["averages"])

    def metrics(self) -> dict[str, float]:
        exchanges = self.averager.exchanges if self.averager is not None else self.averages
        return {"pair_averages": exchanges}
