"""DeepSpeed's hostfile, read the way its runner reads it, and which ranks run on which node.

A hostfile lists one machine per line as `HOST slots=N` (a slot is a GPU on a GPU machine, one
rank on a CPU machine). DeepSpeed's runner keeps the hosts in file order, narrows them with
`--include`/`--exclude` (`host[:slot,slot][@host...]`) or `--num_nodes`, and numbers the ranks
host by host in that order. This module does the same before anything is launched, so that a
line DeepSpeed would reject, an unknown host in a filter, or unequal nodes are one clear line
here instead of a traceback from the runner, and so that the launcher knows which global ranks
each node runs (to watch and signal them).
"""
from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from core.errors import UserError

# The pattern of deepspeed.launcher.runner._parse_hostfile: a prefix match, so trailing text after
# `slots=N` is accepted there, and therefore here.
HOST_LINE = re.compile(r"^(\S+)\s+slots=(\d+)")


@dataclass(frozen=True)
class NodePlan:
    """The hosts a job runs on, in rank order, with the slot ids (GPU indices) used on each."""

    hosts: tuple[str, ...]
    slots: tuple[tuple[int, ...], ...]

    @property
    def num_nodes(self) -> int:
        return len(self.hosts)

    @property
    def world_size(self) -> int:
        return sum(len(s) for s in self.slots)

    @property
    def ranks_per_node(self) -> int:
        """Ranks on every node (`node_plan` refuses nodes of different sizes)."""
        return len(self.slots[0])

    def ranks_of(self, node_rank: int) -> list[int]:
        """The global ranks DeepSpeed starts on node `node_rank` (hosts are numbered in order)."""
        start = sum(len(s) for s in self.slots[:node_rank])
        return list(range(start, start + len(self.slots[node_rank])))


def read_hostfile(path: str | Path) -> "OrderedDict[str, int]":
    """Host -> slots, in file order; `UserError` naming the file and line for what DeepSpeed rejects."""
    p = Path(path)
    try:
        lines = p.read_text().splitlines()
    except OSError as err:
        raise UserError(f"launch.hostfile={path}: cannot read it ({err.strerror or err}); "
                        "see hostfile.example for the format") from None
    pool: "OrderedDict[str, int]" = OrderedDict()
    for number, raw in enumerate(lines, start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = HOST_LINE.search(line)
        if match is None:
            raise UserError(f"launch.hostfile={path} line {number}: {line!r} is not 'HOST slots=N' "
                            "(DeepSpeed's hostfile format, see hostfile.example)")
        host, slots = match.group(1), int(match.group(2))
        if host in pool:
            raise UserError(f"launch.hostfile={path} line {number}: host {host} is listed twice "
                            "(DeepSpeed refuses that); give it one line with all its slots")
        if slots < 1:
            raise UserError(f"launch.hostfile={path} line {number}: host {host} has slots={slots}; "
                            "give it at least 1 or leave it out")
        pool[host] = slots
    if not pool:
        raise UserError(f"launch.hostfile={path} lists no host (lines 'HOST slots=N'; see hostfile.example)")
    return pool


def _parse_filter(key: str, text: str, pool: "OrderedDict[str, int]") -> dict[str, list[int]]:
    """`host[:slot,slot][@host...]` -> host -> slots (empty: the whole host), checked against the pool."""
    chosen: dict[str, list[int]] = {}
    for spec in text.split("@"):
        host, _, slot_text = spec.partition(":")
        if host not in pool:
            raise UserError(f"launch.{key}={text}: host {host!r} is not in the hostfile "
                            f"(hosts: {', '.join(pool)})")
        slots = chosen.setdefault(host, [])
        for item in filter(None, slot_text.split(",")):
            if not item.isdigit():
                raise UserError(f"launch.{key}={text}: slot {item!r} of host {host} is not a number")
            if int(item) >= pool[host]:
                raise UserError(f"launch.{key}={text}: host {host} has slots 0..{pool[host] - 1}, not {item}")
            slots.append(int(item))
    return chosen


def select_hosts(pool: "OrderedDict[str, int]", include: Optional[str] = None,
                 exclude: Optional[str] = None, num_nodes: Optional[int] = None) -> NodePlan:
    """Apply DeepSpeed's --include/--exclude/--num_nodes to the hostfile's pool, in file order."""
    active: "OrderedDict[str, list[int]]" = OrderedDict((h, list(range(n))) for h, n in pool.items())
    if include:
        chosen = _parse_filter("include", include, pool)
        active = OrderedDict((h, sorted(set(chosen[h])) or s) for h, s in active.items() if h in chosen)
    elif exclude:
        for host, slots in _parse_filter("exclude", exclude, pool).items():
            active[host] = [s for s in active[host] if slots and s not in slots]
        active = OrderedDict((h, s) for h, s in active.items() if s)
    if num_nodes is not None:
        if num_nodes > len(active):
            raise UserError(f"launch.num_nodes={num_nodes} but the hostfile has {len(active)} usable hosts")
        active = OrderedDict(list(active.items())[:num_nodes])
    if not active:
        raise UserError(f"launch.exclude={exclude} leaves no host to run on")
    return NodePlan(tuple(active), tuple(tuple(s) for s in active.values()))


def node_plan(hostfile: str | Path, include: Optional[str] = None, exclude: Optional[str] = None,
              num_nodes: Optional[int] = None, nproc: Optional[int] = None) -> NodePlan:
    """The checked plan for a hostfile launch: equal nodes, and `nproc` (when given) equal to the slots.

    Equal nodes because the algorithms' node-level groups (LSGD's intra-node leader, WAGMA's
    groups) and the OMP thread split assume every node runs the same number of ranks.
    """
    plan = select_hosts(read_hostfile(hostfile), include, exclude, num_nodes)
    sizes = {h: len(s) for h, s in zip(plan.hosts, plan.slots)}
    if len(set(sizes.values())) > 1:
        listed = ", ".join(f"{h}: {n}" for h, n in sizes.items())
        raise UserError(f"launch.hostfile={hostfile}: hosts have different numbers of slots ({listed}); "
                        "every node must run the same number of ranks: select equal slots with launch.include")
    if nproc is not None and nproc != plan.ranks_per_node:
        host = plan.hosts[0]
        raise UserError(f"launch.nproc={nproc} but host {host} has {plan.ranks_per_node} slots in "
                        f"launch.hostfile={hostfile}; set launch.nproc={plan.ranks_per_node}, or null "
                        "to take the slots, or change the hostfile")
    return plan
