"""CPU jobs (no device) in the controller's decision, without Ray.

A CPU job is the policies' host-bound request (``Request(0, cpu_milli, memory_mib)``) on the CPU
pools of ``ClusterModel.from_snapshot(..., cpu_pools=True)``: the same policies, the same round
functions, checked against the simulator like device jobs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from hetflow.accelerators.synthetic import synthetic_node
from hetflow.control.jobspec import JobSpec, job_from_dict
from hetflow.control.scheduler import (ControllerSettings, CpuHold, LiveCluster, LiveScheduler, Why, job_request,
                                      live_throughputs)
from hetflow.control.state import HeldDevices, JobRecord, Slot, Status
from hetflow.core.errors import Unschedulable
from hetflow.core.topology import ClusterSnapshot, NodeTopology
from hetflow.scheduling.policies.capacity import CPU_POOL_TYPE, ClusterModel, Request
from hetflow.scheduling.policies.registry import make_policy, policy_names
from hetflow.scheduling.throughput import FIXED_DURATION
from hetflow.sim.engine import SimConfig, Simulator
from hetflow.sim.traces import Job

GIB = 1 << 30
# node a: 2 MI210 whose ranks may use its 2 CPUs; node cpu: 4 CPUs and 8 GiB, no accelerator
A = replace(synthetic_node("2x MI210", "a"), cpu_cores=2, host_memory_bytes=16 * GIB)
CPU = NodeTopology("cpu", cpu_cores=4, host_memory_bytes=8 * GIB)
MIXED = ClusterSnapshot(nodes=(A, CPU))
CPU_ONLY = ClusterSnapshot(nodes=(CPU,))


def cpu_spec(name: str, cpus: float, seconds: float, **extra: Any) -> JobSpec:
    return job_from_dict({"name": name, "kind": "python", "python": {"script": "/x.py"},
                          "devices": {"count": 0}, "cpus": cpus, "work": {"seconds": seconds}, **extra})


def gpu_spec(name: str, count: int, seconds: float, cpus: float = 0.0, **extra: Any) -> JobSpec:
    return job_from_dict({"name": name, "kind": "python", "python": {"script": "/x.py"},
                          "devices": {"count": count}, "cpus": cpus, "work": {"seconds": seconds}, **extra})


def record(seq: int, s: JobSpec, **fields: Any) -> JobRecord:
    return JobRecord(f"{s.name}-{seq}", seq, s.model_dump(mode="json"), 0.0, **fields)


def launched(plan: Any) -> dict[str, str]:
    return {l.job_id: l.held.text() for l in plan.launches}


# -- the model ------------------------------------------------------------------------------------


def test_cpu_pools_come_after_the_device_pools_and_only_when_asked() -> None:
    plain = ClusterModel.from_snapshot(MIXED)
    assert [(n.machine, n.device_type) for n in plain.nodes] == [("a", "MI210")]  # the simulator's view
    assert plain.nodes[0].cpu_milli == 2000
    model = ClusterModel.from_snapshot(MIXED, cpu_pools=True)
    assert [(n.machine, n.device_type, n.devices) for n in model.nodes] == [
        ("a", "MI210", (0, 1)), ("a", CPU_POOL_TYPE, ()), ("cpu", CPU_POOL_TYPE, ())]
    assert [(n.cpu_milli, n.memory_mib) for n in model.nodes] == [(0, 0), (2000, 16384), (4000, 8192)]
    assert model.capacity_by_type == {"MI210": 2, CPU_POOL_TYPE: 0}
    only = ClusterModel.from_snapshot(CPU_ONLY, cpu_pools=True)
    assert only.device_types == (CPU_POOL_TYPE,) and only.total_devices == 0


def test_a_cpu_job_asks_the_policy_for_host_resources_only() -> None:
    assert job_request(cpu_spec("x", 2.5, 10, memory="1GiB")) == Request(0, cpu_milli=2500, memory_mib=1024)
    assert job_request(gpu_spec("x", 2, 10, cpus=4)) == Request(2)  # ranks' CPUs: charged by the controller


# -- admission ------------------------------------------------------------------------------------


def test_a_cpu_job_runs_at_one_unit_per_second_on_cpus_only() -> None:
    assert LiveScheduler(ControllerSettings()).admit(cpu_spec("x", 4, 10), MIXED) == {CPU_POOL_TYPE: 1.0}


@pytest.mark.parametrize("snapshot, job, message", [
    (MIXED, cpu_spec("big", 5, 10),
     "job big (5 CPUs on one node) can never run on this cluster, even empty: the largest node has too "
     "few (a: 2 CPUs, cpu: 4 CPUs). Ask for fewer CPUs, or add a bigger node"),
    (MIXED, cpu_spec("fat", 1, 10, memory="17GiB"),
     "the largest node has too few (a: 2 CPUs 16.0 GiB, cpu: 4 CPUs 8.0 GiB)"),
    (ClusterSnapshot(nodes=(synthetic_node("2x MI210", "a"),)), cpu_spec("x", 1, 10),
     "no node's CPU count is known"),
    (CPU_ONLY, gpu_spec("x", 1, 10),
     "job x asks for 1 device(s) and this cluster has no accelerators (only CPUs)"),
    (ClusterSnapshot(nodes=()), cpu_spec("x", 1, 10), "the cluster has no nodes to run jobs on"),
])
def test_a_job_that_can_never_fit_is_refused_with_the_reason(snapshot: ClusterSnapshot, job: JobSpec,
                                                            message: str) -> None:
    with pytest.raises(Unschedulable) as exc:
        LiveScheduler(ControllerSettings()).admit(job, snapshot)
    assert message in str(exc.value)


def test_device_refusals_do_not_list_cpus_as_a_device_type() -> None:
    with pytest.raises(Unschedulable) as exc:
        LiveScheduler(ControllerSettings()).admit(gpu_spec("x", 1, 10, devices={"count": 1, "model": "L40S"}), MIXED)
    assert "no L40S devices in this cluster (it has MI210)" in str(exc.value)


# -- decisions: every policy --------------------------------------------------------------------------


@pytest.mark.parametrize("policy", policy_names())
def test_cpu_jobs_run_beside_device_jobs_with_every_policy(policy: str) -> None:
    records = [record(1, gpu_spec("g", 2, 60)), record(2, cpu_spec("c", 4, 30)), record(3, cpu_spec("w", 1, 30))]
    plan = LiveScheduler(ControllerSettings(policy=policy)).decide(records, replace(MIXED, nodes=(
        replace(A, cpu_cores=None), CPU)), 0.0, False, force=True)
    assert launched(plan) == {"g-1": "2x MI210 on a [0 1]", "c-2": "4 CPUs on cpu"}
    assert plan.reasons["w-3"] == "waiting: needs 1 CPU on one node; CPUs free: 0 on cpu" + (
        f"; policy {policy} gave the free devices to c-2, g-1 first")
    cpu_launch = next(l for l in plan.launches if l.job_id == "c-2")
    assert cpu_launch.placement is None and cpu_launch.held.nodes == ["cpu"]


@pytest.mark.parametrize("policy", policy_names())
def test_a_cluster_of_cpus_only_runs_cpu_jobs_with_every_policy(policy: str) -> None:
    records = [record(1, cpu_spec("c", 3, 30)), record(2, cpu_spec("d", 1, 60)), record(3, cpu_spec("e", 1, 5))]
    plan = LiveScheduler(ControllerSettings(policy=policy)).decide(records, CPU_ONLY, 0.0, False, force=True)
    assert sorted(launched(plan).values()) == ["1 CPU on cpu", "3 CPUs on cpu"]
    assert len(plan.reasons) == 1 and "needs 1 CPU on one node; CPUs free: 0 on cpu" in next(iter(plan.reasons.values()))


@pytest.mark.parametrize("policy", policy_names())
def test_first_decision_with_cpu_jobs_is_the_simulators(policy: str) -> None:
    jobs = [("g", 2, 0, 60.0), ("c", 0, 2, 30.0), ("d", 0, 3, 10.0), ("e", 0, 1, 90.0), ("f", 0, 2, 5.0)]
    two_cpu_nodes = replace(MIXED, nodes=(replace(A, cpu_cores=None), CPU, replace(CPU, name="cpu2", cpu_cores=3)))
    model = ClusterModel.from_snapshot(two_cpu_nodes, cpu_pools=True)
    trace = [Job(n, FIXED_DURATION, 0.0, k, s, cpu_milli=c * 1000) for n, k, c, s in jobs]
    first: dict[str, Any] = {}

    class Keep:
        name, preemptive = policy, make_policy(policy).preemptive
        inner = make_policy(policy)

        def schedule(self, view: Any) -> Any:
            out = self.inner.schedule(view)
            first.setdefault("out", out)
            return out

    Simulator(model, trace, Keep(), live_throughputs(), SimConfig()).run()
    cluster = LiveCluster.of(two_cpu_nodes)
    sim = {jid: cluster.held(a).text() for jid, a in first["out"].items()}
    records = [record(i + 1, cpu_spec(n, c, s) if k == 0 else gpu_spec(n, k, s)) for i, (n, k, c, s) in enumerate(jobs)]
    plan = LiveScheduler(ControllerSettings(policy=policy)).decide(records, two_cpu_nodes, 0.0, False, force=True)
    live = {l.job_id.rsplit("-", 1)[0]: l.held.text() for l in plan.launches}
    assert live == sim
    assert sum("CPUs" in t for t in live.values()) >= 2  # CPU jobs are in the comparison


# -- the CPUs the policy does not see -----------------------------------------------------------------


def test_cpus_of_device_ranks_are_not_given_to_cpu_jobs() -> None:
    held = HeldDevices("MI210", [Slot("a", 0), Slot("a", 1)])
    running = record(1, gpu_spec("g", 2, 600, cpus=1), status=Status.RUNNING, token=1, held=held)
    cpu_job = record(2, cpu_spec("c", 1, 10))
    only_a = replace(MIXED, nodes=(A,))
    plan = LiveScheduler(ControllerSettings(policy="fifo")).decide([running, cpu_job], only_a, 0.0, False, force=True)
    assert not plan.launches  # a's 2 CPUs feed its two ranks
    assert plan.reasons["c-2"] == "waiting: needs 1 CPU on one node; CPUs free: 0 on a"
    light = record(1, gpu_spec("g", 2, 600, cpus=0.5), status=Status.RUNNING, token=1, held=held)
    plan = LiveScheduler(ControllerSettings(policy="fifo")).decide([light, cpu_job], only_a, 0.0, False, force=True)
    assert launched(plan) == {"c-2": "1 CPU on a"}


def test_a_device_job_waits_when_its_node_has_too_few_cpus_for_its_ranks() -> None:
    busy = record(1, cpu_spec("c", 1.5, 600), status=Status.RUNNING, token=1,
                  held=HeldDevices(CPU_POOL_TYPE, [], host="a", cpu_milli=1500))
    gang = record(2, gpu_spec("g", 2, 60, cpus=1))
    plan = LiveScheduler(ControllerSettings(policy="fifo")).decide([busy, gang], replace(MIXED, nodes=(A,)), 0.0,
                                                                   False, force=True)
    assert not plan.launches
    assert plan.reasons["g-2"] == ("waiting: policy fifo chose 2x MI210 on a [0 1], but its ranks need 2 CPUs "
                                   "on a and 0.5 are free there now")


def test_cpus_held_by_other_placement_groups_are_not_handed_out() -> None:
    job = record(1, cpu_spec("c", 2, 10))
    plan = LiveScheduler(ControllerSettings(policy="fifo")).decide(
        [job], CPU_ONLY, 0.0, False, force=True, cpu_holds=[CpuHold("by-hand", "cpu", 3)])
    assert not plan.launches and plan.reasons["c-1"] == "waiting: needs 2 CPUs on one node; CPUs free: 1 on cpu"
    # the job's own group is not someone else's
    ours = LiveScheduler(ControllerSettings(policy="fifo")).decide(
        [job], CPU_ONLY, 0.0, False, force=True, cpu_holds=[CpuHold("c-1", "cpu", 2)])
    assert launched(ours) == {"c-1": "2 CPUs on cpu"}


def test_a_running_cpu_job_keeps_its_node_at_a_boundary_and_can_be_preempted() -> None:
    held = HeldDevices(CPU_POOL_TYPE, [], host="cpu", cpu_milli=4000)
    long = record(1, cpu_spec("long", 4, 1000), status=Status.RUNNING, token=1, held=held)
    scheduler = LiveScheduler(ControllerSettings(policy="srtf", round_s=10))
    alone = scheduler.decide([long], CPU_ONLY, 10.0, boundary=True)
    assert alone.decided and not alone.stops and not alone.launches  # its assignment round-trips
    short = record(2, cpu_spec("short", 2, 5))
    plan = scheduler.decide([long, short], CPU_ONLY, 10.0, boundary=True)
    assert [(s.job_id, s.moving_to) for s in plan.stops] == [("long-1", None)]
    assert not plan.launches  # the CPUs are long-1's until it has checkpointed
    assert plan.reasons["short-2"] == ("waiting: policy srtf chose 2 CPUs on cpu, but cpu has 0 CPUs free now; "
                                       "long-1 is checkpointing to free them")
    assert plan.reasons["short-2"].why is Why.SHORT_OF_CPUS
    stopped = replace(long, status=Status.QUEUED, held=None, needs_restore=True)
    after = scheduler.decide([stopped, short], CPU_ONLY, 11.0, boundary=False, force=True)
    assert launched(after) == {"short-2": "2 CPUs on cpu"}


def test_held_cpus_survive_the_record_round_trip() -> None:
    held = HeldDevices(CPU_POOL_TYPE, [], host="cpu", cpu_milli=2500, memory_mib=1024)
    r = record(1, cpu_spec("c", 2.5, 10, memory="1GiB"), status=Status.RUNNING, held=held)
    back = JobRecord.from_dict(r.to_dict())
    assert back.held == held and back.held.text() == "2.5 CPUs, 1.0 GiB on cpu"
