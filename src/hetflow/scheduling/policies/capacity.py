"""The cluster as cluster policies see it: pools of devices, what is free, and assignments.

- :class:`ClusterModel` - immutable: every node's device type, devices, host resources and the
  bandwidth between its devices, built from a :class:`~hetflow.core.topology.ClusterSnapshot`
  (``ClusterModel.from_snapshot``). A node with two device models becomes two pools; with
  ``cpu_pools=True`` (the live controller) each node's CPUs are one more pool, of type ``CPU``.
- :class:`FreeCapacity` - what is free, per device in thousandths of a GPU ("milli", 1000 = a
  whole device) plus host CPU (milli-cores) and memory (MiB) per node. Policies work on a
  ``fork()`` of it (a scratch copy); the engine owns the real one.
- :class:`Assignment` - where one job runs: a device type, (node, device) slots, the share of
  each device, the host resources, and the group's collective bandwidth.
- :class:`Request` - what a job asks for.

Group bandwidth follows :func:`hetflow.scheduling.throughput.group_bandwidth`: in a group whose
pairs are all dedicated links (xGMI mesh, direct NVLink) each device's links add up and the
slowest device sets the pace; otherwise the weakest pair does (NVSwitch port, PCIe); a group
spanning nodes runs at most at the inter-node network. Links the snapshot does not know get the device's PCIe
bandwidth from the catalog (or 16 GB/s, PCIe 3.0 x16) - a conservative guess, named in docs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Iterable, Sequence

import numpy as np

from hetflow.core.topology import Allocation, ClusterSnapshot, LinkKind, NodeTopology, Vendor
from hetflow.core.errors import InputError

WHOLE = 1000  # milli of one whole device
CPU_POOL_TYPE = "CPU"  # the catalog's name for a host's CPUs: the device type of CPU pools
DEFAULT_PCIE_GBPS = 16.0
_UNLIMITED = np.iinfo(np.int64).max // 4
_DEDICATED = {LinkKind.NVLINK, LinkKind.XGMI, LinkKind.SAME_PACKAGE}


@dataclass(frozen=True, slots=True)
class Request:
    """What one job asks for. ``milli`` < 1000 only with ``num_gpus == 1`` (a shared device)."""

    num_gpus: int
    milli: int = WHOLE
    cpu_milli: int = 0
    memory_mib: int = 0

    def __post_init__(self) -> None:
        assert self.num_gpus >= 0 and 0 < self.milli <= WHOLE, self
        assert self.milli == WHOLE or self.num_gpus == 1, "only a single device can be shared"

    @property
    def fractional(self) -> bool:
        return self.milli < WHOLE

    @property
    def uses_host(self) -> bool:
        """Host resources are charged on one node, so such jobs never span nodes."""
        return self.cpu_milli > 0 or self.memory_mib > 0 or self.num_gpus == 0

    @property
    def gpu_milli(self) -> int:
        return self.num_gpus * self.milli


@dataclass(frozen=True, slots=True)
class Assignment:
    """Where one job runs. ``slots`` are (node index, device position in that node).

    ``host`` is the node whose CPU and memory the job uses (None when it uses none).
    ``group_gbps`` is the collective bandwidth of the slots (inf for one device).
    """

    device_type: str
    slots: tuple[tuple[int, int], ...]
    milli: int = WHOLE
    host: int | None = None
    cpu_milli: int = 0
    memory_mib: int = 0
    group_gbps: float = math.inf

    def allocations(self, model: "ClusterModel", job_id: str) -> tuple[Allocation, ...]:
        """The core-type view (node name, device index) for reports and the runtime."""
        return tuple(
            Allocation(job_id, model.nodes[n].name, model.nodes[n].devices[p],
                       exclusive=self.milli == WHOLE)
            for n, p in self.slots
        )

    def nodes(self) -> tuple[int, ...]:
        return tuple(sorted({n for n, _ in self.slots} | ({self.host} if self.host is not None else set())))


@dataclass(frozen=True)
class PoolNode:
    """One node's devices of one type, with the host resources they may use."""

    name: str
    device_type: str
    devices: tuple[int, ...]  # device indices as the node numbers them
    cpu_milli: int | None = None
    memory_mib: int | None = None
    device_memory_bytes: int | None = None
    shape: int = 0  # nodes with equal link matrices share a shape (and its caches)
    node_name: str = ""  # the snapshot's node this pool is part of ("" = ``name``)

    @property
    def machine(self) -> str:
        return self.node_name or self.name


