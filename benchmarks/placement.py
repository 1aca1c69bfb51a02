"""Placement benchmark: hetflow's planner against Ray's first-fit choice, side by side.

    .venv/bin/python benchmarks/placement.py                 # defaults below, about a minute
    .venv/bin/python benchmarks/placement.py --seed 1 --trials 4000 --jobs 1000

Quality: many small clusters (1-4 nodes) of the node kinds Ray handles worst, each partly
occupied at random: NVLink hybrid cube mesh (DGX-1 V100), PCIe split over two NUMA nodes
(PIX/PXB/SYS), MI250-like multi-hop xGMI, two 4-GPU xGMI hives joined by PCIe. A job asks for a
gang of 2, 3 or 4 devices (one tensor-parallel group). Ray's choice is first fit, as Ray makes
it: the lowest free device indices on the first node with enough free devices. Reported: the
mean and the worst TP-group bottleneck bandwidth of hetflow's choice divided by Ray's (over the
trials Ray can place at all), and the lowest per-trial ratio (never below 1 if the planner is
optimal).

Speed: a 1,024-GPU mixed cluster (128 nodes x 8: the four kinds above plus NVSwitch H100 and
all-to-all xGMI MI300X nodes), about half occupied; a stream of jobs of mixed layouts is planned
one by one, each placement applied, and old jobs released to keep the cluster about half full.
Reported: median and p99 wall-clock milliseconds per ``plan()`` call, the first (cold-cache)
call included; the CPU-time p99 beside it shows how much of the tail is a busy machine.

Simulator: the 1,024-GPU mix of ``benchmarks/scheduling.py`` (32 nodes each of 8x H100, 8x
MI300X, 8x A100-80GB, 8x L40S, catalog topologies, 25 GB/s between nodes; 10,000 jobs at 150/h,
seed 0), simulated under the hetflow policy twice in one run: with the policy's own device pick
and with the planner deciding every started job's devices inside the policy's choice
(``Simulator(..., ranks=RankPlanner(snapshot, model))``, the live controller's interface).
Reported: both wall times (and CPU times), how many starts the planner changed, and the average
JCT of each.

The node topologies are built here with bandwidths set on every link (GB/s per direction, from
the shared fixtures' BANDWIDTH.md figures); the inter-node network is 25 GB/s. Seeded: the same
seed prints the same quality figures. The last line is machine-readable:
``RESULT mean_bw_vs_ray=<x> worst_bw_vs_ray=<x> p50_ms=<x> p99_ms=<x>
controller_over_planner_bw=<x> sim_1024_planner_wall_s=<x>``.
"""

from __future__ import annotations

import ray_home  # noqa: F401 - first: Ray's temp folder is this run's own (ray_home.py)

import argparse
import itertools
import random
import statistics
import time
from collections import deque
from dataclasses import replace
from typing import Callable

from hetflow.accelerators.catalog import default_catalog
from hetflow.accelerators.synthetic import DGX1_CUBE_MESH
from hetflow.core.errors import Unschedulable
from hetflow.core.request import ParallelLayout, PlacementRequest, Strategy
from hetflow.core.topology import (
    Allocation, ClusterSnapshot, Device, Link, LinkKind, NodeTopology, PcieLevel, Vendor,
)
from hetflow.scheduling.planner import Planner, plan

GIB = 1024**3
INTER_NODE_GBPS = 25.0
LinkFn = Callable[[int, int], tuple[LinkKind, float, PcieLevel | None, int | None]]


# --- node kinds -------------------------------------------------------------------------------


def _node(name: str, vendor: Vendor, model: str, arch: str, memory_gib: int, link: LinkFn) -> NodeTopology:
    devices = tuple(
        Device(index=i, vendor=vendor, model=model, arch=arch, memory_bytes=memory_gib * GIB)
        for i in range(8)
    )
    links = []
    for a, b in itertools.combinations(range(8), 2):
        kind, gbps, level, count = link(a, b)
        links.append(Link(a=a, b=b, kind=kind, pcie_level=level, count=count, bandwidth_gbps=gbps))
    return NodeTopology(name=name, devices=devices, links=tuple(links))


_DGX1_NVLINKS = DGX1_CUBE_MESH  # the one DGX-1 link table (accelerators/synthetic.py)


