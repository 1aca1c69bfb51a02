"""The planner's TP bottleneck is optimal: it equals an independent brute force on small clusters.

Definition checked: the TP bottleneck of a placement is the minimum, over its tensor-parallel
groups, of the lowest bandwidth between two devices of the group (the node's link bandwidth
inside a node, the snapshot's ``inter_node_gbps`` across nodes).

The reference below shares no code with the planner: it lists every set of tp usable devices in
the whole cluster, scores it from the pairwise bandwidths, and searches exhaustively (device by
device: leave it out, or open a group with it) for the highest score level at which dp*pp
disjoint groups exist. Cases: every recorded fixture topology (loaded and enriched by
``accelerators.load.load_node``) alone and in small clusters, hand-built topologies of the kinds the planner meets (NVLink
hybrid cube mesh, PCIe split over two NUMA nodes, multi-hop xGMI, two xGMI hives joined by
PCIe, NVSwitch all-to-all), random bandwidth matrices, and up to 4 nodes x 8 devices with
random prior occupancy.
"""

from __future__ import annotations

import itertools
import random
import zlib
from collections import deque
from dataclasses import replace
from typing import Callable

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from hetflow.accelerators.synthetic import DGX1_CUBE_MESH
from hetflow.core.errors import Unschedulable
from hetflow.core.placement import Placement
from hetflow.core.request import ParallelLayout, PlacementRequest
from hetflow.core.topology import (
    Allocation, ClusterSnapshot, Device, Link, LinkKind, NodeTopology, PcieLevel, Vendor,
)
from hetflow.scheduling.planner import plan
from tests.conftest import FIXTURES

GIB = 1024**3
Bandwidth = Callable[[int, int], tuple[LinkKind, float, PcieLevel | None]]


def build(name: str, n: int, link: Bandwidth, vendor: Vendor = Vendor.NVIDIA) -> NodeTopology:
    devices = tuple(Device(index=i, vendor=vendor, model="GPU", memory_bytes=64 * GIB) for i in range(n))
    links = []
    for a, b in itertools.combinations(range(n), 2):
        kind, gbps, level = link(a, b)
        links.append(Link(a=a, b=b, kind=kind, pcie_level=level, bandwidth_gbps=gbps))
    return NodeTopology(name=name, devices=devices, links=tuple(links))


# --- the topologies ---------------------------------------------------------------------

# DGX-1 (V100): NVLink hybrid cube mesh; NV1 = 25 GB/s, NV2 = 50 GB/s, other pairs over SYS.
DGX1_NVLINKS = DGX1_CUBE_MESH  # the one DGX-1 link table (accelerators/synthetic.py)


def dgx1_hybrid_mesh(name: str) -> NodeTopology:
    def link(a: int, b: int):
        count = DGX1_NVLINKS.get((a, b))
        if count:
            return LinkKind.NVLINK, 25.0 * count, None
        return LinkKind.PCIE, 10.0, PcieLevel.SYS

    return build(name, 8, link)


def pcie_two_numa(name: str, n: int = 8) -> NodeTopology:
    """Pairs behind one switch (PIX), a socket's switches under one root (PXB), sockets via SYS."""
    half = n // 2

    def link(a: int, b: int):
        if a // half != b // half:
            return LinkKind.PCIE, 16.0, PcieLevel.SYS
        if a // 2 == b // 2:
            return LinkKind.PCIE, 32.0, PcieLevel.PIX
        return LinkKind.PCIE, 24.0, PcieLevel.PXB

    return build(name, n, link)


MI250_DIRECT = {  # GCD pairs with a direct xGMI path, by bonded link count (50 GB/s per link)
    (0, 1): 4, (2, 3): 4, (4, 5): 4, (6, 7): 4,
    (0, 2): 2, (1, 3): 1, (4, 6): 2, (5, 7): 1, (0, 6): 1, (2, 4): 1, (1, 7): 2, (3, 5): 2,
}