@dataclass
class _Shape:
    """Link matrix of a node, shared by all nodes wired the same way."""

    gbps: np.ndarray  # (D, D) pair bandwidth, GB/s
    dedicated: np.ndarray  # (D, D) bool: a dedicated link (adds up) vs a shared port
    uniform: bool  # every pair the same: a group's bandwidth depends only on its size
    cache: dict = field(default_factory=dict)

    def group(self, positions: Sequence[int]) -> float:
        k = len(positions)
        if k <= 1:
            return math.inf
        if self.uniform:
            bw = float(self.gbps[0, 1])
            return bw * (k - 1) if bool(self.dedicated[0, 1]) else bw
        key = tuple(sorted(positions))
        hit = self.cache.get(key)
        if hit is None:
            idx = np.array(key)
            sub = self.gbps[np.ix_(idx, idx)]
            ded = self.dedicated[np.ix_(idx, idx)]
            off = ~np.eye(len(key), dtype=bool)
            if bool(ded[off].all()):  # a dedicated mesh: each device drives all its links
                np.fill_diagonal(sub, 0.0)
                hit = float(sub.sum(axis=1).min())
            else:  # some pair shares a port or crosses PCIe: the weakest pair sets the pace
                hit = float(sub[off].min())
            self.cache[key] = hit
        return hit

    def best_subset(self, free: Sequence[int], k: int) -> tuple[tuple[int, ...], float]:
        """A k-subset of ``free`` positions with the highest group bandwidth (greedy from each
        start; exact for uniform nodes, close for the usual islands-and-bridges layouts)."""
        if self.uniform or k <= 1:
            chosen = tuple(free[:k])
            return chosen, self.group(chosen)
        key = ("best", tuple(free), k)
        hit = self.cache.get(key)
        if hit is not None:
            return hit
        best: tuple[tuple[int, ...], float] = ((), -1.0)
        for start in free:
            chosen = [start]
            while len(chosen) < k:
                cand = max((p for p in free if p not in chosen),
                           key=lambda p: (self.group(chosen + [p]), -p))
                chosen.append(cand)
            bw = self.group(chosen)
            if bw > best[1]:
                best = (tuple(sorted(chosen)), bw)
        self.cache[key] = best
        return best


def _node_shape(node: NodeTopology, indices: Sequence[int], fallback_gbps: float) -> tuple[np.ndarray, np.ndarray]:
    d = len(indices)
    gbps = np.full((d, d), fallback_gbps, dtype=float)
    dedicated = np.zeros((d, d), dtype=bool)
    for i, a in enumerate(indices):
        for j, b in enumerate(indices):
            if i == j:
                continue
            link = node.link(a, b)
            if link is not None and link.bandwidth_gbps:
                gbps[i, j] = link.bandwidth_gbps
                dedicated[i, j] = link.kind in _DEDICATED
    return gbps, dedicated


def _cpu_pools(snapshot: ClusterSnapshot, shape: int) -> list[PoolNode]:
    """One device-less pool per node with a known CPU count (see ``from_snapshot``)."""
    return [PoolNode(name=f"{node.name}/{CPU_POOL_TYPE}", device_type=CPU_POOL_TYPE, devices=(),
                     cpu_milli=int(node.cpu_cores * 1000),
                     memory_mib=None if node.host_memory_bytes is None else node.host_memory_bytes >> 20,
                     shape=shape, node_name=node.name)
            for node in snapshot.nodes if node.cpu_cores is not None]


