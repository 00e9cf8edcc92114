"""DiLoCo's outer gradient as a composition (issue 22 (2)): compression with error feedback
(SparseLoCo, Sarfi et al. 2025: top-k, 2-bit values, decayed error feedback; Streaming DiLoCo,
Douillard et al. 2025: low-precision outer gradients), and Streaming DiLoCo's overlap and mixing.

Per fragment f at its synchronisation: the outer gradient global - local of its parameters goes
through the chain (`Communicator`, memory per fragment and worker); DiLoCo's outer optimizer moves
the global model by the combined outer gradient. The new global values then land on the worker
`overlap_steps` = tau inner steps later (the paper's overlap: communication runs while the next
tau inner steps do; here the exchange itself is synchronous, what tau changes is when its result
is used, which is the algorithm's effect), merged as local = alpha local + (1 - alpha) global
(`mixing` = alpha; 0 replaces the local values). A fragment's update must land before its next
synchronisation: tau < inner_steps."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional

import torch
import torch.nn as nn

from core.errors import UserError
from dist_algos.comm import allreduce_bytes
from dist_algos.compress import build_chain, check_chain
from dist_algos.compress.communicator import Communicator
from dist_algos.flat import FlatBuffer, average_

Span = tuple[int, int, int]


def check_outer_options(cfg: Any) -> None:
    check_chain(cfg.outer_compress, cfg.outer_feedback, "algo.outer_compress", "algo.outer_feedback")
    if cfg.overlap_steps >= cfg.inner_steps:
        raise UserError(f"algo.overlap_steps={cfg.overlap_steps} must be below algo.inner_steps={cfg.inner_steps} "
                        "(a fragment's update lands before its next synchronisation)")
    if build_chain(cfg.outer_compress) is None and cfg.outer_feedback != "none":
        raise UserError(f"algo.outer_feedback={cfg.outer_feedback} needs a chain in algo.outer_compress")


class OuterExchange:
    def __init__(self, comms: list[Optional[Communicator]], spans: list[list[Span]], world: int, tau: int,
                 alpha: float) -> None:
        self.comms, self.spans, self.world, self.tau, self.alpha = comms, spans, world, tau, alpha
        self.flight: list[dict[str, Any]] = []  # updates sent, not yet landed: fragment, due, values

    @classmethod
    def build(cls, cfg: Any, fragment_params: Sequence[list[nn.Parameter]], spans: list[list[Span]], world: int,
              rank: int) -> Optional["OuterExchange"]:
        if build_chain(cfg.outer_compress) is None and cfg.overlap_steps == 0 and cfg.mixing == 0:
            return None
        comms: list[Optional[Communicator]] = []
        for params in fragment_params:
            chain = build_chain(cfg.outer_compress)
            comms.append(None if chain is None else Communicator(
                chain, cfg.outer_feedback, world, rank, [p.numel() for p in params],
                shapes=[tuple(p.shape) for p in params]))
        return cls(comms, spans, world, cfg.overlap_steps, cfg.mixing)

    def exchange(self, f: int, flat: FlatBuffer, global_model: list[torch.Tensor], step: int) -> tuple[torch.Tensor, int]:
        """(combined outer gradient of fragment f, bytes this rank sent)."""
        delta = torch.cat([(global_model[i][lo:hi] - flat.buffers[i][lo:hi]).float() for i, lo, hi in self.spans[f]])
        comm = self.comms[f]
        if comm is not None:
            return comm.exchange(delta, step)
        if self.world > 1:
            average_([delta], None, self.world)
        return delta, allreduce_bytes(delta.numel() * delta.element_size(), self.world)

    def schedule(self, f: int, flat: FlatBuffer, global_model: list[torch.Tensor], steps_done: int) -> None:
        values = torch.cat([global_model[i][lo:hi].clone() for i, lo, hi in self.spans[f]])
        self.flight.append({"fragment": f, "due": steps_done + self.tau, "values": values})

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

    def state_dict(self) -> dict[str, Any]:
        return {"memory": [c.state_dict() if c is not None else {} for c in self.comms],
                "in_flight": [{"fragment": x["fragment"], "due": x["due"], "values": x["values"].clone()}
                              for x in self.flight]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for comm, mem in zip(self.comms, state["memory"]):
            if comm is not None:
                comm.load_state_dict(mem)
        self.flight = [{"fragment": int(x["fragment"]), "due": int(x["due"]), "values": x["values"].clone()}
                       for x in state["in_flight"]]
