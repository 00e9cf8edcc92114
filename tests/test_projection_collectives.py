"""The closed forms of the collectives (Thakur, Rabenseifner and Gropp 2005) against values worked
by hand, the algorithm each library runs, and the network's split of a collective's steps and
bytes over the links (projection/collectives.py, projection/network.py)."""
from __future__ import annotations

import math

import pytest

from dist_algos.comm.pattern import CommOp, OpKind
from projection.cluster import Cluster, LinkClass
from projection.collectives import (Algorithm, Cost, Library, allgather, allreduce, broadcast, choose,
                                    hierarchical_allreduce, reduce_scatter)
from projection.network import Network, members, partition


def test_ring_allreduce_by_hand() -> None:
    """p = 4, n = 1,000: 6 steps; each rank sends 3/4 of n twice (750 + 750) and reduces 750."""
    assert allreduce(Algorithm.RING, 4, 1000) == Cost(6, 1500, 750)
    # alpha = 1 us, beta = 1 ns/B, gamma = 0.5 ns/B: 6 + 1.5 + 0.375 us
    assert allreduce(Algorithm.RING, 4, 1000).time(1e-6, 1e-9, 5e-10) == pytest.approx(7.875e-6)


def test_the_other_allreduce_forms_by_hand() -> None:
    # recursive doubling, p = 8: 3 rounds, each the whole vector sent and reduced
    assert allreduce(Algorithm.RECURSIVE_DOUBLING, 8, 100) == Cost(3, 300, 300)
    # Rabenseifner, p = 8: 2 lg p = 6 steps, 2 x 7/8 x 100 bytes, 7/8 x 100 reduced
    assert allreduce(Algorithm.RABENSEIFNER, 8, 100) == Cost(6, 175, 87.5)
    # double binary tree, p = 8: 2 lg p steps, 2n through a rank's link
    assert allreduce(Algorithm.TREE, 8, 100) == Cost(6, 200, 100)
    # a non-power of two rounds its rounds up
    assert allreduce(Algorithm.TREE, 5, 100).messages == 6
    assert allreduce(Algorithm.RING, 1, 100) == Cost(0, 0, 0)


def test_gather_scatter_broadcast_by_hand() -> None:
    assert allgather(Algorithm.RING, 4, 100) == Cost(3, 300)  # 3 steps of 100 bytes
    assert reduce_scatter(4, 100) == Cost(3, 75, 75)
    assert broadcast(Algorithm.BINOMIAL, 8, 100) == Cost(3, 300)
    assert broadcast(Algorithm.SCATTER_ALLGATHER, 8, 80) == Cost(3 + 7, 140)  # (lg p + p - 1) alpha + 2(p-1)/p n


def test_hierarchical_is_intra_node_then_across_nodes() -> None:
    """4 nodes of 8 ranks, n = 8,000: reduce-scatter and all-gather of n inside (7 steps each,
    7/8 n each), then an all-reduce of n / 8 = 1,000 across the 4 nodes."""
    intra, inter = hierarchical_allreduce(4, 8, 8000, Algorithm.RING)
    assert intra == Cost(14, 14000, 7000)
    assert inter == allreduce(Algorithm.RING, 4, 1000) == Cost(6, 1500, 750)


def test_each_library_runs_its_own_algorithm() -> None:
    alpha, beta = 10e-6, 1 / 25e9
    assert choose(Library.GLOO, OpKind.ALLREDUCE, 64, 8, alpha, beta) == Algorithm.RING  # gloo: ring at every size
    assert choose(Library.MPI, OpKind.ALLREDUCE, 64, 1024, alpha, beta) == Algorithm.RECURSIVE_DOUBLING
    assert choose(Library.MPI, OpKind.ALLREDUCE, 64, 1 << 20, alpha, beta) == Algorithm.RABENSEIFNER
    # NCCL: the cheaper of its two forms; latency-bound small messages on many ranks take the tree,
    # a large message on few ranks the ring (2(p-1)/p n < 2n)
    assert choose(Library.NCCL, OpKind.ALLREDUCE, 1024, 1024, alpha, beta) == Algorithm.TREE
    assert choose(Library.NCCL, OpKind.ALLREDUCE, 4, 1 << 28, alpha, beta) == Algorithm.RING
    assert choose(Library.NCCL, OpKind.SEND, 2, 100, alpha, beta) == Algorithm.DIRECT


def cluster(per_node: int = 1, nics: int = 1, **kw: object) -> Cluster:
    return Cluster("t", "", Library.GLOO, per_node, LinkClass("intra_node", 1e-6, 100e9),
                   LinkClass("nic", 10e-6, 1e9), nics_per_node=nics, **kw)  # type: ignore[arg-type]


