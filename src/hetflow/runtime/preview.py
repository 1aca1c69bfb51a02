"""``--dry-run``: which Ray a run would join or start, and where its ranks would go, starting nothing.

    cluster = preview_cluster(address)                 # reads a running cluster, or this machine
    placed = preview_ranks(layout, resources, cluster, "digits")   # or Unschedulable (exit 3)

A run with no address starts a new local Ray: the preview describes this machine instead (its
cores, the accelerators discovery finds) and starts nothing. A run that joins a cluster - an
address given, in ``RAY_ADDRESS``, or the one ``ray start`` recorded here - has it read: the
preview connects as a driver for a moment (the unreachable check first), reads its resources
and the published hetflow nodes, plans on them with the planner, and disconnects. It reserves
nothing: the decisions follow :func:`hetflow.workloads.train.group.place_layout` (hetflow
nodes: the planner's exact devices; else Ray GPUs, else CPUs, with the same capacity refusals),
but where that path creates a placement group this one only says what the group would hold.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from hetflow.core.errors import InputError, Unschedulable


@dataclass
class ClusterPreview:
    address: str | None  # what the run joins; None: a new local Ray on this machine
    source: str  # where the address came from ("" for a new local Ray)
    cpus: float
    gpus: float  # Ray's GPU resource (a new local Ray: the GPUs discovery finds here)
    nodes: int
    snapshot: Any = None  # published hetflow nodes (ClusterSnapshot) or None

    def describe(self) -> str:
        what = f"{self.nodes} node(s), {self.cpus:g} CPUs, {self.gpus:g} GPUs"
        if self.address is None:
            return f"a new local Ray on this machine ({what})"
        hetflow = f", {len(self.snapshot.nodes)} hetflow node(s)" if self.snapshot is not None else ""
        return f"the running cluster at {self.address} (from {self.source}; {what}{hetflow})"

    def to_dict(self) -> dict[str, Any]:
        return {"address": self.address, "source": self.source or None, "cpus": self.cpus,
                "gpus": self.gpus, "nodes": self.nodes, "new_local_ray": self.address is None,
                "hetflow_nodes": [n.name for n in self.snapshot.nodes] if self.snapshot is not None else []}


@dataclass
class RanksPreview:
    ranks: int
    how: str  # one line, as the run prints it
    devices: str  # "hetflow" (planned devices), "ray-gpu" or "cpu"
    cpus_per_rank: float
    where: list[str] = field(default_factory=list)  # per rank: "node:device" (planned devices only)

    def to_dict(self) -> dict[str, Any]:
        return {"ranks": self.ranks, "how": self.how, "devices": self.devices,
                "cpus_per_rank": self.cpus_per_rank, "where": self.where}


def preview_cluster(address: str | None, default: str | None = None, *,
                    local_cpus: int | None = None) -> ClusterPreview:
    """The cluster ``ray.init(address or default)`` would join, read without starting Ray; a
    new local Ray is this machine (``local_cpus``: the CPUs it would be given)."""
    from hetflow.runtime.session import check_reachable, effective_address

    check_reachable(address, default)
    target, source = effective_address(address or default)
    if target is None or target == "auto":
        from hetflow.accelerators.discover import discover_local

        gpus = len(discover_local().accelerators)
        return ClusterPreview(None, "", float(local_cpus or os.cpu_count() or 1), float(gpus), 1)
    from hetflow.runtime.session import ray_loopback_mode

    ray_loopback_mode(target)
    import ray

    from hetflow.runtime.binding import live_snapshot, published_nodes

    joined = not ray.is_initialized()
    if joined:
        try:
            ray.init(address=target, log_to_driver=False, logging_level="ERROR")
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise InputError(f"cannot join the Ray cluster at {target} (from {source}) to read it: "
                             f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}; with token "
                             "authentication set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN") from None
    try:
        total = ray.cluster_resources()
        nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
        snapshot = live_snapshot() if published_nodes() else None
        return ClusterPreview(target, source, total.get("CPU", 0.0), total.get("GPU", 0.0), nodes, snapshot)
    finally:
        if joined:
            ray.shutdown()


def preview_ranks(layout: Any, res: Any, cluster: ClusterPreview, job_id: str) -> RanksPreview:
    """Where ``layout``'s ranks would go with resources ``res`` (a train ResourcesConfig) on
    ``cluster``; Unschedulable with the run's own reasons when they could not."""
    world = layout.world_size
    if res.devices.kind != "cpu" and cluster.snapshot is not None:
        from hetflow.scheduling.planner import plan

        placement = plan(cluster.snapshot, res.placement_request(job_id, layout))
        return RanksPreview(world, placement.explain().splitlines()[0], "hetflow", res.cpus_per_rank,
                            [str(d) for d in placement.devices])
    gpus = cluster.gpus if res.devices.kind != "cpu" else 0
    if res.devices.kind == "gpu" and not gpus:
        raise Unschedulable(f"job {job_id}: resources.devices.kind is gpu but {cluster.describe()} has no "
                            "hetflow-managed nodes and no GPUs; set resources.devices: cpu, or join a GPU "
                            "cluster with --address")
    if gpus and world > gpus:
        raise Unschedulable(f"job {job_id}: {world} ranks need one GPU each, {cluster.describe()} has "
                            f"{gpus:g}; use fewer ranks or add GPU nodes")
    if world * res.cpus_per_rank > cluster.cpus + 1e-9:
        raise Unschedulable(f"job {job_id}: {world} ranks x {res.cpus_per_rank:g} CPUs = "
                            f"{world * res.cpus_per_rank:g} CPUs, {cluster.describe()} has {cluster.cpus:g}; "
                            "use fewer ranks, fewer CPUs per rank, or add nodes")
    kind = "one Ray GPU each (Ray chooses which)" if gpus else f"{res.cpus_per_rank:g} CPU each"
    return RanksPreview(world, f"{world} ranks, {kind}", "ray-gpu" if gpus else "cpu", res.cpus_per_rank)


__all__ = ["ClusterPreview", "RanksPreview", "preview_cluster", "preview_ranks"]
