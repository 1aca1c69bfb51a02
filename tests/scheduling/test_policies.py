"""Cluster policies: the registry, the shared contract (no mutation, only waiting/unpinned jobs),
each policy's rule, the max-min LP, and the placers (best fit, links, fragmentation)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from hetflow.accelerators.synthetic import synthetic_node
from hetflow.core.errors import InputError
from hetflow.core.topology import ClusterSnapshot
from hetflow.scheduling.policies.base import ClusterView
from hetflow.scheduling.policies.capacity import Assignment, ClusterModel, FreeCapacity, Request
from hetflow.scheduling.policies.max_min_fairness import solve_max_min
from hetflow.scheduling.policies.placer import BestFitPlacer, FirstFitPlacer, TopologyPlacer
from hetflow.scheduling.policies.registry import POLICIES, make_policy, parse_policy_list
from hetflow.sim.engine import SimConfig, Simulator
from hetflow.sim.traces import synthetic_trace
from tests.sim.world import cluster, jct, job, node, simulate, table

# ------------------------------------------------------------------------------- registry


def test_registry_names_and_errors() -> None:
    assert set(POLICIES) == {"fifo", "bestfit", "srtf", "las", "max_min_fairness", "hetflow"}
    for name in POLICIES:
        p = make_policy(name)
        assert p.name == name and isinstance(p.preemptive, bool)
    assert parse_policy_list("fifo, hetflow") == ["fifo", "hetflow"]
    with pytest.raises(InputError, match="unknown policy 'gavel'"):
        parse_policy_list("fifo,gavel")
    with pytest.raises(InputError, match="twice"):
        parse_policy_list("fifo,fifo")
    with pytest.raises(InputError, match="unknown policy"):
        make_policy("nope")


# ------------------------------------------------------------------------------- contract


class _Guard:
    """Wraps a policy; checks every call leaves the view untouched and names only its jobs."""

    def __init__(self, inner) -> None:
        self.inner, self.name, self.preemptive = inner, inner.name, inner.preemptive
        self.calls = 0

    def schedule(self, view: ClusterView):
        jobs_before = [(j.job_id, j.assignment, j.done_work, dict(j.service_by_type)) for j in view.jobs]
        free_before = copy.deepcopy((view.free.milli, view.free.cpu, view.free.mem, view.free.type_milli))
        out = self.inner.schedule(view)
        assert [(j.job_id, j.assignment, j.done_work, dict(j.service_by_type)) for j in view.jobs] == jobs_before
        for a, b in zip((view.free.milli, view.free.cpu, view.free.mem, view.free.type_milli), free_before):
            assert np.array_equal(a, b), "policy changed the view's capacity"
        decidable = {j.job_id for j in view.jobs}
        assert set(out) <= decidable and not set(out) & set(view.pinned)
        if not view.round_boundary:
            assert all(j.assignment is None for j in view.jobs)  # mid-round: only waiting jobs
        self.calls += 1
        return out


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_policies_never_mutate_what_they_are_shown(policy: str) -> None:
    speeds = table({**{("p", n, t): r * n for n in (1, 2, 4) for t, r in (("fast", 2.0), ("slow", 1.0))},
                    **{("q", n, t): 1.0 for n in (1, 2, 4) for t in ("fast", "slow")}})
    model = cluster(node("a", "fast", 4), node("b", "slow", 4), node("c", "fast", 2))
    jobs = [job(i, "pq"[i % 2], i * 37.0 % 500, (1, 2, 4, 1, 1)[i % 5], 100.0 + 70 * i) for i in range(24)]
    guard = _Guard(make_policy(policy))
    r = Simulator(model, jobs, guard, speeds, SimConfig(round_s=60.0)).run()
    assert guard.calls > 5 and all(rec.finish is not None for rec in r.jobs)


# ------------------------------------------------------------------------------- each policy


def test_fifo_is_heterogeneity_agnostic_first_fit() -> None:
    # The slow node comes first in the cluster: fifo fills it first, whatever the speeds.
    model = cluster(node("s", "slow", 1), node("f", "fast", 1))
    speeds = table({("p", 1, "fast"): 4.0, ("p", 1, "slow"): 1.0})
    r = simulate(model, [job(0, "p", 0, 1, 400), job(1, "p", 0, 1, 400)], "fifo", speeds)
    assert jct(r) == {"0": 400.0, "1": 100.0}  # job0 on slow (400 s), job1 on fast (100 s)
    # hetflow: equal areas (100 each); both jobs value fast 4x more -> job0 (first) gets fast.
    assert jct(simulate(model, [job(0, "p", 0, 1, 400), job(1, "p", 0, 1, 400)], "hetflow", speeds)) == {
        "0": 100.0, "1": 400.0}


def test_las_runs_the_least_served_job_first() -> None:
    model = cluster(node("n", "fast", 1))
    speeds = table({("a", 1, "fast"): 1.0})
    # job0 runs alone 0..100 (100 device-s attained). job1 arrives at 10 with 0 attained: at the
    # boundary t=100 it preempts job0 and runs 100..200 (JCT 190) - LAS does not know sizes,
    # so the longer job1 still goes first. job0 resumes at 200 with a 5 s restore: 900 s left
    # -> ends 1105.
    r = simulate(model, [job(0, "a", 0, 1, 1000), job(1, "a", 10, 1, 100)], "las", speeds,
                 round_s=100.0, restore_s=5.0)
    assert jct(r) == {"0": 1105.0, "1": 190.0}


def test_srtf_keeps_the_shorter_running_job() -> None:
    model = cluster(node("n", "fast", 1))
    speeds = table({("a", 1, "fast"): 1.0})
    # job0 (300 steps) runs; job1 (1000) arrives at 10 and is longer: no preemption.
    r = simulate(model, [job(0, "a", 0, 1, 300), job(1, "a", 10, 1, 1000)], "srtf", speeds, round_s=100.0)
    assert jct(r) == {"0": 300.0, "1": 1290.0}
    assert r.jobs[0].preemptions == 0


def test_max_min_lp_on_hand_cases() -> None:
    # Two jobs, two types of 1 device. Job A runs 2x faster on type 0 (normalised 1, 0.5); job B
    # the same on both (1, 1). Max-min optimum: A on type 0, B on type 1 (both at 1.0).
    x = solve_max_min(np.array([[1.0, 0.5], [1.0, 1.0]]), np.ones(2), np.ones(2), np.ones(2), np.array([1.0, 1.0]))
    assert x == pytest.approx(np.array([[1.0, 0.0], [0.0, 1.0]]), abs=1e-6)
    # Three identical jobs (one class of 3) on one device: a third each.
    x = solve_max_min(np.array([[1.0]]), np.ones(1), np.array([3.0]), np.ones(1), np.array([1.0]))
    assert x[0, 0] == pytest.approx(1 / 3)
    # Weight 2 gets twice weight 1's share: x1 + x2 = 1, x2 = 2 x1 -> 1/3, 2/3.
    x = solve_max_min(np.array([[1.0], [1.0]]), np.ones(2), np.ones(2), np.array([1.0, 2.0]), np.array([1.0]))
    assert x[:, 0] == pytest.approx([1 / 3, 2 / 3])
    # A job that cannot run on a type gets nothing there.
    x = solve_max_min(np.array([[1.0, 0.0]]), np.ones(1), np.ones(1), np.ones(1), np.array([1.0, 1.0]))
    assert x[0, 1] == 0.0


def test_max_min_fairness_time_shares_by_rounds() -> None:
    # One GPU, two equal jobs arriving together: each should get half the rounds.
    model = cluster(node("n", "fast", 1))
    speeds = table({("a", 1, "fast"): 1.0})
    r = simulate(model, [job(0, "a", 0, 1, 1000), job(1, "a", 0, 1, 1000)], "max_min_fairness", speeds,
                 round_s=100.0, restore_s=0.0)
    # Alternating 100 s leases: both finish near 2000 s (one at 1900, the other at 2000).
    assert sorted(jct(r).values()) == [1900.0, 2000.0]


def test_hetflow_beats_the_baselines_on_a_small_gavel_run() -> None:
    gavel = __import__("hetflow.scheduling.throughput", fromlist=["x"]).load_gavel_throughputs(
        __import__("tests.conftest", fromlist=["x"]).TRACES / "gavel" / "simulation_throughputs.json")
    model = ClusterModel.from_snapshot(ClusterSnapshot(
        tuple(synthetic_node(s, f"{s}-{i}".replace(" ", "")) for s in ("4x V100", "4x P100", "4x K80")
              for i in range(2)), inter_node_gbps=3.125))
    trace = synthetic_trace(gavel, 160, 2.5, seed=5, multi_gpu=False)
    avg = {}
    for p in ("fifo", "max_min_fairness", "hetflow"):
        r = Simulator(model, trace.jobs, make_policy(p), gavel, SimConfig(window=(40, 120))).run()
        done = [rec.jct_s for rec in r.jobs[40:120]]
        assert None not in done
        avg[p] = sum(done) / len(done)
    assert avg["hetflow"] < avg["max_min_fairness"] < avg["fifo"]


# ------------------------------------------------------------------------------- placers


def _dgx1() -> ClusterModel:
    return ClusterModel.from_snapshot(ClusterSnapshot((synthetic_node("8x V100", "dgx1"),)))


def test_topology_placer_picks_a_well_linked_quad_on_a_cube_mesh() -> None:
    model = _dgx1()
    free = FreeCapacity(model)
    a = TopologyPlacer().place(free, Request(4), ["V100-16GB"])
    assert a is not None
    # DGX-1: quads 0-3 and 4-7 are fully NVLinked (1 or 2 links of 25 GB/s per pair): every
    # member reaches the other three at >= 100 GB/s in total. Any other 4-set has a member
    # with a PCIe-only peer.
    chosen = [p for _, p in a.slots]
    assert sorted(chosen) in ([0, 1, 2, 3], [4, 5, 6, 7])
    assert a.group_gbps == pytest.approx(100.0)
    naive = FreeCapacity(model)
    naive.take(Assignment("V100-16GB", ((0, 0),)))
    naive.take(Assignment("V100-16GB", ((0, 4),)))
    b = TopologyPlacer().place(naive, Request(2), ["V100-16GB"])
    assert b is not None and model.group_gbps(b.slots) == pytest.approx(50.0)  # an NV2 pair


def test_best_fit_and_first_fit_choose_different_nodes() -> None:
    model = cluster(node("a", "t", 4), node("b", "t", 2))
    free = FreeCapacity(model)
    assert FirstFitPlacer().place(free, Request(2), ["t"]).slots[0][0] == 0  # first node with room
    assert BestFitPlacer().place(free, Request(2), ["t"]).slots[0][0] == 1  # the tighter fit
    assert TopologyPlacer().place(free, Request(2), ["t"]).slots[0][0] == 1
    assert TopologyPlacer().place(free, Request(5), ["t"]) is not None  # spans nodes
    assert TopologyPlacer().place(free, Request(7), ["t"]) is None


def test_fragmentation_aware_placement_keeps_room_for_common_sizes() -> None:
    # One node, two GPUs: one with 600 milli free, one whole. A 300-milli request arrives; most
    # requests so far were 600 milli. Best fit puts it on the 600 device, leaving 300 that no
    # 600 request can use. FGD puts it on the whole GPU (700 left: still room for a 600).
    model = cluster(node("n", "t", 2, cpu_cores=64, memory_mib=65536))
    free = FreeCapacity(model)
    free.take(Assignment("t", ((0, 0),), milli=400, host=0))
    req = Request(1, 300, 1000, 1024)
    assert BestFitPlacer().place(free, req, ["t"]).slots == ((0, 0),)
    fgd = TopologyPlacer().with_mix({(1, 600): 10.0, (1, 300): 1.0}, {(1, 600): (1000.0, 1024.0)})
    assert fgd.place(free, req, ["t"]).slots == ((0, 1),)


def test_fragmentation_aware_placement_counts_cpu() -> None:
    # Two nodes with a free GPU each. Node 0 has 8 cores left, node 1 has 40. A CPU-only task of
    # 6 cores: on node 0 it leaves 2 cores, too few for the usual 1-GPU request (4 cores), so
    # node 0's GPU would be stranded; FGD puts it on node 1. Best fit (least CPU left) picks 0.
    model = cluster(node("n0", "t", 1, cpu_cores=8, memory_mib=65536),
                    node("n1", "t", 1, cpu_cores=40, memory_mib=65536))
    free = FreeCapacity(model)
    req = Request(0, 1000, 6000, 100)
    assert BestFitPlacer().place(free, req, ["t"]).host == 0
    fgd = TopologyPlacer().with_mix({(1, 1000): 5.0}, {(1, 1000): (4000.0, 1024.0)})
    assert fgd.place(free, req, ["t"]).host == 1


def test_fragmentation_ties_go_to_the_placement_that_balances_cpu_against_free_gpus() -> None:
    # Two nodes with 4 free GPUs each; the usual request is 1 GPU with 10 cores. Node 0 is rich
    # in CPU (80 cores), node 1 poor (20 cores: two of its GPUs already lack CPU). A light
    # request (1 GPU, 2 cores) leaves the usual request fitting on either node, so FGD's score
    # ties; the tighter fit ties too, and the index would pick node 0. Balance sends it to node 1,
    # keeping node 0's cores for requests that need them.
    model = cluster(node("rich", "t", 4, cpu_cores=80, memory_mib=65536),
                    node("poor", "t", 4, cpu_cores=20, memory_mib=65536))
    fgd = TopologyPlacer().with_mix({(1, 1000): 5.0}, {(1, 1000): (10000.0, 1024.0)})
    free = FreeCapacity(model)
    assert fgd.place(free, Request(1, 1000, 2000, 100), ["t"]).host == 1
    # a heavy request (1 GPU, 16 cores) would leave node 1 with too few cores for the usual one
    assert fgd.place(free, Request(1, 1000, 16000, 100), ["t"]).host == 0
    # ... but a CPU-rich node in use comes before an unused one (kept whole for a large
    # request), though the unused one is the tighter fit and its balance gains as much
    model = cluster(node("used", "t", 4, cpu_cores=70, memory_mib=65536),
                    node("unused", "t", 2, cpu_cores=60, memory_mib=65536))
    free = FreeCapacity(model)
    free.take(Assignment("t", ((0, 0),), host=0, cpu_milli=10000, memory_mib=100))
    assert fgd.place(free, Request(1, 1000, 16000, 100), ["t"]).host == 0
    # a request without GPUs goes beside busy GPUs, where its cores strand none
    busy = cluster(node("idle", "t", 1, cpu_cores=40, memory_mib=65536),
                   node("busy", "t", 1, cpu_cores=40, memory_mib=65536))
    free = FreeCapacity(busy)
    free.take(Assignment("t", ((1, 0),), host=1, cpu_milli=2000, memory_mib=100))
    fgd = TopologyPlacer().with_mix({(1, 1000): 5.0, (0, 1000): 1.0}, {(1, 1000): (4000.0, 1024.0)})
    assert fgd.place(free, Request(0, 1000, 6000, 100), ["t"]).host == 1


def _min_pair_gbps(model: ClusterModel, snap: ClusterSnapshot, slots) -> float:
    nodes = {n.name: n for n in snap.nodes}
    pairs = [(a, b) for i, a in enumerate(slots) for b in slots[i + 1:]]
    return min(nodes[model.nodes[a[0]].machine].bandwidth(model.nodes[a[0]].devices[a[1]],
                                                          model.nodes[b[0]].devices[b[1]]) for a, b in pairs)


def test_fast_placer_matches_the_planner_on_the_bottleneck_link() -> None:
    import random

    from hetflow.scheduling.policies.placer import PlannerPlacer

    snap = ClusterSnapshot(tuple(synthetic_node(s, s.replace(" ", "")) for s in ("8x V100", "8x H100", "8x MI300X")))
    model = ClusterModel.from_snapshot(snap)
    planner = PlannerPlacer(snap)
    rng = random.Random(0)
    compared = 0
    for _ in range(25):
        free = FreeCapacity(model)
        for n, pool in enumerate(model.nodes):
            for p in rng.sample(range(8), rng.randint(0, 5)):
                free.take(Assignment(pool.device_type, ((n, p),)))
        for k in (2, 3, 4):
            for t in model.device_types:
                fast = TopologyPlacer().place(free, Request(k), [t])
                exact = planner.place(free, Request(k), [t])
                assert (fast is None) == (exact is None)
                if fast is not None and exact is not None:
                    compared += 1
                    # the planner maximises the weakest pair exactly; the fast path must match it
                    assert _min_pair_gbps(model, snap, fast.slots) == pytest.approx(
                        _min_pair_gbps(model, snap, exact.slots)), (t, k, fast.slots, exact.slots)
    assert compared > 100


def test_a_policy_runs_with_the_planner_injected() -> None:
    from hetflow.scheduling.policies.placer import PlannerPlacer

    snap = ClusterSnapshot((synthetic_node("8x V100", "dgx1"),))
    model = ClusterModel.from_snapshot(snap)
    speeds = table({("g", 4, "V100-16GB"): 1.0, ("s", 1, "V100-16GB"): 1.0})
    jobs = [job(0, "s", 0, 1, 50), job(1, "g", 0, 4, 100), job(2, "g", 0, 4, 100), job(3, "s", 10, 1, 20)]
    fast = Simulator(model, jobs, make_policy("hetflow"), speeds, SimConfig()).run()
    exact = Simulator(model, jobs, make_policy("hetflow", placer=PlannerPlacer(snap)), speeds, SimConfig()).run()
    assert jct(fast) == jct(exact)
