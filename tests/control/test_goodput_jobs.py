"""Goodput-adaptive controller jobs without Ray: the job file's ``goodput`` section, the speed
curve and batch it gives each size (checked against Pollux's model computed here), and the
live scheduler resizing such a job by that curve. One small test trains for real (two spawned
CPU processes, no Ray): a run resumed from its checkpoint with another global batch and dp."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from hetflow.accelerators.synthetic import synthetic_node
from hetflow.control.jobspec import JobSpec, job_from_dict, load_job, resolve
from hetflow.control.scheduler import ControllerSettings, LiveScheduler
from hetflow.control.state import HeldDevices, JobRecord, Slot, Status
from hetflow.core.errors import InputError
from hetflow.core.topology import ClusterSnapshot
from hetflow.scheduling.elastic import parse_scaling
from hetflow.scheduling.goodput import GoodputModel, GradParams, PerfParams, fit_perf_params

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "jobs"
SNAPSHOT = ClusterSnapshot(nodes=(synthetic_node("4x L40S", "a"),))

# compute-bound: more replicas (and a larger batch) keep paying
FAST = {"alpha_c": 0.01, "beta_c": 0.001, "alpha_n": 0.05, "beta_n": 0.01, "alpha_r": 0.005, "beta_r": 0.001,
        "gamma": 1.5}
# exchange-bound: the gradient exchange costs more than the step computes
SLOW = {**FAST, "alpha_r": 2.0, "beta_r": 1.0}
NOISE = 400.0


def goodput(**changes: Any) -> dict[str, Any]:
    """A valid section (FAST, noise scale NOISE, batches 64..1024) with ``changes``; a key
    changed to None is left out."""
    out: dict[str, Any] = {"batch_size": 64, "max_batch_size": 1024, "gradient_noise_scale": NOISE,
                           "step_time": FAST, **changes}
    return {k: v for k, v in out.items() if v is not None}


def config(layout: dict[str, Any] | None = None, batch: int = 48) -> dict[str, Any]:
    return {"model": {"kind": "mlp", "hidden": [32, 32]}, "layout": layout or {"dp": 2},
            "train": {"steps": 10, "batch_size": batch}, "resources": {"devices": "cpu"}}


def job(devices: dict[str, Any] | None = None, section: dict[str, Any] | None = None, tmp: Path | None = None,
        **extra: Any) -> JobSpec:
    data = {"name": extra.pop("name", "g"), "kind": "train", "train": config(extra.pop("layout", None)),
            "devices": {"min": 1, "max": 8, "scaling": "goodput"} if devices is None else devices,
            "goodput": goodput() if section is None else section, **extra}
    spec = job_from_dict(data)
    return resolve(spec, tmp) if tmp is not None else spec


def model(step_time: dict[str, float] = FAST, noise: float = NOISE, batch: float = 64) -> GoodputModel:
    return GoodputModel(PerfParams(**step_time), GradParams(sqr=1.0, var=noise), batch)


def optimum(m: GoodputModel, replicas: int, nodes: int = 1, max_batch: float = 1024) -> tuple[float, int]:
    """Pollux's best (goodput, global batch) at ``replicas``: ``GoodputModel.optimize`` where it
    needs no accumulation step (more than one replica, no memory cap), else the initial batch
    (one replica: Pollux grows its batch only by accumulating)."""
    if replicas == 1:
        return float(m.goodput(nodes, 1, m.init_batch_size, 0)), int(m.init_batch_size)
    good, atomic, accum = m.optimize(nodes, replicas, max_batch, (1, max_batch))
    assert accum == 0  # the premise: hetflow's training takes this batch as it is
    return good, atomic * replicas


# --- the job file -----------------------------------------------------------------------------------


def test_the_curve_is_the_ratio_of_pollux_optima_and_each_size_runs_its_batch(tmp_path: Path) -> None:
    spec = job(tmp=tmp_path)
    assert spec.is_elastic and spec.num_devices == 2 and spec.sizes == (1, 2, 4, 8)
    m = model()
    best = {n: optimum(m, n) for n in spec.sizes}
    curve = spec.scaling_curve
    for n in spec.sizes:
        assert curve.relative(n, 2) == pytest.approx(best[n][0] / best[2][0], rel=1e-9)
        at = spec.at_size(n).train_config()
        assert (at.layout.dp, at.train.batch_size) == (n, best[n][1])
        assert spec.goodput_batch(n).batch_size == best[n][1]  # type: ignore[union-attr]
    assert len({b for _, b in best.values()}) > 2  # the batch does change with the size
    # the declared size runs its own choice too: resolve() wrote it into the config
    assert spec.at_size(2) is spec and spec.train_config().train.batch_size == best[2][1] != 48


def test_the_nodes_a_size_spans_and_the_gradient_statistics_change_the_choice(tmp_path: Path) -> None:
    per_node = job(section=goodput(devices_per_node=2), tmp=tmp_path)
    m = model()
    for n in (2, 4, 8):
        good, batch = optimum(m, n, nodes=-(-n // 2))
        assert per_node.goodput_batch(n).goodput == pytest.approx(good, rel=1e-9)  # type: ignore[union-attr]
        assert per_node.goodput_batch(n).batch_size == batch  # type: ignore[union-attr]
    # sqr and var are the same model as their ratio
    pair = job(section=goodput(gradient_noise_scale=None, sqr=0.5, var=0.5 * NOISE), tmp=tmp_path)
    plain = job(tmp=tmp_path)
    assert [pair.goodput_batch(n) for n in pair.sizes] == [plain.goodput_batch(n) for n in plain.sizes]
    assert [per_node.goodput_batch(n) for n in (4, 8)] != [plain.goodput_batch(n) for n in (4, 8)]
    # no gradient noise: a larger batch buys no progress, so every size keeps the reference batch
    flat = job(section=goodput(gradient_noise_scale=0), tmp=tmp_path)
    assert {flat.goodput_batch(n).batch_size for n in flat.sizes} == {64}  # type: ignore[union-attr]


def test_a_profile_is_fitted_with_pollux_fit(tmp_path: Path) -> None:
    points = [(1, 1, 32, 0.040, 0.042), (1, 1, 128, 0.130, 0.134), (1, 2, 64, 0.070, 0.080),
              (1, 4, 64, 0.070, 0.090)]
    keys = ("nodes", "replicas", "local_batch", "compute_s", "step_s")
    section = goodput(step_time=None, profile=[dict(zip(keys, p)) for p in points])
    spec = job(section=section, tmp=tmp_path)
    perf = fit_perf_params(*zip(*points))
    fitted = GoodputModel(perf, GradParams(1.0, NOISE), 64)
    for n in spec.sizes:
        choice = spec.goodput_batch(n)
        assert choice is not None and choice.goodput == pytest.approx(optimum(fitted, n)[0], rel=1e-6)


def test_a_memory_cap_keeps_each_replicas_batch_and_bounds_the_sizes(tmp_path: Path) -> None:
    capped = job({"min": 2, "max": 8, "scaling": "goodput"}, goodput(max_local_batch=48), tmp=tmp_path)
    for n in capped.sizes:
        choice = capped.goodput_batch(n)
        assert choice is not None and choice.local_batch <= 48 and choice.batch_size >= 64
        assert capped.at_size(n).train_config().train.batch_size == choice.batch_size
    # one replica cannot hold the reference batch of 64 in one step: size 1 is refused
    with pytest.raises(InputError, match="devices.min 1: goodput: no global batch from batch_size 64 "
                                         "to max_batch_size 1024 runs as dp 1 replicas of at most 48"):
        job(section=goodput(max_local_batch=48), tmp=tmp_path)


def test_the_policys_sizes_follow_the_goodput_curve_not_a_default_one(tmp_path: Path) -> None:
    slow = job(section=goodput(step_time=SLOW), tmp=tmp_path)
    m = model(SLOW)
    assert slow.scaling_curve.relative(4, 2) == pytest.approx(optimum(m, 4)[0] / optimum(m, 2)[0])
    assert slow.scaling_curve.relative(4, 2) < 1 < slow.scaling_curve.relative(1, 2)
    scheduler = LiveScheduler(ControllerSettings())
    assert scheduler.relative_speed(slow, 4, "L40S") == pytest.approx(slow.scaling_curve.relative(4, 2))


def test_a_pipeline_job_runs_batches_its_microbatches_split(tmp_path: Path) -> None:
    # tp x pp = 2: sizes 2, 4, 8 are dp 1, 2, 4; every replica's batch splits into 4 microbatches
    spec = job(devices={"min": 2, "max": 8, "scaling": "goodput"}, tmp=tmp_path,
               layout={"dp": 1, "pp": 2, "microbatches": 4})
    assert spec.sizes == (2, 4, 8)
    for n in spec.sizes:
        at = spec.at_size(n).train_config()
        assert at.layout.dp == n // 2 and (at.train.batch_size // at.layout.dp) % 4 == 0


def test_the_batch_survives_the_round_trip_the_controller_makes(tmp_path: Path) -> None:
    spec = job(tmp=tmp_path)
    back = JobSpec.model_validate(spec.model_dump(mode="json"))  # what the record stores and the runner reads
    assert back == spec and back.scaling_curve == spec.scaling_curve
    assert back.at_size(4).train_config().train.batch_size == spec.at_size(4).train_config().train.batch_size


def test_a_training_config_read_from_its_file_gets_its_batch_at_submit(tmp_path: Path) -> None:
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(config()))
    (tmp_path / "job.yaml").write_text(yaml.safe_dump({
        "name": "g", "kind": "train", "train": "cfg.yaml", "goodput": goodput(),
        "devices": {"min": 1, "max": 4, "scaling": "goodput"}}))
    spec = load_job(tmp_path / "job.yaml")
    assert spec.sizes == (1, 2, 4) and spec.train_config().train.batch_size == optimum(model(), 2)[1]


def test_the_example_adaptive_job_file_is_valid() -> None:
    spec = load_job(EXAMPLES / "digits-adaptive.yaml")
    assert spec.is_elastic and spec.sizes == (1, 2, 4, 8) and spec.num_devices == 2
    assert spec.devices.scaling == "goodput" and spec.goodput is not None and spec.goodput.profile
    batches = [spec.at_size(n).train_config().train.batch_size for n in spec.sizes]
    assert all(64 <= b <= 512 for b in batches) and len(set(batches)) > 1


OK = {"min": 1, "max": 8, "scaling": "goodput"}
RANGE = "Input should be greater than"
POINT = {"replicas": 1, "local_batch": 8, "compute_s": 0.1, "step_s": 0.1}


@pytest.mark.parametrize("kind, devices, section, message", [
    ("train", OK, goodput(max_batch=512),
     "goodput.max_batch: unknown key (did you mean 'max_batch_size'?"),
    ("train", OK, goodput(step_time={**FAST, "alpha_x": 1}), "goodput.step_time.alpha_x: unknown key"),
    ("train", OK, goodput(step_time=None, profile=[{**POINT, "node": 1}]),
     "goodput.profile.0.node: unknown key (did you mean 'nodes'?"),
    ("train", OK, goodput(batch_size=None), "goodput.batch_size: missing"),
    ("train", OK, goodput(batch_size=0), f"goodput.batch_size: {RANGE} 0"),
    ("train", OK, goodput(max_batch_size=32), "max_batch_size 32 < batch_size 64"),
    ("train", OK, goodput(sqr=1.0, var=2.0),
     "give gradient_noise_scale (var / sqr) or sqr and var, not both"),
    ("train", OK, goodput(gradient_noise_scale=None, sqr=1.0),
     "sqr without var: give the gradient statistics"),
    ("train", OK, goodput(gradient_noise_scale=None), "give the gradient statistics at batch_size"),
    ("train", OK, goodput(gradient_noise_scale=-1), f"goodput.gradient_noise_scale: {RANGE} or equal to 0"),
    ("train", OK, goodput(gradient_noise_scale=float("nan")),
     "goodput.gradient_noise_scale: Input should be a finite number"),
    ("train", OK, goodput(profile=[POINT]),
     "exactly one of step_time (Pollux's seven parameters) or profile"),
    ("train", OK, goodput(step_time={}), "goodput.step_time.alpha_c: missing"),
    ("train", OK, goodput(step_time=None), "exactly one of step_time"),
    ("train", OK, goodput(step_time=None, profile=[]), "profile: give at least one measured step"),
    ("train", OK, goodput(step_time={**FAST, "gamma": 0.5}),
     f"goodput.step_time.gamma: {RANGE} or equal to 1"),
    ("train", OK, goodput(step_time={**FAST, "alpha_c": 0}), f"goodput.step_time.alpha_c: {RANGE} 0"),
    ("train", OK, goodput(step_time=None, profile=[{**POINT, "compute_s": 0.2}]),
     "step_s 0.1 < compute_s 0.2: step_s is the whole step"),
    ("train", OK, goodput(step_time=None, profile=[{**POINT, "nodes": 2}]),
     "2 nodes for 1 replicas: every node holds a replica"),
    ("train", OK, goodput(devices_per_node=0), f"goodput.devices_per_node: {RANGE} or equal to 1"),
    ("train", {"min": 1, "max": 8, "scaling": "eff:0.9"}, goodput(),
     "goodput: the model applies through devices.scaling: goodput"),
    ("train", {"count": 2}, goodput(), "goodput: the model applies through devices.scaling: goodput"),
    ("train", OK, None, "devices.scaling goodput: give the job's goodput section"),
    ("train", {"scaling": "goodput"}, goodput(),
     "scaling is the speed curve of an elastic job: give min and/or max"),
    ("train", {"min": 1, "max": 128, "scaling": "goodput"}, goodput(max_batch_size=64),
     "devices.max 128: goodput: no global batch from batch_size 64 to max_batch_size 64 runs as dp 128"),
    ("train", OK, goodput(), "an elastic job is resized by checkpointing"),  # preemptible: false (below)
    ("launch", {"min": 1, "max": 4, "scaling": "goodput"}, goodput(),
     "goodput: a goodput-adaptive job is kind train (hetflow sets its global batch at each size); "
     "a launch job chooses its own batch"),
    ("launch", {"min": 1, "max": 4, "scaling": "goodput"}, None,
     "devices.scaling goodput: a goodput-adaptive job is kind train"),
    ("python", {"count": 1}, goodput(), "goodput: a goodput-adaptive job is kind train"),
])
def test_a_bad_goodput_job_is_one_clear_error(tmp_path: Path, kind: str, devices: dict, section: dict | None,
                                              message: str) -> None:
    data: dict[str, Any] = {"name": "g", "kind": kind, "devices": devices}
    if section is not None:
        data["goodput"] = section
    if kind == "train":
        data["train"] = config()
    elif kind == "launch":
        data["launch"] = {"script": "/x.py", "nproc": 2}
    else:
        data["python"] = {"script": "/x.py"}
    if "checkpointing" in message:
        data["preemptible"] = False
    with pytest.raises(InputError) as exc:
        resolve(job_from_dict(data), tmp_path)
    assert message in str(exc.value)
    assert "\n" not in str(exc.value).strip()


def test_a_trace_cannot_name_the_goodput_curve() -> None:
    with pytest.raises(InputError, match="scaling 'goodput': the curve of a job file's goodput section"):
        parse_scaling("goodput")


# --- the live scheduler -----------------------------------------------------------------------------


def record(seq: int, s: JobSpec, **fields: Any) -> JobRecord:
    return JobRecord(f"{s.name}-{seq}", seq, s.model_dump(mode="json"), 0.0, **fields)


def on(*devices: int) -> HeldDevices:
    return HeldDevices("L40S", [Slot("a", d) for d in devices])


def test_the_policy_grows_a_job_whose_goodput_grows_and_keeps_one_whose_goodput_falls(tmp_path: Path) -> None:
    # long enough (10^5 steps at the unknown job type's 1 step/s) that growing pays for a restart
    devices = {"count": 2, "min": 1, "max": 4, "scaling": "goodput"}
    fast = job(devices, tmp=tmp_path, name="f", work={"steps": 1e5})
    slow = job(devices, goodput(step_time=SLOW), tmp=tmp_path, name="s", work={"steps": 1e5})
    assert fast.scaling_curve.relative(4, 2) > 1 > slow.scaling_curve.relative(4, 2)

    # alone on 4 idle devices: the fast one starts at 4 with its batch there; the slow one at 2
    for spec, size in ((fast, 4), (slow, 2)):
        scheduler = LiveScheduler(ControllerSettings(policy="hetflow", round_s=10, restore_s=5))
        plan = scheduler.decide([record(1, spec)], SNAPSHOT, 0.0, False, force=True)
        assert [(len(l.held.slots), l.placement.layout.dp) for l in plan.launches] == [(size, size)]

    # running at 2 with 2 devices idle, at a round boundary: the fast one is resized to 4, the
    # slow one is left as it is (its curve says 4 devices run it slower)
    for spec, grows in ((fast, True), (slow, False)):
        scheduler = LiveScheduler(ControllerSettings(policy="hetflow", round_s=10, restore_s=5))
        running = record(1, spec, status=Status.RUNNING, token=1, held=on(0, 1), seg_start=0.0, size=2)
        plan = scheduler.decide([running], SNAPSHOT, 10.0, True)
        grown = [len(s.moving_to.slots) for s in plan.stops]  # type: ignore[union-attr]
        assert grown == ([4] if grows else [])
    # what the runner then starts: dp 4 and the batch goodput chose at 4
    at4 = fast.at_size(4).train_config()
    assert (at4.layout.dp, at4.train.batch_size) == (4, optimum(model(), 4)[1])


def test_a_goodput_job_shrinks_for_a_shorter_job_and_restarts_with_its_smaller_batch(tmp_path: Path) -> None:
    spec = job({"count": 2, "min": 1, "max": 4, "scaling": "goodput"}, tmp=tmp_path, name="f",
               work={"steps": 1e5})
    scheduler = LiveScheduler(ControllerSettings(policy="hetflow", round_s=10, restore_s=5))
    e = record(1, spec, status=Status.RUNNING, token=1, held=on(0, 1, 2, 3), seg_start=0.0, size=4)
    short = record(2, job_from_dict({"name": "r", "kind": "python", "python": {"script": "/x.py"},
                                     "devices": {"count": 3}, "work": {"seconds": 10}}))
    plan = scheduler.decide([e, short], SNAPSHOT, 10.0, True)
    shrunk = [(s.job_id, len(s.moving_to.slots)) for s in plan.stops]  # type: ignore[union-attr]
    assert shrunk == [("f-1", 1)]
    stopped = replace(e, status=Status.QUEUED, held=None, needs_restore=True, done_base=10.0)
    after = scheduler.decide([stopped, short], SNAPSHOT, 11.0, False, force=True)
    got = {l.job_id: len(l.held.slots) for l in after.launches}
    assert got == {"f-1": 1, "r-2": 3}
    assert spec.at_size(1).train_config().train.batch_size == 64  # one replica: the reference batch


# --- a resumed run with another batch ---------------------------------------------------------------


def test_a_run_resumed_with_another_global_batch_continues_at_the_next_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a goodput resize does to the training: 4 steps at batch 8, then the run resumed from
    that checkpoint at batch 16. One rank in this process (gloo, no spawn: seconds): it
    continues at step 5 with the first steps' history and trains 4 steps more."""
    from hetflow.workloads.train.checkpoint import list_checkpoints
    from hetflow.workloads.train.config import config_from_dict
    from hetflow.workloads.train.loop import train_rank

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):  # train_rank sets them
        monkeypatch.setenv(name, "0")

    def run(steps: int, batch: int, store: str) -> Any:
        cfg = config_from_dict({"model": {"kind": "mlp", "hidden": [16]},
                                "train": {"steps": steps, "batch_size": batch, "log_every": 1, "lr": 0.01},
                                "checkpoint": {"dir": str(tmp_path / "ckpt")},
                                "resources": {"devices": "cpu"}})
        return train_rank(cfg, 0, 1, f"file://{tmp_path / store}")

    first = run(4, 8, "s1")
    resumed = run(8, 16, "s2")
    assert (first.start_step, first.end_step) == (0, 4) and (resumed.start_step, resumed.end_step) == (4, 8)
    assert sorted(resumed.losses) == list(range(1, 9))
    assert all(resumed.losses[s] == first.losses[s] for s in range(1, 5))  # carried, not recomputed
    assert all(0 < resumed.losses[s] < 10 for s in range(5, 9))
    assert [c.step for c in list_checkpoints(tmp_path / "ckpt")] == [4, 8]


