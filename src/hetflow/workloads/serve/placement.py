"""Where a model's replicas run: hetflow's planner -> one Serve deployment per device.

Ray Serve gives every replica of one deployment the same options, while on hetflow nodes a
replica must hold its own device's resource (``hetflow_dev_<i>``, in MiB of device memory) on
its own node and see exactly that device. So a model becomes **one deployment per planned
device** (a :class:`ReplicaGroup`):

* Each replica slot (``replicas``, or autoscaling's ``max_replicas``) is planned as its own
  one-device job, shareable by memory (``devices.share``) or exclusive, against the live
  snapshot with the slots already planned applied - so several small replicas share a device
  while their memory fits, and the plan never over-commits a device.
* Slots on the same device form a group: ``placement_group_bundles=[{hetflow_dev_<i>: MiB,
  CPU: c}]`` with ``placement_group_bundle_label_selector=[{hetflow.io/node: <node>}]`` (Serve
  makes one such group per replica, so Ray's resource accounting holds each replica's memory),
  and a ``runtime_env`` whose visibility variables name exactly that device (set before the
  worker process starts, and never rewritten by Ray: see :mod:`hetflow.runtime.resources`).
* The gateway spreads a model's requests over its groups.

Without hetflow devices a model is one group: CPU replicas, or (``devices: gpu`` on Ray's own
GPU nodes) replicas with ``num_gpus=gpu_fraction``, where Ray sets the visibility itself.

Autoscaling on hetflow devices: a group scales between ``max(1, its share of min_replicas)``
and the slots planned on its device, so each device used keeps one replica running.

Pure: no ray import; the live snapshot and Ray's GPU count are passed in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from hetflow.core.errors import InputError, Unschedulable
from hetflow.core.placement import DeviceRef, Placement
from hetflow.core.request import PlacementRequest, parse_vendor
from hetflow.core.topology import ClusterSnapshot, Vendor
from hetflow.runtime.resources import (
    device_ask,
    label_value,
    visibility_env,
)
from hetflow.scheduling.planner import plan
from hetflow.workloads.serve.config import ModelServeConfig


@dataclass(frozen=True)
class ReplicaGroup:
    """Replicas of one model that share the same Serve options (one deployment)."""

    model: str
    deployment: str  # Serve deployment name, unique within the application
    num_replicas: int | None  # fixed count; None when autoscaling
    autoscaling: dict[str, Any] | None  # Serve's autoscaling_config
    ray_actor_options: dict[str, Any]
    placement_group_bundles: list[dict[str, float]] | None = None
    bundle_label_selector: list[dict[str, str]] | None = None
    device: DeviceRef | None = None  # the hetflow device every replica of the group uses
    compute: str = "cpu"  # "cpu" or "gpu": what the replicas compute on
    env: dict[str, str] = field(default_factory=dict)  # visibility variables, when placed
    # an LLM engine over several nodes (one replica per group): each node's actor options, its
    # first node's first; ``spread``: a bundle per node for Ray to put on distinct nodes (CPU
    # and Ray's own GPUs), empty where hetflow planned the nodes (``stage_nodes``)
    stages: tuple[dict[str, Any], ...] = ()
    spread: tuple[dict[str, float], ...] = ()
    stage_nodes: tuple[str, ...] = ()

    def describe(self) -> str:
        count = (f"{self.num_replicas} replica{'s' if self.num_replicas != 1 else ''}"
                 if self.num_replicas is not None else
                 f"{self.autoscaling['min_replicas']}-{self.autoscaling['max_replicas']} replicas")
        where = f"device {self.device}" if self.device else self.compute.upper()
        resources = self.ray_actor_options.get("resources") or {}
        mem = "".join(f", {v} MiB of {k}" for k, v in resources.items())
        return f"{self.deployment}: {count} on {where}{mem}"

    def serve_options(self) -> dict[str, Any]:
        """Keyword arguments for ``Deployment.options``."""
        options: dict[str, Any] = {"name": self.deployment,
                                   "ray_actor_options": self.ray_actor_options}
        if self.autoscaling is not None:
            options["autoscaling_config"] = self.autoscaling
        else:
            options["num_replicas"] = self.num_replicas
        if self.placement_group_bundles is not None:
            options["placement_group_bundles"] = self.placement_group_bundles
            options["placement_group_bundle_label_selector"] = self.bundle_label_selector
        return options


def has_devices(snapshot: ClusterSnapshot | None, entry: ModelServeConfig) -> bool:
    """Whether the snapshot holds hetflow accelerators this model may use."""
    if snapshot is None:
        return False
    vendor = parse_vendor(entry.devices.vendor)
    return any(d.vendor is not Vendor.CPU and (vendor is None or d.vendor is vendor)
               for node in snapshot.nodes for d in node.accelerators)


def plan_replica_groups(app: str, entry: ModelServeConfig, snapshot: ClusterSnapshot | None,
                        ray_gpus: float, memory_bytes: int) -> list[ReplicaGroup]:
    """The deployments that run ``entry``'s replicas (see the module docstring).

    ``snapshot``: the live hetflow snapshot (None or empty: no hetflow nodes); ``ray_gpus``:
    Ray's own GPU count in the cluster; ``memory_bytes``: device memory per replica.
    Raises Unschedulable when ``devices: gpu`` finds no GPU or the planner finds no room.
    """
    kind = entry.devices.kind
    wants_gpu = kind == "gpu" or (kind == "auto" and entry.precision != "int8")
    base = f"{app}.{entry.name}"
    if kind != "cpu" and entry.precision != "int8" and has_devices(snapshot, entry):
        assert snapshot is not None
        return _planned_groups(base, entry, snapshot, memory_bytes)
    if wants_gpu and ray_gpus > 0:
        share = ray_gpu_share(entry, memory_bytes)
        replicas = entry.fixed_replicas or (entry.autoscaling.min_replicas if entry.autoscaling else 1)
        if replicas * share > ray_gpus + 1e-9:
            raise Unschedulable(
                f"model {entry.name}: {replicas} replicas x {share:g} GPU each do not fit in "
                f"the cluster's {ray_gpus:g} Ray GPUs; lower replicas, set devices.memory (replicas "
                "then share a GPU by it) or gpu_fraction, or use devices: cpu")
        options = {"num_cpus": entry.cpus_per_replica, "num_gpus": share}
        return [_single_group(base, entry, options, "gpu")]
    if kind == "gpu":
        raise Unschedulable(f"model {entry.name}: devices: gpu, but the cluster has no hetflow "
                            "GPU node (hetflow node start) and no Ray GPUs; use devices: auto "
                            "or cpu")
    # A CPU replica on a hetflow node must not see the node's devices.
    options = {"num_cpus": entry.cpus_per_replica,
               "runtime_env": {"env_vars": visibility_env(Vendor.CPU, [])}}
    return [_single_group(base, entry, options, "cpu")]


def ray_gpu_share(entry: ModelServeConfig, memory_bytes: int,
                  resources: dict[str, float] | None = None) -> float:
    """``num_gpus`` per replica on Ray's own GPUs: ``gpu_fraction`` when given; else, with
    ``devices.share``, the replica's memory over the smallest memory of the GPUs Ray names
    (``accelerator_type:<model>`` resources, looked up in the catalog), rounded up to 1/100;
    a whole GPU when the memory of any of them is unknown."""
    if entry.gpu_fraction is not None:
        return float(entry.gpu_fraction)
    if not entry.devices.share or memory_bytes <= 0:
        return 1.0
    import math

    import ray

    from hetflow.accelerators.catalog import default_catalog

    if resources is None:
        resources = ray.cluster_resources() if ray.is_initialized() else {}
    catalog = default_catalog()
    sizes = []
    for key in resources:
        if key.startswith("accelerator_type:"):
            spec = catalog.find(key.split(":", 1)[1])
            if spec is None or not spec.memory_bytes:
                return 1.0
            sizes.append(spec.memory_bytes)
    if not sizes:
        return 1.0
    return min(1.0, math.ceil(100 * memory_bytes / min(sizes)) / 100)


def _single_group(base: str, entry: ModelServeConfig, options: dict[str, Any],
                  compute: str) -> ReplicaGroup:
    autoscaling = entry.autoscaling.to_serve() if entry.autoscaling else None
    return ReplicaGroup(entry.name, base, entry.fixed_replicas, autoscaling, options,
                        compute=compute)


def _planned_groups(base: str, entry: ModelServeConfig, snapshot: ClusterSnapshot,
                    memory_bytes: int) -> list[ReplicaGroup]:
    slots = plan_slots(base, entry, snapshot, memory_bytes)
    order: list[DeviceRef] = []
    for ref in slots:
        if ref not in order:
            order.append(ref)
    minimum = entry.autoscaling.min_replicas if entry.autoscaling else 0
    groups = []
    for ref in order:
        count = slots.count(ref)
        ask = device_ask(snapshot, [ref], memory_bytes, exclusive=not entry.devices.share)
        options = ask.actor_options(entry.cpus_per_replica)
        bundle = ask.bundle(entry.cpus_per_replica)
        autoscaling = None
        if entry.autoscaling is not None:
            share = sum(1 for r in slots[:minimum] if r == ref)
            low = max(1, share)
            autoscaling = {**entry.autoscaling.to_serve(), "min_replicas": low,
                           "initial_replicas": low, "max_replicas": count}
        name = f"{base}-{label_value(ref.node)}-d{ref.device}"
        groups.append(ReplicaGroup(
            entry.name, name, None if autoscaling else count, autoscaling, options,
            placement_group_bundles=[bundle],
            bundle_label_selector=[ask.selector],
            device=ref, compute="gpu", env=ask.env))
    return groups


def plan_in_turn(requests: list[PlacementRequest], snapshot: ClusterSnapshot,
                 refusal: Callable[[int, Unschedulable], str]) -> tuple[list[Placement], ClusterSnapshot]:
    """Plan ``requests`` one after another, each on the snapshot with the earlier ones taken;
    the placements and the snapshot with all of them taken. A request that does not fit raises
    Unschedulable with ``refusal(index, the planner's reason)``."""
    placements = []
    for i, request in enumerate(requests):
        try:
            placement = plan(snapshot, request)
        except Unschedulable as exc:
            raise Unschedulable(refusal(i, exc)) from None
        snapshot = placement.apply_to(snapshot)
        placements.append(placement)
    return placements, snapshot


def plan_slots(base: str, entry: ModelServeConfig, snapshot: ClusterSnapshot,
               memory_bytes: int) -> list[DeviceRef]:
    """One device per replica slot, planned one slot at a time on the updated snapshot."""
    n = entry.planned_replicas
    requests = [PlacementRequest.parse(
        f"{base}-{i}", count=1, memory=memory_bytes, memory_note="serving replica",
        vendor=entry.devices.vendor, model=entry.devices.model, share=entry.devices.share,
        strategy=entry.devices.strategy) for i in range(n)]
    placements, _ = plan_in_turn(requests, snapshot, lambda i, exc: (
        f"model {entry.name}: replica {i + 1} of {n} does not fit ({exc}); lower replicas "
        "or devices.memory, or allow devices.share"))
    return [p.devices[0] for p in placements]


def check_memory(entry: ModelServeConfig, estimate: int) -> int:
    """The memory to plan per replica: the configured one, else the estimate."""
    given = entry.memory_bytes
    if given is not None and given <= 0:
        raise InputError(f"model {entry.name}: devices.memory must be positive")
    return given if given is not None else estimate


__all__ = ["ReplicaGroup", "check_memory", "has_devices", "plan_in_turn", "plan_replica_groups", "plan_slots"]
