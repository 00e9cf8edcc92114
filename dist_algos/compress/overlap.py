"""Compressed exchanges overlapped with backward, bucket by bucket (`algo=compressed
algo.overlap=true`): DDP's bucket order and sizes (`dist_algos.comm.grad_buckets`), but a full bucket
is handed to a communication thread that compresses it (its own chain state and error-feedback
memory per bucket), runs its collectives and writes the combined result back into the bucket,
while backward goes on producing the earlier layers' gradients. One thread, buckets submitted in
bucket order on every rank: the ranks issue their collectives in the same order, as DDP's hooks.

Every combine kind overlaps (the collectives run on the thread, so a gathered payload needs no
async all_gather). Per-layer compressors (topk, sign, terngrad, int8 blocks within a layer)
with deterministic selection give the same result as the whole-gradient exchange (tested); rules
over the whole vector (topk_global, QSGD's buckets, random-k positions) see one bucket at a time
instead, and random draws (stochastic rounding) come from each bucket's own stream."""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Optional

import torch

from dist_algos.comm.accounting import CommStats, HeldOps
from dist_algos.compress.communicator import Communicator
from dist_algos.comm.grad_buckets import Bucket, OverlappedAverage

THREAD = "compressed-buckets"  # the communication thread's name (the time ledger's `thread`)


class OverlappedExchange(OverlappedAverage):
    """`OverlappedAverage` whose buckets go through a `Communicator` each, on a thread."""

    def __init__(self, params: list[torch.nn.Parameter], group_size: int,
                 make_communicator: Callable[[list[int], list[tuple[int, ...]]], Communicator],
                 bucket_bytes: int, first_bucket_bytes: int, stats: Optional[CommStats] = None) -> None:
        super().__init__(params, group_size, None, bucket_bytes=bucket_bytes, first_bucket_bytes=first_bucket_bytes,
                         stats=stats)
        self.comms: list[Communicator] = []
        for bucket in self.buckets:
            members = sorted(bucket.params, key=lambda i: self._offset(i))  # flat (model) order
            self.comms.append(make_communicator([self.params[i].numel() for i in members],
                                                [tuple(self.params[i].shape) for i in members]))
        self.index = {id(b): n for n, b in enumerate(self.buckets)}
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=THREAD)
        self.futures: list[Future] = []
        self.exchanges = 0  # the step number handed to the chains (checkpointed)
        self.bytes_sent = 0

    def _offset(self, i: int) -> int:
        grad = self.params[i].grad
        assert grad is not None
        return grad.data_ptr()

    def _launch(self, bucket: Bucket) -> None:
        index = self.index[id(bucket)]
        comm, step = self.comms[index], self.exchanges

        def run() -> HeldOps:
            held = HeldOps()  # counted in `wait`, on the training thread, in bucket order
            combined, _ = comm.exchange(bucket.view, step, held, thread=THREAD, bucket=index)
            bucket.view.copy_(combined.view_as(bucket.view))
            return held

        self.futures.append(self.pool.submit(run))
        self.next += 1

    def wait(self) -> None:
        """Launch what backward did not, wait for every bucket: the gradients are then the combined
        ones, their collectives counted (`stats`)."""
        self._check_views()
        while self.next < len(self.buckets):
            self._launch(self.buckets[self.next])
        held = [f.result() for f in self.futures]
        self.bytes_sent = sum(h.wire_bytes for h in held)
        for h in held:
            h.replay(self.stats)
        self.futures = []
        self.exchanges += 1
        self._reset()

    def state_dict(self) -> dict[str, Any]:
        return {"exchanges": self.exchanges, "memory": [c.state_dict() for c in self.comms]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.exchanges = int(state["exchanges"])
        for comm, mem in zip(self.comms, state["memory"]):
            comm.load_state_dict(mem)

    def close(self) -> None:
        super().close()
        self.pool.shutdown(wait=True)