def mi250_multihop(name: str) -> NodeTopology:
    """4 MI250-like packages x 2 GCDs: 200/100/50 GB/s direct paths; other pairs go through
    intermediate GCDs (2 hops ~ 40 GB/s, 3 hops ~ 30 GB/s)."""
    adjacency: dict[int, set[int]] = {i: set() for i in range(8)}
    for a, b in MI250_DIRECT:
        adjacency[a].add(b)
        adjacency[b].add(a)

    def hops(a: int, b: int) -> int:
        seen, queue = {a: 0}, deque([a])
        while queue:
            x = queue.popleft()
            for y in adjacency[x]:
                if y not in seen:
                    seen[y] = seen[x] + 1
                    queue.append(y)
        return seen[b]

    def link(a: int, b: int):
        count = MI250_DIRECT.get((a, b))
        if count:
            return LinkKind.XGMI, 50.0 * count, None
        return LinkKind.XGMI, {2: 40.0, 3: 30.0}[hops(a, b)], None

    return build(name, 8, link, Vendor.AMD)


def two_xgmi_hives(name: str) -> NodeTopology:
    """Two 4-GPU xGMI hives (MI210 bridges, 50 GB/s) joined by PCIe (28 GB/s)."""

    def link(a: int, b: int):
        if a // 4 == b // 4:
            return LinkKind.XGMI, 50.0, None
        return LinkKind.PCIE, 28.0, PcieLevel.SYS

    return build(name, 8, link, Vendor.AMD)


def nvswitch(name: str, n: int = 8) -> NodeTopology:
    return build(name, n, lambda a, b: (LinkKind.NVSWITCH, 450.0, None))


TEMPLATES = {
    "dgx1": dgx1_hybrid_mesh,
    "pcie2numa": pcie_two_numa,
    "mi250": mi250_multihop,
    "hives": two_xgmi_hives,
    "nvswitch": nvswitch,
}


def random_node(name: str, rng: random.Random, n: int) -> NodeTopology:
    values = [0.0, 10.0, 20.0, 25.0, 32.0, 50.0, 100.0]
    table = {p: rng.choice(values) for p in itertools.combinations(range(n), 2)}
    return build(name, n, lambda a, b: (LinkKind.UNKNOWN, table[(a, b)], None))


# --- the independent reference ------------------------------------------------------------


def pair_gbps(snapshot: ClusterSnapshot, x: tuple[str, int], y: tuple[str, int]) -> float:
    if x[0] != y[0]:
        return snapshot.inter_node_gbps
    return snapshot.node(x[0]).bandwidth(x[1], y[1])


def free_devices(snapshot: ClusterSnapshot, vendor: Vendor | None = None) -> list[tuple[str, int]]:
    taken = {(a.node, a.device) for a in snapshot.allocations}
    return [(n.name, d.index) for n in snapshot.nodes for d in n.devices
            if (n.name, d.index) not in taken and vendor in (None, d.vendor)]


def brute_force_bottleneck(snapshot: ClusterSnapshot, tp: int, groups: int,
                           vendor: Vendor | None = None) -> float:
    """Highest achievable minimum TP-group bottleneck, by exhaustive search (over the devices
    of ``vendor`` only, when given)."""
    devices = free_devices(snapshot, vendor)
    scored = []  # (bottleneck, bitmask over `devices`, lowest member)
    for combo in itertools.combinations(range(len(devices)), tp):
        value = min(pair_gbps(snapshot, devices[a], devices[b]) for a, b in itertools.combinations(combo, 2))
        scored.append((value, sum(1 << k for k in combo), combo[0]))
    for level in sorted({s[0] for s in scored}, reverse=True):
        by_lowest: dict[int, list[int]] = {}
        for value, mask, lowest in scored:
            if value >= level:
                by_lowest.setdefault(lowest, []).append(mask)
        if disjoint_sets_exist(by_lowest, len(devices), groups, tp):
            return level
    raise AssertionError("at the lowest level any devices form groups")


