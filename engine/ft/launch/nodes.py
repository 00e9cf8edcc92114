"""A fault-tolerant job over several nodes: one supervisor per node, meeting in the run directory.

With `launch.hostfile` and `launch.no_ssh=true` (slurm/syncopt.sbatch starts it so), the same
command runs on every node; each node's cli.py supervises only the replicas of its own hostfile
line (replica indices as DeepSpeed numbers the ranks, node by node). What one supervisor must know
of the others travels through the run directory, which a no-ssh job already requires to be shared
(node 0's launch record, which names every node's join token, proves it before anything starts):

- `logs/ft_node_<k>.json`, rewritten by node k every poll: its replicas (done, exit codes,
  restarts), its failures, the replicas it stopped as outrun, and `ended` when it ended the job
  (a user error, the lighthouse's death) so that every node ends with it;
- the replicas' own files (ready flags, heartbeats, summaries), as on one node.

Node 0 starts the lighthouse on `launch.master_addr:launch.master_port` (the port every node
already agrees on; in this mode no replica uses it for a store), gives the start gate's go when
every replica of every node is ready, waits for every node's replicas to be done, writes the job's
summary and then `logs/ft_job.json`, which the other nodes wait for so that every node exits with
the job's code. A node whose record has not changed for `stale_s` is taken as lost (its machine or
supervisor died): its replicas count as done, so that the job can end.
"""
from __future__ import annotations

import secrets
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from core.run_files import (go_flag, quorum_lost_flag, read_json, read_launch_record, wait_for, write_json_atomic,
                            write_launch_record)
from core.rundir import RunDir
from engine.launch.config import node_plan_of


@dataclass
class NodeLayout:
    """Where this supervisor stands: node `node` of `nodes`, owning replicas `indices` of `count`,
    its replicas listening on `host`; the lighthouse is (or will be) on `lighthouse_host`:`lighthouse_port`
    (port None: a free one, chosen by node 0 of a one-node job)."""

    node: int
    nodes: int
    count: int
    indices: list[int]
    host: str
    lighthouse_host: str
    lighthouse_port: Optional[int] = None

    @property
    def multi(self) -> bool:
        return self.nodes > 1


def resolve(host: str) -> str:
    """A hostfile's name as the address to bind (torchft's lighthouse binds an address, not a name)."""
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


def layout_of(launch: Any, count: int) -> NodeLayout:
    """This node's layout from the launch section: one node, or this line of a no-ssh hostfile."""
    if not launch.hostfile:
        host = launch.master_addr or "127.0.0.1"
        return NodeLayout(0, 1, count, list(range(count)), host, host)
    plan = node_plan_of(launch)
    node = int(launch.node_rank)
    return NodeLayout(node, len(plan.hosts), count, list(plan.ranks_of(node)), resolve(plan.hosts[node]),
                      resolve(launch.master_addr or plan.hosts[0]), int(launch.master_port))


@dataclass
class NodeRecord:
    """What node `node`'s supervisor knows of its own replicas (logs/ft_node_<k>.json)."""

    node: int
    replicas: dict[str, dict[str, Any]] = field(default_factory=dict)  # index -> done, exits, restarts
    failures: list[dict[str, Any]] = field(default_factory=list)
    outrun: list[dict[str, Any]] = field(default_factory=list)
    ended: Optional[str] = None  # why this node ended the job early (None: it has not)
    code: int = 0  # the exit code that ending carries
    time: float = 0.0

    def finished(self) -> bool:
        return all(r["done"] for r in self.replicas.values())


def node_record_path(run_dir: RunDir, node: int) -> Path:
    return run_dir.logs / f"ft_node_{node}.json"


def job_end_path(run_dir: RunDir) -> Path:
    return run_dir.logs / "ft_job.json"


def write_node_record(run_dir: RunDir, record: NodeRecord) -> None:
    record.time = time.time()
    write_json_atomic(node_record_path(run_dir, record.node), asdict(record))


def read_node_record(run_dir: RunDir, node: int) -> Optional[NodeRecord]:
    try:
        return NodeRecord(**read_json(node_record_path(run_dir, node)))
    except TypeError:  # not there yet, cut short, or not a node record
        return None


def write_job_end(run_dir: RunDir, code: int, ended: str) -> None:
    write_json_atomic(job_end_path(run_dir), {"code": code, "ended": ended, "time": time.time()})


def read_job_end(run_dir: RunDir) -> Optional[dict[str, Any]]:
    return read_json(job_end_path(run_dir))


def join_path(run_dir: RunDir, node: int) -> Path:
    return run_dir.logs / f"ft_join_{node}.json"


