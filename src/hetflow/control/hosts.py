"""The CPUs in the controller's view of the cluster: every alive Ray node's CPUs and memory.

    view = host_view(live_snapshot(gbps), ray.nodes(), placement_group_table())
    view.snapshot      # hetflow nodes + plain Ray nodes, cpu_cores/host memory as Ray counts them
    view.ray_ids       # node name -> Ray node id (what a CPU job's reservation is pinned to)
    view.cpu_holds     # CPUs each placement group holds, by node

Which nodes take CPU jobs (docs/controller.md, "CPU jobs"):

- **hetflow nodes** (``hetflow node start``: published topology, ``hetflow.io/node`` label),
  with or without accelerators, under their published name;
- **plain Ray nodes** (``ray start`` without hetflow: no published topology), named
  ``ray-<first 12 hex digits of the node id>``; they hold no devices hetflow knows.

The CPU count is Ray's ``CPU`` resource of the node (what a placement group can reserve, e.g.
``--num-cpus 2``), not the host's core count; memory is Ray's ``memory`` resource. A node that
gives Ray no CPUs still appears (device jobs need it) with 0 CPUs.

Pure: it reads the dictionaries Ray returns; the controller passes them in.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from hetflow.control.scheduler import CpuHold
from hetflow.core.topology import ClusterSnapshot, NodeTopology
from hetflow.runtime.resources import NODE_LABEL, label_value

PLAIN_NODE_PREFIX = "ray-"
NODE_ID_LABEL = "ray.io/node-id"  # set by Ray on every node


@dataclass(frozen=True)
class HostView:
    snapshot: ClusterSnapshot
    ray_ids: Mapping[str, str]
    cpu_holds: tuple[CpuHold, ...]

    def selector(self, node: str) -> dict[str, str]:
        """The label selector that pins a bundle or an actor to ``node``."""
        return {NODE_ID_LABEL: self.ray_ids[node]}


def plain_node_name(node_id: str) -> str:
    return PLAIN_NODE_PREFIX + node_id[:12]


def host_view(published: ClusterSnapshot, ray_nodes: Iterable[Mapping[str, Any]],
              pg_table: Mapping[str, Mapping[str, Any]]) -> HostView:
    """``published`` (``live_snapshot``: alive hetflow nodes, devices held) with every alive
    Ray node's CPUs and memory, plus the plain Ray nodes (see the module docstring)."""
    by_label = {label_value(n.name): n for n in published.nodes}
    nodes: dict[str, NodeTopology] = {n.name: n for n in published.nodes}
    ray_ids: dict[str, str] = {}
    for info in ray_nodes:
        if not info.get("Alive"):
            continue
        node_id = str(info["NodeID"])
        resources = info.get("Resources") or {}
        cpus = int(resources.get("CPU", 0))
        memory = int(resources["memory"]) if "memory" in resources else None
        label = (info.get("Labels") or {}).get(NODE_LABEL)
        hetflow = by_label.get(label) if label else None
        if hetflow is not None:
            name = hetflow.name
            nodes[name] = dataclasses.replace(hetflow, cpu_cores=cpus, host_memory_bytes=memory)
        else:  # a plain Ray node (or a hetflow node whose topology is not published yet)
            name = plain_node_name(node_id)
            nodes[name] = NodeTopology(name, cpu_cores=cpus, host_memory_bytes=memory, sources=("ray",))
        ray_ids[name] = node_id
    names = {node_id: name for name, node_id in ray_ids.items()}
    holds = []
    for group in pg_table.values():
        if group.get("state") == "REMOVED":
            continue
        job = str(group.get("name") or group.get("placement_group_id", "?")).removeprefix("hetflow-")
        where = group.get("bundles_to_node_id") or {}
        for index, resources in (group.get("bundles") or {}).items():
            node = names.get(where.get(index, ""))
            if node is not None and resources.get("CPU"):
                holds.append(CpuHold(job, node, float(resources["CPU"])))
    ordered = tuple(nodes[n] for n in sorted(nodes, key=lambda n: (n.startswith(PLAIN_NODE_PREFIX), n)))
    return HostView(dataclasses.replace(published, nodes=ordered), ray_ids, tuple(holds))


__all__ = ["HostView", "NODE_ID_LABEL", "PLAIN_NODE_PREFIX", "host_view", "plain_node_name"]