def disjoint_sets_exist(by_lowest: dict[int, list[int]], n: int, groups: int, tp: int) -> bool:
    """Whether ``groups`` disjoint sets exist: walk the devices in order; each is left out or
    opens one of the sets whose lowest member it is. Pruned only by counting: the devices
    still free from k on that belong to some set must be enough for the sets still needed."""
    members = 0
    for masks in by_lowest.values():
        for mask in masks:
            members |= mask

    def search(k: int, used: int, need: int) -> bool:
        if need == 0:
            return True
        if ((members & ~used) >> k).bit_count() < need * tp:
            return False
        if used >> k & 1:
            return search(k + 1, used, need)
        for mask in by_lowest.get(k, ()):
            if not mask & used and search(k + 1, used | mask, need - 1):
                return True
        return search(k + 1, used, need)

    return search(0, 0, groups)


def check_against_brute_force(snapshot: ClusterSnapshot, layout: ParallelLayout) -> Placement | None:
    """The planner's bottleneck is the best over single vendors (a job never mixes vendors),
    and it refuses when no vendor alone has enough free devices."""
    vendors = {snapshot.node(n).device(i).vendor for n, i in free_devices(snapshot)}
    fitting = [v for v in vendors if len(free_devices(snapshot, v)) >= layout.world_size]
    if not fitting:
        with pytest.raises(Unschedulable, match="cannot mix vendors"):
            plan(snapshot, PlacementRequest("job", layout=layout))
        return None
    placement = plan(snapshot, PlacementRequest("job", layout=layout))
    assert len({snapshot.node(d.node).device(d.device).vendor for d in placement.devices}) == 1
    free = set(free_devices(snapshot))
    assert len(placement.devices) == layout.world_size
    assert len(set(placement.devices)) == layout.world_size
    assert all((d.node, d.device) in free for d in placement.devices)
    # the reported group bandwidths are the real ones
    for g in range(layout.num_tp_groups):
        members = placement.devices[g * layout.tp:(g + 1) * layout.tp]
        real = min(pair_gbps(snapshot, x, y) for x, y in itertools.combinations(members, 2))
        assert placement.tp_group_gbps[g] == real
    expected = max(brute_force_bottleneck(snapshot, layout.tp, layout.num_tp_groups, v) for v in fitting)
    assert placement.tp_bottleneck_gbps == expected, placement.explain()
    assert not any("not proven" in n for n in placement.notes)
    return placement


def occupy(nodes: list[NodeTopology], busy: dict[str, list[int]], inter: float) -> ClusterSnapshot:
    allocations = tuple(Allocation("other", name, i) for name, ids in busy.items() for i in ids)
    return ClusterSnapshot(nodes=tuple(nodes), inter_node_gbps=inter, allocations=allocations)


# --- the brute force itself must be right: hand-checked answers ----------------------------


def test_brute_force_reference_on_hand_checked_cases() -> None:
    dgx1 = occupy([dgx1_hybrid_mesh("a")], {}, 25.0)
    assert brute_force_bottleneck(dgx1, 2, 1) == 50.0  # an NV2 pair
    assert brute_force_bottleneck(dgx1, 2, 4) == 50.0  # the NV2 links form an 8-cycle
    assert brute_force_bottleneck(dgx1, 4, 2) == 25.0  # the two NVLink quads
    assert brute_force_bottleneck(dgx1, 8, 1) == 10.0
    hives = occupy([two_xgmi_hives("h")], {"h": [0]}, 25.0)
    assert brute_force_bottleneck(hives, 4, 1) == 50.0
    hives = occupy([two_xgmi_hives("h")], {"h": [0, 1]}, 25.0)
    assert brute_force_bottleneck(hives, 3, 2) == 28.0  # hive 0 has only 2 free devices
    two = occupy([pcie_two_numa("p", 4), pcie_two_numa("q", 4)], {"p": [0], "q": [3]}, 20.0)
    assert brute_force_bottleneck(two, 2, 2) == 32.0  # p:2-3 and q:0-1 share a switch
    # inside a node a group of 3 crosses sockets (16); across nodes p:2,3+q:2 and p:1+q:0,1 get 20
    assert brute_force_bottleneck(two, 3, 2) == 20.0
    assert brute_force_bottleneck(two, 4, 1) == 20.0  # p:2,3 + q:0,1


# --- named cases ----------------------------------------------------------------------------

