"""`python -m projection.simgrid_run DIR`: one discrete-event simulation on SimGrid, in a process
of its own (SimGrid allows one engine per process, and an error inside an actor aborts it).

DIR holds `spec.json` (the platform, every op instance, every rank's steps; written by
projection/events.py) and `compute.npz` (each rank's compute before and after its ops, per
step). This process builds the platform, runs one actor per training rank, one per background
thread and one per parameter server, and writes `result.json`: each rank's end of each step.

Platform: one SimGrid host per node, in a Dijkstra zone; a node's NICs are one split-duplex link
(all its NICs' bandwidth) to its leaf switch; a leaf's traffic towards other leaves crosses its
uplink (split duplex) to the core; inside a leaf, flows between nodes cross the leaf's fabric (a
fat pipe, or the emulated cluster's shared backplane). Links have no latency here: the closed
forms' message steps are waited explicitly, so a flow's time is its bytes over its max-min share
(SimGrid's CM02 model: max-min fairness with no TCP correction factors). Flows inside a node
use the intra-node link's bandwidth and share nothing.

Semantics of an op (the same as the recurrence's where both apply; docs/projection.md):
- a collective: its members meet (a barrier), each sends its ring edge's bytes as a flow, they
  meet again when every flow is through, then wait the latency steps and the reduction;
- a message (send/recv): a flow from sender to receiver; both ends wait for it when blocking;
- a push to a parameter server: a flow to the server, which serves pushes one at a time in
  arrival order (`service_s` each) and replies with a flow of the reply's bytes;
- an op of a background thread runs on that thread, in the thread's order; a non-blocking
  collective starts when any member issues it (the first arrival activates the others, as
  WAGMA's externally triggered collectives); a blocking one when every member's training thread
  has issued it, and the training thread waits for it;
- gradient buckets run on the `buckets` stream, each issued when backward has produced it.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import simgrid as sg

BUCKETS = "buckets"


class Sim:
    def __init__(self, spec: dict[str, Any], compute: Any) -> None:
        self.spec = spec
        self.before, self.after = compute["before"], compute["after"]
        self.mids = compute["mids"] if "mids" in compute.files else np.zeros(self.before.shape + (0,))
        self.instances: dict[str, dict[str, Any]] = spec["instances"]
        self.barriers: dict[tuple[str, int], Any] = {}
        self.step_end: dict[int, list[float]] = {}
        self.issued: set[tuple[str, int]] = set()  # (op instance, rank): its training thread issued it
        self.activated: dict[str, set[int]] = {}  # op instance -> members whose thread it has reached
        self.wakeup: dict[tuple[int, str], Any] = {}
        self.done: dict[tuple[str, int], Any] = {}
        self.landing: list[Any] = []

    # ---- platform ----------------------------------------------------------------------------
    def build(self) -> None:
        p = self.spec["platform"]
        zone = sg.NetZone.create_dijkstra_zone("cluster")
        self.hosts = []
        leaves: dict[int, tuple[Any, Any]] = {}
        core = zone.create_router("core") if p["leaves"] > 1 else None
        for leaf in range(p["leaves"]):
            down, up = zone.create_router(f"leaf{leaf}_in"), zone.create_router(f"leaf{leaf}_out")
            fabric = zone.create_link(f"fabric{leaf}", p["backplane_Bps"] or 1e18)
            if not p["backplane_Bps"]:  # a switch's fabric: each flow gets the whole, none shares
                fabric.set_sharing_policy(sg.Link.SharingPolicy.FATPIPE, None)
            fabric.seal()
            zone.add_route(down, up, None, None, [sg.LinkInRoute(fabric)], False)
            if core is not None:
                uplink = zone.create_split_duplex_link(f"uplink{leaf}", p["leaf_uplink_Bps"]).seal()
                zone.add_route(down, core, None, None, [sg.LinkInRoute(uplink, sg.LinkInRoute.UP)], False)
                zone.add_route(core, up, None, None, [sg.LinkInRoute(uplink, sg.LinkInRoute.DOWN)], False)
            leaves[leaf] = (down, up)
        for node in range(p["nodes"]):
            host = zone.create_host(f"node{node}", 1e9).seal()
            nic = zone.create_split_duplex_link(f"nic{node}", p["node_Bps"]).seal()
            down, up = leaves[p["leaf_of"][node]]
            zone.add_route(host.netpoint, down, None, None, [sg.LinkInRoute(nic, sg.LinkInRoute.UP)], False)
            zone.add_route(up, host.netpoint, None, None, [sg.LinkInRoute(nic, sg.LinkInRoute.DOWN)], False)
            self.hosts.append(host)
        zone.seal()

    def host(self, rank: int) -> Any:
        return self.hosts[self.spec["platform"]["node_of"][rank]]

    # ---- flows -----------------------------------------------------------------------------
    def inside(self, src: int, dst: int) -> bool:
        node_of = self.spec["platform"]["node_of"]
        return node_of[src] == node_of[dst]

    def send(self, inst: str, src: int, dst: int, nbytes: float, cap: float) -> tuple[float, Any]:
        """(seconds to wait, flow or None): inside a node the intra-node link, unshared."""
        if self.inside(src, dst):
            return nbytes / self.spec["platform"]["intra_Bps"], None
        comm = sg.Mailbox.by_name(f"{inst}>{src}>{dst}").put_init(None, max(int(nbytes), 1))
        if cap > 0:
            comm.set_rate(cap)
        comm.start()
        return 0.0, comm

    def receive(self, inst: str, src: int, dst: int, nbytes: float) -> tuple[float, Any]:
        if self.inside(src, dst):
            return nbytes / self.spec["platform"]["intra_Bps"], None
        comm, landing = sg.Mailbox.by_name(f"{inst}>{src}>{dst}").get_async()
        self.landing.append(landing)  # where the payload lands: must outlive the transfer
        return 0.0, comm

    @staticmethod
    def finish(pending: list[tuple[float, Any]]) -> None:
        """Wait for every flow; a transfer inside a node runs beside them (its seconds from the start)."""
        start = sg.Engine.clock
        for _, comm in pending:
            if comm is not None:
                comm.wait()
        longest = max((seconds for seconds, _ in pending), default=0.0)
        if start + longest > sg.Engine.clock:
            sg.this_actor.sleep_for(start + longest - sg.Engine.clock)

    def barrier(self, inst: str, phase: int, count: int) -> None:
        key = (inst, phase)
        if key not in self.barriers:
            self.barriers[key] = sg.Barrier(count)
        self.barriers[key].wait()

    def collective(self, rank: int, inst: str) -> None:
        op = self.instances[inst]
        members = op["members"]
        if len(members) > 1:
            self.barrier(inst, 0, len(members))
            pending = [self.send(inst, s, d, b, op["cap"]) for s, d, b in op["edges"] if s == rank]
            pending += [self.receive(inst, s, d, b) for s, d, b in op["edges"] if d == rank]
            self.finish(pending)
            self.barrier(inst, 1, len(members))
        if op["wait_s"] > 0:
            sg.this_actor.sleep_for(op["wait_s"])

    def messages(self, rank: int, insts: list[str]) -> None:
        """Messages issued together: all posted, then all waited for, then the slowest latency."""
        pending = []
        for inst in insts:
            op = self.instances[inst]
            src, dst, nbytes = op["edges"][0]
            pending.append(self.send(inst, src, dst, nbytes, op["cap"]) if rank == src
                           else self.receive(inst, src, dst, nbytes))
        self.finish(pending)
        wait = max(self.instances[inst]["wait_s"] for inst in insts)
        if wait > 0:
            sg.this_actor.sleep_for(wait)

    def run_op(self, rank: int, inst: str) -> None:
        op = self.instances[inst]
        if op["type"] == "collective":
            self.collective(rank, inst)
        elif op["type"] == "message":
            self.messages(rank, [inst])
        elif op["type"] == "push":
            src, dst, nbytes = op["edges"][0]
            sg.Mailbox.by_name(f"server{dst}<{rank}").put((op["reply_bytes"], op["wait_s"]), max(int(nbytes), 1))
        elif op["type"] == "pull":
            sg.Mailbox.by_name(f"reply{rank}").get()

    # ---- actors ----------------------------------------------------------------------------
    def trainer(self, rank: int) -> None:
        index = self.spec["train_ranks"].index(rank)
        ends = self.step_end.setdefault(rank, [])
        for step, ops in enumerate(self.spec["steps"][str(rank)]):
            before = float(self.before[index, step]) if step < self.before.shape[1] else 0.0
            after = float(self.after[index, step]) if step < self.after.shape[1] else 0.0
            main = [o for o in ops if o[1] == "main"]
            others = [o for o in ops if o[1] != "main"]
            ready = [(self.instances[o[0]].get("ready", 1.0), o) for o in others if o[1] == BUCKETS]
            spent = 0.0
            for frac, (inst, thread, _) in sorted(ready):
                sg.this_actor.sleep_for(max(frac * before - spent, 0.0))
                spent = max(spent, frac * before)
                self.issue(rank, thread, inst)
            sg.this_actor.sleep_for(max(before - spent, 0.0))
            for inst, thread, _ in others:
                if thread != BUCKETS:
                    self.issue(rank, thread, inst)
            gaps = [float(g) for g in self.mids[index, step]] if step < self.mids.shape[1] else []
            waits = 0  # wait points passed; a replay's own time between them comes from `gaps`
            blocked = [inst for inst, _, blocking in others if blocking]
            for inst in blocked:
                self.wait_done(inst, rank)
            waits += 1 if blocked else 0
            batch: list[str] = []  # blocking messages issued together (a D-PSGD exchange), waited together
            for inst, _, blocking in main + [("", "", True)]:
                if inst and blocking and self.instances[inst]["type"] == "message":
                    batch.append(inst)
                    continue
                if batch:
                    waits = self.gap(gaps, waits)
                    self.messages(rank, batch)
                    batch = []
                if not inst:
                    break
                if blocking:
                    waits = self.gap(gaps, waits)
                    self.run_op(rank, inst)
                else:
                    sg.Actor.create(f"async{rank}", self.host(rank), self.run_op, rank, inst).daemonize()
            after += sum(gaps[max(waits - 1, 0):])  # more gaps than waits: the rest after them
            if after > 0:
                sg.this_actor.sleep_for(after)
            ends.append(sg.Engine.clock)

    @staticmethod
    def gap(gaps: list[float], waits: int) -> int:
        """Before wait point `waits` (from the second on), the rank's own time since the last."""
        if 0 < waits <= len(gaps) and gaps[waits - 1] > 0:
            sg.this_actor.sleep_for(gaps[waits - 1])
        return waits + 1

    def issue(self, rank: int, thread: str, inst: str) -> None:
        """The training thread reached `inst` of `thread`: wake the thread, and when
        the op is externally triggered, its other members' threads after one message step."""
        self.issued.add((inst, rank))
        self.wake(rank, thread)
        op = self.instances[inst]
        if not op["blocking"] and inst not in self.activated:
            self.activated[inst] = {rank}
            for member in op["members"]:
                if member != rank:
                    sg.Actor.create("activate", self.host(rank), self.activate, inst, member, thread,
                                    op["activation_s"]).daemonize()

    def activate(self, inst: str, member: int, thread: str, delay: float) -> None:
        if delay > 0:
            sg.this_actor.sleep_for(delay)
        self.activated.setdefault(inst, set()).add(member)
        self.wake(member, thread)

    def wake(self, rank: int, thread: str) -> None:
        sem = self.wakeup.get((rank, thread))
        if sem is not None:
            sem.release()

    def done_sem(self, inst: str, rank: int) -> Any:
        key = (inst, rank)
        if key not in self.done:
            self.done[key] = sg.Semaphore(0)
        return self.done[key]

    def wait_done(self, inst: str, rank: int) -> None:
        sem = self.done_sem(inst, rank)
        sem.acquire()
        sem.release()

    def background(self, rank: int, thread: str, queue: list[list[Any]]) -> None:
        sem = self.wakeup.setdefault((rank, thread), sg.Semaphore(0))
        for inst in queue:
            op = self.instances[inst]
            while not ((inst, rank) in self.issued or (not op["blocking"] and rank in self.activated.get(inst, ()))):
                sem.acquire()
            self.run_op(rank, inst)
            self.done_sem(inst, rank).release()

    def serving(self, server: int, worker: int, pushes: int, lock: Any) -> None:
        """A server's thread for one worker: receives its pushes (beside the other workers'), applies
        each under the server's lock (one at a time: the service time), sends the reply."""
        box = sg.Mailbox.by_name(f"server{server}<{worker}")
        for _ in range(pushes):
            reply_bytes, service_s = box.get()
            lock.acquire()
            if service_s > 0:
                sg.this_actor.sleep_for(service_s)
            lock.release()
            if reply_bytes:
                sg.Mailbox.by_name(f"reply{worker}").put_init(None, max(int(reply_bytes), 1)).detach()

    def start(self) -> None:
        for rank in self.spec["train_ranks"]:
            sg.Actor.create(f"rank{rank}", self.host(rank), self.trainer, rank)
        for key, queue in self.spec["threads"].items():
            rank, thread = key.split("/", 1)
            sg.Actor.create(f"{thread}{rank}", self.host(int(rank)), self.background, int(rank), thread, queue)
        for server, workers in self.spec["servers"].items():
            lock = sg.Semaphore(1)
            for worker, pushes in workers.items():
                sg.Actor.create(f"serve{server}<{worker}", self.host(int(server)), self.serving, int(server),
                                int(worker), pushes, lock)


def main(folder: Path) -> None:
    spec = json.loads((folder / "spec.json").read_text())
    compute = np.load(folder / "compute.npz", allow_pickle=False)
    engine = sg.Engine(["projection", "--cfg=network/model:CM02", "--cfg=network/crosstraffic:0",
                        "--cfg=contexts/stack-size:256", "--log=root.thres:critical"])
    sim = Sim(spec, compute)
    sim.build()
    sim.start()
    engine.run()
    (folder / "result.json").write_text(json.dumps({"step_end": {str(k): v for k, v in sim.step_end.items()},
                                                    "clock": sg.Engine.clock}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
