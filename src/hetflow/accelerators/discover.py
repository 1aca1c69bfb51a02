"""Discover this machine: its accelerators through the vendor libraries, else its CPU.

:func:`discover_local` asks NVML (:mod:`.nvidia`) and amdsmi (:mod:`.amd`). When one finds
devices, the node is that backend's devices and links plus the host facts of :mod:`.cpu`
(cores, memory, NUMA node count); sources name both, e.g. ``("nvml", "cpu")``. When neither
finds anything, the node is the CPU node. Each backend logs (``logging``, INFO) why it found
nothing, and this module logs which backend it used.

A host with GPUs of both vendors: a node's device indices are each vendor's own (what
CUDA_VISIBLE_DEVICES and HIP_VISIBLE_DEVICES address), so the two sets would collide and cannot
be renumbered without breaking that. The node therefore describes one vendor: the one with more
total accelerator memory (then more devices; NVIDIA on a full tie), which keeps the compute
GPUs over a small display GPU of the other vendor. A WARNING names what was left out.

Run by hand: ``python -c "from hetflow.accelerators.discover import discover_local as d; print(d())"``.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from hetflow.accelerators import amd, cpu, nvidia
from hetflow.core.topology import NodeTopology

log = logging.getLogger(__name__)


def discover_local(*, nvidia_lib: Any = None, amd_lib: Any = None) -> NodeTopology:
    """This host as a NodeTopology; a machine without accelerators is a CPU node, never an error.

    ``nvidia_lib`` / ``amd_lib`` replace the ``pynvml`` / ``amdsmi`` modules (tests pass fakes);
    by default each backend imports its library lazily.
    """
    host = cpu.discover()
    found = [n for n in (nvidia.discover(nvidia_lib), amd.discover(amd_lib)) if n is not None]
    if not found:
        log.info("no NVIDIA or AMD accelerators found; describing %s as a CPU node", host.name)
        return host
    chosen = max(found, key=_preference)
    for other in found:
        if other is not chosen:
            log.warning(
                "this host has %d %s and %d %s devices; a node describes one vendor, so the %s "
                "devices are left out",
                len(chosen.devices), chosen.sources[0], len(other.devices), other.sources[0], other.sources[0],
            )
    log.info("found %d accelerators through %s", len(chosen.devices), chosen.sources[0])
    return replace(
        chosen,
        cpu_cores=host.cpu_cores,
        host_memory_bytes=host.host_memory_bytes,
        numa_nodes=host.numa_nodes,
        sources=chosen.sources + host.sources,
    )


def _preference(node: NodeTopology) -> tuple[int, int, int]:
    """Order between vendors' nodes: total memory, then device count, then NVIDIA first."""
    memory = sum(d.memory_bytes or 0 for d in node.devices)
    return memory, len(node.devices), int(nvidia.SOURCE in node.sources)
