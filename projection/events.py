"""Asynchronous patterns as discrete events, on SimGrid: this side writes the simulation down.

What the recurrence cannot express runs here: parameter servers (pushes queued at a server that
serves one at a time, replies racing each other down the links), wait-avoiding group averages
on a background thread (the first member to arrive starts them), point-to-point pairs chosen by
a schedule, ops that do not block. The flows of all of them share the links by SimGrid's max-min
model, validated flow-level sharing rather than a solver of our own (docs/projection.md says why
SimGrid and not simpy: simpy is an event queue and would have left the sharing to us).

SimGrid allows one engine per process and aborts the process on an error inside an actor, so
each simulation runs in a child process (`python -m projection.simgrid_run DIR`); this module
resolves the workload into op instances (who takes part, the flows' bytes, the message steps to
wait: projection/network.py), writes them with the compute draws, runs the child and reads back
each rank's step ends. SimGrid comes from Debian (python3-simgrid 3.32, linked into the
environment by scripts/setup_env.sh); where it is missing, one line says how to install it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

import numpy as np

from core.errors import UserError
from dist_algos.comm.pattern import MAIN, CommOp, OpKind
from projection.collectives import Algorithm
from projection.network import PEER_LABELS, Network, members, peer_of, ring_edges
from projection.recurrence import Timeline
from projection.workload import Workload

REPO = Path(__file__).resolve().parent.parent
BUCKETS = "buckets"
INSTALL = ("SimGrid is not importable: apt-get install python3-simgrid, then scripts/setup_env.sh links it "
           "into .venv (Debian's python3-simgrid 3.32 for Python 3.11)")


@lru_cache(maxsize=1)
def simgrid_problem() -> Optional[str]:
    """Why the discrete-event engine cannot run here (None: it can); asked once per process."""
    probe = subprocess.run([sys.executable, "-c", "import simgrid"], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
    return None if probe.returncode == 0 else INSTALL


class Resolver:
    """Turns a workload's ops into the instances the child simulates (see simgrid_run's docstring)."""

    def __init__(self, workload: Workload, network: Network, service_s: dict[int, float],
                 bucket_ready: Sequence[float]) -> None:
        self.w, self.net = workload, network
        self.service_s = service_s
        self.bucket_ready = tuple(bucket_ready)
        self.instances: dict[str, dict[str, Any]] = {}
        self.threads: dict[str, list[str]] = {}
        self.pushes: Counter[tuple[int, int]] = Counter()  # (server, worker) -> pushes
        self.train = set(workload.train_ranks)
        self.rounds: Counter[tuple[int, str, tuple[int, ...]]] = Counter()

    def steps_of(self, rank: int, count: int) -> list[list[list[Any]]]:
        out = []
        for step in range(count):
            ops = self.w.ops(rank, step)
            seen: Counter[tuple] = Counter()
            entries = []
            for i, op in enumerate(ops):
                entry = self.entry(rank, step, op, ops[i + 1:], seen)
                if entry is not None:
                    entries.append(entry)
            out.append(entries)
        return out

    def entry(self, rank: int, step: int, op: CommOp, later: Sequence[CommOp], seen: Counter) -> Optional[list[Any]]:
        kind = OpKind(op.kind)
        thread = BUCKETS if op.bucket is not None else op.thread
        if kind in (OpKind.SEND, OpKind.RECV) and op.group.partition(":")[0] not in PEER_LABELS:
            return None  # a group's activation message: modelled by the collective's external trigger
        if kind in (OpKind.SEND, OpKind.RECV):
            peer = peer_of(op.group, rank, self.w.world)
            src, dst = (rank, peer) if kind == OpKind.SEND else (peer, rank)
            seen[("m", src, dst)] += 1
            inst = f"m{step}|{src}>{dst}|{seen[('m', src, dst)]}"
            if inst not in self.instances:
                self.instances[inst] = self.message(op, src, dst)
        elif kind == OpKind.PUSH:
            server = peer_of(op.group, rank, self.w.world)
            seen[("p", server)] += 1
            inst = f"p{step}|{rank}>{server}|{seen[('p', server)]}"
            reply = next((o for o in later if OpKind(o.kind) == OpKind.PULL and o.group == op.group), None)
            self.instances[inst] = {**self.message(op, rank, server), "type": "push",
                                    "reply_bytes": max(reply.recv_bytes, reply.payload_bytes) if reply else 0,
                                    "wait_s": self.service_s.get(server, 0.0)}
            self.pushes[(server, rank)] += 1
        elif kind == OpKind.PULL:
            inst = f"q{step}|{rank}|{seen[('q',)]}"
            seen[("q",)] += 1
            self.instances[inst] = {"type": "pull", "members": [rank], "blocking": op.blocking, "edges": []}
        else:
            group = members(op.group, rank, self.w.world, op.group_size)
            if thread == MAIN:
                seen[("c", op.group, thread)] += 1
                inst = f"c{step}|{thread}|{op.group}|{group[0]}|{seen[('c', op.group, thread)]}"
            else:  # a background thread's k-th op with this group, whichever step it fell in on each member
                self.rounds[(rank, thread, group)] += 1
                inst = f"c|{thread}|{op.group}|{','.join(map(str, group))}|{self.rounds[(rank, thread, group)]}"
            if inst not in self.instances:
                self.instances[inst] = self.collective(op, group)
                if op.bucket is not None:
                    ready = self.bucket_ready
                    self.instances[inst]["ready"] = ready[op.bucket] if op.bucket < len(ready) else 1.0
        blocking = op.blocking or op.bucket is not None
        self.instances[inst]["blocking"] = blocking
        if thread != MAIN:
            self.threads.setdefault(f"{rank}/{thread}", []).append(inst)
        return [inst, thread, blocking]

    def collective(self, op: CommOp, group: Sequence[int]) -> dict[str, Any]:
        edges = ring_edges(sorted(group))
        timing = self.net.group_time(op, sorted(group), edges, self.net.shares(edges))
        nodes, local = self.net.spans(group)
        if timing.algorithm == Algorithm.HIERARCHICAL:
            local = 1  # each of its flows runs between one rank per node
        return {"type": "collective", "members": list(group), "edges": [[f.src, f.dst, f.nbytes] for f in timing.flows],
                "wait_s": timing.latency_s + timing.extra_s, "cap": self.cap(local, group) if nodes > 1 else 0.0,
                "activation_s": self.net.cluster.nic.latency_s if nodes > 1 else self.net.cluster.intra.latency_s}

    def message(self, op: CommOp, src: int, dst: int) -> dict[str, Any]:
        nbytes = max(op.wire_bytes, op.recv_bytes, op.payload_bytes)
        sized = CommOp(OpKind.SEND, op.group, 2, nbytes, nbytes)
        timing = self.net.group_time(sized, sorted((src, dst)), [(src, dst)], self.net.shares([(src, dst)]), set())
        return {"type": "message", "members": [src, dst], "edges": [[src, dst, float(nbytes)]],
                "wait_s": timing.latency_s + timing.extra_s, "cap": self.cap(1, (src, dst)),
                "activation_s": timing.latency_s}

    def cap(self, local: int, group: Sequence[int]) -> float:
        """The most one flow of the group gets: the NICs it can spread over, and across the core
        its per-flow limit."""
        c = self.net.cluster
        cap = c.nic.bandwidth_Bps * min(max(local, 1), c.nics_per_node)
        if c.core_flow_Bps is not None and len({self.net.leaf(self.net.node(r)) for r in group}) > 1:
            cap = min(cap, c.core_flow_Bps)
        return cap


def servers_of(pushes: Counter) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (server, worker), count in sorted(pushes.items()):
        out.setdefault(str(server), {})[str(worker)] = count
    return out


def platform(network: Network, world: int) -> dict[str, Any]:
    c = network.cluster
    node_of = [network.node(r) for r in range(world)]
    nodes = max(node_of) + 1
    leaf_of = [network.leaf(n) for n in range(nodes)]
    return {"nodes": nodes, "node_of": node_of, "leaf_of": leaf_of, "leaves": max(leaf_of) + 1,
            "node_Bps": c.node_Bps, "intra_Bps": c.intra.bandwidth_Bps,
            "leaf_uplink_Bps": min(c.leaf_uplink_Bps(nodes), 1e18), "backplane_Bps": c.backplane_Bps or 0.0}


def simulate_events(workload: Workload, network: Network, before: np.ndarray, after: np.ndarray,
                    service_s: Optional[dict[int, float]] = None, bucket_ready: Sequence[float] = (),
                    timeout_s: float = 900.0, mids: Optional[np.ndarray] = None) -> Timeline:
    """Every training rank's steps (`before`/`after`: (ranks, steps) seconds, in `train_ranks`
    order; `mids`: (ranks, steps, M), a replay's own time between a step's waits) through
    SimGrid; the end of each step and of each rank."""
    problem = simgrid_problem()
    if problem:
        raise UserError(problem)
    resolver = Resolver(workload, network, service_s or {}, bucket_ready)
    count = workload.steps + (1 if any(workload.ops(r, workload.steps) for r in workload.train_ranks) else 0)
    steps = {str(r): resolver.steps_of(r, count) for r in workload.train_ranks}
    spec = {"platform": platform(network, workload.world), "train_ranks": list(workload.train_ranks),
            "instances": resolver.instances, "steps": steps, "threads": resolver.threads,
            "servers": servers_of(resolver.pushes)}
    with tempfile.TemporaryDirectory(prefix="syncopt-events-") as tmp:
        folder = Path(tmp)
        (folder / "spec.json").write_text(json.dumps(spec))
        extra = {"mids": np.asarray(mids, float)} if mids is not None else {}
        np.savez(folder / "compute.npz", before=np.asarray(before, float), after=np.asarray(after, float), **extra)
        done = subprocess.run([sys.executable, "-m", "projection.simgrid_run", str(folder)], cwd=REPO,
                              capture_output=True, text=True, timeout=timeout_s,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
        if done.returncode != 0 or not (folder / "result.json").is_file():
            lines = [ln for ln in (done.stderr or done.stdout).splitlines() if "CRITICAL" in ln or "Error" in ln]
            tail = lines[:3] or (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise RuntimeError(f"the SimGrid simulation failed (exit {done.returncode}): {' | '.join(tail)}")
        result = json.loads((folder / "result.json").read_text())
    ends = [result["step_end"][str(r)] for r in workload.train_ranks]
    width = max(len(e) for e in ends)
    table = np.array([e + [e[-1]] * (width - len(e)) for e in ends])
    return Timeline(table.max(axis=0), table[:, -1])
