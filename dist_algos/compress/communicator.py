"""Memory + compressor + the collective that their combine kind calls for.

`Communicator.exchange(x, step)` is what a plugin calls on every worker alike: it returns the
combined vector (mean of the decoded payloads, the majority vote, or EF21's estimate) and the
bytes this rank put on the wire:
- summable payloads: one all_reduce (SUM) per payload tensor; 2 (K - 1) / K of their bytes;
- gathered payloads: first an all_gather of each tensor's length (int64, so payloads whose size
  depends on the data, as threshold's, can be padded to the longest), then one all_gather per
  tensor padded to that length, sent as its bytes; (K - 1) times the lengths' and the padded tensors' bytes.
`combine_payloads` is the same combination on a list of payloads, shared by the collective path
and `simulate`, the one-process K-worker reference the tests compare against.

Given a `sink` (the plugin's `CommStats`, or `HeldOps` for an exchange on a thread), each round
of collectives is recorded there as one operation (the time ledger's `CommOp`): the all_reduce
of the summable payload, or the all_gather of the lengths and then that of the padded tensors.
`exchange_ops` declares the same operations from the layout alone (the compressor's payload on
a probe vector; its largest, marked data-dependent, where the data decides the size).
"""
from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, Optional

import torch
import torch.distributed as dist

from dist_algos.comm.accounting import OpSink, allgather_op, allreduce_op, now
from dist_algos.comm.pattern import MAIN, CommOp
from dist_algos.compress.contract import Combine, Compressor, EncodeContext, Payload
from dist_algos.compress.memory import Memory

#: a probe's magnitude: above any sensible threshold, so a data-dependent sparsifier keeps its most
PROBE_SCALE = 1e4


def combine_payloads(compressor: Compressor, payloads: Sequence[Payload]) -> torch.Tensor:
    """The K workers' payloads combined as the compressor's kind says (mean, or vote)."""
    k = len(payloads)
    if compressor.combine == Combine.SUM:
        first = payloads[0]
        summed = {name: sum((p.tensors[name] for p in payloads[1:]), first.tensors[name].clone())
                  for name in first.tensors}
        return compressor.decode(Payload(summed, first.numel, first.info)).div_(k)  # type: ignore[arg-type]
    decoded = torch.stack([compressor.decode(p) for p in payloads]).sum(dim=0)
    return decoded.sign_() if compressor.combine == Combine.VOTE else decoded.div_(k)


class Communicator:
    """One worker's end of a compressed exchange over `group` (K = group_size workers)."""

    def __init__(self, compressor: Compressor, feedback: str, group_size: int, rank: int,
                 sizes: Sequence[int], seed: int = 0, group: Optional[dist.ProcessGroup] = None,
                 shapes: Optional[Sequence[tuple[int, ...]]] = None) -> None:
        self.compressor, self.memory = compressor, Memory(feedback)
        self.group, self.world, self.rank = group, group_size, rank
        self.sizes, self.seed, self.shapes = list(sizes), seed, shapes

    def exchange(self, x: torch.Tensor, step: int, sink: Optional[OpSink] = None, thread: str = MAIN,
                 bucket: Optional[int] = None) -> tuple[torch.Tensor, int]:
        """(combined vector, bytes sent by this rank); each round of collectives recorded in `sink`
        (made on `thread`, for overlapped `bucket`)."""
        prepared = self.memory.prepare(x)
        payload = self.compressor.encode(prepared, EncodeContext(self.sizes, step, self.rank, self.seed, self.shapes))
        self.memory.sent(prepared, self.compressor.decode(payload))
        if self.world <= 1:
            return self.memory.result(combine_payloads(self.compressor, [payload])), 0
        issued = now()
        if self.compressor.combine == Combine.SUM:
            summed = {}
            for name, t in payload.tensors.items():
                buf = t.clone()
                dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=self.group)
                summed[name] = buf
            op = allreduce_op(payload.wire_bytes, self.world, thread=thread, bucket=bucket)
            if sink is not None:
                sink.record(op, issued, now())
            mean = self.compressor.decode(Payload(summed, payload.numel, payload.info)).div_(self.world)
            return self.memory.result(mean), op.wire_bytes
        payloads, nbytes = self._gather(payload, sink, thread, bucket)
        return self.memory.result(combine_payloads(self.compressor, payloads)), nbytes

    def _gather(self, payload: Payload, sink: Optional[OpSink], thread: str,
                bucket: Optional[int]) -> tuple[list[Payload], int]:
        names = list(payload.tensors)
        lengths = torch.tensor([payload.tensors[n].numel() for n in names], dtype=torch.int64)
        all_lengths = [torch.empty_like(lengths) for _ in range(self.world)]
        issued = now()
        dist.all_gather(all_lengths, lengths, group=self.group)
        counted = allgather_op(lengths.numel() * lengths.element_size(), self.world, thread=thread, bucket=bucket)
        if sink is not None:
            sink.record(counted, issued, now())
        issued = now()
        longest = torch.stack(all_lengths).amax(dim=0)
        received: list[dict[str, torch.Tensor]] = [{} for _ in range(self.world)]
        sent = 0
        for i, name in enumerate(names):
            t = payload.tensors[name].reshape(-1)
            padded = torch.zeros(int(longest[i]), dtype=t.dtype)
            padded[:t.numel()] = t
            raw = padded.view(torch.uint8)  # as bytes: gloo has no int16 (nor float8) collectives
            bufs = [torch.empty_like(raw) for _ in range(self.world)]
            dist.all_gather(bufs, raw, group=self.group)
            sent += raw.numel()
            for r in range(self.world):
                received[r][name] = bufs[r].view(t.dtype)[:int(all_lengths[r][i])]
        op = allgather_op(sent, self.world, thread=thread, bucket=bucket)
        if sink is not None:
            sink.record(op, issued, now())
        payloads = [Payload(t, payload.numel, payload.info) for t in received]
        return payloads, counted.wire_bytes + op.wire_bytes

    def state_dict(self) -> dict[str, Any]:
        return self.memory.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.memory.load_state_dict(state)


