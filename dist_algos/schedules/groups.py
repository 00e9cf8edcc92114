"""Who averages with whom at which step: WAGMA's group schedule and the gossip graphs.

Pure functions of (rank, world size, step), shared by the plugins (which build process groups
and message peers from them) and by the tests' single-process reference simulations, so that a
plugin and its reference can never disagree about the topology.

WAGMA's groups (`GroupSchedule`). The authors' library forms a group of G = 2^g ranks by
recursive doubling: g rounds, partner = rank XOR mask, masks 1, 2, 4 for groups of 8; the next
step uses masks 8, 16, 32, so that the groups are rank-strided and information crosses the
previous step's groups; the phase flips every step. Here the log2(P) bits of a rank are cut
into windows of g consecutive bits, phase k using window [k*g, k*g + g) (the last window is
moved down to end at the top bit when g does not divide log2(P)); a rank's group in phase k is
every rank that differs from it only inside that window. For P = 64, G = 8 this is exactly the
reference's two phases; for P = 8, G = 4 the phases use bits {0, 1} and {1, 2}.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass


def log2_exact(n: int) -> int | None:
    """log2(n) when n is a positive power of two, else None."""
    if n < 1 or n & (n - 1):
        return None
    return n.bit_length() - 1


def is_global_step(step: int, global_period: int) -> bool:
    """Whether optimizer step `step` (0-based) is WAGMA's global average: every tau-th step."""
    return (step + 1) % global_period == 0


@dataclass(frozen=True)
class GroupSchedule:
    """Recursive-doubling groups of `group_size` ranks among `world_size` (both powers of two)."""

    world_size: int
    group_size: int

    def __post_init__(self) -> None:
        world_bits, group_bits = log2_exact(self.world_size), log2_exact(self.group_size)
        if world_bits is None or group_bits is None or group_bits > world_bits:
            raise ValueError(f"group_size={self.group_size} and world_size={self.world_size} must be "
                             "powers of two with group_size <= world_size")

    @property
    def world_bits(self) -> int:
        return self.world_size.bit_length() - 1

    @property
    def group_bits(self) -> int:
        return self.group_size.bit_length() - 1

    @property
    def num_phases(self) -> int:
        if self.group_bits == 0:
            return 1
        return -(-self.world_bits // self.group_bits)

    def phase_at(self, step: int) -> int:
        return step % self.num_phases

    def masks(self, phase: int) -> list[int]:
        """The XOR masks of the recursive-doubling rounds in `phase` (partner = rank ^ mask)."""
        start = min(phase * self.group_bits, self.world_bits - self.group_bits)
        return [1 << bit for bit in range(start, start + self.group_bits)]

    def group_of(self, rank: int, phase: int) -> list[int]:
        """The sorted members of `rank`'s group in `phase` (itself included)."""
        masks = self.masks(phase)
        members = set()
        for chosen in itertools.product((0, 1), repeat=len(masks)):
            flip = sum(m for m, c in zip(masks, chosen) if c)
            members.add(rank ^ flip)
        return sorted(members)

    def groups(self, phase: int) -> list[list[int]]:
        """The partition of all ranks into groups in `phase`, ordered by their smallest member
        (the order in which every rank creates the process groups)."""
        seen: dict[int, list[int]] = {}
        for rank in range(self.world_size):
            group = self.group_of(rank, phase)
            seen.setdefault(group[0], group)
        return [seen[k] for k in sorted(seen)]

    def peers(self, rank: int) -> list[int]:
        """Every rank that shares a group with `rank` in some phase."""
        return sorted({m for p in range(self.num_phases) for m in self.group_of(rank, p)} - {rank})


def ring_neighbours(rank: int, world_size: int) -> tuple[int, int]:
    """D-PSGD's ring: (left, right)."""
    return (rank - 1) % world_size, (rank + 1) % world_size


def exponential_hops(world_size: int) -> int:
    """How many distinct power-of-two offsets 1, 2, 4, ... below `world_size` exist."""
    return max(1, (world_size - 1).bit_length()) if world_size > 1 else 0


def exponential_peers(rank: int, world_size: int, step: int, num_peers: int) -> tuple[list[int], list[int]]:
    """SGP's time-varying directed exponential graph at `step`: (out-peers, in-peers).

    Rank i sends to i + 2^((step + j) mod m) for j < num_peers, m = the number of offsets
    below the world size, and so receives from i - 2^(...): every rank has as many in-peers
    as out-peers, and over m steps it reaches every power-of-two distance.
    """
    hops = exponential_hops(world_size)
    offsets = [1 << ((step + j) % hops) for j in range(num_peers)]
    return ([(rank + o) % world_size for o in offsets], [(rank - o) % world_size for o in offsets])


def bipartite_partner(rank: int, world_size: int, step: int) -> int:
    """AD-PSGD's partner at `step`: even ranks (active) pair with odd ranks (passive) at an odd
    offset that cycles through 1, 3, ..., world_size - 1, so every step is a perfect matching
    and over world_size / 2 steps every active rank meets every passive one."""
    offset = 2 * (step % (world_size // 2)) + 1
    return (rank + offset) % world_size if rank % 2 == 0 else (rank - offset) % world_size
