"""Bind a planner Placement exactly to devices in a running Ray cluster.

Steps (reserve -> commit -> rollback, as Volcano and the Kubernetes scheduler framework do):

1. ``publish_node`` stores each hetflow node's topology in Ray's internal KV; ``live_snapshot``
   reads them back with what Ray's resource accounting says is in use, so the planner sees the
   cluster as it is now.
2. ``reserve`` turns a Placement into one placement group: one bundle per rank holding exactly
   its device's resource (``hetflow_dev_<i>``) on exactly its node (label selector on
   ``hetflow.io/node``). A group that is not ready within the timeout is removed and reported
   (Ray would leave it pending forever); any failure removes it.
3. ``BoundPlacement.actor_options(rank)`` gives the ``.options(...)`` for the rank's actor or
   task: the bundle, the device resource and the visibility environment (see
   :mod:`hetflow.runtime.resources`). ``release()`` (or leaving the ``with`` block) removes the
   group and frees the devices.
4. ``reserve_cpus`` is the same for a job with no device: one ``{CPU, memory}`` bundle per
   rank on one node (chosen by label, e.g. Ray's ``ray.io/node-id``, which plain Ray nodes have
   too); ``BoundCpus.actor_options(rank)`` runs a rank there with no device visible.
"""

from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

import ray
from ray.experimental import internal_kv
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from hetflow.core.errors import HetflowError, Unschedulable
from hetflow.core.placement import Placement
from hetflow.core.serialize import node_from_dict, node_to_dict
from hetflow.core.topology import Allocation, ClusterSnapshot, NodeTopology, Vendor
from hetflow.runtime.resources import (
    DEVICE_RESOURCE_PREFIX,
    MIB,
    NODE_LABEL,
    device_ask,
    device_capacity,
    device_resource,
    label_value,
    visibility_env,
)

KV_NAMESPACE = "hetflow"


def publish_node(node: NodeTopology) -> None:
    """Store the node's topology where every driver of this cluster can read it."""
    internal_kv._internal_kv_put(
        f"node/{node.name}", json.dumps(node_to_dict(node)), overwrite=True, namespace=KV_NAMESPACE
    )


def published_nodes() -> dict[str, NodeTopology]:
    keys = internal_kv._internal_kv_list("node/", namespace=KV_NAMESPACE) or []
    nodes = {}
    for key in keys:
        raw = internal_kv._internal_kv_get(key, namespace=KV_NAMESPACE)
        if raw:
            node = node_from_dict(json.loads(raw))
            nodes[node.name] = node
    return nodes


def published_accelerators() -> bool:
    """Whether any published node has an accelerator hetflow manages. CPU-only nodes started
    with ``hetflow node start`` are published too, but a job with ``devices: auto`` on a
    cluster of only those runs on CPUs (as on plain Ray nodes), not on the device planner."""
    from hetflow.core.topology import Vendor

    return any(a.vendor is not Vendor.CPU for n in published_nodes().values()
               for a in n.accelerators)


def _ray_nodes_by_label() -> dict[str, str]:
    """hetflow node label value -> Ray node id, for alive nodes."""
    out = {}
    for info in ray.nodes():
        labels = info.get("Labels") or {}
        if info.get("Alive") and NODE_LABEL in labels:
            out[labels[NODE_LABEL]] = info["NodeID"]
    return out