_PROBED: dict[tuple[str, tuple[int, ...], tuple[tuple[int, ...], ...]], tuple[Combine, int, int, bool]] = {}


def _probe(compressor: Compressor, sizes: Sequence[int], shapes: Sequence[tuple[int, ...]]
           ) -> tuple[Combine, int, int, bool]:
    """(combine, payload bytes, payload tensors, size fixed) of the compressor's payload for this
    layout, from a probe vector (a fresh copy of the compressor encodes it: stages that keep state
    are not touched); remembered per spec and layout."""
    key = (compressor.spec(), tuple(sizes), tuple(tuple(s) for s in shapes))
    if key not in _PROBED:
        fresh = copy.deepcopy(compressor)
        g = torch.Generator().manual_seed(0)
        probe = torch.randn(sum(sizes), generator=g).sign_().mul_(PROBE_SCALE)
        payload = fresh.encode(probe, EncodeContext(list(sizes), 0, 0, 0, [tuple(s) for s in shapes]))
        _PROBED[key] = (fresh.combine, payload.wire_bytes, len(payload.tensors), fresh.fixed_size)
    return _PROBED[key]


def exchange_ops(compressor: Compressor, sizes: Sequence[int], shapes: Sequence[tuple[int, ...]], world: int,
                 thread: str = MAIN, bucket: Optional[int] = None) -> list[CommOp]:
    """What `Communicator.exchange` records for a vector of these layers on `world` workers: the
    declared side of the ledger (data-dependent where the compressor's size is)."""
    if world <= 1:
        return []
    combine, wire, tensors, fixed = _probe(compressor, sizes, shapes)
    if combine == Combine.SUM:
        return [allreduce_op(wire, world, thread=thread, bucket=bucket)]
    return [allgather_op(8 * tensors, world, thread=thread, bucket=bucket),
            allgather_op(wire, world, thread=thread, bucket=bucket, data_dependent=not fixed)]


def simulate(compressor: Compressor, memories: Sequence[Memory], xs: Sequence[torch.Tensor],
             sizes: Sequence[int], step: int, seed: int = 0,
             shapes: Optional[Sequence[tuple[int, ...]]] = None) -> list[torch.Tensor]:
    """One exchange of K workers in one process (worker r holds xs[r] and memories[r]): each
    worker's result, computed from the definitions without any collective."""
    prepared = [m.prepare(x) for m, x in zip(memories, xs)]
    payloads = [compressor.encode(p, EncodeContext(sizes, step, r, seed, shapes)) for r, p in enumerate(prepared)]
    for m, p, pay in zip(memories, prepared, payloads):
        m.sent(p, compressor.decode(pay))
    combined = combine_payloads(compressor, payloads)
    return [m.result(combined.clone()) for m in memories]