def test_steps_that_count_more_end_the_run_at_its_progress_and_resume_carries_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``train.step_gain`` (what ``at_size`` sets with a goodput job's batch): a run of 10
    reference steps at gain 1 stopped after 3 steps, resumed at gain 2.5 (a larger batch), needs
    ceil(7 / 2.5) = 3 steps more and ends at step 6 with progress 10.5 in its checkpoint."""
    from hetflow.workloads.train.checkpoint import latest_checkpoint
    from hetflow.workloads.train.config import config_from_dict
    from hetflow.workloads.train.loop import train_rank

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.setenv(name, "0")

    def run(steps: int, batch: int, gain: float, store: str) -> Any:
        cfg = config_from_dict({"model": {"kind": "mlp", "hidden": [16]},
                                "train": {"steps": steps, "batch_size": batch, "step_gain": gain,
                                          "log_every": 1},
                                "checkpoint": {"dir": str(tmp_path / "ckpt")},
                                "resources": {"devices": "cpu"}})
        return train_rank(cfg, 0, 1, f"file://{tmp_path / store}")

    first = run(3, 8, 1.0, "s1")  # (3 of 10 reference steps: stopped there as a preemption would)
    assert (first.end_step, first.progress) == (3, 3.0)
    resumed = run(10, 16, 2.5, "s2")
    assert (resumed.start_step, resumed.end_step) == (3, 6) and resumed.progress == pytest.approx(10.5)
    info = latest_checkpoint(tmp_path / "ckpt")
    assert info is not None and info.step == 6 and info.meta["progress"] == pytest.approx(10.5)
    again = run(10, 16, 2.5, "s3")  # done: nothing more runs
    assert (again.start_step, again.end_step) == (6, 6)


def test_the_controller_counts_a_goodput_jobs_work_in_steps_of_its_declared_batch(tmp_path: Path) -> None:
    spec = job(tmp=tmp_path)
    train = spec.train_config().train
    gain = spec.goodput_batch(spec.num_devices).gain
    assert train.step_gain == pytest.approx(gain) and gain > 1
    assert spec.total_work == pytest.approx(train.steps / gain)
    bigger = spec.at_size(8).train_config().train
    assert bigger.step_gain == pytest.approx(spec.goodput_batch(8).gain) and bigger.step_gain > gain
    # an attempt preempted after 4 steps at 8 devices made 4 x gain(8) reference steps
    assert spec.done_steps(4, 4 * bigger.step_gain) == pytest.approx(4 * bigger.step_gain / gain)
    plain = job_from_dict({"name": "p", "kind": "train", "train": config()})
    assert plain.total_work == 10 and plain.done_steps(4, 4.0) == 4


def test_submit_dry_run_shows_each_sizes_batch(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"name": "g", "kind": "train", "train": config(),
                                    "devices": {"min": 1, "max": 8, "scaling": "goodput"},
                                    "goodput": goodput()}))
    out = subprocess.run([sys.executable, "-m", "hetflow.cli.main", "submit", str(path), "--dry-run"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    spec = job(tmp=tmp_path)
    m = model()
    text = out.stdout
    for n in spec.sizes:  # the batch Pollux's optimum gives at each size (computed here)
        assert f"{optimum(m, n)[1]} on {n} " in text, (n, text)
