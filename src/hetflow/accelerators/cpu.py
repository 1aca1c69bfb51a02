"""This host as a CPU node: the fallback every machine has (pure standard library).

:func:`discover` always returns a node (sources ``("cpu",)``) with one device, index 0, vendor
CPU: name = the CPU model (``model name`` in /proc/cpuinfo, else ``platform.processor()``),
memory = host memory, compute units = logical CPUs (``os.cpu_count()``), NUMA node 0. The node
also carries ``cpu_cores`` (logical CPUs), ``host_memory_bytes`` and ``numa_nodes`` (the
``node<N>`` directories under /sys/devices/system/node; 1 where that directory is missing).

Run by hand: ``python -c "from hetflow.accelerators import cpu; print(cpu.discover())"``.
"""

from __future__ import annotations

import logging
import os
import platform
import socket
from pathlib import Path
from typing import Any

from hetflow.core.topology import Device, NodeTopology, Vendor

log = logging.getLogger(__name__)

SOURCE = "cpu"
CPUINFO = Path("/proc/cpuinfo")
NUMA_NODES_DIR = Path("/sys/devices/system/node")


def discover(lib: Any = None, *, cpuinfo: Path = CPUINFO, numa_dir: Path = NUMA_NODES_DIR) -> NodeTopology:
    """This host's CPU as a one-device node. Never ``None``, never raises for missing files.

    ``lib`` is accepted so every backend has the same call shape and is unused; ``cpuinfo`` and
    ``numa_dir`` let tests point at other files.
    """
    cores = os.cpu_count()
    memory = host_memory_bytes()
    device = Device(
        index=0,
        vendor=Vendor.CPU,
        name=cpu_model(cpuinfo),
        memory_bytes=memory,
        compute_units=cores,
        numa_node=0,
    )
    return NodeTopology(
        name=socket.gethostname(),
        devices=(device,),
        cpu_cores=cores,
        host_memory_bytes=memory,
        numa_nodes=numa_node_count(numa_dir),
        sources=(SOURCE,),
    )


def cpu_model(cpuinfo: Path = CPUINFO) -> str | None:
    """The first ``model name`` in /proc/cpuinfo, else ``platform.processor()``, else None.

    (Many ARM kernels print no ``model name``; x86 always does.)
    """
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError as err:
        log.debug("cannot read %s: %s", cpuinfo, err)
        text = ""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "model name" and value.strip():
            return value.strip()
    return platform.processor() or None


def host_memory_bytes() -> int | None:
    """Physical memory in bytes (page size x physical pages), None where sysconf cannot say."""
    try:
        pages = os.sysconf("SC_PHYS_PAGES")
        page_size = os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError) as err:
        log.debug("sysconf cannot report memory: %s", err)
        return None
    return pages * page_size if pages > 0 and page_size > 0 else None


def numa_node_count(numa_dir: Path = NUMA_NODES_DIR) -> int:
    """The number of ``node<N>`` directories in ``numa_dir``; 1 when there are none."""
    try:
        nodes = [p for p in numa_dir.iterdir() if p.name.startswith("node") and p.name[4:].isdigit()]
    except OSError as err:
        log.debug("cannot list %s: %s", numa_dir, err)
        return 1
    return len(nodes) or 1