def dgx1_v100(name: str) -> NodeTopology:
    """NVLink 2 hybrid cube mesh: NV1 25 GB/s, NV2 50 GB/s; other pairs PCIe 3 across sockets."""

    def link(a: int, b: int):
        count = _DGX1_NVLINKS.get((a, b))
        if count:
            return LinkKind.NVLINK, 25.0 * count, None, count
        return LinkKind.PCIE, 10.0, PcieLevel.SYS, None

    return _node(name, Vendor.NVIDIA, "V100-SXM2", "sm_70", 32, link)


def pcie_two_numa(name: str) -> NodeTopology:
    """8 PCIe 4 GPUs: pairs behind a switch (PIX), two switches per socket (PXB), sockets (SYS)."""

    def link(a: int, b: int):
        if a // 4 != b // 4:
            return LinkKind.PCIE, 16.0, PcieLevel.SYS, None
        if a // 2 == b // 2:
            return LinkKind.PCIE, 32.0, PcieLevel.PIX, None
        return LinkKind.PCIE, 24.0, PcieLevel.PXB, None

    return _node(name, Vendor.NVIDIA, "RTX4090", "sm_89", 24, link)


_MI250_DIRECT = {
    (0, 1): 4, (2, 3): 4, (4, 5): 4, (6, 7): 4,
    (0, 2): 2, (1, 3): 1, (4, 6): 2, (5, 7): 1, (0, 6): 1, (2, 4): 1, (1, 7): 2, (3, 5): 2,
}


def _hops(a: int, b: int) -> int:
    adjacency: dict[int, set[int]] = {i: set() for i in range(8)}
    for x, y in _MI250_DIRECT:
        adjacency[x].add(y)
        adjacency[y].add(x)
    seen, queue = {a: 0}, deque([a])
    while queue:
        x = queue.popleft()
        for y in adjacency[x]:
            if y not in seen:
                seen[y] = seen[x] + 1
                queue.append(y)
    return seen[b]


def mi250_multihop(name: str) -> NodeTopology:
    """4 packages x 2 GCDs: 200/100/50 GB/s direct xGMI; 2 hops ~40, 3 hops ~30 GB/s."""

    def link(a: int, b: int):
        count = _MI250_DIRECT.get((a, b))
        if count:
            return LinkKind.XGMI, 50.0 * count, None, count
        return LinkKind.XGMI, {2: 40.0, 3: 30.0}[_hops(a, b)], None, None

    return _node(name, Vendor.AMD, "MI250X", "gfx90a", 64, link)


def two_xgmi_hives(name: str) -> NodeTopology:
    """Two 4-GPU MI210 xGMI bridges (50 GB/s) joined over PCIe 4 across sockets (28 GB/s)."""

    def link(a: int, b: int):
        if a // 4 == b // 4:
            return LinkKind.XGMI, 50.0, None, 1
        return LinkKind.PCIE, 28.0, PcieLevel.SYS, None

    return _node(name, Vendor.AMD, "MI210", "gfx90a", 64, link)


def nvswitch_h100(name: str) -> NodeTopology:
    return _node(name, Vendor.NVIDIA, "H100-SXM", "sm_90", 80,
                 lambda a, b: (LinkKind.NVSWITCH, 450.0, None, 18))


def mi300x_oam(name: str) -> NodeTopology:
    return _node(name, Vendor.AMD, "MI300X", "gfx942", 192,
                 lambda a, b: (LinkKind.XGMI, 64.0, None, 1))


QUALITY_KINDS = [dgx1_v100, pcie_two_numa, mi250_multihop, two_xgmi_hives]
SPEED_KINDS = QUALITY_KINDS + [nvswitch_h100, mi300x_oam]


# --- the two choosers ----------------------------------------------------------------------


def bottleneck(snapshot: ClusterSnapshot, devices: list[tuple[str, int]]) -> float:
    """Lowest pairwise bandwidth of one group (GB/s)."""
    worst = float("inf")
    for (na, a), (nb, b) in itertools.combinations(devices, 2):
        bw = snapshot.node(na).bandwidth(a, b) if na == nb else snapshot.inter_node_gbps
        worst = min(worst, bw)
    return worst


def ray_first_fit(snapshot: ClusterSnapshot, count: int) -> list[tuple[str, int]] | None:
    """Ray's choice for one bundle of ``count`` GPUs: the first node with that many free, and
    the lowest free indices on it."""
    busy = {(a.node, a.device) for a in snapshot.allocations}
    for node in snapshot.nodes:
        free = [d.index for d in node.devices if (node.name, d.index) not in busy]
        if len(free) >= count:
            return [(node.name, i) for i in sorted(free)[:count]]
    return None


