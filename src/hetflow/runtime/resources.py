"""How a hetflow node presents its devices to Ray, and how a worker sees exactly its devices.

Why this shape (Ray 2.60, checked on this kind of machine; see docs/placement.md):

* Inside a node Ray hands out GPU instances first fit by index, and per-device custom resources
  do not steer which instance it picks. So a hetflow node gives Ray **no** ``GPU`` resource at
  all (``--num-gpus 0``). Each accelerator is a custom resource ``hetflow_dev_<i>`` whose
  capacity is the device's memory in MiB. Ray's own resource accounting is then hetflow's
  device bookkeeping: an exclusive job takes a device's whole capacity, a shareable replica
  takes its memory, and Ray refuses to over-commit either.
* A plain Ray workload (``num_gpus=1``) is never handed a hetflow device: Ray sees no GPUs on a
  hetflow node, so such work cannot be scheduled there at all.
* Each worker gets its visibility variables from its actor's ``runtime_env`` (set before the
  process starts, so before any framework initialises a device), plus Ray's
  ``RAY_EXPERIMENTAL_NOSET_*_VISIBLE_DEVICES`` so that Ray never rewrites them.

This module is pure (no ray import): names, capacities, labels, the ``ray start`` command line
and the visibility environment.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from hetflow.core.errors import InputError
from hetflow.core.topology import ClusterSnapshot, Device, LinkKind, NodeTopology, Vendor

DEVICE_RESOURCE_PREFIX = "hetflow_dev_"
LABEL_PREFIX = "hetflow.io/"
NODE_LABEL = LABEL_PREFIX + "node"
UNKNOWN_MEMORY_UNITS = 1024  # capacity for a device whose memory no tool reported
MIB = 1024 * 1024

# Links fast enough to call a group of devices one island (not PCIe, not unknown).
FAST_KINDS = frozenset({LinkKind.NVLINK, LinkKind.NVSWITCH, LinkKind.XGMI, LinkKind.SAME_PACKAGE})


def device_resource(index: int) -> str:
    return f"{DEVICE_RESOURCE_PREFIX}{index}"


def device_capacity(device: Device) -> int:
    """Capacity of a device's Ray resource: its memory in MiB (a fixed 1024 when unknown)."""
    if device.memory_bytes:
        return max(1, device.memory_bytes // MIB)
    return UNKNOWN_MEMORY_UNITS


def units_for(device: Device, memory_bytes: int | None, exclusive: bool) -> int:
    """How much of ``device``'s resource one rank takes: all of it, or its memory share."""
    capacity = device_capacity(device)
    if exclusive or memory_bytes is None or not device.memory_bytes:
        return capacity
    return min(capacity, max(1, -(-memory_bytes // MIB)))  # ceil to whole MiB


def node_resources(node: NodeTopology) -> dict[str, int]:
    return {device_resource(d.index): device_capacity(d) for d in node.accelerators}


def fast_islands(node: NodeTopology) -> list[list[int]]:
    """Groups of accelerators joined by NVLink/NVSwitch/xGMI (connected components), largest first."""
    parent = {d.index: d.index for d in node.accelerators}

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for link in node.links:
        if link.kind in FAST_KINDS and link.a in parent and link.b in parent:
            parent[find(link.a)] = find(link.b)
    groups: dict[int, list[int]] = {}
    for idx in sorted(parent):
        groups.setdefault(find(idx), []).append(idx)
    return sorted(groups.values(), key=lambda g: (-len(g), g[0]))


def label_value(text: str) -> str:
    """A Ray (Kubernetes-syntax) label value: <= 63 chars of [A-Za-z0-9_.-], alnum at both ends."""
    value = re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-_.")[:63].strip("-_.")
    return value or "unknown"


def node_labels(node: NodeTopology) -> dict[str, str]:
    """Labels for ``ray start --labels``: what a label selector can ask of this node."""
    accs = node.accelerators
    labels = {NODE_LABEL: label_value(node.name)}
    if not accs:
        labels[LABEL_PREFIX + "vendor"] = "cpu"
        return labels
    vendors = sorted({d.vendor.value for d in accs})
    models = sorted({d.model or d.name or "unknown" for d in accs})
    mems = [d.memory_bytes for d in accs if d.memory_bytes]
    islands = fast_islands(node)
    labels.update({
        LABEL_PREFIX + "vendor": label_value("-".join(vendors)),
        LABEL_PREFIX + "model": label_value("-".join(models)),
        LABEL_PREFIX + "devices": str(len(accs)),
        LABEL_PREFIX + "island-size": str(len(islands[0])),
        LABEL_PREFIX + "islands": str(len(islands)),
    })
    if mems:
        labels[LABEL_PREFIX + "memory-gib"] = str(min(mems) // (1024 * MIB))
    return labels


def split_ray_gpus(node: NodeTopology, spec: str | None) -> tuple[NodeTopology, tuple[int, ...]]:
    """Split ``node`` for ``hetflow node start --ray-gpus``: ``spec`` is a count K (the K
    highest-numbered accelerators) or a list of device indices ("6,7"; one device: "7,"). Returns the node hetflow
    manages (those devices and their links removed) and the devices left to Ray's own GPU
    accounting. No device is in both."""
    if spec is None or str(spec).strip() in ("", "0"):
        return node, ()
    accs = sorted(d.index for d in node.accelerators)
    text = str(spec).strip()
    try:
        if "," in text:  # device indices ("6,7"; one device: "7,")
            chosen = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
        else:
            count = int(text)
            if count > len(accs):
                raise InputError(f"--ray-gpus {count}: node {node.name} has {len(accs)} accelerators; "
                                 f"give at most {len(accs)}, or a list of device indices")
            chosen = tuple(accs[len(accs) - count:])
    except ValueError:
        raise InputError(f"--ray-gpus {spec!r}: give a count (e.g. 2) or device indices (e.g. 6,7)") from None
    unknown = [i for i in chosen if i not in accs]
    if unknown:
        raise InputError(f"--ray-gpus: node {node.name} has no accelerator {unknown[0]} "
                         f"(it has {', '.join(str(i) for i in accs)})")
    vendors = {node.device(i).vendor for i in chosen}
    if len(vendors) > 1:
        raise InputError("--ray-gpus: Ray's GPU resource is one vendor's; the devices given mix "
                         + " and ".join(sorted(v.value for v in vendors)))
    import dataclasses

    kept = dataclasses.replace(
        node, devices=tuple(d for d in node.devices if d.index not in chosen),
        links=tuple(l for l in node.links if l.a not in chosen and l.b not in chosen))
    return kept, chosen


def ray_gpu_env(node: NodeTopology, devices: tuple[int, ...]) -> dict[str, str]:
    """The environment ``ray start`` runs with so that Ray's GPU accounting holds exactly
    ``devices`` (Ray reads the visibility variable at start and hands out only those ids)."""
    if not devices:
        return {}
    ids = ",".join(str(d) for d in devices)
    if node.device(devices[0]).vendor is Vendor.AMD:
        return {"HIP_VISIBLE_DEVICES": ids}
    return {"CUDA_VISIBLE_DEVICES": ids}


def ray_start_command(
    node: NodeTopology,
    address: str | None,
    num_cpus: int | None = None,
    extra: list[str] | None = None,
    object_store_memory: int | None = None,
    ray_gpus: int = 0,
) -> list[str]:
    """``ray start`` for this node: ``ray_gpus`` Ray GPUs (0 unless some devices are left to
    Ray, see :func:`split_ray_gpus`), one resource per hetflow-managed device, hetflow labels,
    and the object store size when one is given (None: Ray's default)."""
    cmd = ["ray", "start"]
    cmd += [f"--address={address}"] if address else ["--head"]
    cmd += [f"--num-gpus={ray_gpus}"]
    if num_cpus is not None:
        cmd.append(f"--num-cpus={num_cpus}")
    if object_store_memory is not None:
        cmd.append(f"--object-store-memory={object_store_memory}")
    res = node_resources(node)
    if res:
        cmd.append("--resources=" + json.dumps(res, separators=(",", ":"), sort_keys=True))
    cmd.append("--labels=" + ",".join(f"{k}={v}" for k, v in sorted(node_labels(node).items())))
    return cmd + list(extra or [])


def format_command(cmd: list[str], env: dict[str, str] | None = None) -> str:
    prefix = [f"{k}={shlex.quote(v)}" for k, v in sorted((env or {}).items())]
    return " ".join(prefix + [shlex.quote(c) for c in cmd])


VISIBILITY_VARS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")
"""Every vendor's device-visibility variable: what :func:`visibility_env` sets (or leaves) and
what a worker reports it saw. A new vendor's variable goes here."""


def visible_devices() -> dict[str, str | None]:
    """This process's visibility variables (:data:`VISIBILITY_VARS`; None: not set)."""
    return {k: os.environ.get(k) for k in VISIBILITY_VARS}


def visibility_env(vendor: Vendor, devices: list[int] | tuple[int, ...]) -> dict[str, str]:
    """Environment that makes a worker see exactly ``devices`` (physical indices, rank order).

    NVIDIA: ``CUDA_VISIBLE_DEVICES``. AMD: ``HIP_VISIBLE_DEVICES`` *and*
    ``CUDA_VISIBLE_DEVICES`` with the same ids - HIP honours either, and Ray Train computes a
    worker's local device index from ``CUDA_VISIBLE_DEVICES`` only (the ROCm "invalid device
    ordinal" reports, ray#49260). ``ROCR_VISIBLE_DEVICES`` is left alone: HIP indices apply
    after ROCr's filtering, so setting both would filter twice. The NOSET variables stop Ray
    from rewriting any of them. CPU: no device is visible.
    """
    ids = ",".join(str(d) for d in devices)
    noset = {
        "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1",
        "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES": "1",
        "RAY_EXPERIMENTAL_NOSET_ROCR_VISIBLE_DEVICES": "1",
    }
    if vendor is Vendor.NVIDIA:
        return {"CUDA_VISIBLE_DEVICES": ids, **noset}
    if vendor is Vendor.AMD:
        return {"HIP_VISIBLE_DEVICES": ids, "CUDA_VISIBLE_DEVICES": ids, **noset}
    return {"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": "", **noset}


# --- planned devices -> what Ray is asked for ---------------------------------------------------


@dataclass(frozen=True)
class DeviceAsk:
    """What Ray is asked for so that one process runs on planned devices of one node, and sees
    exactly them: the devices' resources (``hetflow_dev_<i>``: units), the node's label selector
    and the visibility variables. Every workload turns a placement into Ray options through
    this (actors, Serve replicas, Tune trials, placement-group bundles)."""

    node: str
    resources: dict[str, float] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def selector(self) -> dict[str, str]:
        """The bundle label selector that pins a bundle to the node."""
        return {NODE_LABEL: label_value(self.node)}

    def bundle(self, cpus: float = 0.0) -> dict[str, float]:
        """A placement-group bundle: the devices' resources, with ``cpus`` CPUs when non-zero."""
        return {**({"CPU": cpus} if cpus else {}), **self.resources}

    def actor_options(self, cpus: float) -> dict:
        """``num_cpus``, no Ray GPUs, the devices' resources and the visibility variables."""
        return {"num_cpus": cpus, "num_gpus": 0, "resources": dict(self.resources),
                "runtime_env": {"env_vars": dict(self.env)}}


def device_ask(snapshot: ClusterSnapshot, devices: Sequence, memory_bytes: int | None,
               exclusive: bool) -> DeviceAsk:
    """The :class:`DeviceAsk` for ``devices`` (``DeviceRef``s, all on one node, in rank order),
    each taking all of its device (``exclusive``) or ``memory_bytes`` of it."""
    nodes = {ref.node for ref in devices}
    if len(nodes) != 1:
        raise ValueError(f"one process's devices must be on one node, got {sorted(nodes)}")
    node = snapshot.node(devices[0].node)
    resources = {device_resource(ref.device): units_for(node.device(ref.device), memory_bytes, exclusive)
                 for ref in devices}
    env = visibility_env(node.device(devices[0].device).vendor, [ref.device for ref in devices])
    return DeviceAsk(node.name, resources, env)