class ClusterModel:
    """Immutable description of a cluster's schedulable devices (see module docstring)."""

    def __init__(self, nodes: Sequence[PoolNode], shapes: Sequence[_Shape], inter_node_gbps: float) -> None:
        if not nodes:
            raise InputError("the cluster has no accelerators to schedule (check --cluster)")
        assert inter_node_gbps > 0
        self.nodes = tuple(nodes)
        self.shapes = list(shapes)
        self.inter_node_gbps = float(inter_node_gbps)
        self.device_types: tuple[str, ...] = tuple(dict.fromkeys(n.device_type for n in nodes))
        self.type_index = {t: i for i, t in enumerate(self.device_types)}
        self.node_type = np.array([self.type_index[n.device_type] for n in nodes], dtype=np.int64)
        self.max_devices = max(len(n.devices) for n in nodes)
        self.num_devices = np.array([len(n.devices) for n in nodes], dtype=np.int64)
        self.nodes_of_type = {t: np.flatnonzero(self.node_type == i) for t, i in self.type_index.items()}
        self.capacity_by_type = {t: int(self.num_devices[idx].sum()) for t, idx in self.nodes_of_type.items()}
        self.largest_node_by_type = {t: int(self.num_devices[idx].max()) for t, idx in self.nodes_of_type.items()}
        self.total_devices = int(self.num_devices.sum())
        self.index_of = {n.name: i for i, n in enumerate(nodes)}
        self.cpu = np.array([_UNLIMITED if n.cpu_milli is None else n.cpu_milli for n in nodes], dtype=np.int64)
        self.mem = np.array([_UNLIMITED if n.memory_mib is None else n.memory_mib for n in nodes], dtype=np.int64)
        self.has_host_limits = any(n.cpu_milli is not None or n.memory_mib is not None for n in nodes)
        self._ideal: dict[tuple[str, int], float] = {}

    # -- construction -------------------------------------------------------------------

    @classmethod
    def from_snapshot(cls, snapshot: ClusterSnapshot, lookup=None, *, cpu_pools: bool = False) -> "ClusterModel":
        """Pools from a snapshot: one per (node, device model); CPUs only with ``cpu_pools``.

        ``lookup`` (a catalog lookup, default the catalog) canonicalises device models and
        gives the PCIe bandwidth used for links the snapshot does not know.

        ``cpu_pools`` (the live controller; the simulator leaves it off): every node whose
        ``cpu_cores`` is known - accelerator nodes and CPU-only nodes alike - also gets a pool
        of device type :data:`CPU_POOL_TYPE` with no devices, holding the node's whole CPU and
        memory, for jobs that ask for no device (``Request(0, cpu_milli=...)``). Its device
        pools then hold no host resources (nothing is counted twice). These pools come after
        every device pool, so device pools keep the indices they have without the flag.
        """
        from hetflow.scheduling.throughput import canonical_device_type, catalog_spec

        lookup = lookup or catalog_spec
        nodes: list[PoolNode] = []
        shapes: list[_Shape] = []
        shape_ids: dict[bytes, int] = {}
        for node in snapshot.nodes:
            groups: dict[str, list[int]] = {}
            for dev in node.devices:
                if dev.vendor is Vendor.CPU:
                    continue
                model = dev.model or dev.name or f"unknown-{dev.vendor.value}"
                groups.setdefault(model, []).append(dev.index)
            total = sum(len(v) for v in groups.values())
            for model, indices in groups.items():
                device_type = canonical_device_type(model, lookup)
                spec = lookup(device_type)
                fallback = (spec.pcie_gbps if spec and spec.pcie_gbps else DEFAULT_PCIE_GBPS)
                gbps, dedicated = _node_shape(node, indices, fallback)
                key = gbps.tobytes() + dedicated.tobytes() + bytes([len(indices)])
                if key not in shape_ids:
                    off = ~np.eye(len(indices), dtype=bool)
                    uniform = len(indices) < 2 or (
                        np.all(gbps[off] == gbps[off][0]) and np.all(dedicated[off] == dedicated[off][0]))
                    shape_ids[key] = len(shapes)
                    shapes.append(_Shape(gbps, dedicated, bool(uniform)))
                share = len(indices) / total  # host resources split by device count
                mems = [node.device(i).memory_bytes for i in indices]
                nodes.append(PoolNode(
                    name=node.name if len(groups) == 1 else f"{node.name}/{device_type}",
                    device_type=device_type,
                    devices=tuple(indices),
                    cpu_milli=None if node.cpu_cores is None else int(node.cpu_cores * 1000 * share),
                    memory_mib=None if node.host_memory_bytes is None else int(node.host_memory_bytes * share) >> 20,
                    device_memory_bytes=None if None in mems else min(mems),  # type: ignore[type-var]
                    shape=shape_ids[key],
                    node_name=node.name,
                ))
        if cpu_pools:
            nodes = [replace(n, cpu_milli=0, memory_mib=0) for n in nodes] + _cpu_pools(snapshot, len(shapes))
            shapes.append(_Shape(np.zeros((0, 0)), np.zeros((0, 0), dtype=bool), True))
        return cls(nodes, shapes, snapshot.inter_node_gbps)

    # -- topology -------------------------------------------------------------------------

    def group_gbps(self, slots: Iterable[tuple[int, int]]) -> float:
        """Collective bandwidth of a set of slots (see module docstring)."""
        by_node: dict[int, list[int]] = {}
        for n, p in slots:
            by_node.setdefault(n, []).append(p)
        bw = math.inf if len(by_node) <= 1 else self.inter_node_gbps
        for n, positions in by_node.items():
            bw = min(bw, self.shapes[self.nodes[n].shape].group(positions))
        return bw

    def ideal_gbps(self, device_type: str, num_gpus: int) -> float:
        """The best group bandwidth ``num_gpus`` devices of this type can have here."""
        key = (device_type, num_gpus)
        hit = self._ideal.get(key)
        if hit is None:
            if num_gpus <= 1:
                hit = math.inf
            else:
                best = -1.0
                for shape_id in {self.nodes[i].shape for i in self.nodes_of_type.get(device_type, ())}:
                    shape = self.shapes[shape_id]
                    d = shape.gbps.shape[0]
                    if d >= num_gpus:
                        best = max(best, shape.best_subset(list(range(d)), num_gpus)[1])
                hit = best if best >= 0 else self.inter_node_gbps
            self._ideal[key] = hit
        return hit

    def shape_of(self, node: int) -> _Shape:
        return self.shapes[self.nodes[node].shape]


