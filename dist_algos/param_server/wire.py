"""The parameter server's wire format and point-to-point channels.

One message is a fixed header followed by its payload tensors, all sent with torch.distributed
point-to-point calls on a group that holds just the two ends (a server and a worker):

    header   int64[8]: kind, step, count, value dtype code, version, staleness, buffer count,
                       density (a sparse push's per-layer density, in parts per billion)
    indices  int32[count]                      (SPARSE only; positions inside the server's shard)
    values   float32 or float16 [count]        (SPARSE, DENSE, MODEL)
    buffers  float32[buffer count]             (a push's BatchNorm statistics, when it carries them)

Both ends know the shard's layout, so `count` alone fixes every shape. The header travels on a
gloo group (CPU) and the payload on the data group (the run's backend, tensors on the run's
device; through a host copy where a shared GPU makes that backend gloo, `dist_algos.comm.p2p`): with NCCL the receiver then posts the payload receives only once the header says they are
on their way, so no NCCL operation ever waits for a slow peer (NCCL's watchdog would abort it),
while the gloo header receive may wait as long as a server idles between pushes. On a CPU run
both are the same gloo group.

Bytes are counted as they go on the wire, header included, so that the comparison between dense
and sparse exchanges is honest.
"""
from __future__ import annotations

import datetime
import enum
from dataclasses import dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist

from dist_algos.comm import p2p
from dist_algos.comm.pattern import CommOp, OpKind, server, worker

HEADER_LEN = 8
HEADER_BYTES = HEADER_LEN * 8
PPB = 10**9
#: How long a server waits for a worker's next push: a live worker may be slow (data loading,
#: an evaluation on the server); a dead one shows as a closed connection at once.
IDLE_WAIT = datetime.timedelta(days=30)

VALUE_DTYPES = {"float32": torch.float32, "float16": torch.float16}
_DTYPE_CODES = {torch.float32: 0, torch.float16: 1}
_CODE_DTYPES = {code: dtype for dtype, code in _DTYPE_CODES.items()}


def serving_thread(worker_rank: int) -> str:
    """The name of the server's thread that serves this worker (the time ledger's `thread`)."""
    return f"serve:{worker_rank}"


def push_op(nbytes: int, peer: int, at_worker: bool, data_dependent: bool = False) -> CommOp:
    """A push of `nbytes`, header included, as the worker sends it to server `peer` (blocking:
    its step waits for the reply) or as the server receives it from worker `peer` (on the thread
    serving that worker)."""
    if at_worker:
        return CommOp(OpKind.PUSH, server(peer), 2, nbytes, nbytes, data_dependent=data_dependent)
    return CommOp(OpKind.PUSH, worker(peer), 2, nbytes, 0, False, serving_thread(peer), recv_bytes=nbytes,
                  data_dependent=data_dependent)


def pull_op(nbytes: int, peer: int, at_worker: bool, data_dependent: bool = False) -> CommOp:
    """A reply of `nbytes`, header included, as the worker receives it from server `peer` or as
    the server sends it to worker `peer`."""
    if at_worker:
        return CommOp(OpKind.PULL, server(peer), 2, nbytes, 0, recv_bytes=nbytes, data_dependent=data_dependent)
    return CommOp(OpKind.PULL, worker(peer), 2, nbytes, nbytes, False, serving_thread(peer),
                  data_dependent=data_dependent)


class Kind(enum.IntEnum):
    DENSE = 1  # values for every entry of the shard (an update)
    SPARSE = 2  # (index, value) pairs (an update, or a DGS reply to add to the model)
    MODEL = 3  # the shard's model itself (dense reply: replaces the worker's copy)
    BYE = 4  # the worker has finished; no payload


