"""The network of a cluster applied to one op: who takes part, which links it crosses, how long.

Groups. A pattern names its groups symbolically (dist_algos/comm/pattern.py); `members` turns a
label into ranks for a world of any size: `world` (every rank, or the first `group_size` when the
op says fewer), `wagma:<k>` (WAGMA's recursive-doubling group of phase k,
`dist_algos.schedules.groups.GroupSchedule`), `block:<g>` (g consecutive ranks), and the
point-to-point labels `ring:+d`, `pair:<p>`, `server:<s>`, `worker:<w>` (this rank and one peer).

Links. Ranks fill nodes in order; an op over a group runs as a ring over its members in rank
order (node-mates adjacent), each ring edge a flow: inside a node on the intra-node link, between
nodes through the sender's NICs, the receiver's NICs and, across leaf switches, the core. Ops
that run at once (every group of one WAGMA phase, the buckets of another thread) share links:
a node's NICs are shared equally by the flows leaving it (and by those entering it), a leaf's
uplinks by the flows crossing the core, the emulated cluster's backplane by every flow between
nodes, and one flow uses at most as many NICs as its node has members of the group (NCCL's
channels spread a ring over the rails). The op's time is its closed form
(projection/collectives.py) with beta the slowest edge's share, the message steps split between
intra-node and network steps as NCCL's own model splits them, plus the bytes reduced (gamma)
and the host's per-byte software cost. This bottleneck share is exact when the concurrent flows
are alike (symmetric collectives); the discrete-event engine hands the same flows to SimGrid's
max-min sharing, which also covers the rest (projection/events.py), and a test checks the two
agree where both apply.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Optional

from dist_algos.comm.pattern import CommOp, OpKind
from dist_algos.schedules.groups import GroupSchedule
from projection.cluster import Cluster
from projection.collectives import Algorithm, Cost, choose, collective, hierarchical_allreduce

POINT_TO_POINT = (OpKind.SEND, OpKind.RECV, OpKind.PUSH, OpKind.PULL)
PEER_LABELS = ("ring", "pair", "server", "worker")


def peer_of(label: str, rank: int, world: int) -> int:
    """The other end of a point-to-point label."""
    kind, _, value = label.partition(":")
    if kind == "ring":
        return (rank + int(value)) % world
    return int(value)


@lru_cache(maxsize=4096)
def members(label: str, rank: int, world: int, group_size: int) -> tuple[int, ...]:
    """The ranks of `rank`'s group named `label` in a world of `world` ranks, sorted."""
    kind, _, value = label.partition(":")
    if kind == "world":
        return tuple(range(world)) if group_size >= world else tuple(range(world - group_size, world))
    if kind == "wagma":
        return tuple(GroupSchedule(world, group_size).group_of(rank, int(value)))
    if kind == "block":
        size = int(value)
        start = rank // size * size
        return tuple(range(start, min(start + size, world)))
    if kind in PEER_LABELS:
        return tuple(sorted({rank, peer_of(label, rank, world)}))
    raise ValueError(f"unknown group label {label!r}")


