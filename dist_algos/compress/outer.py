"""DiLoCo's outer gradient as a composition (issue 22 (2)): compression with error feedback
(SparseLoCo, Sarfi et al. 2025: top-k, 2-bit values, decayed error feedback; Streaming DiLoCo,
Douillard et al. 2025: low-precision outer gradients), and Streaming DiLoCo's overlap and mixing.

Per fragment f at its synchronisation: the outer gradient global - local of its parameters goes
through the chain (`Communicator`, memory per fragment and worker); DiLoCo's outer optimizer moves
the global model by the combined outer gradient. The new global values then land on the worker
`overlap_steps` = tau inner steps later, merged as local = alpha local + (1 - alpha) global
(`mixing` = alpha; 0 replaces the local values). A fragment's update must land before its next
synchronisation: tau < inner_steps.

With tau > 0 and several workers the exchange runs while those tau inner steps do, as in the
paper: at the synchronisation the outer gradient is taken (global - local, on the training
thread) and handed to a communication thread whose collectives go over a process group of their
own (so they never interleave with the trainer's); the outer optimizer step and the landing
happen when the update is due, after waiting for the thread. Fragment f's global values, outer
momentum and error-feedback memory are touched by nothing else in between (fragments are
disjoint, and tau < inner_steps keeps one exchange per fragment in flight), so the numbers are
those of the synchronous order: only the time the trainer waits changes. A checkpoint waits for
what is in flight and saves the state the synchronous order has at that step."""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, ContextManager, Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from core.errors import UserError
from dist_algos.comm.accounting import CommStats, HeldOps, allreduce_op, now
from dist_algos.comm.pattern import MAIN, CommOp
from dist_algos.compress import build_chain, check_chain
from dist_algos.compress.communicator import Communicator, exchange_ops
from dist_algos.comm.flat import FlatBuffer, average_

Span = tuple[int, int, int]
THREAD = "streaming-diloco"  # the communication thread's name (the time ledger's `thread`)


def check_outer_options(cfg: Any) -> None:
    check_chain(cfg.outer_compress, cfg.outer_feedback, "algo.outer_compress", "algo.outer_feedback")
    if cfg.overlap_steps >= cfg.inner_steps:
        raise UserError(f"algo.overlap_steps={cfg.overlap_steps} must be below algo.inner_steps={cfg.inner_steps} "
                        "(a fragment's update lands before its next synchronisation)")
    if build_chain(cfg.outer_compress) is None and cfg.outer_feedback != "none":
        raise UserError(f"algo.outer_feedback={cfg.outer_feedback} needs a chain in algo.outer_compress")


#: apply(fragment, combined outer gradient, its collectives held for counting): DiLoCo's outer
#: step on that fragment, after an overlapped exchange
OuterStep = Callable[[int, torch.Tensor, HeldOps], None]


def outer_ops(compress: Any, sizes: Sequence[int], shapes: Sequence[tuple[int, ...]], world: int,
              overlapped: bool) -> list[CommOp]:
    """What one fragment's exchange records (the declared side): the chain's collectives, or one
    all_reduce of its float32 outer gradient; on the communication thread when overlapped."""
    thread = THREAD if overlapped else MAIN
    chain = build_chain(compress)
    if chain is not None:
        return [_on(op, thread) for op in exchange_ops(chain, sizes, shapes, world, thread=thread)]
    return [] if world <= 1 else [allreduce_op(4 * sum(sizes), world, thread=thread, blocking=not overlapped)]


def _on(op: CommOp, thread: str) -> CommOp:
    """`op` as made on `thread` (one the training thread does not wait for, off the main thread)."""
    return dataclasses.replace(op, thread=thread, blocking=thread == MAIN)