def random_occupancy(rng: random.Random, nodes: list[NodeTopology], fraction: float) -> tuple[Allocation, ...]:
    return tuple(
        Allocation(job_id=f"prior-{n.name}-{d.index}", node=n.name, device=d.index)
        for n in nodes for d in n.devices if rng.random() < fraction
    )


# --- quality -------------------------------------------------------------------------------


def quality(seed: int, trials: int) -> dict[str, float]:
    rng = random.Random(seed)
    ours, rays, ratios = [], [], []
    skipped = 0
    for t in range(trials):
        kinds = [rng.choice(QUALITY_KINDS) for _ in range(rng.randint(1, 4))]
        nodes = [kind(f"n{k}") for k, kind in enumerate(kinds)]
        snapshot = ClusterSnapshot(
            nodes=tuple(nodes), inter_node_gbps=INTER_NODE_GBPS,
            allocations=random_occupancy(rng, nodes, rng.uniform(0.1, 0.7)),
        )
        count = rng.choice([2, 3, 4])
        ray = ray_first_fit(snapshot, count)
        if ray is None:  # Ray cannot place one bundle of that size anywhere
            skipped += 1
            continue
        placement = plan(snapshot, PlacementRequest(f"q{t}", count=count))
        ours_bw = bottleneck(snapshot, [tuple(d) for d in placement.devices])
        assert ours_bw == placement.tp_bottleneck_gbps
        ray_bw = bottleneck(snapshot, ray)
        ours.append(ours_bw)
        rays.append(ray_bw)
        ratios.append(ours_bw / ray_bw)
    return {
        "trials": len(ours),
        "skipped": skipped,
        "mean_ours": statistics.fmean(ours),
        "mean_ray": statistics.fmean(rays),
        "worst_ours": min(ours),
        "worst_ray": min(rays),
        "mean_ratio": statistics.fmean(ours) / statistics.fmean(rays),
        "worst_ratio": min(ours) / min(rays),
        "min_trial_ratio": min(ratios),
        "improved": sum(r > 1 for r in ratios) / len(ratios),
        "median_trial_ratio": statistics.median(ratios),
    }


# --- the controller's path ----------------------------------------------------------------


def controller_path(seed: int, trials: int) -> dict[str, float]:
    """The same kind of trials through the live controller's decision (the cluster policy picks
    type, count and nodes; the planner the devices inside): its TP bottleneck against the
    planner's alone on the same snapshot. Prior allocations count as other users' devices."""
    from hetflow.control.jobspec import job_from_dict
    from hetflow.control.scheduler import ControllerSettings, LiveScheduler
    from hetflow.control.state import JobRecord

    rng = random.Random(seed + 2)
    scheduler = LiveScheduler(ControllerSettings())
    ours, planner_bw, any_type = [], [], []
    for t in range(trials):
        kinds = [rng.choice(QUALITY_KINDS) for _ in range(rng.randint(1, 4))]
        nodes = [kind(f"n{k}") for k, kind in enumerate(kinds)]
        snapshot = ClusterSnapshot(nodes=tuple(nodes), inter_node_gbps=INTER_NODE_GBPS,
                                   allocations=random_occupancy(rng, nodes, rng.uniform(0.1, 0.7)))
        count = rng.choice([2, 3, 4])
        try:
            best = plan(snapshot, PlacementRequest(f"c{t}", count=count))
        except Unschedulable:
            continue
        spec = job_from_dict({"name": f"c{t}", "kind": "python", "python": {"script": "/x.py"},
                              "devices": {"count": count}, "work": {"seconds": 60.0}})
        record = JobRecord(f"c{t}-1", 1, spec.model_dump(mode="json"), 0.0)
        decision = scheduler.decide([record], snapshot, 0.0, False, force=True)
        if not decision.launches:
            continue  # the policy left it waiting (e.g. only across nodes): not comparable
        launch = decision.launches[0]
        placed = launch.placement
        # the same request with the device type the policy chose (choosing the type is the
        # policy's job: by throughput and fairness, not by links)
        same_type = plan(snapshot, PlacementRequest(f"c{t}", count=count, model=launch.held.device_type))
        ours.append(bottleneck(snapshot, [tuple(d) for d in placed.devices]))
        planner_bw.append(same_type.tp_bottleneck_gbps)
        any_type.append(best.tp_bottleneck_gbps)
    return {"trials": len(ours), "mean_controller": statistics.fmean(ours),
            "mean_planner": statistics.fmean(planner_bw), "mean_any_type": statistics.fmean(any_type),
            "ratio": statistics.fmean(ours) / statistics.fmean(planner_bw),
            "equal": sum(a == b for a, b in zip(ours, planner_bw)) / len(ours)}


