"""The discrete-event engine: golden runs worked out by hand, and invariants on random traces."""

from __future__ import annotations

import math
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetflow.core.errors import InputError
from hetflow.scheduling.policies.registry import POLICIES
from hetflow.scheduling.throughput import CompositeThroughputs, FIXED_DURATION, FixedDurationThroughputs
from hetflow.scheduling.elastic import mark_elastic
from hetflow.sim.engine import SimClock, SimConfig, Simulator
from hetflow.scheduling.policies.registry import make_policy
from hetflow.sim.metrics import summarise, utilisation

from tests.sim.world import cluster, jct, job, node, simulate, table

# ------------------------------------------------------------------------------- golden runs


def test_fifo_first_fit_lets_small_jobs_pass_and_measures_contended_utilisation() -> None:
    # One node, 2 GPUs of one type, 1 step/s for any gang.
    model = cluster(node("n0", "fast", 2))
    speeds = table({("a", 1, "fast"): 1.0, ("a", 2, "fast"): 1.0})
    jobs = [job(0, "a", 0, 1, 100), job(1, "a", 10, 2, 50), job(2, "a", 20, 1, 30)]
    r = simulate(model, jobs, "fifo", speeds)
    # t=0 job0 starts (ends 100). t=10 job1 needs 2 GPUs, 1 free: waits. t=20 job2 fits the
    # free GPU (first fit does not block behind job1), ends 50. t=100 job0 ends, job1 runs
    # 100..150.  JCT: 100, 150-10=140, 50-20=30.
    assert jct(r) == {"0": 100.0, "1": 140.0, "2": 30.0}
    s = summarise(r, 0.0)
    assert s["avg_jct_s"] == pytest.approx(90.0)
    assert s["makespan_s"] == pytest.approx(150.0)
    assert s["avg_queue_s"] == pytest.approx((0 + 90 + 0) / 3)
    # Outstanding demand (GPUs of arrived, unfinished jobs): [0,10) 1, [10,20) 3, [20,50) 4,
    # [50,100) 3, [100,150) 2 -> demand >= 2 GPUs on [10,150) = 140 s ("contended").
    # Allocated there: [10,20) 1, [20,50) 2, [50,100) 1, [100,150) 2 -> 10+60+50+100 = 220 GPU-s
    # utilisation = 220 / (2 x 140) = 0.7857; unallocated share = 1 - that.
    u = utilisation(r)
    assert u["utilisation"] == pytest.approx(220 / 280)
    assert u["unallocated_gpu_share"] == pytest.approx(60 / 280)
    assert u["contended_share"] == pytest.approx(140 / 150)
    assert u["effective_utilisation"] == pytest.approx(220 / 280)  # ideal placement, no restores


def _two_types():
    # One "fast" and one "slow" GPU on two nodes. Type x gains 2x from fast; y does not care.
    model = cluster(node("n0", "fast", 1), node("n1", "slow", 1))
    speeds = table({("x", 1, "fast"): 2.0, ("x", 1, "slow"): 1.0,
                    ("y", 1, "fast"): 1.0, ("y", 1, "slow"): 1.0})
    return model, speeds


def test_hetflow_gives_the_fast_gpu_to_the_job_that_gains_from_it() -> None:
    model, speeds = _two_types()
    jobs = [job(0, "y", 0, 1, 100), job(1, "x", 0, 1, 180)]
    # fifo, in trace order on the first node first: y on fast (100 s), x on slow (180 s).
    assert jct(simulate(model, jobs, "fifo", speeds)) == {"0": 100.0, "1": 180.0}
    # hetflow: areas y 100/1 = 100, x 180/2 = 90: x is first and values fast at 1/90 > y's
    # 1/100, so x takes fast (180/2 = 90 s) and y runs on slow (100 s). Avg 95 vs 140.
    assert jct(simulate(model, jobs, "hetflow", speeds)) == {"0": 100.0, "1": 90.0}


def test_hetflow_breaks_ties_by_comparative_advantage() -> None:
    model, speeds = _two_types()
    jobs = [job(0, "y", 0, 1, 100), job(1, "x", 0, 1, 200)]
    # Both areas are 100 and both first pairs are worth 1/100; x's advantage on fast is
    # 1 - 0.5 = 0.5, y's is 0, so x takes fast (200/2 = 100 s) and y slow (100 s).
    assert jct(simulate(model, jobs, "hetflow", speeds)) == {"0": 100.0, "1": 100.0}


