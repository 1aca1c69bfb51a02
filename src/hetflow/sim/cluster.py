"""Clusters for the simulator, from any of the places a cluster can be described.

``load_sim_cluster(text)`` accepts:

- a cluster YAML or snapshot JSON (``hetflow.accelerators.load.load_cluster``): catalog
  shorthand nodes such as ``{count: 32, node: 8x H100}`` and recorded machines;
- Alibaba's openb node list CSV (``sn,cpu_milli,memory_mib,gpu,model``);
- inline shorthand: ``"9 * 4x V100 + 9 * 4x P100 + 9 * 4x K80"`` (COUNT * NODE, joined by
  ``+``), optionally ending in ``@ GBPS`` for the network between nodes (GB/s per direction).

Everything becomes a :class:`~hetflow.scheduling.policies.capacity.ClusterModel`.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Sequence

from hetflow.core.errors import InputError
from hetflow.core.topology import ClusterSnapshot
from hetflow.scheduling.policies.capacity import ClusterModel
from hetflow.sim.textio import open_text, plain_suffix

_PART = re.compile(r"^\s*(\d+)\s*\*\s*(.+?)\s*$")


MAX_NODES = 100_000
"""The most nodes a synthetic cluster has (10,000 nodes of 8 build and run a short trace in
seconds; 10^8 once ran until killed)."""


def synthetic_cluster(parts: Sequence[tuple[int, str]], inter_node_gbps: float = 25.0) -> ClusterSnapshot:
    """``[(32, "8x H100"), (32, "8x MI300X")]`` -> a snapshot of catalog nodes named
    ``<model>-<i>`` (e.g. ``H100-SXM-0``)."""
    from hetflow.accelerators.synthetic import synthetic_node

    nodes = []
    used: dict[str, int] = {}
    total = sum(count for count, _ in parts)
    if total > MAX_NODES:
        raise InputError(f"a cluster of {total:,} nodes is past the {MAX_NODES:,} a simulated cluster holds; "
                         "lower the node counts")
    for count, node_text in parts:
        if count <= 0:
            raise InputError(f"node count {count} for {node_text!r} must be > 0")
        proto = synthetic_node(node_text, "proto")  # identical boards: build one, rename copies
        label = proto.devices[0].model if proto.devices and proto.devices[0].model else node_text.replace(" ", "")
        for _ in range(count):
            i = used.get(label, 0)
            used[label] = i + 1
            nodes.append(dataclasses.replace(proto, name=f"{label}-{i}"))
    if inter_node_gbps <= 0:
        raise InputError("the network between nodes must be faster than 0 GB/s")
    return ClusterSnapshot(tuple(nodes), inter_node_gbps=inter_node_gbps)


def parse_shorthand(text: str) -> ClusterSnapshot:
    """``"9 * 4x V100 + 9 * 4x P100 @ 3.125"`` -> snapshot (see module docstring)."""
    body, at, gbps_text = text.partition("@")
    gbps = 25.0
    if at:
        try:
            gbps = float(gbps_text)
        except ValueError:
            raise InputError(f"cluster {text!r}: after '@' give the network speed in GB/s, e.g. '@ 25'") from None
    parts = []
    for chunk in body.split("+"):
        m = _PART.match(chunk)
        if not m:
            raise InputError(f"cluster part {chunk.strip()!r}: write COUNT * NODE, e.g. '32 * 8x H100'")
        parts.append((int(m.group(1)), m.group(2)))
    return synthetic_cluster(parts, gbps)


def load_sim_snapshot(text: str) -> ClusterSnapshot:
    """A cluster file or inline shorthand -> its snapshot (devices and links)."""
    path = Path(text)
    if _is_file(path):
        from hetflow.sim.traces import detect_format, load_openb_nodes

        if plain_suffix(path) == ".csv" and _is_openb_nodes(path):  # also .csv.gz / .csv.xz
            return load_openb_nodes(path)
        if plain_suffix(path) == ".csv":
            kind = detect_format(path)
            raise InputError(f"{path}: a {kind} file is a trace; --cluster takes a cluster YAML, a snapshot "
                             f"JSON, an openb node list or shorthand such as '32 * 8x H100'")
        from hetflow.accelerators.load import load_cluster

        return load_cluster(path)
    if "*" in text:
        return parse_shorthand(text)
    raise InputError(f"--cluster {text!r}: no such file, and not shorthand such as '32 * 8x H100 + 32 * 8x MI300X'")


def load_sim_cluster(text: str) -> ClusterModel:
    """A cluster file or inline shorthand -> the model the simulator schedules on."""
    return ClusterModel.from_snapshot(load_sim_snapshot(text))


def _is_file(path: Path) -> bool:
    """``path.is_file()``, False for text no file can have (a name too long for the system)."""
    try:
        return path.is_file()
    except OSError:
        return False


def _is_openb_nodes(path: Path) -> bool:
    with open_text(path, errors="replace") as f:
        header = f.readline().strip().split(",")
    return {"sn", "gpu", "model"} <= set(header)
