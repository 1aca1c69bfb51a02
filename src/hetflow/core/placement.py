"""The planner's answer for one job: which device each rank gets, how good that is, and why.

A ``Placement`` is a plan, not a change: the cluster snapshot is updated only by applying it
(:meth:`Placement.apply_to`, or ``dataclasses.replace`` with :meth:`to_allocations`).

Bandwidths are GB/s per direction (1 GB = 1e9 bytes), estimated from the node topology
(``NodeTopology.bandwidth``) and, for devices on different nodes, the snapshot's
``inter_node_gbps``.

* TP-group bottleneck: the lowest bandwidth between any two devices of one tensor-parallel
  group (``None`` for a group of one device: it has no tensor-parallel traffic).
* Pipeline hop: between stage p and p+1 of one replica, the lowest bandwidth between the
  devices holding the same tp index in both stages (they exchange activations).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from hetflow.core.request import ParallelLayout
from hetflow.core.topology import Allocation, ClusterSnapshot
from hetflow.core.units import format_bytes


class DeviceRef(NamedTuple):
    """One device of the cluster: node name and the device's index on that node."""

    node: str
    device: int

    def __str__(self) -> str:
        return f"{self.node}:{self.device}"


@dataclass(frozen=True)
class Placement:
    """Rank -> device for one job, with the bandwidth of each group and a score.

    ``devices[rank]`` is the device of ``rank`` (rank order: dp outer, pp middle, tp inner;
    see :class:`~hetflow.core.request.ParallelLayout`). ``tp_group_gbps`` and
    ``tp_group_weakest`` are indexed by group ``dp_index * pp + pp_index``; ``pp_hop_gbps`` by
    ``dp_index * (pp - 1) + pp_index`` for the hop from stage ``pp_index`` to the next.

    ``score`` compares placements of one job, higher is better, lexicographically:
    (lowest TP-group bottleneck, lowest pipeline hop, minus the number of whole free nodes
    this placement starts using). ``math.inf`` stands for "no traffic of that kind".
    """

    job_id: str
    layout: ParallelLayout  # resolved: no -1 left
    devices: tuple[DeviceRef, ...]
    tp_group_gbps: tuple[float | None, ...]
    tp_group_weakest: tuple[str, ...]  # the weakest link of each group, e.g. "0-5 PCIe/SYS"
    pp_hop_gbps: tuple[float, ...]
    score: tuple[float, float, float]
    memory_bytes: int | None = None  # per device, recorded in the allocations
    exclusive: bool = True
    notes: tuple[str, ...] = ()  # why: the planner's reasons, one sentence each

    def __post_init__(self) -> None:
        assert self.layout.is_resolved, "a placement needs a resolved layout"
        assert len(self.devices) == self.layout.world_size, "one device per rank"
        assert len(set(self.devices)) == len(self.devices), "a rank per device within one job"
        assert len(self.tp_group_gbps) == self.layout.num_tp_groups
        assert len(self.pp_hop_gbps) == self.layout.dp * (self.layout.pp - 1)

    # --- summaries -----------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        return len(self.devices)

    @property
    def tp_bottleneck_gbps(self) -> float | None:
        """Lowest TP-group bottleneck over all groups; ``None`` when tp is 1."""
        known = [g for g in self.tp_group_gbps if g is not None]
        return min(known) if known else None

    @property
    def pp_bottleneck_gbps(self) -> float | None:
        """Lowest pipeline hop over all replicas; ``None`` when pp is 1."""
        return min(self.pp_hop_gbps) if self.pp_hop_gbps else None

    @property
    def nodes(self) -> tuple[str, ...]:
        """Nodes used, in order of first rank."""
        return tuple(dict.fromkeys(d.node for d in self.devices))

    def devices_on(self, node: str) -> tuple[int, ...]:
        """Device indices used on ``node``, in rank order."""
        return tuple(d.device for d in self.devices if d.node == node)

    def ranks_on(self, node: str) -> tuple[int, ...]:
        return tuple(r for r, d in enumerate(self.devices) if d.node == node)

    def tp_group(self, dp_index: int, pp_index: int) -> tuple[DeviceRef, ...]:
        return tuple(self.devices[r] for r in self.layout.tp_group_ranks(dp_index, pp_index))

    # --- applying ------------------------------------------------------------------------

    def to_allocations(self) -> tuple[Allocation, ...]:
        """One allocation per rank, ready to add to a snapshot's allocations."""
        return tuple(
            Allocation(
                job_id=self.job_id,
                node=d.node,
                device=d.device,
                memory_bytes=self.memory_bytes,
                exclusive=self.exclusive,
            )
            for d in self.devices
        )

    def apply_to(self, snapshot: ClusterSnapshot) -> ClusterSnapshot:
        """The snapshot with this placement's allocations added (the input is unchanged)."""
        return replace(snapshot, allocations=snapshot.allocations + self.to_allocations())

    # --- showing -------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form; bandwidths without traffic are ``null``."""

        def num(x: float | None) -> float | None:
            return None if x is None or math.isinf(x) else x

        dp, pp, tp = self.layout.shape
        return {
            "job_id": self.job_id,
            "layout": {"dp": dp, "pp": pp, "tp": tp},
            "ranks": [
                {"rank": r, "node": d.node, "device": d.device,
                 "dp": c[0], "pp": c[1], "tp": c[2]}
                for r, d in enumerate(self.devices)
                for c in [self.layout.coords(r)]
            ],
            "tp_groups": [
                {"dp": g // pp, "pp": g % pp, "gbps": num(bw), "weakest_link": weak}
                for g, (bw, weak) in enumerate(zip(self.tp_group_gbps, self.tp_group_weakest))
            ],
            "pp_hops": [
                {"dp": h // (pp - 1), "from_stage": h % (pp - 1), "gbps": num(bw)}
                for h, bw in enumerate(self.pp_hop_gbps)
            ],
            "tp_bottleneck_gbps": num(self.tp_bottleneck_gbps),
            "pp_bottleneck_gbps": num(self.pp_bottleneck_gbps),
            "score": [num(s) if not math.isinf(s) else None for s in self.score],
            "memory_bytes": self.memory_bytes,
            "exclusive": self.exclusive,
            "notes": list(self.notes),
        }

    def explain(self) -> str:
        """Readable, multi-line: the layout, each group's devices and links, and why."""
        dp, pp, tp = self.layout.shape
        mem = f", {format_bytes(self.memory_bytes)} per device" if self.memory_bytes else ""
        use = "exclusive" if self.exclusive else "shared by memory"
        lines = [
            f"job {self.job_id}: {self.world_size} device{'s' if self.world_size != 1 else ''} "
            f"({self.layout.describe()}) on {len(self.nodes)} node"
            f"{'s' if len(self.nodes) != 1 else ''}{mem}, {use}"
        ]
        bottleneck = self.tp_bottleneck_gbps
        lines.append(
            "tensor-parallel groups: " + (
                f"bottleneck {_gbps(bottleneck)} (lowest link inside any group)"
                if bottleneck is not None else "one device each (no tensor-parallel traffic)"
            )
        )
        for g in range(self.layout.num_tp_groups):
            d_i, p_i = divmod(g, pp)
            group = self.tp_group(d_i, p_i)
            where = _group_text(group)
            bw = self.tp_group_gbps[g]
            link = f"  {_gbps(bw)}, weakest {self.tp_group_weakest[g]}" if bw is not None else ""
            label = f"replica {d_i}" + (f" stage {p_i}" if pp > 1 else "")
            first = self.layout.rank(d_i, p_i, 0)
            ranks = f"rank {first}" if tp == 1 else f"ranks {first}-{first + tp - 1}"
            lines.append(f"  {label:<20} {ranks:<14} {where}{link}")
        if self.pp_hop_gbps:
            lines.append(f"pipeline hops: bottleneck {_gbps(self.pp_bottleneck_gbps)}")
            for h, bw in enumerate(self.pp_hop_gbps):
                d_i, p_i = divmod(h, pp - 1)
                a = self.tp_group(d_i, p_i)[0].node
                b = self.tp_group(d_i, p_i + 1)[0].node
                hop = "same node" if a == b else f"{a} -> {b}"
                lines.append(f"  replica {d_i} stage {p_i} -> {p_i + 1}: {_gbps(bw)} ({hop})")
        if self.notes:
            lines.append("why:")
            lines.extend(f"  - {n}" for n in self.notes)
        return "\n".join(lines)


def _gbps(x: float | None) -> str:
    if x is None or math.isinf(x):
        return "-"
    return f"{x:g} GB/s"


def _group_text(group: tuple[DeviceRef, ...]) -> str:
    """``dgx-0 [0 1 2 3]`` or, for a group spanning nodes, ``a [0 1] + b [4 5]``."""
    per_node: dict[str, list[int]] = {}
    for d in group:
        per_node.setdefault(d.node, []).append(d.device)
    return " + ".join(f"{n} [{' '.join(map(str, ix))}]" for n, ix in per_node.items())


__all__ = ["DeviceRef", "Placement"]
