"""The shape of one catalog row: what hetflow knows about an accelerator model.

The rows themselves are data (``data/catalog.yaml``); :mod:`hetflow.accelerators.catalog`
loads and looks them up. Peak figures are the vendor's dense (no sparsity) numbers.

A "device" is what the runtime enumerates (what ``CUDA_VISIBLE_DEVICES`` /
``HIP_VISIBLE_DEVICES`` address): one GCD of an MI250/MI250X, one GK210 die of a K80, one whole
GPU otherwise. Per-device figures (memory, TFLOP/s, compute units) are for that unit.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetflow.core.topology import LinkKind, Vendor


@dataclass(frozen=True)
class AcceleratorSpec:
    name: str  # canonical name, e.g. "MI300X", "H100-SXM", "A100-80GB", "CPU"
    vendor: Vendor
    aliases: tuple[str, ...]  # other spellings: product names, Ray accelerator types, PCI ids
    memory_bytes: int | None  # per device (per GCD on MI250/MI250X, per die on K80)
    arch: str | None  # "sm_90", "gfx942"
    bf16_tflops: float | None  # dense peak
    fp16_tflops: float | None
    fp32_tflops: float | None
    memory_bandwidth_gbps: float | None  # GB/s
    link_kind: LinkKind | None  # the GPU-to-GPU fabric of its usual multi-GPU node
    link_generation: str | None  # "NVLink4", "xGMI3", "PCIe4", ...
    link_gbps_per_link: float | None  # GB/s per direction per link
    links_per_device: int | None  # NVLinks / xGMI links per device
    pcie_gbps: float | None  # host link, GB/s per direction (x16)
    source: str  # where the figures come from (URL or document)
    pci_device_ids: tuple[str, ...] = ()  # "0x74a1"
    partitions: int | None = None  # max compute partitions per device (CPX=8 on MI300X)
    compute_units: int | None = None  # CUs (AMD) or SMs (NVIDIA) per device, as tools report
    devices_per_package: int = 1  # devices sharing one physical package (2 GCDs on MI250X)
    same_package_gbps: float | None = None  # GB/s per direction between devices/partitions
    # of one package (None: no on-package path faster than the host, e.g. MIG instances)
    notes: str = ""  # caveats: derived or uncertain figures, what a "device" is
