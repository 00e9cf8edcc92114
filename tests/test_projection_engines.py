"""The two engines: the recurrence over ranks and the discrete events on SimGrid agree where both
apply (synchronous patterns), and the discrete events do what only they can (a server's incast
and service queue, a wait-avoiding group that does not wait for its slowest member).

Each discrete-event simulation runs SimGrid in a child process (about a second); where SimGrid is
not installed (apt-get install python3-simgrid, linked by scripts/setup_env.sh) those tests skip,
naming it."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pytest

from dist_algos.comm.pattern import CommOp, OpKind
from projection.cluster import Cluster, LinkClass
from projection.collectives import Library
from projection.engine import EVENTS, RECURRENCE, extrapolate, replay
from projection.events import simgrid_problem
from projection.network import Network
from projection.recurrence import Recurrence, Timeline
from projection.workload import Workload

needs_simgrid = pytest.mark.skipif(bool(simgrid_problem()), reason=simgrid_problem() or "")
W, STEPS = 8, 6


def cluster(per_node: int = 2) -> Cluster:
    return Cluster("t", "", Library.GLOO, per_node, LinkClass("intra_node", 2e-5, 2e9),
                   LinkClass("nic", 1e-4, 1.25e8))


def workload(ops: Callable[[int, int], Sequence[CommOp]], world: int = W, train: Sequence[int] = ()) -> Workload:
    return Workload(world, STEPS, tuple(train or range(world)),
                    lambda r, s: tuple(ops(r, s)) if s < STEPS else (), "test")


def compute(ranks: int, same: bool = False, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    rows = 1 if same else ranks
    before, after = rng.uniform(0.05, 0.1, (rows, STEPS)), rng.uniform(0.0, 0.01, (rows, STEPS))
    return np.tile(before, (ranks // rows, 1)), np.tile(after, (ranks // rows, 1))


SYNCHRONOUS = {
    # a world all-reduce after backward; ranks draw their own compute
    "world": (lambda r, s: [CommOp(OpKind.ALLREDUCE, "world", W, 1_000_000, 0)], False),
    # two buckets overlapped with backward, ready at half and at the end of it
    "buckets": (lambda r, s: [CommOp(OpKind.ALLREDUCE, "world", W, 1_000_000, 0, bucket=0),
                              CommOp(OpKind.ALLREDUCE, "world", W, 3_000_000, 0, bucket=1)], False),
    # groups of 4 whose flows share the nodes' links (alike compute: the groups run at once)
    "groups": (lambda r, s: [CommOp(OpKind.ALLREDUCE, "wagma:1", 4, 500_000, 0)], True),
    # a ring exchange, D-PSGD's (alike compute: the messages run at once)
    "ring": (lambda r, s: [CommOp(OpKind.SEND, "ring:+1", 2, 200_000, 200_000),
                           CommOp(OpKind.RECV, "ring:-1", 2, 200_000, 0, recv_bytes=200_000)], True),
}


@needs_simgrid
@pytest.mark.parametrize("name", sorted(SYNCHRONOUS))
def test_recurrence_and_discrete_events_agree_on_synchronous_patterns(name: str) -> None:
    ops, same = SYNCHRONOUS[name]
    work = workload(ops)
    assert work.synchronous()
    before, after = compute(W, same)
    net = Network(cluster(), W)
    rec = replay(work, net, before, after, RECURRENCE, bucket_ready=(0.5, 1.0))
    des = replay(work, net, before, after, EVENTS, bucket_ready=(0.5, 1.0))
    np.testing.assert_allclose(des.step_end[:STEPS], rec.step_end[:STEPS], rtol=1e-6, atol=1e-9)


def test_a_synchronous_step_waits_for_its_slowest_rank_then_communicates() -> None:
    """By hand: one rank computes 0.2 s, the others 0.1 s; the world all-reduce then takes its
    closed form; every rank ends the step together."""
    before = np.full((W, STEPS), 0.1)
    before[3, :] = 0.2
    after = np.zeros((W, STEPS))
    op = CommOp(OpKind.ALLREDUCE, "world", W, 1_000_000, 0)
    net = Network(cluster(per_node=1), W)
    comm = net.times(op, [tuple(range(W))])[0].seconds
    tl = Recurrence(workload(lambda r, s: [op]), net).run(lambda s: (before[:, s], after[:, s]))
    np.testing.assert_allclose(tl.step_s, 0.2 + comm)
    np.testing.assert_allclose(tl.rank_end, STEPS * (0.2 + comm))


def test_overlapped_buckets_hide_behind_backward() -> None:
    """A bucket ready halfway through a long backward is through before backward ends: the step
    costs the compute alone plus the last bucket's transfer."""
    net = Network(cluster(per_node=1), W)
    first, last = (CommOp(OpKind.ALLREDUCE, "world", W, 100_000, 0, bucket=b) for b in (0, 1))
    t_last = net.times(last, [tuple(range(W))])[0].seconds
    before, after = np.full((W, STEPS), 1.0), np.zeros((W, STEPS))
    tl = Recurrence(workload(lambda r, s: [first, last]), net, (0.5, 1.0)).run(lambda s: (before[:, s], after[:, s]))
    np.testing.assert_allclose(tl.step_s, 1.0 + t_last)