def test_max_min_fairness_splits_types_by_lp() -> None:
    model, speeds = _two_types()
    jobs = [job(0, "y", 0, 1, 100), job(1, "x", 0, 1, 200)]
    # LP: x on fast and y on slow gives both their best normalised rate (1.0), the max-min
    # optimum; so x runs 200/2 = 100 s and y 100 s.
    assert jct(simulate(model, jobs, "max_min_fairness", speeds)) == {"0": 100.0, "1": 100.0}


def test_preemption_at_round_boundary_pays_restore() -> None:
    model = cluster(node("n0", "fast", 1))
    speeds = table({("a", 1, "fast"): 1.0})
    jobs = [job(0, "a", 0, 1, 1000), job(1, "a", 50, 1, 100)]
    for policy in ("srtf", "hetflow"):
        r = simulate(model, jobs, policy, speeds, round_s=100.0, restore_s=10.0)
        # job1 arrives at 50 and waits for the round boundary at 100 (leases hold until then);
        # it is shorter (100 < 900 left; hetflow: 900 - 2 x 10 credit = 880 > 100), so job0 is
        # preempted. job1 runs 100..200 (JCT 150). job0 restarts at 200, restores for 10 s and
        # does its 900 remaining steps: ends at 1110.
        assert jct(r) == {"0": 1110.0, "1": 150.0}, policy
        assert r.jobs[0].preemptions == 1
        segs = [s for s in r.segments if s.job == 0]
        assert [(s.start, s.end, s.restore_s) for s in segs] == [(0.0, 100.0, 0.0), (200.0, 1110.0, 10.0)]
        # effective utilisation over the span [0, 1110] (demand never exceeds 1 GPU... it does:
        # both jobs outstanding on [50, 200) -> contended 150 s, fully allocated, restore-free)
        u = utilisation(r)
        assert u["utilisation"] == pytest.approx(1.0)
    # fifo does not preempt: job0 ends at 1000, job1 runs 1000..1100 (JCT 1050).
    assert jct(simulate(model, jobs, "fifo", speeds, round_s=100.0)) == {"0": 1000.0, "1": 1050.0}


def test_gang_across_nodes_runs_at_the_network_speed() -> None:
    # Two nodes of 1 GPU, network 1 GB/s. Gang rate 1.0 on its best placement (here the only
    # one spans nodes: ideal = network) - the engine must use the cross-node figure: the
    # measured table says 0.25 at the 1 GB/s reference network.
    model = cluster(node("n0", "fast", 1), node("n1", "fast", 1), inter_node_gbps=1.0)
    speeds = table({("g", 2, "fast"): (1.0, 0.25)}, cross_ref_gbps=1.0)
    r = simulate(model, [job(0, "g", 0, 2, 100)], "fifo", speeds)
    # ideal for 2 GPUs here is the network itself, so the job's ideal rate is the cross-node
    # rate: 100 / 0.25 = 400 s, and it counts as fully effective.
    assert jct(r) == {"0": 400.0}
    assert r.segments[0].rate == pytest.approx(0.25)
    assert utilisation(r)["effective_utilisation"] == pytest.approx(1.0)


def test_topology_aware_packing_keeps_a_whole_node_for_the_gang() -> None:
    # Nodes of 1, 2 and 1 GPUs, network 1 GB/s. Gang rate 2 steps/s inside a node (16 GB/s, the
    # PCIe fallback) and 0.5 measured across the 1 GB/s network.
    model = cluster(node("n0", "fast", 1), node("n1", "fast", 2), node("n2", "fast", 1), inter_node_gbps=1.0)
    speeds = table({("s", 1, "fast"): 1.0, ("g", 2, "fast"): (2.0, 0.5)}, cross_ref_gbps=1.0)
    jobs = [job(0, "s", 0, 1, 1000), job(1, "s", 0, 1, 1000), job(2, "g", 1, 2, 100)]
    # fifo (first fit): job0 -> n0, job1 -> n1 (first node with room); the gang must span n1+n2
    # over the network: 100 / 0.5 = 200 s.
    r = simulate(model, jobs, "fifo", speeds)
    assert jct(r)["2"] == 200.0
    assert r.segments[-1].rate == pytest.approx(0.5) if r.segments[-1].job == 2 else True
    # hetflow (best fit): job0 -> n0, job1 -> n2 (the tightest fits), n1 stays whole: 100 / 2 = 50 s.
    assert jct(simulate(model, jobs, "hetflow", speeds))["2"] == 50.0