class OuterExchange:
    """Fragment f's exchange, outer step and landing, over DiLoCo's `global_model` (its outer
    parameters); `outer_step` is DiLoCo's outer optimizer step on a fragment, `timed` the timer
    of the time the trainer waits for an overlapped exchange."""

    def __init__(self, comms: list[Optional[Communicator]], spans: list[list[Span]], world: int, tau: int,
                 alpha: float, global_model: list[torch.Tensor], outer_step: OuterStep,
                 timed: Callable[[], ContextManager[Any]] = contextlib.nullcontext,
                 group: Optional[dist.ProcessGroup] = None) -> None:
        self.comms, self.spans, self.world, self.tau, self.alpha = comms, spans, world, tau, alpha
        self.global_model, self.outer_step, self.timed = global_model, outer_step, timed
        # updates sent, not yet landed: fragment, due, and its global values once its outer step
        # ran (until then, on the overlapped path, the exchange's future)
        self.flight: list[dict[str, Any]] = []
        self.group = group  # the communication thread's own process group (overlapped path only)
        self.pool: Optional[ThreadPoolExecutor] = None

    @property
    def overlapped(self) -> bool:
        """The exchange runs during the tau inner steps (tau > 0 and several workers)."""
        return self.group is not None

    @classmethod
    def build(cls, cfg: Any, fragment_params: Sequence[list[nn.Parameter]], spans: list[list[Span]], world: int,
              rank: int, global_model: list[torch.Tensor], outer_step: OuterStep,
              timed: Callable[[], ContextManager[Any]]) -> Optional["OuterExchange"]:
        if build_chain(cfg.outer_compress) is None and cfg.overlap_steps == 0 and cfg.mixing == 0:
            return None
        comms: list[Optional[Communicator]] = []
        for params in fragment_params:
            chain = build_chain(cfg.outer_compress)
            comms.append(None if chain is None else Communicator(
                chain, cfg.outer_feedback, world, rank, [p.numel() for p in params],
                shapes=[tuple(p.shape) for p in params]))
        group = None
        if cfg.overlap_steps > 0 and world > 1:  # (a collective: every rank builds it at set-up)
            group = dist.new_group(list(range(world)))
            for comm in comms:
                if comm is not None:
                    comm.group = group
        return cls(comms, spans, world, cfg.overlap_steps, cfg.mixing, global_model, outer_step, timed, group)

    def _delta(self, f: int, flat: FlatBuffer) -> torch.Tensor:
        """Fragment f's outer gradient: global - local."""
        return torch.cat([(self.global_model[i][lo:hi] - flat.buffers[i][lo:hi]).float() for i, lo, hi in self.spans[f]])

    def _values(self, f: int) -> torch.Tensor:
        """Fragment f's global values (a copy: what lands on the workers when it is due)."""
        return torch.cat([self.global_model[i][lo:hi].clone() for i, lo, hi in self.spans[f]])

    def _combine(self, f: int, delta: torch.Tensor, step: int) -> tuple[torch.Tensor, HeldOps]:
        """(combined outer gradient, its collectives held for counting): on the communication
        thread when overlapped, else on the training thread."""
        # (an overlapped exchange belongs to the step that launched it, counted when it lands)
        thread, held = (THREAD, HeldOps(step)) if self.overlapped else (MAIN, HeldOps())
        comm = self.comms[f]
        if comm is not None:
            mine = HeldOps()
            combined, _ = comm.exchange(delta, step, mine, thread=thread)
            for op, issued, completed, _ in mine.ops:
                held.record(_on(op, thread), issued, completed)
            return combined, held
        issued = now()
        if self.world > 1:
            average_([delta], self.group, self.world)
        held.record(allreduce_op(delta.numel() * delta.element_size(), self.world, thread=thread,
                                 blocking=thread == MAIN), issued, now())
        return delta, held

    def exchange(self, f: int, flat: FlatBuffer, step: int, sink: CommStats) -> torch.Tensor:
        """The combined outer gradient of fragment f, now; its collectives counted in `sink`."""
        combined, held = self._combine(f, self._delta(f, flat), step)
        held.replay(sink)
        return combined

    def launch(self, f: int, flat: FlatBuffer, step: int, steps_done: int) -> None:
        """The overlapped path: fragment f's outer gradient is taken now and exchanged on the
        communication thread; its outer step, landing and counting wait until it is due."""
        if self.pool is None:
            self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=THREAD)
        future: Future = self.pool.submit(self._combine, f, self._delta(f, flat), step)
        self.flight.append({"fragment": f, "due": steps_done + self.tau, "future": future})

    def _resolve(self, item: dict[str, Any]) -> None:
        """Wait for an overlapped exchange, run its outer step, keep the values that will land."""
        future = item.pop("future", None)
        if future is None:
            return
        with self.timed():
            combined, held = future.result()
        self.outer_step(item["fragment"], combined, held)
        item["values"] = self._values(item["fragment"])

    def close(self) -> None:
        """Stop the thread; on an error path an exchange whose peer died is not waited for."""
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None

    def schedule(self, f: int, steps_done: int) -> None:
        """The synchronous path: fragment f's new global values land `tau` steps after `steps_done`."""
        self.flight.append({"fragment": f, "due": steps_done + self.tau, "values": self._values(f)})

    def land_due(self, flat: FlatBuffer, steps_done: Optional[int]) -> None:
        """Merge every update due by `steps_done` into the workers' parameters; None: the end of
        training, where everything lands and replaces the local values (no mixing), so the final
        model is the global model on every worker."""
        alpha = self.alpha if steps_done is not None else 0.0
        keep = []
        for item in self.flight:
            if steps_done is not None and item["due"] > steps_done:
                keep.append(item)
                continue
            self._resolve(item)
            at = 0
            for i, lo, hi in self.spans[item["fragment"]]:
                new = item["values"][at:at + hi - lo].to(flat.buffers[i].dtype)
                local = flat.buffers[i][lo:hi]
                if alpha == 0:
                    local.copy_(new)
                else:
                    local.mul_(alpha).add_(new, alpha=1 - alpha)
                at += hi - lo
        self.flight = keep

    def in_flight(self) -> bool:
        return bool(self.flight)

    def resolve_all(self) -> None:
        """Wait for every exchange in flight and run its outer step: the global model is then what
        the synchronous order has at this step (for an evaluation or a checkpoint)."""
        for item in self.flight:
            self._resolve(item)

    def state_dict(self) -> dict[str, Any]:
        self.resolve_all()
        return {"memory": [c.state_dict() if c is not None else {} for c in self.comms],
                "in_flight": [{"fragment": x["fragment"], "due": x["due"], "values": x["values"].clone()}
                              for x in self.flight]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for comm, mem in zip(self.comms, state["memory"]):
            if comm is not None:
                comm.load_state_dict(mem)
        self.flight = [{"fragment": int(x["fragment"]), "due": int(x["due"]), "values": x["values"].clone()}
                       for x in state["in_flight"]]