@dataclass
class Message:
    kind: Kind
    step: int = 0  # the worker's step (pushes)
    values: Optional[torch.Tensor] = None
    indices: Optional[torch.Tensor] = None  # int32, SPARSE only
    buffers: Optional[torch.Tensor] = None  # float32 BatchNorm statistics (pushes to the first server)
    version: int = 0  # the server's version after applying the push (replies)
    staleness: int = 0  # server updates applied between the worker's last reply and this push (replies)
    density: float = 0.0  # the per-layer density a sparse push was selected with (0: not sparse)

    @property
    def count(self) -> int:
        return 0 if self.values is None else self.values.numel()

    @property
    def nbytes(self) -> int:
        """Bytes this message puts on the wire, header included."""
        total = HEADER_BYTES
        for t in (self.values, self.indices, self.buffers):
            if t is not None:
                total += t.numel() * t.element_size()
        return total

    def header(self) -> torch.Tensor:
        code = _DTYPE_CODES[self.values.dtype] if self.values is not None else 0
        nbuf = 0 if self.buffers is None else self.buffers.numel()
        return torch.tensor([int(self.kind), self.step, self.count, code, self.version, self.staleness, nbuf,
                             round(self.density * PPB)], dtype=torch.int64)


def sparse(indices: torch.Tensor, values: torch.Tensor, value_dtype: torch.dtype, step: int = 0,
           density: float = 0.0) -> Message:
    """A SPARSE message: int32 positions and values rounded to the wire's value dtype."""
    return Message(Kind.SPARSE, step=step, indices=indices.to(torch.int32), values=values.to(value_dtype),
                   density=density)


def dense(values: torch.Tensor, value_dtype: torch.dtype, step: int = 0) -> Message:
    return Message(Kind.DENSE, step=step, values=values.to(value_dtype))


class ProtocolError(RuntimeError):
    """A message that does not fit the shard it is meant for."""


class Channel:
    """One end of a server-worker pair: sends and receives whole messages.

    Used by exactly one thread at a time on each end (the worker's main thread; the server's
    thread for that worker), so the two groups see one ordered stream of operations.
    """

    def __init__(self, peer: int, control_group: Any, data_group: Any, device: torch.device) -> None:
        self.peer = peer
        self.control_group = control_group
        self.data_group = data_group
        self.device = device

    def post(self, msg: Message) -> list[Any]:
        """Start sending `msg`; returns the pending works (keep `msg` alive until they finish)."""
        works = [dist.isend(msg.header(), dst=self.peer, group=self.control_group)]
        for t in (msg.indices, msg.values, msg.buffers):
            if t is not None and t.numel():
                works.append(p2p.isend(t.contiguous(), dst=self.peer, group=self.data_group))
        return works

    def send(self, msg: Message) -> None:
        for work in self.post(msg):
            work.wait()

    def recv(self, shard_numel: int, timeout: Optional[datetime.timedelta] = None) -> Message:
        """Receive one message; `timeout` bounds the wait for its header (None: the group's)."""
        header = torch.zeros(HEADER_LEN, dtype=torch.int64)
        work = dist.irecv(header, src=self.peer, group=self.control_group)
        if timeout is None:
            work.wait()
        else:
            work.wait(timeout=timeout)
        kind_code, step, count, code, version, staleness, nbuf, density_ppb = header.tolist()
        try:
            kind = Kind(kind_code)
        except ValueError:
            raise ProtocolError(f"unknown message kind {kind_code} from rank {self.peer}") from None
        msg = Message(kind, step=step, version=version, staleness=staleness, density=density_ppb / PPB)
        if kind == Kind.BYE:
            return msg
        if code not in _CODE_DTYPES or count < 0 or count > shard_numel or \
                (kind != Kind.SPARSE and count != shard_numel):
            raise ProtocolError(f"rank {self.peer} sent a {kind.name} message of {count} values (dtype code {code}) "
                                f"for a shard of {shard_numel}")
        if kind == Kind.SPARSE:
            msg.indices = self._recv_tensor(count, torch.int32)
        msg.values = self._recv_tensor(count, _CODE_DTYPES[code])
        if nbuf:
            msg.buffers = self._recv_tensor(nbuf, torch.float32)
        return msg

    def _recv_tensor(self, count: int, dtype: torch.dtype) -> torch.Tensor:
        t = torch.empty(count, dtype=dtype, device=self.device)
        if count:  # empty tensors are not sent (a reply with nothing left to send)
            p2p.recv(t, src=self.peer, group=self.data_group)
        return t