def live_snapshot(inter_node_gbps: float = 25.0) -> ClusterSnapshot:
    """Published topologies of the alive hetflow nodes, with the devices now held.

    What is held is read from Ray's placement-group table (every group that is not REMOVED and
    holds ``hetflow_dev_*`` bundles), not from Ray's available-resource view: the table changes
    the moment a group is created or removed, while the resource view lags by a report period.
    Devices are only ever taken through placement groups (:func:`reserve`). A bundle that takes
    a device's whole capacity is an exclusive allocation; a smaller one holds that much memory.
    """
    from ray.util import placement_group_table

    topologies = published_nodes()
    alive = _ray_nodes_by_label()
    by_ray_id: dict[str, NodeTopology] = {}
    nodes = []
    for name, node in sorted(topologies.items()):
        node_id = alive.get(label_value(name))
        if node_id is not None:
            nodes.append(node)
            by_ray_id[node_id] = node
    allocs = []
    for group in placement_group_table().values():
        if group.get("state") == "REMOVED":
            continue
        job = group.get("name") or group.get("placement_group_id", "?")
        job = job.removeprefix("hetflow-")
        for index, resources in (group.get("bundles") or {}).items():
            node = by_ray_id.get((group.get("bundles_to_node_id") or {}).get(index, ""))
            for key, amount in resources.items():
                if node is None or not key.startswith(DEVICE_RESOURCE_PREFIX):
                    continue
                dev = int(key[len(DEVICE_RESOURCE_PREFIX):])
                capacity = device_capacity(node.device(dev))
                allocs.append(Allocation(job, node.name, dev, int(amount) * MIB,
                                         exclusive=amount >= capacity))
    return ClusterSnapshot(nodes=tuple(nodes), inter_node_gbps=inter_node_gbps,
                           allocations=tuple(allocs))


@dataclasses.dataclass
class BoundPlacement:
    """A placement reserved in Ray; hand ``actor_options(rank)`` to each rank's actor."""

    placement: Placement
    group: PlacementGroup
    units: tuple[int, ...]
    envs: tuple[dict[str, str], ...]
    cpus_per_rank: float
    released: bool = False

    def actor_options(self, rank: int) -> dict[str, Any]:
        assert not self.released, "this placement was released"
        ref = self.placement.devices[rank]
        return {
            "num_cpus": self.cpus_per_rank,
            "num_gpus": 0,
            "resources": {device_resource(ref.device): self.units[rank]},
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.group, placement_group_bundle_index=rank
            ),
            "runtime_env": {"env_vars": dict(self.envs[rank])},
        }

    def release(self) -> None:
        if not self.released:
            remove_placement_group(self.group)
            self.released = True

    def __enter__(self) -> "BoundPlacement":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def reserve(
    placement: Placement,
    snapshot: ClusterSnapshot,
    *,
    cpus_per_rank: float = 0.0,
    timeout_s: float = 30.0,
) -> BoundPlacement:
    """Create the placement group for ``placement`` and wait until Ray has committed it.

    Raises Unschedulable (after removing the group) when it is not ready in ``timeout_s``:
    a device taken since the snapshot was read, a node gone, or too few CPUs.
    """
    bundles, selectors, units, envs = [], [], [], []
    for ref in placement.devices:
        ask = device_ask(snapshot, [ref], placement.memory_bytes, placement.exclusive)
        bundles.append(ask.bundle(cpus_per_rank))
        selectors.append(ask.selector)
        units.append(ask.resources[device_resource(ref.device)])
        envs.append(ask.env)
    group = placement_group(
        bundles, strategy="PACK", name=f"hetflow-{placement.job_id}",
        bundle_label_selector=selectors,
    )
    try:
        ready, _ = ray.wait([group.ready()], timeout=timeout_s)
        if not ready:
            raise Unschedulable(
                f"job {placement.job_id}: Ray did not commit the placement on "
                f"{', '.join(placement.nodes)} within {timeout_s:g}s (a device was taken since "
                "the snapshot, a node left, or CPUs are short); nothing was kept - "
                "plan again from a fresh snapshot"
            )
    except BaseException:
        remove_placement_group(group)
        raise
    return BoundPlacement(placement, group, tuple(units), tuple(envs), cpus_per_rank)