def test_groups_resolve_for_any_world() -> None:
    assert members("world", 3, 8, 8) == tuple(range(8))
    assert members("wagma:1", 0, 8, 4) == (0, 2, 4, 6)  # bits 1 and 2 for groups of 4 of 8
    assert members("block:4", 6, 8, 4) == (4, 5, 6, 7)
    assert members("ring:-1", 0, 8, 2) == (0, 7)
    assert partition("wagma:0", 8, 2, range(8)) == ((0, 1), (2, 3), (4, 5), (6, 7))


def test_a_world_allreduce_on_one_rank_per_node() -> None:
    """8 nodes, 8 MB: ring steps all between nodes at 10 us; each rank's flow gets its NIC."""
    net = Network(cluster(), 8)
    op = CommOp(OpKind.ALLREDUCE, "world", 8, 8_000_000, 0)
    (t,) = net.times(op, [tuple(range(8))])
    assert t.latency_s == pytest.approx(14 * 10e-6)
    assert t.rate_Bps == pytest.approx(1e9)
    assert t.seconds == pytest.approx(14e-5 + 2 * 7 / 8 * 8e6 / 1e9)


def test_concurrent_groups_share_a_node_uplink() -> None:
    """Two ranks per node, one NIC: WAGMA's phase-1 groups of 2 pair rank r with r ^ 2, on another
    node, so both ranks of a node send through its one NIC at once (half each); phase 0 pairs
    node-mates, whose flows stay inside."""
    net = Network(cluster(per_node=2), 8)
    op = CommOp(OpKind.ALLREDUCE, "wagma:1", 2, 1_000_000, 0)
    groups = partition("wagma:1", 8, 2, range(8))
    assert {t.rate_Bps for t in net.times(op, groups)} == {0.5e9}
    inside = net.times(CommOp(OpKind.ALLREDUCE, "wagma:0", 2, 1_000_000, 0), partition("wagma:0", 8, 2, range(8)))
    assert {t.rate_Bps for t in inside} == {100e9}


def test_an_oversubscribed_core_is_shared_by_the_flows_crossing_it() -> None:
    """Two leaves of two one-NIC nodes, uplinks oversubscribed 4:1 (each leaf 2 x 1 GB/s / 4 =
    0.5 GB/s to the core): two flows crossing it get 0.25 GB/s each."""
    net = Network(cluster(nodes_per_leaf=2, oversubscription=4.0), 4)
    op = CommOp(OpKind.SEND, "pair:2", 2, 1_000_000, 1_000_000)
    times = net.times(op, [(0, 2), (1, 3)])
    assert [t.rate_Bps for t in times] == [pytest.approx(0.25e9)] * 2
    alone = net.times(op, [(0, 1)])  # inside a leaf: the NIC alone
    assert alone[0].rate_Bps == pytest.approx(1e9)


def test_incast_shares_the_receivers_link() -> None:
    """Three workers pushing to one server at once: its downlink splits three ways."""
    net = Network(cluster(), 4)
    op = CommOp(OpKind.PUSH, "server:0", 2, 3_000_000, 3_000_000)
    times = net.times(op, [(1, 0), (2, 0), (3, 0)])
    assert all(t.transfer_s == pytest.approx(3e6 / (1e9 / 3)) for t in times)


def test_a_flow_spreads_over_the_nics_its_node_mates_give_it() -> None:
    """Eight ranks per node, eight NICs: the ring's one crossing per node runs over eight rails
    (NCCL's channels), so the network is not slower than one NIC per rank."""
    net = Network(cluster(per_node=8, nics=8), 16)
    op = CommOp(OpKind.ALLREDUCE, "world", 16, 16_000_000, 0)
    (t,) = net.times(op, [tuple(range(16))])
    assert t.rate_Bps == pytest.approx(8e9)
    assert math.isfinite(t.seconds)


def test_a_hierarchical_allreduce_crosses_the_network_with_a_slice_per_rank() -> None:
    """Two nodes of four ranks, one NIC each, hierarchical: inside each node a reduce-scatter and
    an all-gather (6 intra steps, 2 x 3/4 n on the intra link), across the nodes four all-reduces
    of n/4 at once (each 2 steps, 2 x 1/2 x n/4 bytes), the four sharing each node's NIC."""
    n = 8_000_000
    net = Network(cluster(per_node=4, hierarchical=True), 8)
    (t,) = net.times(CommOp(OpKind.ALLREDUCE, "world", 8, n, 0), [tuple(range(8))])
    assert t.algorithm == Algorithm.HIERARCHICAL
    assert t.latency_s == pytest.approx(6 * 1e-6 + 2 * 10e-6)
    assert t.rate_Bps == pytest.approx(1e9 / 4)  # four flows leave each node through its one NIC
    assert t.transfer_s == pytest.approx(n / 4 / 0.25e9)
    assert t.extra_s == pytest.approx(2 * 0.75 * n / 100e9)