NAMED_CASES = [
    # (templates, busy devices per node, inter-node GB/s, dp, pp, tp)
    (["dgx1"], {}, 25.0, 1, 1, 2),
    (["dgx1"], {}, 25.0, 4, 1, 2),
    (["dgx1"], {"n0": [0, 5]}, 25.0, 3, 1, 2),
    (["dgx1"], {"n0": [1]}, 25.0, 1, 1, 4),
    (["dgx1", "dgx1"], {"n0": [0, 1, 2], "n1": [4, 5, 6]}, 25.0, 2, 1, 4),
    (["pcie2numa"], {"n0": [0, 2]}, 25.0, 1, 1, 2),
    (["pcie2numa", "pcie2numa"], {"n0": [0, 1, 4], "n1": [2, 3, 6, 7]}, 25.0, 1, 2, 4),
    (["mi250"], {"n0": [1, 2]}, 25.0, 1, 1, 2),
    (["mi250"], {}, 25.0, 1, 1, 4),
    (["mi250", "mi250"], {"n0": [0, 3, 5], "n1": [1, 4, 6]}, 25.0, 2, 1, 3),
    (["hives"], {"n0": [0, 5]}, 25.0, 2, 1, 3),
    (["hives", "hives"], {"n0": [0, 1], "n1": [5, 6, 7]}, 40.0, 2, 1, 4),
    (["nvswitch", "hives", "dgx1"], {"n0": [0, 1, 2, 3, 4], "n1": [0, 4], "n2": [2, 3, 4, 5]}, 25.0, 3, 1, 3),
    (["nvswitch", "pcie2numa"], {"n0": [0, 1, 2, 3, 4, 5], "n1": [1, 3, 5]}, 25.0, 1, 1, 6),
    (["pcie2numa"] * 3, {"n0": [0, 1, 2, 3, 4, 5], "n1": [0, 1, 2, 3, 6, 7], "n2": [2, 3, 4, 5, 6]}, 25.0, 1, 1, 6),
]


@pytest.mark.parametrize("templates,busy,inter,dp,pp,tp", NAMED_CASES)
def test_named_topologies_match_brute_force(templates, busy, inter, dp, pp, tp) -> None:
    nodes = [TEMPLATES[t](f"n{k}") for k, t in enumerate(templates)]
    check_against_brute_force(occupy(nodes, busy, inter), ParallelLayout(dp=dp, pp=pp, tp=tp))


# --- generated cases: up to 4 nodes x 8 devices, random occupancy ---------------------------


MAX_FREE = {2: 20, 3: 16, 4: 16, 5: 16, 6: 16}  # keeps the reference's search to a second


def random_cluster(rng: random.Random, tp: int) -> ClusterSnapshot:
    """1-4 nodes (templates or random matrices), random prior occupancy, with at least tp and
    at most MAX_FREE[tp] free devices."""
    nodes = []
    for k in range(rng.randint(1, 4)):
        kind = rng.choice(sorted(TEMPLATES) + ["random"])
        name = f"n{k}"
        nodes.append(random_node(name, rng, rng.randint(2, 8)) if kind == "random" else TEMPLATES[kind](name))
    slots = [(n.name, d.index) for n in nodes for d in n.devices]
    busy_count = rng.randint(0, len(slots))
    busy_count = min(max(busy_count, len(slots) - MAX_FREE[tp]), len(slots) - min(tp, len(slots)))
    busy: dict[str, list[int]] = {}
    for name, index in rng.sample(slots, busy_count):
        busy.setdefault(name, []).append(index)
    return occupy(nodes, busy, rng.choice([10.0, 20.0, 25.0, 40.0, 100.0]))


