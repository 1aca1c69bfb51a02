"""The simulator with the placement planner deciding ranks (``Simulator(..., ranks=RankPlanner)``):
its placements are the planner's for the same requests on the same occupancy."""

from __future__ import annotations

import itertools
import math

from hetflow.accelerators.synthetic import DGX1_CUBE_MESH
from hetflow.core.request import PlacementRequest
from hetflow.core.topology import Allocation, ClusterSnapshot, Device, Link, LinkKind, NodeTopology, PcieLevel, Vendor
from hetflow.scheduling.planner import plan
from hetflow.scheduling.policies.capacity import ClusterModel
from hetflow.scheduling.policies.registry import make_policy
from hetflow.scheduling.rank_planner import RankPlanner
from hetflow.sim.engine import SimConfig, Simulator
from tests.sim.world import job, no_catalog, table


def cube_mesh(name: str) -> NodeTopology:
    """A DGX-1-like node: NV1 25 GB/s, NV2 50 GB/s, other pairs 10 GB/s over PCIe."""
    links = []
    for a, b in itertools.combinations(range(8), 2):
        count = DGX1_CUBE_MESH.get((a, b))
        if count:
            links.append(Link(a, b, LinkKind.NVLINK, count=count, bandwidth_gbps=25.0 * count))
        else:
            links.append(Link(a, b, LinkKind.PCIE, pcie_level=PcieLevel.SYS, bandwidth_gbps=10.0))
    return NodeTopology(name, tuple(Device(i, Vendor.NVIDIA, model="cube") for i in range(8)), tuple(links))


def run(snapshot: ClusterSnapshot, jobs, ranks: bool):
    model = ClusterModel.from_snapshot(snapshot, lookup=no_catalog)
    speeds = table({("t", n, "cube"): 1.0 for n in range(1, 9)})
    planner = RankPlanner(snapshot, model) if ranks else None
    sim = Simulator(model, jobs, make_policy("fifo"), speeds, SimConfig(until_s=100.0), ranks=planner)
    return model, sim.run(), planner


def _replay(sizes: list[int]):
    """Each start of a fifo run with the rank planner (jobs one at a time, none finishing) and
    the planner's own placement for the same request on the same occupancy."""
    snapshot = ClusterSnapshot((cube_mesh("a"), cube_mesh("b")), inter_node_gbps=5.0)
    jobs = [job(i, "t", float(i), gpus, math.inf) for i, gpus in enumerate(sizes)]
    model, result, planner = run(snapshot, jobs, ranks=True)
    assert len(result.segments) == len(jobs)
    held: list[Allocation] = []
    pairs = []
    for seg in sorted(result.segments, key=lambda s: s.start):
        ours = tuple((model.nodes[p].machine, model.nodes[p].devices[q]) for p, q in seg.slots)
        alone = plan(ClusterSnapshot(snapshot.nodes, snapshot.inter_node_gbps, tuple(held)),
                     PlacementRequest(f"j{seg.job}", count=len(ours), model="cube"))
        pairs.append((seg, ours, alone))
        held += [Allocation(f"j{seg.job}", node, dev) for node, dev in ours]
    return snapshot, jobs, result, planner, pairs


def _bottleneck(snapshot: ClusterSnapshot, devices) -> float:
    return min((snapshot.node(na).bandwidth(a, b) if na == nb else snapshot.inter_node_gbps
                for (na, a), (nb, b) in itertools.combinations(devices, 2)), default=math.inf)


def test_simulated_placements_are_the_planners_for_the_same_requests() -> None:
    # the planner takes other devices than first fit on the policy's node for the early jobs,
    # and moves the fourth (3 GPUs), left only poorly linked devices on node a, to an
    # NV-linked trio on node b
    snapshot, jobs, result, planner, pairs = _replay([2, 3, 5, 3, 1])
    for seg, ours, alone in pairs:
        assert ours == tuple((d.node, d.device) for d in alone.devices), f"job {seg.job}"
    assert planner is not None and planner.calls == len(jobs) and planner.moved >= 1

    _, first_fit, _ = run(snapshot, jobs, ranks=False)  # the policy's own pick differs
    assert {s.job: s.slots for s in first_fit.segments} != {s.job: s.slots for s in result.segments}


def test_ties_stay_on_the_policys_nodes_at_the_planners_bottleneck() -> None:
    # here a later job's equally fast choice differs from the planner's alone (it keeps the
    # policy's node on a tie); the TP bottleneck is the planner's in every start
    snapshot, _, _, _, pairs = _replay([3, 2, 4, 3, 1, 3])
    assert any(ours != tuple((d.node, d.device) for d in alone.devices) for _, ours, alone in pairs)
    for seg, ours, alone in pairs:
        assert _bottleneck(snapshot, ours) == _bottleneck(snapshot, [tuple(d) for d in alone.devices]), f"job {seg.job}"


def test_ranks_follow_the_policys_nodes_when_no_other_node_is_faster() -> None:
    snapshot = ClusterSnapshot((cube_mesh("a"), cube_mesh("b")), inter_node_gbps=5.0)
    jobs = [job(0, "t", 0.0, 4, math.inf), job(1, "t", 1.0, 4, math.inf)]
    model, result, planner = run(snapshot, jobs, ranks=True)
    for seg in result.segments:  # first fit chose node a for both; its two quads are NV-connected
        assert {model.nodes[p].machine for p, _ in seg.slots} == {"a"}
        assert seg.rate > 0
    assert planner is not None and planner.moved == 0
