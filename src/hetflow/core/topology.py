"""Devices, links between them, a node's topology and a cluster snapshot.

Pure data: frozen dataclasses, no ray, no torch. Facts a tool did not report stay ``None``
(unknown), never a guessed number; the catalog fills estimates in a separate, named step
(:mod:`hetflow.accelerators.bandwidth`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Iterable, Iterator, Literal, get_args


class Vendor(str, enum.Enum):
    NVIDIA = "nvidia"
    AMD = "amd"
    CPU = "cpu"


AcceleratorVendor = Literal["nvidia", "amd"]
"""The vendors a config may ask devices of (every :class:`Vendor` but the CPU): the one type every
config schema's ``vendor`` field uses, so that a new vendor is added here and in ``Vendor``."""
assert set(get_args(AcceleratorVendor)) == {v.value for v in Vendor} - {"cpu"}


class LinkKind(str, enum.Enum):
    """How two devices of one node talk to each other, fastest kinds first."""

    SAME_PACKAGE = "same_package"  # two partitions (GCD/XCD/MIG) of one physical package
    NVLINK = "nvlink"  # direct GPU-to-GPU NVLink (bridge or hybrid cube mesh)
    NVSWITCH = "nvswitch"  # NVLink through NVSwitch: all-to-all at the GPU's NVLink speed
    XGMI = "xgmi"  # AMD Infinity Fabric between GPUs
    PCIE = "pcie"  # only PCIe (and maybe the CPU interconnect); see PcieLevel
    UNKNOWN = "unknown"


class PcieLevel(enum.IntEnum):
    """PCIe common-ancestor level, as ``nvidia-smi topo -m`` and NVML name it (NVML values)."""

    PIX = 10  # at most one PCIe bridge
    PXB = 20  # several PCIe bridges, no host bridge
    PHB = 30  # through a PCIe host bridge (the CPU)
    NODE = 40  # between host bridges inside one NUMA node
    SYS = 50  # across the SMP interconnect between NUMA nodes (QPI/UPI/xGMI-CPU)


@dataclass(frozen=True)
class Device:
    """One schedulable accelerator (a whole GPU, or one partition of it) on a node.

    ``index`` is the vendor tool's index on the node (what CUDA_VISIBLE_DEVICES /
    HIP_VISIBLE_DEVICES address when nothing filters them).
    """

    index: int
    vendor: Vendor
    model: str | None = None  # canonical catalog name, e.g. "MI300X", "H100-SXM"
    name: str | None = None  # product name as the tool printed it
    memory_bytes: int | None = None
    arch: str | None = None  # "sm_90", "gfx942", ...
    numa_node: int | None = None
    pci_bus_id: str | None = None  # normalised "0000:18:00.0"
    uuid: str | None = None
    partition: str | None = None  # "CPX", "MIG 1g.5gb", ... None for a whole device
    package: int | None = None  # physical package this partition belongs to
    compute_units: int | None = None  # CUs (AMD) or SMs (NVIDIA) or cores (CPU)
    device_id: str | None = None  # PCI device id, "0x74a1"


@dataclass(frozen=True)
class Link:
    """The connection between devices ``a`` < ``b`` of one node.

    ``bandwidth_gbps`` is an estimate, GB/s per direction (1 GB = 1e9 bytes), filled from the
    catalog or from what the tool reported; ``bandwidth_note`` says which.
    """

    a: int
    b: int
    kind: LinkKind
    pcie_level: PcieLevel | None = None
    count: int | None = None  # bonded NVLinks (NV#) or xGMI links
    weight: int | None = None  # AMD KFD link weight (15 per xGMI hop, 20 per PCIe segment)
    hops: int | None = None
    bandwidth_gbps: float | None = None
    bandwidth_note: str | None = None

    def __post_init__(self) -> None:
        assert self.a < self.b, f"link endpoints must be ordered, got {self.a}, {self.b}"

    @property
    def label(self) -> str:
        """Short form like nvidia-smi's: NV18, NVSW18, XGMI, PCIe/SYS."""
        if self.kind is LinkKind.NVLINK:
            return f"NV{self.count}" if self.count else "NV"
        if self.kind is LinkKind.NVSWITCH:
            return f"NVSW{self.count}" if self.count else "NVSW"
        if self.kind is LinkKind.XGMI:
            return "XGMI" + (f"/w{self.weight}" if self.weight is not None else "")
        if self.kind is LinkKind.PCIE:
            return "PCIe/" + (self.pcie_level.name if self.pcie_level else "?")
        if self.kind is LinkKind.SAME_PACKAGE:
            return "PKG"
        return "?"


def pair(a: int, b: int) -> tuple[int, int]:
    return (a, b) if a < b else (b, a)


@dataclass(frozen=True)
class NodeTopology:
    """One machine: its devices, the links between them and its host resources."""

    name: str
    devices: tuple[Device, ...] = ()
    links: tuple[Link, ...] = ()
    cpu_cores: int | None = None
    host_memory_bytes: int | None = None
    numa_nodes: int | None = None
    sources: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        seen: set[int] = set()
        for d in self.devices:
            assert d.index not in seen, f"duplicate device index {d.index} on {self.name}"
            seen.add(d.index)

    @cached_property
    def _links(self) -> dict[tuple[int, int], Link]:
        return {(l.a, l.b): l for l in self.links}

    @cached_property
    def _devices(self) -> dict[int, Device]:
        return {d.index: d for d in self.devices}

    def device(self, index: int) -> Device:
        return self._devices[index]

    def link(self, a: int, b: int) -> Link | None:
        return self._links.get(pair(a, b))

    def bandwidth(self, a: int, b: int) -> float:
        """Estimated GB/s between two devices; 0.0 when unknown."""
        if a == b:
            return float("inf")
        l = self.link(a, b)
        return l.bandwidth_gbps if l and l.bandwidth_gbps is not None else 0.0

    @property
    def accelerators(self) -> tuple[Device, ...]:
        return tuple(d for d in self.devices if d.vendor is not Vendor.CPU)

    def pairs(self) -> Iterator[tuple[int, int]]:
        idx = sorted(self._devices)
        for i, a in enumerate(idx):
            for b in idx[i + 1 :]:
                yield a, b

    def with_links(self, links: Iterable[Link]) -> "NodeTopology":
        return replace(self, links=tuple(sorted(links, key=lambda l: (l.a, l.b))))


@dataclass(frozen=True)
class Allocation:
    """Part of one device held by a job. ``exclusive`` jobs own the whole device."""

    job_id: str
    node: str
    device: int
    memory_bytes: int | None = None
    exclusive: bool = True


@dataclass(frozen=True)
class ClusterSnapshot:
    """Every node's topology, the network between nodes and what is already allocated."""

    nodes: tuple[NodeTopology, ...] = ()
    inter_node_gbps: float = 25.0  # per direction; 200 Gb/s InfiniBand/RoCE per node by default
    allocations: tuple[Allocation, ...] = field(default=())

    def __post_init__(self) -> None:
        names = [n.name for n in self.nodes]
        assert len(names) == len(set(names)), f"node names must be unique: {names}"

    @cached_property
    def _nodes(self) -> dict[str, NodeTopology]:
        return {n.name: n for n in self.nodes}

    def node(self, name: str) -> NodeTopology:
        return self._nodes[name]

    def allocations_on(self, node: str, device: int) -> tuple[Allocation, ...]:
        return tuple(a for a in self.allocations if a.node == node and a.device == device)

    @property
    def num_accelerators(self) -> int:
        return sum(len(n.accelerators) for n in self.nodes)