def partition(label: str, world: int, group_size: int, ranks: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """The distinct groups `ranks` fall into under `label` (every group of a phase at once)."""
    seen: dict[tuple[int, ...], None] = {}
    for rank in ranks:
        seen.setdefault(members(label, rank, world, group_size), None)
    return tuple(seen)


@dataclass(frozen=True)
class Flow:
    src: int
    dst: int
    nbytes: float


@dataclass(frozen=True)
class OpTime:
    """One group's op: `latency_s` of message steps, `flows` carrying the closed form's bytes
    (each ring edge once), `rate_Bps` the bottleneck flow's share, `extra_s` what no link
    shares (reduction, the host's per-byte cost)."""

    latency_s: float
    flows: tuple[Flow, ...]
    rate_Bps: float
    extra_s: float
    algorithm: Algorithm

    @property
    def transfer_s(self) -> float:
        nbytes = max((f.nbytes for f in self.flows), default=0.0)
        return nbytes / self.rate_Bps if nbytes else 0.0

    @property
    def seconds(self) -> float:
        return self.latency_s + self.transfer_s + self.extra_s


def ring_edges(group: Sequence[int]) -> list[tuple[int, int]]:
    if len(group) < 2:
        return []
    if len(group) == 2:
        return [(group[0], group[1]), (group[1], group[0])]
    return [(group[i], group[(i + 1) % len(group)]) for i in range(len(group))]


class Network:
    """A cluster's links for a world of `world` ranks (see the module docstring)."""

    def __init__(self, cluster: Cluster, world: int, busy: Optional[int] = None) -> None:
        self.cluster = cluster
        self.world = world
        # ranks busy on a shared host (the emulated cluster): every rank of the run, unless a
        # calibration times a few ranks while the others idle; with more busy ranks than cores,
        # a software cost stretches by 1 + oversubscription x (the busy share beyond the cores)
        cores, busy = cluster.host_cores, busy if busy is not None else world
        self.contention = 1.0 + cluster.oversubscribed * max(0, busy - cores) / busy if cores else 1.0
        self._cache: dict[tuple, tuple[OpTime, ...]] = {}

    def node(self, rank: int) -> int:
        return self.cluster.node_of(rank)

    @property
    def nodes(self) -> int:
        return self.node(self.world - 1) + 1

    def leaf(self, node: int) -> int:
        return self.cluster.leaf_of(node, self.nodes)

    def spans(self, group: Sequence[int]) -> tuple[int, int]:
        """(nodes the group spans, most members on one node)."""
        count = Counter(self.node(r) for r in group)
        return len(count), max(count.values()) if count else 0

    def op_bytes(self, op: CommOp) -> float:
        """The size the closed form takes: a collective's tensor (payload), a message's wire bytes."""
        return float(op.wire_bytes if OpKind(op.kind) in POINT_TO_POINT else op.payload_bytes)

    # ---- concurrent groups -----------------------------------------------------------------
    def times(self, op: CommOp, groups: Sequence[Sequence[int]],
              extra_flows: Sequence[tuple[int, int]] = ()) -> tuple[OpTime, ...]:
        """The time of `op` in each of `groups`, all running at once (with `extra_flows` more
        (src, dst) flows beside them on the links), in the groups' order. Cached: a pattern
        repeats the same op over the same partition step after step."""
        key = (OpKind(op.kind), self.op_bytes(op), tuple(map(tuple, groups)), tuple(extra_flows))
        found = self._cache.get(key)
        if found is None:
            found = self._cache[key] = self._times(op, groups, extra_flows)
        return found

    def _times(self, op: CommOp, groups: Sequence[Sequence[int]],
               extra: Sequence[tuple[int, int]]) -> tuple[OpTime, ...]:
        # a message's group is (sender, receiver); a collective's, its members in any order
        edges = [ring_edges(sorted(g)) if OpKind(op.kind) not in POINT_TO_POINT else [(g[0], g[1])] for g in groups]
        every = [e for es in edges for e in es] + list(extra)
        shares = self.shares(every)
        receiving = self.receiving(every)
        out = []
        for group, group_edges in zip(groups, edges):
            out.append(self.group_time(op, sorted(group), group_edges, shares, receiving))
        return tuple(out)

    def receiving(self, edges: Sequence[tuple[int, int]]) -> set[int]:
        """The nodes some flow between nodes enters: a flow leaving one of them shares its
        uplink with the acknowledgements of what comes in (`duplex_efficiency`)."""
        return {self.node(b) for a, b in edges if self.node(a) != self.node(b)}

    def shares(self, edges: Sequence[tuple[int, int]]) -> dict[tuple[int, int], float]:
        """Each flow's bottleneck share of the links it crosses, all flows at once."""
        c = self.cluster
        out_node, in_node, out_leaf, in_leaf = Counter(), Counter(), Counter(), Counter()
        between = 0
        for src, dst in edges:
            a, b = self.node(src), self.node(dst)
            if a == b:
                continue
            between += 1
            out_node[a] += 1
            in_node[b] += 1
            if self.leaf(a) != self.leaf(b):
                out_leaf[self.leaf(a)] += 1
                in_leaf[self.leaf(b)] += 1
        rates: dict[tuple[int, int], float] = {}
        for src, dst in edges:
            a, b = self.node(src), self.node(dst)
            if a == b:
                rates[(src, dst)] = c.intra.bandwidth_Bps
                continue
            limits = [c.node_Bps / out_node[a], c.node_Bps / in_node[b]]
            if self.leaf(a) != self.leaf(b):
                uplink = c.leaf_uplink_Bps(self.nodes)
                limits += [uplink / out_leaf[self.leaf(a)], uplink / in_leaf[self.leaf(b)]]
                if c.core_flow_Bps is not None:
                    limits.append(c.core_flow_Bps)
            if c.backplane_Bps is not None:
                limits.append(c.backplane_Bps / between)
            rates[(src, dst)] = min(limits)
        return rates

    def group_time(self, op: CommOp, group: Sequence[int], edges: Sequence[tuple[int, int]],
                   shares: dict[tuple[int, int], float], receiving: Optional[set[int]] = None) -> OpTime:
        """The op over one group: its closed form with the group's slowest flow; `receiving`,
        the nodes that take in flows meanwhile (default: this group's own receivers)."""
        c = self.cluster
        receiving = self.receiving(edges) if receiving is None else receiving
        kind, p = OpKind(op.kind), len(group)
        n = self.op_bytes(op)
        if kind not in POINT_TO_POINT and p <= 1:
            return OpTime(0.0, (), math.inf, 0.0, Algorithm.RING)
        nodes, local = self.spans(group)
        crosses_core = len({self.leaf(self.node(r)) for r in group}) > 1
        net_alpha = c.nic.latency_s + (c.core_latency_s if crosses_core else 0.0)
        if c.hierarchical and kind == OpKind.ALLREDUCE and nodes > 1 and local > 1:
            return self.hierarchical(group, n, nodes, local, net_alpha)
        rate = min(self.flow_cap(src, dst, local, shares) for src, dst in edges) if edges else math.inf
        alpha = net_alpha if nodes > 1 else c.intra.latency_s
        algorithm = choose(c.library, kind, p, n, alpha, 1.0 / rate if rate < math.inf else 0.0)
        cost = collective(kind, algorithm, p, n)
        latency = self.latency(cost, algorithm, p, nodes, local, net_alpha) * self.contention
        if kind not in POINT_TO_POINT:
            latency += c.collective_latency_s
        elif c.message_latency_s:  # a library whose messages cost other than a collective's step
            latency = c.message_latency_s * self.contention
        flows = tuple(Flow(src, dst, self.on_wire(src, dst, cost.wire_bytes, receiving)) for src, dst in edges)
        extra = (cost.reduce_bytes * c.reduce_s_per_byte + cost.wire_bytes * c.host_s_per_byte) * self.contention
        return OpTime(latency, flows, rate, extra, algorithm)

    def hierarchical(self, group: Sequence[int], n: float, nodes: int, local: int, net_alpha: float) -> OpTime:
        """Reduce-scatter inside each node, `local` all-reduces of n/local across the nodes at once
        (one per position in the node, sharing the nodes' NICs), all-gather inside each node."""
        c = self.cluster
        by_position: dict[int, list[int]] = {}
        for rank in sorted(group):
            by_position.setdefault(rank % c.ranks_per_node, []).append(rank)
        edges = [e for ranks in by_position.values() for e in ring_edges(ranks)]
        shares = self.shares(edges)
        rate = min(self.flow_cap(a, b, 1, shares) for a, b in edges)
        inter_alg = choose(c.library, OpKind.ALLREDUCE, nodes, n / local, net_alpha, 1.0 / rate)
        intra, inter = hierarchical_allreduce(nodes, local, n, inter_alg)
        latency = (intra.messages * c.intra.latency_s + inter.messages * net_alpha) * self.contention
        receiving = self.receiving(edges)
        flows = tuple(Flow(a, b, self.on_wire(a, b, inter.wire_bytes, receiving)) for a, b in edges)
        extra = (intra.time(0.0, c.intra.beta, c.reduce_s_per_byte) + inter.reduce_bytes * c.reduce_s_per_byte
                 + (intra.wire_bytes + inter.wire_bytes) * c.host_s_per_byte) * self.contention
        return OpTime(latency + c.collective_latency_s, flows, rate, extra, Algorithm.HIERARCHICAL)

    def on_wire(self, src: int, dst: int, nbytes: float, receiving: set[int]) -> float:
        """What a flow costs its link in payload bytes: less the link's burst, and more where the
        sender's node takes in a flow meanwhile (its uplink also carries the acknowledgements)."""
        if self.node(src) == self.node(dst):
            return nbytes
        nic = self.cluster.nic
        duplex = nic.duplex_efficiency if self.node(src) in receiving else 1.0
        return max(nbytes - nic.burst_bytes, 0.0) / duplex

    def flow_cap(self, src: int, dst: int, local: int, shares: dict[tuple[int, int], float]) -> float:
        """A flow's rate: its share, and at most the NICs its group's node-mates can spread over."""
        share = shares[(src, dst)]
        if self.node(src) == self.node(dst):
            return share
        return min(share, self.cluster.nic.bandwidth_Bps * min(max(local, 1), self.cluster.nics_per_node))

    def latency(self, cost: Cost, algorithm: Algorithm, p: int, nodes: int, local: int, net_alpha: float) -> float:
        """The message steps split as NCCL's model splits them: a ring's steps between nodes are
        (nodes - 1) of every (p - 1); a tree's lg(nodes) of lg(p); the rest stay inside a node."""
        intra = self.cluster.intra.latency_s
        if nodes <= 1:
            return cost.messages * intra
        if p <= 1 or cost.messages == 0:
            return 0.0
        if algorithm == Algorithm.RING:
            inter = cost.messages * (nodes - 1) / (p - 1)
        else:
            inter = cost.messages * min(1.0, math.ceil(math.log2(nodes)) / max(1, math.ceil(math.log2(p))))
        return inter * net_alpha + (cost.messages - inter) * intra
