"""The controller's decision without Ray: the simulator's round on job records.

The strongest check of "same code": for the same jobs on the same cluster, the first decision
of the simulator and of the live scheduler are identical, device for device, for every policy.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from hetflow.accelerators.synthetic import synthetic_node
from hetflow.control.jobspec import JobSpec, job_from_dict
from hetflow.control.scheduler import ControllerSettings, LiveScheduler, Why, live_throughputs
from hetflow.control.state import HeldDevices, JobRecord, Slot, Status
from hetflow.core.errors import Unschedulable
from hetflow.core.topology import Allocation, ClusterSnapshot
from hetflow.scheduling.policies.capacity import ClusterModel
from hetflow.scheduling.policies.registry import make_policy, policy_names
from hetflow.scheduling.throughput import FIXED_DURATION
from hetflow.sim.engine import SimConfig, Simulator
from hetflow.sim.traces import Job

SNAPSHOT = ClusterSnapshot(nodes=(synthetic_node("2x MI210", "a"), synthetic_node("2x L40S", "b"),
                                  synthetic_node("8x MI300X", "c")))


def spec(name: str, count: int, seconds: float, **extra: Any) -> JobSpec:
    return job_from_dict({"name": name, "kind": "python", "python": {"script": "/x.py"},
                          "devices": {"count": count, **extra.pop("devices", {})},
                          "work": {"seconds": seconds}, **extra})


def record(seq: int, s: JobSpec, **fields: Any) -> JobRecord:
    return JobRecord(f"{s.name}-{seq}", seq, s.model_dump(mode="json"), 0.0, **fields)


class FirstDecision:
    """Wraps a policy and keeps what its first schedule() returned."""

    def __init__(self, policy: Any) -> None:
        self.policy, self.name, self.preemptive, self.first = policy, policy.name, policy.preemptive, None

    def schedule(self, view: Any) -> Any:
        out = self.policy.schedule(view)
        if self.first is None:
            self.first = out
        return out


JOBS = [("a", 2, 60.0), ("b", 4, 600.0), ("c", 1, 30.0), ("d", 8, 900.0), ("e", 2, 120.0), ("f", 1, 5.0)]


@pytest.mark.parametrize("policy", policy_names())
def test_first_decision_is_the_simulators(policy: str) -> None:
    model = ClusterModel.from_snapshot(SNAPSHOT)
    sim_policy = FirstDecision(make_policy(policy))
    trace = [Job(n, FIXED_DURATION, 0.0, k, s) for n, k, s in JOBS]
    Simulator(model, trace, sim_policy, live_throughputs(), SimConfig()).run()
    sim = {jid: sorted((model.nodes[n].machine, model.nodes[n].devices[p]) for n, p in a.slots)
           for jid, a in sim_policy.first.items()}

    records = [record(i + 1, spec(n, k, s)) for i, (n, k, s) in enumerate(JOBS)]
    plan = LiveScheduler(ControllerSettings(policy=policy)).decide(records, SNAPSHOT, 0.0, False, force=True)
    live = {launch.job_id.rsplit("-", 1)[0]: sorted((s.node, s.device) for s in launch.held.slots)
            for launch in plan.launches}
    assert plan.decided and not plan.stops
    assert live == sim
    assert len(live) >= 3  # the cluster holds several of them: the comparison is not empty


@pytest.mark.parametrize("extra, message", [
    ({"devices": {"count": 9}}, "MI300X: 8 in the whole cluster, it needs 9"),
    ({"devices": {"count": 1, "model": "H100-SXM"}}, "no H100-SXM devices in this cluster (it has MI210, L40S, MI300X)"),
    ({"devices": {"count": 1, "vendor": "nvidia", "memory": "64GiB"}}, "L40S: 48.0 GiB per device, it needs 64.0 GiB"),
    ({"devices": {"count": 4, "vendor": "amd", "memory": "200GiB"}},
     "MI210: 2 in the whole cluster, it needs 4; MI300X: 192.0 GiB per device, it needs 200.0 GiB"),
])
def test_a_job_that_can_never_fit_is_refused_with_the_reason(extra: dict, message: str) -> None:
    s = job_from_dict({"name": "x", "kind": "python", "python": {"script": "/x.py"}, **extra})
    with pytest.raises(Unschedulable) as exc:
        LiveScheduler(ControllerSettings()).admit(s, SNAPSHOT)
    assert message in str(exc.value)


def test_admission_gives_the_rate_on_each_allowed_type() -> None:
    rates = LiveScheduler(ControllerSettings()).admit(spec("x", 2, 10, devices={"vendor": "amd"}), SNAPSHOT)
    assert rates == {"MI210": 1.0, "MI300X": 1.0}


def test_a_boundary_preempts_for_a_shorter_job_and_waits_for_the_checkpoint() -> None:
    long_spec, short_spec = spec("long", 2, 1000, devices={"model": "MI210"}), spec("short", 2, 5, devices={"model": "MI210"})
    held = HeldDevices("MI210", [Slot("a", 0), Slot("a", 1)])
    long = record(1, long_spec, status=Status.RUNNING, token=1, held=held, seg_start=0.0)
    short = record(2, short_spec)
    scheduler = LiveScheduler(ControllerSettings(policy="srtf", round_s=10))

    between = scheduler.decide([long, short], SNAPSHOT, 5.0, boundary=False, force=True)
    assert not between.stops and not between.launches  # running jobs are pinned between rounds
    assert between.reasons["short-2"].startswith("waiting: needs 2x MI210; MI210: none free")

    plan = scheduler.decide([long, short], SNAPSHOT, 10.0, boundary=True)
    assert [(s.job_id, s.moving_to) for s in plan.stops] == [("long-1", None)]
    assert plan.stops[0].reason == "preempted by policy srtf at a round boundary for short-2"
    assert not plan.launches  # its devices are still held until long-1 has checkpointed
    assert plan.reasons["short-2"] == ("waiting: policy srtf chose 2x MI210 on a [0 1], still held by "
                                       "long-1 until it checkpoints")

    stopped = replace(long, status=Status.QUEUED, held=None, needs_restore=True, done_base=10.0)
    after = scheduler.decide([stopped, short], SNAPSHOT, 11.0, boundary=False, force=True)
    assert [(l.job_id, [(s.node, s.device) for s in l.held.slots]) for l in after.launches] == \
        [("short-2", [("a", 0), ("a", 1)])]
    assert after.launches[0].placement.devices[1].node == "a"
    assert after.reasons["long-1"].startswith("waiting: needs 2x MI210; MI210: none free")
    # every reason says what it is, typed: the steps that made them
    assert between.reasons["short-2"].why is Why.WAITING
    assert plan.stops[0].reason.why is Why.PREEMPTED and plan.reasons["short-2"].why is Why.HELD
    assert after.launches[0].reason.why is Why.STARTED and after.reasons["long-1"].why is Why.WAITING


def test_reasons_without_a_decision_are_typed_too() -> None:
    never = record(1, spec("huge", 64, 10, devices={"model": "MI210"}))
    plan = LiveScheduler(ControllerSettings()).decide([never], SNAPSHOT, 0.0, boundary=False, force=True)
    assert plan.reasons["huge-1"].why is Why.NEVER_FITS and "can never run on this cluster" in plan.reasons["huge-1"]
    empty = LiveScheduler(ControllerSettings()).decide([never], ClusterSnapshot(nodes=()), 0.0, boundary=False)
    assert empty.reasons["huge-1"] == "waiting: the cluster has no nodes to run on"
    assert empty.reasons["huge-1"].why is Why.NO_NODES
    # a reason is its line: it is stored and compared as text, and survives a copy and a pickle
    import copy
    import pickle

    for again in (copy.deepcopy(plan.reasons["huge-1"]), pickle.loads(pickle.dumps(plan.reasons["huge-1"]))):
        assert again == plan.reasons["huge-1"] and again.why is Why.NEVER_FITS


def test_a_job_that_is_not_preemptible_keeps_its_devices_at_a_boundary() -> None:
    held = HeldDevices("MI210", [Slot("a", 0), Slot("a", 1)])
    long = record(1, spec("long", 2, 1000, devices={"model": "MI210"}, preemptible=False),
                  status=Status.RUNNING, token=1, held=held)
    short = record(2, spec("short", 2, 5, devices={"model": "MI210"}))
    plan = LiveScheduler(ControllerSettings(policy="srtf")).decide([long, short], SNAPSHOT, 360.0, boundary=True)
    assert plan.decided and not plan.stops and not plan.launches


def test_devices_held_outside_the_controller_are_not_handed_out() -> None:
    foreign = replace(SNAPSHOT, allocations=(Allocation("by-hand", "b", 0), Allocation("by-hand", "b", 1)))
    job = record(1, spec("x", 1, 10, devices={"model": "L40S"}))
    plan = LiveScheduler(ControllerSettings(policy="fifo")).decide([job], foreign, 0.0, False, force=True)
    assert not plan.launches
    assert plan.reasons["x-1"] == "waiting: needs 1x L40S; L40S: none free"
    free = LiveScheduler(ControllerSettings(policy="fifo")).decide([job], SNAPSHOT, 0.0, False, force=True)
    assert [l.held.text() for l in free.launches] == ["1x L40S on b [0]"]


# --- the planner decides ranks inside the policy's choice --------------------------------

DGX1 = ClusterSnapshot(nodes=(synthetic_node("8x V100", "dgx1"),))


def _launch_spec(name: str, nproc: int, tp: int) -> JobSpec:
    return job_from_dict({"name": name, "kind": "launch",
                          "launch": {"script": "/x.py", "nproc": nproc, "tp": tp},
                          "work": {"seconds": 60.0}})


def _first_launch(snapshot: ClusterSnapshot, s: JobSpec) -> Any:
    plan = LiveScheduler(ControllerSettings(policy="fifo")).decide(
        [record(1, s)], snapshot, 0.0, False, force=True)
    (launch,) = plan.launches
    return launch


def test_a_tp4_job_on_a_dgx1_lands_on_an_nvlink_quad() -> None:
    busy = replace(DGX1, allocations=(Allocation("someone-else", "dgx1", 0),))
    launch = _first_launch(busy, _launch_spec("tp4", 4, 4))
    assert sorted(s.device for s in launch.held.slots) == [4, 5, 6, 7]  # the free NVLink quad
    assert [d.device for d in launch.placement.devices] == [s.device for s in launch.held.slots]
    assert launch.placement.tp_group_gbps == (25.0,)  # NV1 at worst, never PCIe
    assert "bottleneck 25 GB/s" in launch.placement.explain()


def test_tp_pairs_of_a_controller_job_get_the_nv2_links() -> None:
    launch = _first_launch(DGX1, _launch_spec("tp2", 4, 2))
    devices = [d.device for d in launch.placement.devices]
    assert launch.placement.layout.tp == 2 and launch.placement.layout.dp == 2
    node = DGX1.nodes[0]
    assert [node.bandwidth(devices[0], devices[1]), node.bandwidth(devices[2], devices[3])] == [50.0, 50.0]
    assert launch.placement.tp_group_gbps == (50.0, 50.0)
    assert sorted(s.device for s in launch.held.slots) == sorted(devices)
    assert any("chosen by the cluster policy" in n for n in launch.placement.notes)


def test_a_job_files_device_type_matches_models_as_the_planner_does() -> None:
    from hetflow.control.scheduler import LiveCluster

    snapshot = ClusterSnapshot(nodes=(synthetic_node("2x H100-SXM", "sxm"), synthetic_node("2x H100-PCIe", "pcie"),
                                      synthetic_node("2x A100-80GB", "a100"), synthetic_node("2x A10", "a10")))
    cluster = LiveCluster.of(snapshot)
    scheduler = LiveScheduler(ControllerSettings(policy="fifo"))
    allowed = lambda t: scheduler.allowed_types(spec("j", 1, 5.0, devices={"model": t}), cluster)  # noqa: E731
    assert allowed("H100") == {"H100-SXM", "H100-PCIE"}  # as `hetflow plan --model H100`
    assert allowed("H100-SXM") == {"H100-SXM"}
    assert allowed("A10") == {"A10"}  # not A100-80GB
    assert allowed("A100") == {"A100-80GB"}


def test_the_jobs_log_folder_defaults_to_hetflow_jobs_dir_else_tmp(monkeypatch) -> None:
    """``log_dir``: ``$HETFLOW_JOBS_DIR`` where the controller starts (the tests point it at
    their own folder), else /tmp/hetflow/jobs; a setting given or saved wins over both."""
    from hetflow.control.controller import settings_from

    monkeypatch.delenv("HETFLOW_JOBS_DIR", raising=False)
    assert ControllerSettings().log_dir == "/tmp/hetflow/jobs"
    monkeypatch.setenv("HETFLOW_JOBS_DIR", "/srv/jobs")
    assert ControllerSettings().log_dir == "/srv/jobs"
    assert settings_from({"log_dir": "/saved"}, None).log_dir == "/saved"
    assert settings_from(None, {"log_dir": "/given"}).log_dir == "/given"