def test_window_stops_when_measured_jobs_finish_and_counts_only_them() -> None:
    model = cluster(node("n0", "fast", 1))
    speeds = table({("a", 1, "fast"): 1.0})
    jobs = [job(i, "a", i * 10.0, 1, 5) for i in range(6)]
    r = simulate(model, jobs, "fifo", speeds, window=(2, 4))
    s = summarise(r, 0.0)
    assert s["jobs_measured"] == 2 and s["finished"] == 2
    assert r.end_s == pytest.approx(35.0)  # job 3 (arrives 30) ends at 35; jobs 4, 5 never run
    assert [rec.finish for rec in r.jobs[4:]] == [None, None]


def test_jobs_that_fit_nowhere_are_rejected_with_a_reason() -> None:
    model = cluster(node("n0", "fast", 2))
    speeds = table({("a", 1, "fast"): 1.0, ("a", 4, "fast"): 1.0})
    r = simulate(model, [job(0, "a", 0, 4, 10), job(1, "a", 0, 1, 10), job(2, "b", 0, 1, 10)], "hetflow", speeds)
    assert "cannot run on any device type" in (r.jobs[0].rejected or "")
    assert r.jobs[2].rejected is not None  # job type unknown to the table
    assert r.jobs[1].finish == 10.0
    assert summarise(r, 0.0)["rejected"] == 2


def test_open_ended_jobs_stop_after_the_last_arrival() -> None:
    model = cluster(node("n0", "fast", 1, cpu_cores=4, memory_mib=1024))
    fixed = FixedDurationThroughputs()
    jobs = [job(0, FIXED_DURATION, 0, 1, math.inf, gpu_milli=600, cpu_milli=1000, memory_mib=100),
            job(1, FIXED_DURATION, 5, 1, math.inf, gpu_milli=600, cpu_milli=1000, memory_mib=100)]
    r = simulate(model, jobs, "bestfit", fixed)
    # 600 + 600 > 1000 milli: the second share never fits; the run ends at the last arrival.
    assert r.end_s == 5.0 and r.jobs[0].first_start == 0.0 and r.jobs[1].first_start is None
    s = summarise(r, 0.0)
    # demand 1.2 GPUs >= 1 from t=5 on, but the span ends there: no contended time.
    assert s["unfinished"] == 2


def test_clock_only_moves_forward() -> None:
    clock = SimClock(5.0)
    clock.advance_to(7.5)
    assert clock.now == 7.5
    with pytest.raises(AssertionError):
        clock.advance_to(7.0)


def test_bad_config_and_window_are_input_errors() -> None:
    with pytest.raises(InputError, match="window"):
        SimConfig(window=(5, 5))
    model = cluster(node("n0", "fast", 1))
    with pytest.raises(InputError, match="starts after"):
        Simulator(model, [job(0, "a", 0, 1, 1)], make_policy("fifo"), table({("a", 1, "fast"): 1.0}),
                  SimConfig(window=(3, 9)))
    with pytest.raises(InputError, match="unique"):
        Simulator(model, [job(0, "a", 0, 1, 1), job(0, "a", 1, 1, 1)], make_policy("fifo"),
                  table({("a", 1, "fast"): 1.0}))


# ------------------------------------------------------------------------------- invariants

_SPEEDS = table({
    **{("p", n, "fast"): 2.0 * n for n in (1, 2, 4)},
    **{("p", n, "slow"): 1.0 * n for n in (1, 2, 4)},
    **{("q", n, "fast"): 1.0 for n in (1, 2, 4)},
    **{("q", n, "slow"): (0.8, 0.3) for n in (1, 2, 4)},
}, cross_ref_gbps=4.0)


_MIXED = CompositeThroughputs((_SPEEDS, FixedDurationThroughputs()))


