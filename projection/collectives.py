"""Collectives in closed form: how many message steps, how many bytes through a rank's link, how
many bytes reduced, for the algorithm a library uses at that size.

The forms are those of Thakur, Rabenseifner and Gropp ("Optimization of collective communication
operations in MPICH", IJHPCA 2005), derived here for p ranks each holding n bytes, with alpha the
cost of one message step, beta of one byte on the bottleneck link and gamma of one byte reduced:

- ring all-reduce (a reduce-scatter then an all-gather, p - 1 steps each, each step moving n/p):
  2(p-1) alpha + 2(p-1)/p n beta + (p-1)/p n gamma;
- recursive doubling (lg p rounds, each exchanging and reducing the whole vector):
  lg p (alpha + n beta + n gamma);
- Rabenseifner (reduce-scatter by recursive halving, all-gather by recursive doubling):
  2 lg p alpha + 2(p-1)/p n beta + (p-1)/p n gamma;
- pipelined double binary tree (NCCL's "tree": each half of the vector goes up one tree and down
  again; a rank sends and receives 2n over the two trees): 2 lg p alpha + 2 n beta + n gamma;
- ring all-gather of n bytes per rank: (p-1) alpha + (p-1) n beta; reduce-scatter of n bytes:
  (p-1) alpha + (p-1)/p n (beta + gamma); binomial broadcast: lg p (alpha + n beta);
  scatter + all-gather broadcast (van de Geijn): (lg p + p - 1) alpha + 2(p-1)/p n beta;
- a point-to-point message: alpha + n beta.

A form is a `Cost` (the three coefficients), so the same numbers serve the recurrence (which
multiplies them by a link's alpha, beta, gamma) and the discrete-event engine (which sends the
`wire_bytes` as a flow that shares links with the others and waits the latency steps). The
hierarchical all-reduce (reduce-scatter inside each node, all-reduce of n/g across nodes,
all-gather inside each node) is three such costs on two link classes (`hierarchical_allreduce`).

Which algorithm a library runs (`choose`): gloo runs its ring for every all-reduce size; MPICH
recursive doubling below 2 KiB and Rabenseifner above (Thakur et al.'s thresholds); NCCL whichever
of ring and tree its own cost model finds faster, which is what taking the cheaper of the two
forms reproduces (its tuning model is these two forms with its own alpha and bandwidth figures).
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from dist_algos.comm.pattern import OpKind


class Algorithm(str, enum.Enum):
    RING = "ring"
    TREE = "tree"  # pipelined double binary tree
    RECURSIVE_DOUBLING = "recursive_doubling"
    RABENSEIFNER = "rabenseifner"
    BINOMIAL = "binomial"
    SCATTER_ALLGATHER = "scatter_allgather"
    DIRECT = "direct"  # a point-to-point message
    HIERARCHICAL = "hierarchical"


class Library(str, enum.Enum):
    GLOO = "gloo"
    NCCL = "nccl"
    MPI = "mpi"


#: MPICH's switch from recursive doubling to Rabenseifner's all-reduce (Thakur et al. 2005, sec. 4.4)
MPICH_SHORT_ALLREDUCE = 2048


@dataclass(frozen=True)
class Cost:
    """A closed form's coefficients: `messages` steps of alpha, `wire_bytes` through a rank's
    bottleneck link (times beta), `reduce_bytes` reduced locally (times gamma)."""

    messages: float
    wire_bytes: float
    reduce_bytes: float = 0.0

    def time(self, alpha: float, beta: float, gamma: float = 0.0) -> float:
        return self.messages * alpha + self.wire_bytes * beta + self.reduce_bytes * gamma

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(self.messages + other.messages, self.wire_bytes + other.wire_bytes,
                    self.reduce_bytes + other.reduce_bytes)


ZERO = Cost(0.0, 0.0, 0.0)


def lg(p: int) -> int:
    """Rounds of a recursive algorithm over p ranks: ceil(log2 p)."""
    return max(0, math.ceil(math.log2(p))) if p > 1 else 0


def allreduce(algorithm: Algorithm, p: int, n: float) -> Cost:
    """All-reduce of n bytes on each of p ranks."""
    if p <= 1:
        return ZERO
    share = (p - 1) / p * n
    if algorithm == Algorithm.RING:
        return Cost(2 * (p - 1), 2 * share, share)
    if algorithm == Algorithm.RECURSIVE_DOUBLING:
        return Cost(lg(p), n * lg(p), n * lg(p))
    if algorithm == Algorithm.RABENSEIFNER:
        return Cost(2 * lg(p), 2 * share, share)
    if algorithm == Algorithm.TREE:
        return Cost(2 * lg(p), 2 * n, n)
    raise ValueError(f"no all-reduce form for {algorithm}")


def allgather(algorithm: Algorithm, p: int, n: float) -> Cost:
    """All-gather of n bytes from each of p ranks (p n bytes gathered on every rank)."""
    if p <= 1:
        return ZERO
    if algorithm == Algorithm.RECURSIVE_DOUBLING:
        return Cost(lg(p), (p - 1) * n)
    return Cost(p - 1, (p - 1) * n)


def reduce_scatter(p: int, n: float) -> Cost:
    """Ring reduce-scatter of n bytes on each rank (each keeps n/p reduced)."""
    if p <= 1:
        return ZERO
    share = (p - 1) / p * n
    return Cost(p - 1, share, share)


def broadcast(algorithm: Algorithm, p: int, n: float) -> Cost:
    if p <= 1:
        return ZERO
    if algorithm == Algorithm.SCATTER_ALLGATHER:
        return Cost(lg(p) + p - 1, 2 * (p - 1) / p * n)
    return Cost(lg(p), lg(p) * n)


def point_to_point(n: float) -> Cost:
    return Cost(1, n)


def choose(library: Library, kind: OpKind, p: int, n: float, alpha: float, beta: float) -> Algorithm:
    """The algorithm `library` runs for this collective at this size (see the module docstring)."""
    kind = OpKind(kind)
    if kind in (OpKind.SEND, OpKind.RECV, OpKind.PUSH, OpKind.PULL):
        return Algorithm.DIRECT
    if kind == OpKind.BROADCAST:
        large = library == Library.MPI and n >= 12288 and p >= 8  # MPICH's long-message broadcast
        return Algorithm.SCATTER_ALLGATHER if large else Algorithm.BINOMIAL
    if kind != OpKind.ALLREDUCE:
        return Algorithm.RING
    if library == Library.GLOO:
        return Algorithm.RING
    if library == Library.MPI:
        return Algorithm.RECURSIVE_DOUBLING if n < MPICH_SHORT_ALLREDUCE else Algorithm.RABENSEIFNER
    ring, tree = allreduce(Algorithm.RING, p, n), allreduce(Algorithm.TREE, p, n)
    return Algorithm.TREE if tree.time(alpha, beta) < ring.time(alpha, beta) else Algorithm.RING


def collective(kind: OpKind, algorithm: Algorithm, p: int, n: float) -> Cost:
    """The closed form of one op of `kind` run by `algorithm` over p ranks, n bytes per rank."""
    kind = OpKind(kind)
    if kind == OpKind.ALLREDUCE:
        return allreduce(algorithm, p, n)
    if kind == OpKind.ALLGATHER:
        return allgather(algorithm, p, n)
    if kind == OpKind.REDUCE_SCATTER:
        return reduce_scatter(p, n)
    if kind == OpKind.BROADCAST:
        return broadcast(algorithm, p, n)
    if kind == OpKind.BARRIER:
        return Cost(lg(p), 0.0) if p > 1 else ZERO
    return point_to_point(n)


def hierarchical_allreduce(nodes: int, local: int, n: float, inter: Algorithm) -> tuple[Cost, Cost]:
    """(cost on the intra-node link, cost on the network) of the hierarchical all-reduce:
    reduce-scatter among the `local` ranks of each node, all-reduce of n/local across `nodes`
    (the local ranks' slices in parallel), all-gather inside each node."""
    intra = reduce_scatter(local, n) + allgather(Algorithm.RING, local, n / local) if local > 1 else ZERO
    return intra, allreduce(inter, nodes, n / max(local, 1))
