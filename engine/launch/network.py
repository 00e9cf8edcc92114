"""An emulated cluster on this machine: one network namespace per node, each node's link shaped with tc.

On loopback, communication is nearly free, so a method that sends 50x fewer bytes shows no gain in
wall-clock. `launch.network` builds the regime the papers are about: `nodes` namespaces (the ranks
split evenly over them, sharing their node's namespace so that traffic inside a node stays on its
loopback, as on a real node), joined by a switch, each node's link limited to `bandwidth_mbit`
(and, where the kernel has netem, delayed by `latency_ms` with `jitter_ms` and dropping `loss_pct`).
This module's one job is to build that and remove it; `engine.launch.loop` starts DeepSpeed's
per-node launcher in every node's namespace, as a no-ssh multi-node job starts it on real nodes.

Layout, all of it in namespaces of its own (nothing is added to the root namespace, so no address,
route or firewall rule of this machine is involved, and concurrent runs cannot collide):

    <prefix>-sw      the switch: bridge `sw0` with one port `n<i>` per node
    <prefix>-n<i>    node i: loopback, and IFNAME (address 10.77.<i // 250>.<i % 250 + 1>/16), the
                     other end of port n<i>

Each node's link is shaped in both directions, as a full-duplex NIC on a switch: the egress of
IFNAME (node to switch) and of port n<i> (switch to node) each get a token bucket (tbf) at the
link's rate, with a netem qdisc inside it for delay, jitter and loss. A packet between two nodes
crosses two such hops (the sender's uplink, the receiver's downlink), so each hop gets half the
delay and jitter and the loss probability that makes the path's loss `loss_pct`.

Nothing may outlive the run: `EmulatedCluster.close` runs after the launch, also after an error.
After a `kill -9` of the launching process nothing can run, so every name carries the owner's pid
and start time (`syncopt-net-<pid>-<start>-...`), and every build first removes the namespaces of
this project whose owner is gone (killing what still runs inside them).
"""
from __future__ import annotations

import dataclasses
import enum
import math
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Any, Optional

from core.errors import UserError
from core.schema import Section, option
from engine.launch.procs import start_time

PREFIX = "syncopt-net"
IFNAME = "syncopt0"  # every node's interface to the switch (GLOO_SOCKET_IFNAME)
MASTER_PORT = 29500  # every node has its own port space, so the default port is always free
_NAME = re.compile(rf"^{PREFIX}-(\d+)-(\d+)-(sw|n\d+)$")


class NetworkKind(enum.StrEnum):
    none = "none"  # this machine's loopback
    emulated = "emulated"  # `nodes` namespaces on this machine, links shaped with tc


@dataclass
class NetworkConfig(Section):
    """`launch.network`: `kind=none` (the default) runs on this machine's loopback; `kind=emulated`
    emulates a cluster of `nodes` on this machine (root, Linux, iproute2), e.g.
    `launch.network.kind=emulated launch.network.bandwidth_mbit=100`."""

    kind: NetworkKind = NetworkKind.none
    nodes: Optional[int] = option(None, ge=2)  # null: one node per rank; must divide launch.nproc
    bandwidth_mbit: float = option(1000.0, gt=0)  # each node's link, each direction (Mbit/s = 1e6 bit/s)
    latency_ms: float = option(0.0, ge=0)  # one-way node-to-node delay added to the link (netem)
    jitter_ms: float = option(0.0, ge=0)  # spread of that delay (netem)
    loss_pct: float = option(0.0, ge=0, lt=100)  # node-to-node packet loss in percent (netem)

    def record(self, nodes: int) -> dict[str, Any]:
        """The link as summary.json and metrics.jsonl record it."""
        return {"nodes": nodes, "bandwidth_mbit": self.bandwidth_mbit, "latency_ms": self.latency_ms,
                "jitter_ms": self.jitter_ms, "loss_pct": self.loss_pct}

    @property
    def emulated(self) -> bool:
        return self.kind == NetworkKind.emulated

    def unused_settings(self) -> list[str]:
        """Link settings given while `kind=none` (they would be silently ignored)."""
        default = NetworkConfig()
        return [f.name for f in dataclasses.fields(self) if f.name != "kind"
                and getattr(self, f.name) != getattr(default, f.name)]

    @property
    def needs_netem(self) -> bool:
        return bool(self.latency_ms or self.jitter_ms or self.loss_pct)


# ---- commands ---------------------------------------------------------------------------------

def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and out.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")
    return out


def _tc(namespace: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["tc", "-n", namespace, *args], capture_output=True, text=True)


def requirements_problem() -> Optional[str]:
    """Why an emulated network cannot be built here (None: it can), before anything is made."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root (it creates network namespaces and shapes their links with tc); run as root or drop launch.network"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return (f"needs iproute2's {' and '.join(missing)} on PATH "
                "(apt-get install iproute2, or scripts/setup_env.sh --test)")
    return None


# ---- owners and stale namespaces --------------------------------------------------------------

def owner_alive(pid: int, start: int) -> bool:
    return start_time(pid) == start


def namespaces() -> list[str]:
    """This machine's named network namespaces."""
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _kill_inside(namespace: str) -> None:
    """SIGKILL every process whose network namespace is `namespace`; wait until they are gone."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pids = [int(p) for p in _ip("netns", "pids", namespace, check=False).stdout.split() if p.isdigit()]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)


def remove_namespace(namespace: str) -> None:
    _kill_inside(namespace)
    _ip("netns", "del", namespace, check=False)


def remove_stale() -> list[str]:
    """Remove this project's namespaces whose owner is gone (a launcher killed with -9); returns them."""
    stale = [name for name in namespaces()
             if (m := _NAME.match(name)) and not owner_alive(int(m.group(1)), int(m.group(2)))]
    for name in stale:
        remove_namespace(name)
    return stale