def serve(push_bytes: int, service_s: float) -> float:
    """Seconds per round of four workers pushing `push_bytes` to one server (1-byte replies, no compute)."""
    push = CommOp(OpKind.PUSH, "server:0", 2, push_bytes, push_bytes)
    pull = CommOp(OpKind.PULL, "server:0", 2, 1, 0, recv_bytes=1)
    work = workload(lambda r, s: [push, pull], world=5, train=range(1, 5))
    assert not work.synchronous()
    zero = np.zeros((4, STEPS))
    return replay(work, Network(cluster(per_node=1), 5), zero, zero, EVENTS, service_s={0: service_s}).wall_s / STEPS


@needs_simgrid
def test_a_servers_incast_shares_its_downlink() -> None:
    """Four 1.25 MB pushes at once through the server's 125 MB/s downlink: 40 ms a round (plus a
    message step each way), not the 10 ms one push alone would take."""
    assert serve(1_250_000, 0.0) == pytest.approx(0.04 + 2e-4, rel=0.02)


@needs_simgrid
def test_a_server_applies_pushes_one_at_a_time() -> None:
    """Tiny pushes, 10 ms of service each: four workers' pushes queue at the server, 40 ms a round."""
    assert serve(16, 0.01) == pytest.approx(0.04, rel=0.03)


@needs_simgrid
def test_wait_avoiding_groups_do_not_wait_for_a_slow_member() -> None:
    """Group averages on a background thread, started by the first member to arrive (WAGMA):
    with one rank twice as slow, the fast ranks' steps cost their own compute; the same averages
    blocking on the training thread make everyone wait for the slow one."""
    def ops(blocking: bool) -> Callable[[int, int], list[CommOp]]:
        return lambda r, s: [CommOp(OpKind.ALLREDUCE, f"wagma:{s % 3}", 2, 100_000, 0, blocking,
                                    "main" if blocking else "wagma")]
    before, after = np.full((W, STEPS), 0.1), np.zeros((W, STEPS))
    before[0, :] = 0.2
    net = Network(cluster(per_node=1), W)
    avoiding = replay(workload(ops(False)), net, before, after, EVENTS)
    waiting = replay(workload(ops(True)), net, before, after, RECURRENCE)
    fast_end = STEPS * 0.1
    assert avoiding.rank_end[1:].max() < fast_end * 1.1  # the others never wait for rank 0
    assert waiting.wall_s > STEPS * 0.2  # synchronous: everyone pays the slow rank's compute


def test_a_window_is_carried_to_the_run_at_its_steady_rate() -> None:
    tl = Timeline(np.arange(1, 11) * 2.0 + 1.0, np.array([21.0]))
    wall, rate = extrapolate(tl, 10, 100)
    assert rate == pytest.approx(2.0)
    assert wall == pytest.approx(21.0 + 90 * 2.0)


@needs_simgrid
def test_a_replay_keeps_the_work_between_two_waits() -> None:
    """PowerSGD's step: an all-reduce, the rank's own arithmetic, another all-reduce. One rank's
    arithmetic between them is slow, and every rank waits for it at the second: by hand the step
    is before + t + 0.1 + t + after, in both engines."""
    op = CommOp(OpKind.ALLREDUCE, "world", W, 100_000, 0)
    before, after = np.full((W, STEPS), 0.05), np.full((W, STEPS), 0.01)
    mids = np.full((W, STEPS, 1), 0.001)
    mids[5, :, 0] = 0.1
    net = Network(cluster(per_node=1), W)
    t = net.times(op, [tuple(range(W))])[0].seconds
    work = workload(lambda r, s: [op, op])
    rec = replay(work, net, before, after, RECURRENCE, mids=mids)
    des = replay(work, net, before, after, EVENTS, mids=mids)
    np.testing.assert_allclose(rec.step_s, 0.05 + t + 0.1 + t + 0.01)
    np.testing.assert_allclose(des.step_end[:STEPS], rec.step_end, rtol=1e-6)