class FreeCapacity:
    """Free device shares and host resources. Mutable; policies mutate only their own fork.

    ``take`` and ``release`` assert that capacity is never exceeded: a violation is a bug in a
    policy or in the engine, never a user error.
    """

    __slots__ = ("model", "milli", "whole", "cpu", "mem", "type_whole", "type_milli", "_total")

    def __init__(self, model: ClusterModel, *, _copy: "FreeCapacity | None" = None) -> None:
        self.model = model
        if _copy is not None:
            self.milli = _copy.milli.copy()
            self.whole = _copy.whole.copy()
            self.cpu = _copy.cpu.copy()
            self.mem = _copy.mem.copy()
            self.type_whole = _copy.type_whole.copy()
            self.type_milli = _copy.type_milli.copy()
            self._total = _copy._total
            return
        n, d = len(model.nodes), model.max_devices
        self.milli = np.full((n, d), -1, dtype=np.int64)  # -1: no such device position
        for i, node in enumerate(model.nodes):
            self.milli[i, : len(node.devices)] = WHOLE
        self.whole = model.num_devices.copy()
        self.cpu = model.cpu.copy()
        self.mem = model.mem.copy()
        self.type_whole = np.array([model.capacity_by_type[t] for t in model.device_types], dtype=np.int64)
        self.type_milli = self.type_whole * WHOLE
        self._total = int(self.type_milli.sum())

    def fork(self) -> "FreeCapacity":
        return FreeCapacity(self.model, _copy=self)

    # -- queries ------------------------------------------------------------------------

    def free_whole(self, device_type: str) -> int:
        return int(self.type_whole[self.model.type_index[device_type]])

    def free_milli(self, device_type: str) -> int:
        return int(self.type_milli[self.model.type_index[device_type]])

    def total_free_milli(self) -> int:
        return self._total

    def could_fit(self, request: Request, device_type: str) -> bool:
        """A cheap necessary condition (totals only) before asking a placer."""
        t = self.model.type_index[device_type]
        if request.num_gpus == 0:
            return True
        if request.fractional:
            return bool(self.type_milli[t] >= request.milli)
        return bool(self.type_whole[t] >= request.num_gpus)

    def can_take(self, a: Assignment) -> bool:
        for n, p in a.slots:
            if self.milli[n, p] < a.milli:
                return False
        if a.host is not None and (self.cpu[a.host] < a.cpu_milli or self.mem[a.host] < a.memory_mib):
            return False
        return len(set(a.slots)) == len(a.slots)

    # -- changes ------------------------------------------------------------------------

    def take(self, a: Assignment) -> None:
        for n, p in a.slots:
            before = int(self.milli[n, p])
            assert before >= a.milli, f"device {self.model.nodes[n].name}#{p} over-committed"
            after = before - a.milli
            self.milli[n, p] = after
            t = self.model.node_type[n]
            self.type_milli[t] -= a.milli
            self._total -= a.milli
            if before == WHOLE:
                self.whole[n] -= 1
                self.type_whole[t] -= 1
        if a.host is not None:
            self.cpu[a.host] -= a.cpu_milli
            self.mem[a.host] -= a.memory_mib
            assert self.cpu[a.host] >= 0 and self.mem[a.host] >= 0, "host resources over-committed"

    def release(self, a: Assignment) -> None:
        for n, p in a.slots:
            before = int(self.milli[n, p])
            after = before + a.milli
            assert after <= WHOLE, f"device {self.model.nodes[n].name}#{p} released twice"
            self.milli[n, p] = after
            t = self.model.node_type[n]
            self.type_milli[t] += a.milli
            self._total += a.milli
            if after == WHOLE:
                self.whole[n] += 1
                self.type_whole[t] += 1
        if a.host is not None:
            self.cpu[a.host] += a.cpu_milli
            self.mem[a.host] += a.memory_mib