@dataclasses.dataclass
class BoundCpus:
    """CPUs (and host memory) reserved on one node for a job with no device: one bundle per
    rank. ``actor_options(rank)`` runs a rank in its bundle with no device visible."""

    group: PlacementGroup
    cpus_per_rank: float
    memory_per_rank: int
    released: bool = False

    def actor_options(self, rank: int) -> dict[str, Any]:
        assert not self.released, "this reservation was released"
        options: dict[str, Any] = {
            "num_cpus": self.cpus_per_rank,
            "num_gpus": 0,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.group, placement_group_bundle_index=rank
            ),
            "runtime_env": {"env_vars": visibility_env(Vendor.CPU, [])},
        }
        if self.memory_per_rank:
            options["memory"] = self.memory_per_rank
        return options

    def release(self) -> None:
        if not self.released:
            remove_placement_group(self.group)
            self.released = True

    def __enter__(self) -> "BoundCpus":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def reserve_cpus(
    name: str,
    node_selector: dict[str, str],
    *,
    ranks: int,
    cpus: float,
    memory_bytes: int = 0,
    timeout_s: float = 30.0,
) -> BoundCpus:
    """Reserve ``cpus`` (and ``memory_bytes``) in all, split over ``ranks`` bundles, on the one
    node ``node_selector`` matches (e.g. ``{"ray.io/node-id": ID}`` - any Ray node, hetflow's or
    not - or ``{NODE_LABEL: name}``); wait until Ray has committed it.

    Raises Unschedulable (after removing the group) when it is not ready in ``timeout_s``.
    """
    assert ranks >= 1 and cpus > 0
    per_cpu = cpus / ranks
    per_mem = -(-memory_bytes // ranks) if memory_bytes else 0
    bundle: dict[str, float] = {"CPU": per_cpu}
    if per_mem:
        bundle["memory"] = per_mem
    group = placement_group([dict(bundle) for _ in range(ranks)], strategy="PACK", name=f"hetflow-{name}",
                            bundle_label_selector=[dict(node_selector) for _ in range(ranks)])
    try:
        ready, _ = ray.wait([group.ready()], timeout=timeout_s)
        if not ready:
            where = ", ".join(f"{k}={v}" for k, v in node_selector.items())
            raise Unschedulable(
                f"job {name}: Ray did not commit {cpus:g} CPUs on the node {where} within "
                f"{timeout_s:g}s (taken since the decision, or the node left); nothing was kept"
            )
    except BaseException:
        remove_placement_group(group)
        raise
    return BoundCpus(group, per_cpu, per_mem)


@dataclasses.dataclass(frozen=True)
class BoundDevice:
    """What a running process holds: ``where`` is ``node:device[,device...]``,
    ``ray-gpu:<ids>`` or ``cpu``; ``units`` the share of the hetflow device resource (MiB)."""

    where: str
    units: float = 0.0


def bind_assigned_devices() -> BoundDevice:
    """In a Ray task, actor or Tune trial: make the hetflow devices its bundle holds the only
    visible ones.

    Call before anything initialises a GPU. The devices come from the resources Ray assigned
    to this process (``hetflow_dev_<i>``), their vendor from the node's published topology.
    """
    import os

    context = ray.get_runtime_context()
    assigned = context.get_assigned_resources()
    held = {int(name[len(DEVICE_RESOURCE_PREFIX):]): amount for name, amount in assigned.items()
            if name.startswith(DEVICE_RESOURCE_PREFIX)}
    if not held:
        gpu_ids = ray.get_gpu_ids()
        return BoundDevice(f"ray-gpu:{','.join(str(g) for g in gpu_ids)}" if gpu_ids else "cpu")
    devices = sorted(held)
    label = (context.get_node_labels() or {}).get(NODE_LABEL, "")
    node = next((n for n in published_nodes().values() if label_value(n.name) == label), None)
    vendor = node.device(devices[0]).vendor if node is not None else Vendor.NVIDIA
    os.environ.update(visibility_env(vendor, devices))
    name = node.name if node is not None else label
    return BoundDevice(f"{name}:{','.join(str(d) for d in devices)}", float(sum(held.values())))


def wait_removed(group: PlacementGroup, timeout_s: float = 10.0) -> bool:
    """True once Ray reports the group REMOVED (used by tests and cleanup checks)."""
    from ray.util import placement_group_table

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if placement_group_table(group).get("state") == "REMOVED":
            return True
        time.sleep(0.1)
    return False


__all__ = [
    "BoundCpus", "BoundDevice", "BoundPlacement", "bind_assigned_devices", "publish_node", "reserve_cpus", "published_nodes", "live_snapshot", "reserve",
    "wait_removed", "DEVICE_RESOURCE_PREFIX", "HetflowError",
]