def random_layout(rng: random.Random, snapshot: ClusterSnapshot, tp: int) -> ParallelLayout:
    groups = rng.randint(1, len(free_devices(snapshot)) // tp)
    pp = rng.choice([p for p in (1, 2, 3) if groups % p == 0])
    return ParallelLayout(dp=groups // pp, pp=pp, tp=tp)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), tp=st.integers(2, 6))
def test_generated_clusters_match_brute_force(seed: int, tp: int) -> None:
    rng = random.Random(seed)
    snapshot = random_cluster(rng, tp)
    if len(free_devices(snapshot)) < tp:  # a tiny random node with fewer devices than tp
        tp = 2
    check_against_brute_force(snapshot, random_layout(rng, snapshot, min(tp, len(free_devices(snapshot)))))


def test_seeded_clusters_of_up_to_4_nodes_x_8_match_brute_force() -> None:
    """A fixed sweep that is sure to include full-size clusters and groups spanning nodes."""
    rng = random.Random(20240603)
    spanning = sizes = 0
    for _ in range(300):
        tp = rng.randint(2, 6)
        snapshot = random_cluster(rng, tp)
        tp = min(tp, len(free_devices(snapshot)))
        if tp < 2:
            continue
        layout = random_layout(rng, snapshot, tp)
        placement = check_against_brute_force(snapshot, layout)
        if placement is None:  # no vendor alone holds it (checked: refused)
            continue
        spanning += any(
            len({d.node for d in placement.devices[g * tp:(g + 1) * tp]}) > 1
            for g in range(layout.num_tp_groups)
        )
        sizes += sum(len(n.devices) for n in snapshot.nodes) >= 24
    assert spanning >= 10, "the sweep should exercise TP groups that span nodes"
    assert sizes >= 10, "the sweep should include clusters of 3-4 full nodes"


# --- the recorded fixture topologies --------------------------------------------------------


def _fixture_nodes() -> dict[str, NodeTopology]:
    """Every recorded fixture that describes two or more devices, as an enriched node."""
    from hetflow.accelerators.load import load_node

    nodes = {}
    for path in sorted(FIXTURES.iterdir()):
        if path.suffix == ".md":
            continue
        node = load_node([path])
        if len(node.devices) >= 2:
            nodes[path.name] = node
    return nodes


FIXTURE_NODES = _fixture_nodes()


def test_fixture_topologies_are_the_expected_ones() -> None:
    assert len(FIXTURE_NODES) >= 20
    sizes = {name.split("_")[0]: len(n.devices) for name, n in FIXTURE_NODES.items()}
    assert sizes["amd-mi300x-oam8-cpx"] == 63 and sizes["nvidia-dgx2-v100x16-nvswitch"] == 16
    levels = {round(FIXTURE_NODES[n].bandwidth(a, b), 3) for n in FIXTURE_NODES
              for a, b in FIXTURE_NODES[n].pairs() if n.startswith("amd-mi300x-oam8-cpx")}
    assert levels == {63.333, 819.2}  # partitions of one package vs across packages


def _occupied_fixture_cluster(rng: random.Random, nodes: list[NodeTopology], max_free: int,
                              inter: float) -> ClusterSnapshot:
    slots = [(n.name, d.index) for n in nodes for d in n.devices]
    busy_count = max(rng.randint(0, len(slots) - 2), len(slots) - max_free)
    busy: dict[str, list[int]] = {}
    for name, index in rng.sample(slots, busy_count):
        busy.setdefault(name, []).append(index)
    return occupy(nodes, busy, inter)


@pytest.mark.parametrize("fixture", sorted(FIXTURE_NODES))
def test_each_fixture_topology_matches_brute_force(fixture: str) -> None:
    node = replace(FIXTURE_NODES[fixture], name="n0")
    rng = random.Random(zlib.crc32(fixture.encode()))
    for _ in range(6):
        tp = rng.randint(2, 6)
        snapshot = _occupied_fixture_cluster(rng, [node], MAX_FREE[min(tp, 6)], 25.0)
        tp = min(tp, len(free_devices(snapshot)))
        check_against_brute_force(snapshot, random_layout(rng, snapshot, tp))


def test_clusters_of_fixture_nodes_match_brute_force() -> None:
    rng = random.Random(7)
    names = sorted(FIXTURE_NODES)
    for _ in range(40):
        picked = [replace(FIXTURE_NODES[rng.choice(names)], name=f"n{k}") for k in range(rng.randint(2, 4))]
        tp = rng.randint(2, 5)
        snapshot = _occupied_fixture_cluster(rng, picked, MAX_FREE[tp], rng.choice([10.0, 25.0, 50.0]))
        tp = min(tp, len(free_devices(snapshot)))
        check_against_brute_force(snapshot, random_layout(rng, snapshot, tp))
