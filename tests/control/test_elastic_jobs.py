"""Elastic controller jobs without Ray: the job file's device range, and the live scheduler's
resizes (the policy's sizes for running jobs become a checkpoint-stop, then a start)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from hetflow.accelerators.synthetic import synthetic_node
from hetflow.control.jobspec import JobSpec, job_from_dict, load_job, resolve
from hetflow.control.scheduler import ControllerSettings, LiveScheduler, Why
from hetflow.control.state import HeldDevices, JobRecord, Slot, Status
from hetflow.core.errors import InputError
from hetflow.core.topology import ClusterSnapshot

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "jobs"
SNAPSHOT = ClusterSnapshot(nodes=(synthetic_node("4x L40S", "a"),))


def train_spec(devices: dict[str, Any], tmp: Path, layout: dict[str, Any] | None = None,
               batch: int = 48, **extra: Any) -> JobSpec:
    config = {"model": {"kind": "mlp", "hidden": [32, 32]}, "layout": layout or {"dp": 2},
              "train": {"steps": 10, "batch_size": batch}, "resources": {"devices": "cpu"}}
    return resolve(job_from_dict({"name": "e", "kind": "train", "train": config, "devices": devices, **extra}), tmp)


def launch_spec(devices: dict[str, Any], nproc: int = 4, seconds: float = 600, **launch: Any) -> JobSpec:
    return job_from_dict({"name": "e", "kind": "launch", "launch": {"script": "/x.py", "nproc": nproc, **launch},
                          "devices": devices, "work": {"seconds": seconds}})


# --- the job file ----------------------------------------------------------------------------------


def test_a_train_job_with_a_range_runs_at_its_sizes_with_dp_changed_and_the_global_batch_kept(tmp_path: Path) -> None:
    spec = train_spec({"min": 1, "max": 4, "scaling": "eff:0.9"}, tmp_path)
    assert spec.is_elastic and spec.num_devices == 2 and spec.sizes == (1, 2, 4)
    for n in spec.sizes:
        at = spec.at_size(n)
        config = at.train_config()
        assert at.num_devices == at.num_ranks == n and config.layout.dp == n
        assert config.train.batch_size == 48 and config.checkpoint.dir == spec.train_config().checkpoint.dir
        assert at.devices.bounds(n) == (1, 4)  # the range is kept: the runner knows it is elastic
    assert spec.at_size(2) is spec
    # tp x pp = 2: sizes are multiples of 2 (dp = n / 2); dp > 1 with tp needs fsdp
    tp = train_spec({"min": 2, "max": 8}, tmp_path, layout={"dp": 1, "tp": 2, "data_parallel": "fsdp"}, batch=48)
    assert tp.sizes == (2, 4, 8)
    assert [(tp.at_size(n).train_config().layout.dp, tp.at_size(n).train_config().layout.data_parallel)
            for n in (4, 8)] == [(2, "fsdp"), (4, "fsdp")]
    with pytest.raises(InputError, match="devices.max 4: dp 2 with tp 2 needs layout.data_parallel: fsdp"):
        train_spec({"max": 4}, tmp_path, layout={"dp": 1, "tp": 2})
    rigid = train_spec({"count": 2}, tmp_path)
    assert not rigid.is_elastic and rigid.sizes == (2,)


def test_sizes_the_batch_does_not_split_over_are_left_out(tmp_path: Path) -> None:
    # 1..8 gives 1, 2, 4, 8 and the declared 2; a batch of 12 does not split over 8
    spec = train_spec({"min": 1, "max": 6}, tmp_path, batch=12)
    assert spec.sizes == (1, 2, 4, 6)
    odd = train_spec({"min": 2, "max": 6}, tmp_path, batch=24)
    assert odd.sizes == (2, 4, 6)


@pytest.mark.parametrize("devices, extra, message", [
    ({"min": 3, "max": 4}, {}, "devices: min 3, count 2, max 4: an elastic job needs min <= count <= max"),
    ({"count": 2, "max": 1}, {}, "min 2, count 2, max 1: an elastic job needs min <= count <= max"),
    ({"min": 0}, {}, "min"),
    ({"max": 32}, {}, "devices.max 32: train.batch_size 48 (the global batch, kept at every size) does not split "
                      "evenly over dp 32 replicas"),
    ({"max": 4, "scaling": "eff:2"}, {}, "scaling 'eff:2': the efficiency must be in (0, 1]"),
    ({"max": 4, "scaling": "1:1,2:1.8"}, {}, "scaling '1:1,2:1.8' does not cover min..max = 2..4 devices"),
    ({"scaling": "eff:0.9"}, {}, "scaling is the speed curve of an elastic job: give min and/or max"),
    ({"count": 0, "max": 2}, {}, "count 0 asks for no device, so max cannot apply"),
    ({"max": 4}, {"preemptible": False}, "an elastic job is resized by checkpointing and restarting it, so it "
                                         "must be preemptible"),
    ({"mx": 4}, {}, "did you mean"),
])
def test_a_bad_range_is_one_clear_error(tmp_path: Path, devices: dict, extra: dict, message: str) -> None:
    with pytest.raises(InputError) as exc:
        train_spec(devices, tmp_path, **extra)
    assert message in str(exc.value)
    assert "\n" not in str(exc.value).strip() or message == "did you mean"


def test_only_kinds_that_restart_at_another_size_take_a_range(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="devices.min/max .an elastic job. are for kind train or launch.*a python job"):
        job_from_dict({"name": "p", "kind": "python", "python": {"script": "/x.py"}, "devices": {"count": 1, "max": 2}})
    with pytest.raises(InputError, match="a tune job runs at its one size"):
        job_from_dict({"name": "t", "kind": "tune", "tune": "t.yaml", "devices": {"count": 1, "max": 2}})
    with pytest.raises(InputError, match="devices.min 1: not a multiple of launch's tp x pp = 2"):
        launch_spec({"min": 1, "max": 4}, tp=2)
    launch = launch_spec({"min": 1, "max": 8}, nproc=4)
    assert launch.sizes == (1, 2, 4, 8) and launch.at_size(8).launch.nproc == 8  # type: ignore[union-attr]
    assert launch.at_size(2).layout.dp == 2


def test_a_range_checks_a_training_config_read_from_its_file(tmp_path: Path) -> None:
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump({"train": {"batch_size": 64}, "resources": {"devices": "cpu"}}))
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"name": "e", "kind": "train", "train": "cfg.yaml", "devices": {"max": 3}}))
    with pytest.raises(InputError, match="job e: devices.max 3: train.batch_size 64 .* does not split evenly over dp 3"):
        load_job(job)
    job.write_text(yaml.safe_dump({"name": "e", "kind": "train", "train": "cfg.yaml", "devices": {"max": 4}}))
    assert load_job(job).sizes == (1, 2, 4)


def test_the_example_elastic_job_file_is_valid() -> None:
    spec = load_job(EXAMPLES / "digits-elastic.yaml")
    assert spec.is_elastic and spec.sizes == (1, 2, 4) and spec.num_devices == 2


# --- the live scheduler -----------------------------------------------------------------------------


def record(seq: int, s: JobSpec, **fields: Any) -> JobRecord:
    return JobRecord(f"{s.name}-{seq}", seq, s.model_dump(mode="json"), 0.0, **fields)


def rigid(name: str, count: int, seconds: float, **extra: Any) -> JobSpec:
    return job_from_dict({"name": name, "kind": "python", "python": {"script": "/x.py"},
                          "devices": {"count": count}, "work": {"seconds": seconds}, **extra})


def on(*devices: int) -> HeldDevices:
    return HeldDevices("L40S", [Slot("a", d) for d in devices])


def devices(launch: Any) -> list[int]:
    return sorted(s.device for s in launch.held.slots)


def test_an_elastic_job_shrinks_through_its_checkpoint_for_a_shorter_job_and_grows_back() -> None:
    scheduler = LiveScheduler(ControllerSettings(policy="hetflow", round_s=10, restore_s=5))
    elastic = launch_spec({"min": 1, "max": 4}, nproc=4)
    alone = scheduler.decide([record(1, elastic)], SNAPSHOT, 0.0, False, force=True)
    assert [(l.job_id, devices(l), l.placement.layout.dp) for l in alone.launches] == [("e-1", [0, 1, 2, 3], 4)]

    e = record(1, elastic, status=Status.RUNNING, token=1, held=on(0, 1, 2, 3), seg_start=0.0, size=4)
    short = record(2, rigid("r", 2, 10))
    between = scheduler.decide([e, short], SNAPSHOT, 5.0, False, force=True)
    assert not between.stops and not between.launches  # running jobs are pinned between rounds

    plan = scheduler.decide([e, short], SNAPSHOT, 10.0, True)
    assert [(s.job_id, len(s.moving_to.slots)) for s in plan.stops] == [("e-1", 2)]  # type: ignore[union-attr]
    assert plan.stops[0].reason.startswith("resized by policy hetflow from 4 to 2 devices (2x L40S on a [")
    assert plan.stops[0].reason.endswith("through its checkpoint for r-2") and plan.stops[0].reason.why is Why.RESIZED
    assert not plan.launches  # both wait for e-1's checkpoint; e-1 keeps its stop's reason
    assert "e-1" not in plan.reasons and "still held by e-1" in plan.reasons["r-2"]

    stopped = replace(e, status=Status.QUEUED, held=None, needs_restore=True, done_base=10.0)
    after = scheduler.decide([stopped, short], SNAPSHOT, 11.0, False, force=True)
    got = {l.job_id: l for l in after.launches}
    assert sorted(got) == ["e-1", "r-2"] and len(got["e-1"].held.slots) == 2
    assert got["e-1"].placement.layout.dp == 2 and not set(devices(got["e-1"])) & set(devices(got["r-2"]))
    assert got["e-1"].reason.endswith("(2 of its 1..4 devices)")

    # the short job has ended: at the next boundary the time saved at 4 pays for the restart
    shrunk = replace(stopped, status=Status.RUNNING, held=on(*devices(got["e-1"])), seg_start=11.0, token=2, size=2)
    grow = scheduler.decide([shrunk], SNAPSHOT, 20.0, True)
    assert [(s.job_id, len(s.moving_to.slots)) for s in grow.stops] == [("e-1", 4)]  # type: ignore[union-attr]
    assert grow.stops[0].reason.startswith("resized by policy hetflow from 2 to 4 devices")
    # ... but not when it is nearly done: 5 s of work saves less than (1 + hysteresis) x 5 s of restore
    almost = replace(shrunk, done_base=595.0)
    assert not scheduler.decide([almost], SNAPSHOT, 20.0, True).stops


def test_a_waiting_elastic_job_starts_smaller_on_the_devices_left() -> None:
    scheduler = LiveScheduler(ControllerSettings(policy="hetflow", round_s=10, restore_s=5))
    busy = record(1, rigid("busy", 3, 1000, preemptible=False), status=Status.RUNNING, token=1, held=on(0, 1, 2),
                  seg_start=0.0, size=3)
    elastic = record(2, launch_spec({"min": 1, "max": 4}, nproc=4))
    plan = scheduler.decide([busy, elastic], SNAPSHOT, 1.0, False, force=True)
    assert [(l.job_id, devices(l), l.placement.layout.dp) for l in plan.launches] == [("e-2", [3], 1)]
    # a rigid job of the same size waits instead
    same = record(3, rigid("e", 4, 600))
    plan = scheduler.decide([busy, same], SNAPSHOT, 1.0, False, force=True)
    assert not plan.launches and plan.reasons["e-3"].startswith("waiting: needs 4x L40S")


def test_a_work_estimate_in_seconds_advances_at_the_curves_speed() -> None:
    scheduler = LiveScheduler(ControllerSettings())
    spec = launch_spec({"min": 1, "max": 4, "scaling": "eff:0.8"}, nproc=2)
    assert scheduler.relative_speed(spec, 2, "L40S") == 1.0
    assert scheduler.relative_speed(spec, 4, "L40S") == pytest.approx(2 * 0.8)
    assert scheduler.relative_speed(spec, 1, "L40S") == pytest.approx(0.5 / 0.8)
    assert scheduler.relative_speed(rigid("r", 2, 10), 2, "L40S") == 1.0


def test_a_records_size_and_resizes_survive_a_round_trip() -> None:
    r = record(1, launch_spec({"max": 4}), size=2, resizes=3)
    back = JobRecord.from_dict(r.to_dict())
    assert (back.size, back.resizes) == (2, 3)
    old = r.to_dict()
    del old["size"], old["resizes"]  # a record written before elastic jobs existed
    assert (JobRecord.from_dict(old).size, JobRecord.from_dict(old).resizes) == (None, 0)


# (name, devices, min, max, seconds): elastic and rigid jobs on 2x MI210, 2x L40S, 8x MI300X
MIXED = [("a", 2, 1, 4, 600.0), ("b", 4, None, None, 60.0), ("c", 1, 1, 8, 900.0), ("d", 8, 2, 8, 300.0),
         ("e", 2, None, None, 30.0), ("f", 2, 1, 2, 120.0)]


def test_first_decision_with_elastic_jobs_is_the_simulators() -> None:
    """The simulator (Job.min_gpus/max_gpus/scaling) and the live scheduler (devices.min/max/
    scaling) give policy hetflow the same elastic jobs: its first decision is the same, sizes
    and devices."""
    from hetflow.control.scheduler import live_throughputs
    from hetflow.scheduling.policies.capacity import ClusterModel
    from hetflow.scheduling.policies.registry import make_policy
    from hetflow.scheduling.throughput import FIXED_DURATION
    from hetflow.sim.engine import SimConfig, Simulator
    from hetflow.sim.traces import Job
    from tests.control.test_scheduler import SNAPSHOT as MIXED_CLUSTER
    from tests.control.test_scheduler import FirstDecision

    model = ClusterModel.from_snapshot(MIXED_CLUSTER)
    sim_policy = FirstDecision(make_policy("hetflow"))
    trace = [Job(n, FIXED_DURATION, 0.0, k, s, min_gpus=lo, max_gpus=hi, scaling="eff:0.85" if lo else None)
             for n, k, lo, hi, s in MIXED]
    Simulator(model, trace, sim_policy, live_throughputs(), SimConfig()).run()
    sim = {jid: sorted((model.nodes[n].machine, model.nodes[n].devices[p]) for n, p in a.slots)
           for jid, a in sim_policy.first.items()}

    specs = [launch_spec({"count": k, **({"min": lo, "max": hi, "scaling": "eff:0.85"} if lo else {})}, nproc=k,
                         seconds=s).model_copy(update={"name": n}) for n, k, lo, hi, s in MIXED]
    records = [record(i + 1, s) for i, s in enumerate(specs)]
    plan = LiveScheduler(ControllerSettings(policy="hetflow")).decide(records, MIXED_CLUSTER, 0.0, False, force=True)
    live = {launch.job_id.rsplit("-", 1)[0]: sorted((s.node, s.device) for s in launch.held.slots)
            for launch in plan.launches}
    assert plan.decided and not plan.stops
    assert live == sim
    sizes = {name: len(slots) for name, slots in live.items()}
    assert any(sizes[n] != k for n, k, lo, _, _ in MIXED if lo and n in sizes)  # some elastic job got another size


def test_status_shows_an_elastic_jobs_size_and_resizes() -> None:
    from hetflow.cli.jobs import format_job, format_table

    r = record(4, launch_spec({"min": 1, "max": 4}), status=Status.RUNNING, held=on(2, 3), size=2, resizes=1,
               reason="running on 2x L40S on a [2 3]").to_dict()
    r.update(devices="2x L40S on a [2 3]", name="e", sizes=[1, 2, 4])
    line = format_table([r]).splitlines()[1]
    assert line.split()[:2] == ["e-4", "RUNNING"] and "2x L40S on a [2 3] (resized 1x)" in line
    assert "  size: 2 now, sizes 1 2 4 (elastic), 1 resize(s)" in format_job(r).splitlines()
    rigid_row = {**r, "sizes": None, "resizes": 0}
    assert "resized" not in format_table([rigid_row]) and "size:" not in format_job(rigid_row)