@st.composite
def _worlds(draw):
    """1-3 nodes of 1-4 GPUs; 1-7 jobs: gangs of two job types, and (when nodes have host
    limits) shared-GPU and CPU-only requests with CPU and memory."""
    host = draw(st.booleans())
    nodes = []
    for i in range(draw(st.integers(1, 3))):
        nodes.append(node(f"n{i}", draw(st.sampled_from(["fast", "slow"])), draw(st.integers(1, 4)),
                          cpu_cores=draw(st.integers(4, 16)) if host else None,
                          memory_mib=8192 if host else None))
    model = cluster(*nodes, inter_node_gbps=draw(st.sampled_from([2.0, 25.0])))
    biggest = max(model.capacity_by_type.values())
    jobs = []
    for i in range(draw(st.integers(1, 7))):
        arrival = draw(st.integers(0, 400))
        work = float(draw(st.integers(10, 3000)))
        if host and draw(st.booleans()):
            gpus = draw(st.sampled_from([0, 1]))
            jobs.append(job(i, FIXED_DURATION, arrival, gpus, work, preemptible=draw(st.booleans()),
                            gpu_milli=draw(st.integers(100, 1000)) if gpus else 1000,
                            cpu_milli=draw(st.integers(0, 4000)), memory_mib=draw(st.integers(0, 4096))))
            continue
        gpus = draw(st.sampled_from([g for g in (1, 2, 4) if g <= biggest]))
        jobs.append(job(i, draw(st.sampled_from(["p", "q"])), arrival, gpus, work,
                        preemptible=draw(st.booleans()), restore_s=float(draw(st.integers(0, 50)))))
    return model, jobs


def _check_invariants(result, jobs, model, elastic: bool = False) -> None:
    # 1. No device is double-booked: per device, the shares of overlapping segments <= 1000.
    per_device = defaultdict(list)
    for s in result.segments:
        assert s.end >= s.start
        for slot in s.slots:
            per_device[slot].append((s.start, s.end, s.milli))
    for slot, spans in per_device.items():
        events = sorted([(a, m) for a, _, m in spans] + [(b, -m) for _, b, m in spans], key=lambda e: (e[0], e[1]))
        load = 0
        for _, delta in events:
            load += delta
            assert load <= 1000, f"device {slot} over-committed"
    # 2. Devices are of the type the job was given; host CPU and memory never over-committed.
    per_host = defaultdict(list)
    for s in result.segments:
        assert all(model.nodes[n].device_type == s.device_type for n, _ in s.slots)
        if s.host is not None:
            per_host[s.host].append(s)
    for host, segs in per_host.items():
        events = sorted([(s.start, s.cpu_milli, s.memory_mib) for s in segs]
                        + [(s.end, -s.cpu_milli, -s.memory_mib) for s in segs], key=lambda e: (e[0], e[1]))
        cpu = mem = 0
        for _, dc, dm in events:
            cpu, mem = cpu + dc, mem + dm
            assert cpu <= model.cpu[host] and mem <= model.mem[host], f"host {host} over-committed"
    # 3. Each job does exactly its work, never runs before it arrives, never twice at once.
    by_job = defaultdict(list)
    for s in result.segments:
        by_job[s.job].append(s)
    for i, rec in enumerate(result.jobs):
        segs = sorted(by_job[i], key=lambda s: s.start)
        assert rec.finish is not None, f"job {i} never finished"
        assert all(s.start >= rec.job.arrival_s for s in segs)
        assert all(a.end <= b.start + 1e-9 for a, b in zip(segs, segs[1:]))
        done = sum(s.rate * s.productive_s for s in segs)
        assert done == pytest.approx(rec.job.total_work, rel=1e-6)
        assert rec.finish == pytest.approx(segs[-1].end)
        assert all(len(s.slots) in rec.job.sizes for s in segs)  # an elastic job inside its range
        if not elastic:  # (an elastic job may beat its declared size alone)
            assert rec.jct_s >= rec.job.total_work / rec.best_rate - 1e-6  # never faster than alone


@pytest.mark.parametrize("policy", sorted(POLICIES))
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world=_worlds())
def test_invariants_hold_on_random_traces(policy: str, world) -> None:
    model, jobs = world
    result = simulate(model, jobs, policy, _MIXED, round_s=60.0)
    _check_invariants(result, jobs, model)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world=_worlds(), seed=st.integers(0, 100))
def test_invariants_hold_with_elastic_jobs(world, seed: int) -> None:
    model, jobs = world
    jobs = mark_elastic(jobs, 0.7, seed, model.max_devices)
    result = simulate(model, jobs, "hetflow", _MIXED, round_s=60.0)
    _check_invariants(result, jobs, model, elastic=True)