# --- the simulator with the planner deciding ranks ---------------------------------------

SIM_CLUSTER = "32 * 8x H100 + 32 * 8x MI300X + 32 * 8x A100-80GB + 32 * 8x L40S @ 25"  # scheduling.py's mixed-1024


def simulator_path(seed: int, jobs: int, rate: float) -> dict[str, float]:
    """The hetflow policy on the 1,024-GPU mix, without and with the rank planner."""
    from hetflow.scheduling.policies.capacity import ClusterModel
    from hetflow.scheduling.policies.registry import make_policy
    from hetflow.scheduling.rank_planner import RankPlanner
    from hetflow.scheduling.throughput import default_model
    from hetflow.sim.cluster import parse_shorthand
    from hetflow.sim.engine import SimConfig, Simulator
    from hetflow.sim.metrics import summarise
    from hetflow.sim.traces import synthetic_trace

    speeds = default_model()
    snapshot = parse_shorthand(SIM_CLUSTER)
    model = ClusterModel.from_snapshot(snapshot)
    assert model.total_devices == 1024
    trace = synthetic_trace(speeds, jobs, rate, seed=seed, reference_types=("A100-80GB",))
    out: dict[str, float] = {}
    for name, ranks in (("policy", None), ("planner", RankPlanner(snapshot, model))):
        start, cpu_start = time.perf_counter(), time.process_time()
        result = Simulator(model, trace.jobs, make_policy("hetflow"), speeds, SimConfig(), ranks=ranks).run()
        wall = time.perf_counter() - start
        out[f"{name}_wall_s"] = wall
        out[f"{name}_cpu_s"] = time.process_time() - cpu_start  # what a busy machine does not inflate
        out[f"{name}_avg_jct_s"] = summarise(result, wall)["avg_jct_s"]
        if ranks is not None:
            out.update(starts=ranks.calls, changed=ranks.changed, moved=ranks.moved, refused=ranks.refused)
    return out


# --- speed ---------------------------------------------------------------------------------

SPEED_LAYOUTS = [  # (dp, pp, tp), one gang when dp = pp = 1
    (1, 1, 1), (1, 1, 2), (1, 1, 4), (1, 1, 8), (2, 1, 4), (4, 1, 2), (1, 2, 4), (2, 2, 2),
    (8, 1, 1), (2, 1, 8), (4, 2, 4), (16, 1, 1), (1, 4, 2),
]


