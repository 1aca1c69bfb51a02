"""``hetflow inventory``: what accelerators a machine (or a described cluster) has.

    hetflow inventory                       # probe this machine (NVML, amdsmi, else CPU)
    hetflow inventory --from topo.txt q.xml # the same from recorded tool output
    hetflow inventory --cluster cluster.yaml [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections import Counter

from rich.console import Console
from rich.table import Table

from hetflow.core.serialize import dumps
from hetflow.core.topology import ClusterSnapshot, NodeTopology
from hetflow.core.units import format_bytes


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "inventory",
        help="list accelerators, memory and interconnect of this machine or a cluster",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--from", dest="from_files", nargs="+", metavar="FILE",
                     help="recorded tool output of one machine (nvidia-smi, rocm-smi, amd-smi, KFD sysfs)")
    src.add_argument("--cluster", metavar="CLUSTER",
                     help="cluster description (YAML) or snapshot JSON")
    p.add_argument("--json", action="store_true", help="print the snapshot as JSON")
    p.set_defaults(func=run)


def collect(args: argparse.Namespace) -> ClusterSnapshot:
    if args.cluster:
        from hetflow.accelerators.load import load_cluster

        return load_cluster(args.cluster)
    if args.from_files:
        from hetflow.accelerators.load import load_node

        return ClusterSnapshot(nodes=(load_node(args.from_files),))
    from hetflow.accelerators.discover import discover_local
    from hetflow.accelerators.enrich import enrich_node

    return ClusterSnapshot(nodes=(enrich_node(discover_local()),))


def run(args: argparse.Namespace) -> int:
    snap = collect(args)
    if args.json:
        sys.stdout.write(dumps(snap) + "\n")
        return 0
    console = Console(width=max(100, Console().width), soft_wrap=False)
    print_snapshot(console, snap)
    return 0


def _signature(node: NodeTopology) -> tuple:
    return (
        tuple(dataclasses.replace(d, uuid=None, pci_bus_id=None) for d in node.devices),
        node.links,
    )


def print_snapshot(console: Console, snap: ClusterSnapshot) -> None:
    """One block per group of identical nodes (a 1,000-GPU cluster prints a few blocks)."""
    groups: dict[tuple, list[NodeTopology]] = {}
    for node in snap.nodes:
        groups.setdefault(_signature(node), []).append(node)
    if len(snap.nodes) > 1:
        kinds = Counter(d.model or d.vendor.value for n in snap.nodes for d in n.devices)
        mix = ", ".join(f"{c} x {m}" for m, c in sorted(kinds.items()))
        console.print(
            f"[bold]cluster[/]: {len(snap.nodes)} nodes, {snap.num_accelerators} accelerators "
            f"({mix}); between nodes {snap.inter_node_gbps:g} GB/s"
        )
    for nodes in groups.values():
        print_node(console, nodes[0], also=[n.name for n in nodes[1:]])


def print_node(console: Console, node: NodeTopology, also: list[str] | None = None) -> None:
    title = node.name
    if also:
        title += f" (and {len(also)} identical: {', '.join(also[:3])}{', ...' if len(also) > 3 else ''})"
    host = []
    if node.cpu_cores:
        host.append(f"{node.cpu_cores} CPU cores")
    if node.host_memory_bytes:
        host.append(f"{format_bytes(node.host_memory_bytes)} host memory")
    if node.numa_nodes:
        host.append(f"{node.numa_nodes} NUMA node{'s' if node.numa_nodes != 1 else ''}")
    console.print(f"\n[bold]{title}[/]" + (f": {', '.join(host)}" if host else ""))
    if node.sources:
        console.print(f"  from: {', '.join(node.sources)}")
    t = Table(show_edge=False, pad_edge=False)
    for col in ("#", "vendor", "model", "name", "memory", "arch", "NUMA", "PCI bus", "partition"):
        t.add_column(col)
    for d in node.devices:
        t.add_row(
            str(d.index), d.vendor.value, d.model or "?", d.name or "-", format_bytes(d.memory_bytes),
            d.arch or "-", "-" if d.numa_node is None else str(d.numa_node), d.pci_bus_id or "-",
            d.partition or "-",
        )
    console.print(t)
    if len(node.devices) < 2:
        return
    if len(node.devices) <= 16:
        m = Table(title="links between devices", show_edge=False, pad_edge=False)
        m.add_column("")
        for d in node.devices:
            m.add_column(str(d.index), justify="right")
        for a in node.devices:
            cells = []
            for b in node.devices:
                link = node.link(a.index, b.index) if a.index != b.index else None
                cells.append("X" if a.index == b.index else (link.label if link else "?"))
            m.add_row(str(a.index), *cells)
        console.print(m)
    _print_link_legend(console, node)


def _print_link_legend(console: Console, node: NodeTopology) -> None:
    """Each kind of link once, with its estimated bandwidth and where the figure comes from."""
    kinds: dict[tuple, int] = {}
    for link in node.links:
        key = (link.label, link.bandwidth_gbps, link.bandwidth_note)
        kinds[key] = kinds.get(key, 0) + 1
    for (label, gbps, note), count in sorted(kinds.items(), key=lambda kv: -(kv[0][1] or 0)):
        bw = f"{gbps:g} GB/s per direction" if gbps is not None else "bandwidth unknown"
        console.print(f"  {label:<10} {count:>4} pair{'s' if count != 1 else ' '}  {bw}"
                      + (f"  ({note})" if note else ""))
    unknown = len(node.devices) * (len(node.devices) - 1) // 2 - len(node.links)
    if unknown:
        console.print(f"  ?          {unknown:>4} pairs  not shown by the recorded output")