# ---- the cluster ------------------------------------------------------------------------------

def node_address(node: int) -> str:
    return f"10.77.{node // 250}.{node % 250 + 1}"


def _hop_loss(path_pct: float) -> float:
    """Per-hop loss (percent) such that a path of two hops loses `path_pct`."""
    return 100.0 * (1.0 - math.sqrt(1.0 - path_pct / 100.0))


def _tbf_args(mbit: float) -> list[str]:
    """A token bucket at `mbit`: a burst of at least 64 KiB, enough for a TSO/GSO segment of
    veth, and of 4 ms at the rate (HZ=250 timers); a queue of 50 ms at the rate, short enough
    that TCP sees the bottleneck, long enough that it does not collapse."""
    rate = mbit * 1e6 / 8
    burst = max(64 * 1024 + 1600, int(rate * 0.004))
    limit = max(4 * burst, int(rate * 0.05))
    return ["tbf", "rate", f"{mbit:g}mbit", "burst", str(burst), "limit", str(limit)]


class EmulatedCluster:
    """The namespaces, switch and shaped links of one run (see the module docstring).

    Build with `EmulatedCluster(cfg, ranks).build()` (or `emulated_cluster`); `prefix(node)` runs a
    command on a node; `close()` removes everything and may be called more than once.
    """

    def __init__(self, cfg: NetworkConfig, ranks: int) -> None:
        self.cfg = cfg
        self.nodes = cfg.nodes or ranks
        self.ranks = ranks
        pid = os.getpid()
        self.tag = f"{PREFIX}-{pid}-{start_time(pid)}"
        self.switch = f"{self.tag}-sw"
        self.names = [f"{self.tag}-n{i}" for i in range(self.nodes)]
        self.addresses = [node_address(i) for i in range(self.nodes)]
        self.made: list[str] = []

    @property
    def master_addr(self) -> str:
        return self.addresses[0]

    def prefix(self, node: int) -> list[str]:
        """The command prefix that runs a program on `node`."""
        return ["ip", "netns", "exec", self.names[node]]

    def env(self) -> dict[str, str]:
        """What the ranks need: gloo (and TensorPipe) on the node's link; the namespaces share the
        hostname, which would resolve to loopback."""
        return {"GLOO_SOCKET_IFNAME": IFNAME, "TP_SOCKET_IFNAME": IFNAME}

    def world_info(self) -> dict[str, list[int]]:
        """The nodes and their slots as DeepSpeed's launcher takes them (a hostfile of the addresses)."""
        return {addr: list(range(self.ranks // self.nodes)) for addr in self.addresses}

    # ---- building ---------------------------------------------------------------------------
    def build(self) -> "EmulatedCluster":
        problem = requirements_problem()
        if problem:
            raise UserError(f"launch.network {problem}")
        remove_stale()
        try:
            self._make_switch()
            for node in range(self.nodes):
                self._make_node(node)
        except BaseException:
            self.close()
            raise
        return self

    def _add_namespace(self, name: str) -> None:
        out = _ip("netns", "add", name, check=False)
        if out.returncode:
            raise UserError(f"launch.network: this machine forbids network namespaces ({out.stderr.strip()})")
        self.made.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def _make_switch(self) -> None:
        self._add_namespace(self.switch)
        _ip("-n", self.switch, "link", "add", "sw0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "sw0", "up")

    def _make_node(self, node: int) -> None:
        name, port = self.names[node], f"n{node}"
        self._add_namespace(name)
        _ip("link", "add", IFNAME, "netns", name, "type", "veth", "peer", "name", port, "netns", self.switch)
        _ip("-n", self.switch, "link", "set", port, "master", "sw0")
        _ip("-n", self.switch, "link", "set", port, "up")
        _ip("-n", name, "addr", "add", f"{self.addresses[node]}/16", "dev", IFNAME)
        _ip("-n", name, "link", "set", IFNAME, "up")
        self._shape(name, IFNAME)
        self._shape(self.switch, port)

    def _shape(self, namespace: str, dev: str) -> None:
        """tbf at the link's rate on the egress of `dev`; netem inside it for delay and loss."""
        out = _tc(namespace, "qdisc", "add", "dev", dev, "root", "handle", "1:", *_tbf_args(self.cfg.bandwidth_mbit))
        if out.returncode:
            raise UserError(f"launch.network: tc cannot shape a link here (tbf: {out.stderr.strip()})")
        if not self.cfg.needs_netem:
            return
        cfg = self.cfg
        netem = ["netem", "delay", f"{cfg.latency_ms / 2:g}ms"]
        if cfg.jitter_ms:
            netem += [f"{cfg.jitter_ms / 2:g}ms"]
        if cfg.loss_pct:
            netem += ["loss", f"{_hop_loss(cfg.loss_pct):.6g}%"]
        out = _tc(namespace, "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:", *netem, "limit", "100000")
        if out.returncode:
            raise UserError("launch.network: latency_ms, jitter_ms and loss_pct need the kernel's netem qdisc "
                            f"(sch_netem), which tc cannot use here ({out.stderr.strip()}); set them to 0 "
                            "(bandwidth alone needs only tbf)")

    # ---- removing ---------------------------------------------------------------------------
    def close(self) -> None:
        """Kill what still runs on the nodes and delete every namespace (their links go with them)."""
        for name in reversed(self.made):
            remove_namespace(name)
        self.made.clear()

    def __enter__(self) -> "EmulatedCluster":
        return self.build()

    def __exit__(self, *exc: Any) -> None:
        self.close()