def speed(seed: int, jobs: int) -> dict[str, float]:
    rng = random.Random(seed + 1)
    nodes = [SPEED_KINDS[k % len(SPEED_KINDS)](f"node-{k:03d}") for k in range(128)]
    snapshot = ClusterSnapshot(
        nodes=tuple(nodes), inter_node_gbps=INTER_NODE_GBPS,
        allocations=random_occupancy(rng, nodes, 0.5),
    )
    total = snapshot.num_accelerators
    planner = Planner(default_catalog())  # one for the stream, as a controller keeps one
    times: list[float] = []
    cpu_times: list[float] = []  # CPU time of this thread: wall time minus waiting for the CPU
    refused = 0
    for j in range(jobs):
        dp, pp, tp = rng.choice(SPEED_LAYOUTS)
        vendor = rng.choice([None, None, Vendor.NVIDIA, Vendor.AMD])
        strategy = rng.choice([Strategy.PACK, Strategy.PACK, Strategy.SPREAD])
        request = PlacementRequest(f"job-{j}", layout=ParallelLayout(dp=dp, pp=pp, tp=tp),
                                   vendor=vendor, strategy=strategy)
        start, cpu_start = time.perf_counter(), time.thread_time()
        try:
            placement = planner.plan(snapshot, request)
        except Unschedulable:
            placement = None
            refused += 1
        times.append((time.perf_counter() - start) * 1e3)
        cpu_times.append((time.thread_time() - cpu_start) * 1e3)
        if placement is not None:
            snapshot = placement.apply_to(snapshot)
        # release whole jobs, oldest first, until about half the cluster is busy again
        allocations = list(snapshot.allocations)
        while len(allocations) > total // 2:
            victim = allocations[rng.randrange(len(allocations))].job_id
            allocations = [a for a in allocations if a.job_id != victim]
        snapshot = replace(snapshot, allocations=tuple(allocations))
    times_sorted = sorted(times)
    cpu_sorted = sorted(cpu_times)
    return {
        "cpu_p99_ms": cpu_sorted[min(len(cpu_sorted) - 1, int(round(0.99 * (len(cpu_sorted) - 1))))],
        "jobs": jobs,
        "refused": refused,
        "p50_ms": statistics.median(times),
        "p99_ms": times_sorted[min(len(times) - 1, int(round(0.99 * (len(times) - 1))))],
        "max_ms": times_sorted[-1],
        "first_ms": times[0],
        "gpus": total,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trials", type=int, default=2000, help="quality trials")
    parser.add_argument("--jobs", type=int, default=500, help="planning decisions timed")
    parser.add_argument("--controller-trials", type=int, default=500,
                        help="trials through the live controller's decision")
    parser.add_argument("--sim-jobs", type=int, default=10_000, help="jobs of the simulated trace")
    parser.add_argument("--sim-rate", type=float, default=150.0, help="their arrivals per hour")
    args = parser.parse_args()

    q = quality(args.seed, args.trials)
    print(f"quality: {q['trials']} trials on 1-4 partly occupied nodes "
          f"({q['skipped']} skipped: no node had room for Ray's single bundle)")
    print(f"  TP-group bottleneck, mean:  hetflow {q['mean_ours']:.1f} GB/s, "
          f"Ray first fit {q['mean_ray']:.1f} GB/s -> x{q['mean_ratio']:.3f}")
    print(f"  TP-group bottleneck, worst: hetflow {q['worst_ours']:.1f} GB/s, "
          f"Ray first fit {q['worst_ray']:.1f} GB/s -> x{q['worst_ratio']:.3f}")
    print(f"  per trial: hetflow better in {q['improved']:.0%}, median ratio x{q['median_trial_ratio']:.2f}, "
          f"lowest ratio x{q['min_trial_ratio']:.3f} (never below 1: hetflow is never worse)")
    s = speed(args.seed, args.jobs)
    print(f"speed: {s['jobs']} decisions on {s['gpus']} GPUs (128 nodes x 8, 6 kinds, ~half occupied; "
          f"{s['refused']} refused as unschedulable)")
    print(f"  per decision: p50 {s['p50_ms']:.2f} ms, p99 {s['p99_ms']:.2f} ms, max {s['max_ms']:.2f} ms "
          f"(first, cold caches: {s['first_ms']:.2f} ms); CPU-time p99 {s['cpu_p99_ms']:.2f} ms "
          "(wall minus time waiting for a busy CPU)")
    c = controller_path(args.seed, args.controller_trials)
    print(f"controller path: {c['trials']} trials; TP-group bottleneck mean: controller "
          f"{c['mean_controller']:.1f} GB/s, planner alone on the device type the policy chose "
          f"{c['mean_planner']:.1f} GB/s (equal in {c['equal']:.0%} of trials); planner free to "
          f"choose the type too {c['mean_any_type']:.1f} GB/s")
    m = simulator_path(args.seed, args.sim_jobs, args.sim_rate)
    print(f"simulator: {args.sim_jobs} jobs on {SIM_CLUSTER.split(' @')[0]} (hetflow policy): wall "
          f"{m['policy_wall_s']:.1f} s with the policy's devices, {m['planner_wall_s']:.1f} s with the "
          f"planner deciding ranks (CPU time {m['policy_cpu_s']:.1f} s and {m['planner_cpu_s']:.1f} s; "
          f"{m['starts']} starts planned, {m['changed']} got other devices, "
          f"{m['moved']} other nodes, {m['refused']} refused); average JCT {m['policy_avg_jct_s']:.0f} s "
          f"vs {m['planner_avg_jct_s']:.0f} s")
    print(f"RESULT mean_bw_vs_ray={q['mean_ratio']:.3f} worst_bw_vs_ray={q['worst_ratio']:.3f} "
          f"p50_ms={s['p50_ms']:.2f} p99_ms={s['p99_ms']:.2f} "
          f"controller_over_planner_bw={c['ratio']:.3f} "
          f"sim_1024_planner_wall_s={m['planner_wall_s']:.1f}")


if __name__ == "__main__":
    main()