def meet(run_dir: RunDir, layout: NodeLayout, record: dict[str, Any], wait_s: float,
         abort: Callable[[], bool] = lambda: False) -> None:
    """Several nodes: start this attempt together, none of them reading the last attempt's files.

    Node k > 0 writes a fresh token to logs/ft_join_<k>.json (again whenever it is gone: node 0
    clears the last attempt's files when it starts) and proceeds only when node 0's launch record
    carries that token. Node 0, which has already cleared the old files and started the lighthouse,
    writes its launch record once every node has joined. A record of an earlier attempt can
    therefore never be taken for this one's (seen: a node that started before node 0 read the
    earlier attempt's 'lighthouse died' and ended at once). `abort`: a stop signal came; stop
    waiting (the caller ends)."""
    if layout.node == 0:
        tokens: dict[str, str] = {}

        def everyone_joined() -> Optional[bool]:
            if abort():
                return True
            tokens.clear()
            for node in range(1, layout.nodes):
                joined = read_json(join_path(run_dir, node))
                if isinstance(joined, dict) and "token" in joined:
                    tokens[str(node)] = joined["token"]
            if len(tokens) < layout.nodes - 1:
                return None
            write_launch_record(run_dir, {**record, "tokens": tokens, "time": time.time()})
            return True

        def missing() -> str:
            late = sorted(set(range(1, layout.nodes)) - {int(k) for k in tokens})
            return (f"fault-tolerant mode: node(s) {late} did not start within launch.node_wait_s={wait_s:.0f} s; "
                    "start the same command on every node (launch.node_rank=N), with the run directory on storage "
                    "they share")

        wait_for(everyone_joined, wait_s, 0.2, missing)
        return
    token = secrets.token_hex(8)

    def taken_in() -> Optional[bool]:
        if abort():
            return True
        path = join_path(run_dir, layout.node)
        mine = read_json(path)
        if not isinstance(mine, dict) or mine.get("token") != token:
            write_json_atomic(path, {"token": token, "node": layout.node})
        seen = read_launch_record(run_dir)
        if isinstance(seen, dict) and seen.get("mode") == record["mode"] \
                and seen.get("tokens", {}).get(str(layout.node)) == token:
            return True
        return None

    wait_for(taken_in, wait_s, 0.2, lambda: (
        f"fault-tolerant mode: node 0 did not take this node ({layout.node}) into the job within "
        f"launch.node_wait_s={wait_s:.0f} s: start node 0 with the same hostfile and launch.master_port, and keep "
        "the run directory on storage every node shares"))


def clear_job_files(run_dir: RunDir, nodes: int) -> None:
    """Node 0, before a job (or its resume) starts: the last attempt's go, ready flags, node
    records, job end, stop marker and lost quorum must not be read as this attempt's."""
    logs = run_dir.logs
    stale = [go_flag(logs), quorum_lost_flag(logs), job_end_path(run_dir), run_dir.stopped, run_dir.root / "ft_ended.json",
             *logs.glob("replica_*.ready")]
    stale += [node_record_path(run_dir, k) for k in range(nodes)] + [join_path(run_dir, k) for k in range(nodes)]
    stale += [run_dir.launch_record]
    for path in stale:
        path.unlink(missing_ok=True)


class NodeWatch:
    """The other nodes' records as this node sees them, each judged by when its content last
    changed on this node's clock (nodes' clocks may differ): a node whose record has not changed
    for `stale_s`, or has not appeared within `first_s` of this watch's start, is lost."""

    def __init__(self, run_dir: RunDir, layout: NodeLayout, stale_s: float, first_s: float) -> None:
        self.run_dir, self.layout, self.stale_s, self.first_s = run_dir, layout, stale_s, first_s
        self.started = time.monotonic()
        self._seen: dict[int, tuple[float, float]] = {}  # node -> (its record's time field, when it changed here)
        self.records: dict[int, NodeRecord] = {}

    def poll(self) -> None:
        now = time.monotonic()
        for node in range(self.layout.nodes):
            if node == self.layout.node:
                continue
            record = read_node_record(self.run_dir, node)
            if record is None:
                continue
            if self._seen.get(node, (None, 0.0))[0] != record.time:
                self._seen[node] = (record.time, now)
            self.records[node] = record

    def lost(self, node: int) -> bool:
        now = time.monotonic()
        if node not in self._seen:
            return now - self.started > self.first_s
        return now - self._seen[node][1] > self.stale_s and not self.records[node].finished()

    def others(self) -> list[int]:
        return [k for k in range(self.layout.nodes) if k != self.layout.node]

    def ended(self) -> Optional[NodeRecord]:
        """Another node's record that ended the job (a user error, the lighthouse's death)."""
        return next((r for r in self.records.values() if r.ended), None)

    def remote_replicas(self) -> dict[int, dict[str, Any]]:
        """Every other node's replicas: done, exits, restarts; a lost node's are done (failed)."""
        out: dict[int, dict[str, Any]] = {}
        for node in self.others():
            record = self.records.get(node)
            lost = self.lost(node)
            for index, state in (record.replicas.items() if record else []):
                out[int(index)] = {**state, "done": state["done"] or lost}
        return out

    def all_done(self) -> bool:
        return all((self.records.get(k) is not None and self.records[k].finished()) or self.lost(k)
                   for k in self.others())
