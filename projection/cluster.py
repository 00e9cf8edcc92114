"""A cluster preset (`cluster=NAME`, conf/cluster/NAME.yaml): the system half of the seam.

A preset describes a machine, never a workload: how many ranks share a node, the collective
library, and per link class the latency of one message step and the bandwidth one flow gets:

- `intra_node`: between ranks of one node (NVLink, PCIe, a host's loopback);
- `nic`: a node's network interfaces (`per_node` of them), each direction;
- `core`: what lies between the nodes' switches: `nodes_per_leaf` nodes under one leaf switch
  whose uplinks carry `nodes_per_leaf x per_node x nic` / `oversubscription` (a blocking core
  shares it), with `latency_us` more per step that crosses it; or, for the emulated cluster, a
  `backplane_gbit_s` that every flow between nodes shares (the one kernel that forwards them).

Every number of a preset carries its source, as `{value: X, source: "..."}`: a vendor datasheet,
an nccl-tests report, a published measurement, or the calibration that fitted it
(`calibration: NAME` reads conf/cluster/calibration/NAME.json, written by
bench/calibrate_network.py with its commit, machine and residuals). A bare number, or one with an
empty source, is refused in one line naming its key: a projection is only as good as the
provenance of its constants.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml
from omegaconf import OmegaConf

from core.errors import UserError
from projection.collectives import Library

REPO = Path(__file__).resolve().parent.parent
PRESETS = REPO / "conf" / "cluster"
CALIBRATIONS = PRESETS / "calibration"
GBIT = 1e9 / 8  # bytes per second in one Gbit/s


@dataclass(frozen=True)
class LinkClass:
    """One class of link: alpha (seconds per message step) and the bandwidth of one flow."""

    name: str
    latency_s: float
    bandwidth_Bps: float
    # what a flow gets through at once after the link has idled (the emulated link's token bucket
    # depth); 0 for a real link
    burst_bytes: float = 0.0
    # the share of a flow's rate left when its node also takes in a flow (the acknowledgements of
    # the incoming data share the outgoing link); 1 where they do not count (full-duplex RDMA)
    duplex_efficiency: float = 1.0

    @property
    def beta(self) -> float:
        """Seconds per byte."""
        return 1.0 / self.bandwidth_Bps


@dataclass(frozen=True)
class Cluster:
    """A preset, loaded and checked (see the module docstring); `sources` maps every number's key
    to where it comes from, and is what `project` prints among its assumptions."""

    name: str
    description: str
    library: Library
    ranks_per_node: int
    intra: LinkClass
    nic: LinkClass
    nics_per_node: int = 1
    core_latency_s: float = 0.0
    nodes_per_leaf: Optional[int] = None  # None: every node under one switch (or `leaves` of them)
    leaves: Optional[int] = None  # the nodes split evenly over this many leaves (regions, pods)
    oversubscription: float = 1.0
    core_flow_Bps: Optional[float] = None  # the most one flow gets across the core (a WAN's per-flow limit)
    backplane_Bps: Optional[float] = None  # shared by every flow between nodes (emulated: the kernel)
    collective_latency_s: float = 0.0  # fixed cost of launching one collective (NCCL's base latency)
    message_latency_s: float = 0.0  # a point-to-point message's latency where it is not a step's alpha (0: alpha)
    # all-reduce across nodes as Horovod's HOROVOD_HIERARCHICAL_ALLREDUCE runs it (in the node, then
    # across, then in the node) rather than the library's flat ring or tree
    hierarchical: bool = False
    host_s_per_byte: float = 0.0  # software cost per byte outside the link (gloo and the kernel's copies)
    reduce_s_per_byte: float = 0.0  # gamma: one byte reduced
    # the emulated cluster's nodes share one host's cores: with more ranks busy than cores, every
    # software cost (a message step's, a byte reduced or copied) stretches by
    # 1 + oversubscribed x (busy - cores) / busy (projection/network.py)
    host_cores: Optional[int] = None
    oversubscribed: float = 0.0
    sources: dict[str, str] = field(default_factory=dict)
    calibration: Optional[dict[str, Any]] = None  # the fit's record, for a calibrated preset

    def node_of(self, rank: int) -> int:
        """Ranks fill nodes in order (rank r on node r // ranks_per_node), as a hostfile places them."""
        return rank // self.ranks_per_node

    def leaf_of(self, node: int, nodes: int) -> int:
        """The leaf switch of `node` among `nodes` nodes."""
        if self.nodes_per_leaf is not None:
            return node // self.nodes_per_leaf
        if self.leaves is not None:
            return node * self.leaves // max(nodes, 1)
        return 0

    @property
    def node_Bps(self) -> float:
        """All of a node's NICs together, each direction."""
        return self.nic.bandwidth_Bps * self.nics_per_node

    def leaf_uplink_Bps(self, nodes: int) -> float:
        """A leaf switch's capacity towards the core, each direction (infinite under one switch)."""
        if self.nodes_per_leaf is None and self.leaves is None:
            return math.inf
        per_leaf = self.nodes_per_leaf or math.ceil(nodes / (self.leaves or 1))
        return per_leaf * self.node_Bps / self.oversubscription


# ---- reading a preset --------------------------------------------------------------------------

def sourced(node: Any, key: str, where: str, sources: dict[str, str], positive: bool = True) -> float:
    """The value of `node[key]`, which must be `{value: X, source: "..."}`; its source recorded."""
    item = node.get(key) if isinstance(node, dict) else None
    path = f"{where}.{key}"
    if item is None:
        raise UserError(f"{path} is missing; give it as {{value: X, source: '...'}}")
    if not isinstance(item, dict) or set(item) != {"value", "source"}:
        raise UserError(f"{path}={item!r}: every number of a cluster preset is {{value: X, source: '...'}} "
                        "naming where it comes from (a datasheet, an nccl-tests report, a measurement)")
    value, source = item["value"], item["source"]
    if not isinstance(source, str) or not source.strip():
        raise UserError(f"{path}.source is empty: say where {value!r} comes from")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (positive and value <= 0) or value < 0:
        raise UserError(f"{path}.value={value!r}: expected a {'positive' if positive else 'non-negative'} number")
    sources[path] = source
    return float(value)


def optional_sourced(node: Any, key: str, where: str, sources: dict[str, str],
                     positive: bool = True) -> Optional[float]:
    if not isinstance(node, dict) or node.get(key) is None:
        return None
    return sourced(node, key, where, sources, positive)


def link(node: Any, name: str, where: str, sources: dict[str, str]) -> LinkClass:
    if not isinstance(node, dict):
        raise UserError(f"{where}.{name} is missing: give its bandwidth_gbit_s and latency_us, each with its source")
    here = f"{where}.{name}"
    return LinkClass(name, sourced(node, "latency_us", here, sources, positive=False) * 1e-6,
                     sourced(node, "bandwidth_gbit_s", here, sources) * GBIT)


def plain(node: Any) -> Any:
    """A composed config node as plain dicts and lists (OmegaConf's, or already plain)."""
    if OmegaConf.is_config(node):
        return OmegaConf.to_container(node, resolve=True)
    return node


def load_cluster(node: Any) -> Cluster:
    """The preset `cluster=NAME` composed (a mapping), checked; one line for anything wrong."""
    node = plain(node)
    if not isinstance(node, dict) or not node.get("name"):
        names = ", ".join(preset_names())
        raise UserError(f"no cluster chosen: add cluster=NAME ({names})")
    where = "cluster"
    sources: dict[str, str] = {}
    library = node.get("library", "gloo")
    if library not in {lib.value for lib in Library}:
        raise UserError(f"cluster.library={library!r}: expected one of {', '.join(lib.value for lib in Library)}")
    if node.get("calibration"):
        return calibrated_cluster(node, Library(library), sources)
    core = node.get("core") or {}
    leaf = optional_sourced(core, "nodes_per_leaf", f"{where}.core", sources)
    leaves = optional_sourced(core, "leaves", f"{where}.core", sources)
    backplane = optional_sourced(core, "backplane_gbit_s", f"{where}.core", sources)
    flow = optional_sourced(core, "flow_gbit_s", f"{where}.core", sources)
    per_node = int(sourced(node, "ranks_per_node", where, sources))
    hierarchical = node.get("hierarchical_allreduce", False)
    if not isinstance(hierarchical, bool):
        raise UserError(f"cluster.hierarchical_allreduce={hierarchical!r}: expected true or false")
    intra = (link(node.get("intra_node"), "intra_node", where, sources) if per_node > 1 or node.get("intra_node")
             else LinkClass("intra_node", 0.0, math.inf))  # one rank per node: never crossed
    return Cluster(
        name=str(node["name"]), description=str(node.get("description", "")), library=Library(library),
        ranks_per_node=per_node, intra=intra,
        nic=link(node.get("nic"), "nic", where, sources),
        nics_per_node=int(sourced(node.get("nic") or {}, "per_node", f"{where}.nic", sources)),
        core_latency_s=(optional_sourced(core, "latency_us", f"{where}.core", sources, positive=False) or 0.0) * 1e-6,
        nodes_per_leaf=int(leaf) if leaf else None, leaves=int(leaves) if leaves else None,
        oversubscription=optional_sourced(core, "oversubscription", f"{where}.core", sources) or 1.0,
        core_flow_Bps=flow * GBIT if flow else None, hierarchical=hierarchical,
        backplane_Bps=backplane * GBIT if backplane else None,
        collective_latency_s=(optional_sourced(node, "collective_latency_us", where, sources, False) or 0.0) * 1e-6,
        reduce_s_per_byte=1.0 / (sourced(node, "reduce_gbyte_s", where, sources) * 1e9),
        sources=sources)


def calibrated_cluster(node: dict[str, Any], library: Library, sources: dict[str, str]) -> Cluster:
    """A preset whose links come from a calibration file (the emulated cluster): the fitted
    alpha, efficiency, host cost and backplane, applied to the nominal rate of the links."""
    name = str(node["calibration"])
    record = read_calibration(name)
    fit = record["params"]
    origin = (f"fitted by {record.get('fitted_by', 'bench/calibrate_network.py')} at {record.get('commit', '?')} "
              f"on {record.get('machine', '?')} (conf/cluster/calibration/{name}.json)")
    nominal = sourced(node, "nominal_mbit", "cluster", sources)
    per_flow = nominal * 1e6 / 8 * fit["efficiency"]
    for key in ("alpha_s", "efficiency", "burst_bytes", "duplex", "message_s", "host_s_per_byte", "reduce_s_per_byte",
                "backplane_mbit", "host_cores", "oversubscribed"):
        sources[f"calibration.{key}"] = origin
    backplane = fit.get("backplane_mbit")
    loopback = LinkClass("intra_node", fit.get("intra_alpha_s", fit["alpha_s"]), fit.get("intra_Bps", 1e10))
    return Cluster(
        name=str(node["name"]), description=str(node.get("description", "")), library=library,
        ranks_per_node=int(sourced(node, "ranks_per_node", "cluster", sources)),
        intra=loopback, nic=LinkClass("nic", fit["alpha_s"], per_flow, fit.get("burst_bytes") or 0.0,
                                       fit.get("duplex") or 1.0), nics_per_node=1,
        backplane_Bps=backplane * 1e6 / 8 if backplane else None,
        host_s_per_byte=fit.get("host_s_per_byte") or 0.0, reduce_s_per_byte=fit.get("reduce_s_per_byte") or 0.0,
        message_latency_s=fit.get("message_s") or 0.0, host_cores=fit.get("host_cores") or None,
        oversubscribed=fit.get("oversubscribed") or 0.0, sources=sources,
        calibration=record)


def read_calibration(name: str, folder: Optional[Path] = None) -> dict[str, Any]:
    """A calibration file (JSON, no code), checked for the fields a projection reads."""
    folder = folder or CALIBRATIONS
    path = folder / f"{name}.json"
    if not path.is_file():
        found = ", ".join(sorted(p.stem for p in folder.glob("*.json"))) or "none"
        raise UserError(f"cluster.calibration={name}: no {path}; run bench/calibrate_network.py "
                        f"(calibrations here: {found})")
    try:
        record = json.loads(path.read_text())
        params = record["params"]
        for key in ("alpha_s", "efficiency"):
            float(params[key])
        record["residuals"]["median"], record["residuals"]["worst"]  # noqa: B018 - must be there
    except (ValueError, KeyError, TypeError) as err:
        raise UserError(f"{path} is not a calibration file ({type(err).__name__}: {err}); "
                        "write it again with bench/calibrate_network.py") from None
    return record


def preset_names(folder: Path = PRESETS) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.yaml"))


def load_preset(name: str, folder: Path = PRESETS) -> Cluster:
    """A preset by name, read from its YAML file (what `cluster=NAME` composes)."""
    path = folder / f"{name}.yaml"
    if not path.is_file():
        raise UserError(f"cluster={name}: no such preset; available: {', '.join(preset_names(folder))}")
    return load_cluster(yaml.safe_load(path.read_text()))
