"""Sia's protocol (hetflow.sim.sia) against Sia's own simulator, and the live policy on it.

The fixtures (tests/fixtures/sia/README.md) are slices: the bert and deepspeech2 profiles on
Sia's three GPU types, those models' 19 jobs of workloads/philly/workload-1.csv, and what Sia's
own simulator did with them when it ran the whole workload under Gavel and under Sia with every
job rigid (allocations by round, JCTs, restarts). A job's progress depends only on its own allocations, so replaying them must
give each job the reference JCT exactly: that checks the job model (profiles, accumulation,
statistical efficiency, epoch rounding, restarts) and the round rules.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from hetflow.sim.live_sia import simulate_sia
from hetflow.sim.sia import (SIA_CLUSTER, ReplayPolicy, SiaJob, SiaProfiles, SiaSimulator, load_workload,
                             packed_placement, placement_of, rigid_config)

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "sia"
SLICE = FIX / "workloads" / "philly-workload-1-bert-deepspeech2.csv"
REFS = {"gavel": FIX / "gavel-philly-workload-1-bert-deepspeech2.json",  # Gavel, 360 s rounds
        "sia_rigid": FIX / "sia_rigid-philly-workload-1-bert-deepspeech2.json",  # Sia, every job rigid, 60 s
        "sia": FIX / "sia-philly-workload-1-bert-deepspeech2.json"}  # Sia, every job adaptive, 60 s
KIND = {"gavel": "rigid", "sia_rigid": "rigid", "sia": "adaptive"}  # how the reference ran the jobs


@pytest.fixture(scope="module")
def profiles() -> SiaProfiles:
    return SiaProfiles(FIX / "profiles")


@pytest.fixture(scope="module")
def specs():
    return load_workload(SLICE)


@pytest.mark.parametrize("policy", sorted(REFS))
def test_replaying_a_reference_run_gives_every_job_its_reference_jct(profiles, specs, policy) -> None:
    ref = json.loads(REFS[policy].read_text())
    assert set(ref["jcts"]) == {s.name for s in specs} and len(specs) == 19
    kind = KIND[policy]
    run = SiaSimulator(specs, profiles, ReplayPolicy(ref["changes"]), round_s=ref["round_s"], default_kind=kind).run()
    assert not run.unfinished
    for name, jct in ref["jcts"].items():
        assert run.jcts[name] == pytest.approx(jct, abs=1e-6), name
    assert run.restarts == {k: v or 0 for k, v in ref["restarts"].items()}
    # and the replay is not trivially right: one round later for every change moves the JCTs
    late = {str(float(t) + ref["round_s"]): v for t, v in ref["changes"].items()}
    shifted = SiaSimulator(specs, profiles, ReplayPolicy(late), round_s=ref["round_s"], default_kind=kind).run()
    assert sum(shifted.jcts.values()) > sum(run.jcts.values())
    if kind == "adaptive":  # nor is the job model: the same allocations with the batch sizes fixed miss
        fixed = SiaSimulator(specs, profiles, ReplayPolicy(ref["changes"]), round_s=ref["round_s"],
                             default_kind="scale-gpus").run()
        missed = [k for k, v in ref["jcts"].items() if abs(fixed.jcts.get(k, math.inf) - v) > 1e-6]
        assert len(missed) > len(specs) // 2


def test_rigid_configuration_follows_the_profiles(profiles) -> None:
    # 12 A100s at batch 384: 32 per GPU, within the profiled local batches (up to 48): no accumulation
    c = rigid_config(profiles.app("bert", "A100"), (8, 4), 384)
    assert (c.atomic_bsz, c.accum_steps, c.batch_size) == (32, 0, 384) and c.ok
    # 12 T4s: the placement's profiles go up to 12 per GPU, so 32 takes 3 accumulation steps of 11,
    # then capped so that 12 GPUs x 3 steps stay within bert's largest validated batch (384): the
    # job trains at 12 x 10 x 3 = 360
    bert = profiles.app("bert", "T4")
    assert bert.max_local_bsz_at((4, 4, 4)) == 12 and bert.max_batch_size == 384
    c = rigid_config(bert, (4, 4, 4), 384)
    assert (c.atomic_bsz, c.accum_steps, c.batch_size) == (10, 2, 360) and c.ok
    # one GPU at a batch above the smallest validated one always accumulates (the artifact's rule)
    one = rigid_config(bert, (1,), 384)
    assert one.accum_steps >= 1 and one.batch_size <= 384
    assert one.iteration_s == pytest.approx(one.step_time + (one.step_time - one.sync_time) * one.accum_steps)
    # a placement is priced by its own profile: on T4 nodes (PCIe) 8 GPUs over 4 nodes measured
    # faster than over 2, and the model keeps that
    assert rigid_config(bert, (2, 2, 2, 2), 384).iteration_s < rigid_config(bert, (4, 4), 384).iteration_s
    # deepspeech2's local batch on the RTX 2080Ti is capped at 57 (the artifact's special case)
    assert profiles.app("deepspeech2", "RTX2080Ti").max_local_bsz == 57


def _alone(profiles, spec, gpu_type: str, round_s: float = 60.0):
    """One job alone on ``gpu_type`` at its packed placement from its first round."""
    nodes = []
    for i, k in enumerate(packed_placement(spec.num_replicas, SIA_CLUSTER[gpu_type][2])):
        nodes += [i] * k

    class Pin:
        name = "pin"

        def decide(self, sim):
            return {j.name: (gpu_type, tuple(nodes)) for j in sim.active()}

    return SiaSimulator([spec], profiles, Pin(), round_s=round_s).run()


def test_a_job_alone_takes_its_restart_plus_its_predicted_training_time(profiles, specs) -> None:
    spec = next(s for s in specs if s.app == "deepspeech2")
    for gpu_type in SIA_CLUSTER:
        run = _alone(profiles, spec, gpu_type)
        job = SiaJob(spec, profiles)
        p = packed_placement(spec.num_replicas, SIA_CLUSTER[gpu_type][2])
        train = job.remaining_s(gpu_type, p)
        first_round = math.ceil(spec.submission_s / 60.0) * 60.0  # decided at the end of its first round
        expected = first_round - spec.submission_s + job.app(gpu_type).rescale_time + train
        # each of the 80 epochs' crossing is rounded to a whole second
        assert run.jcts[spec.name] == pytest.approx(expected, abs=80 * 0.5 + 1e-6), gpu_type
        assert run.restarts[spec.name] == 0


def test_restart_rules(profiles, specs) -> None:
    spec = next(s for s in specs if s.app == "bert" and s.num_replicas == 12)
    job = SiaJob(spec, profiles)
    job.migrate("T4", placement_of((0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2)))
    assert job.num_restarts == 0 and job.rescale_time == 120
    job.step(200)
    assert job.rescale_time == 0 and job.progress > 0
    job.reallocate(placement_of((3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5)))  # other nodes, same shape: free
    assert job.num_restarts == 0 and job.rescale_time == 0
    job.reallocate(placement_of((0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1)))  # new shape: a restart
    assert job.num_restarts == 1 and job.rescale_time == 120
    before = job.progress
    job.migrate(None, ())  # no GPUs: progress kept, nothing happens
    job.step(600)
    assert job.progress == before
    job.migrate("A100", placement_of((0,) * 8 + (1,) * 4))
    assert job.num_restarts == 2 and job.rescale_time == 120


def test_the_live_policy_class_runs_sias_protocol(profiles, specs) -> None:
    from hetflow.scheduling.policies.registry import make_policy
    from hetflow.sim.live_sia import live_sia_policy

    adapter = live_sia_policy("hetflow")
    assert type(adapter.policy) is type(make_policy("hetflow"))
    run = SiaSimulator(specs, profiles, adapter, round_s=60).run()  # the simulator checks every allocation
    assert not run.unfinished and 0 < adapter.decisions <= run.rounds
    fifo = simulate_sia(specs, profiles, "fifo", round_s=60)
    assert not fifo.unfinished
    ours = run.summary()["avg_jct_s"]
    assert ours < fifo.summary()["avg_jct_s"]
    # every job alone on its fastest type (packed) from its first decision: no queueing, one start
    # (a bound up to placements that the profiles price faster than the packed one)
    bound = sum(min(_alone(profiles, s, t).jcts[s.name] for t in SIA_CLUSTER) for s in specs) / len(specs)
    assert ours >= bound - 1e-6


def test_an_adaptive_job_learns_its_batch_size(profiles, specs) -> None:
    for app in ("bert", "deepspeech2"):
        spec = next(s for s in specs if s.app == app)
        job = SiaJob(spec, profiles, "adaptive")
        job.migrate("A100", (8,))
        a = job.app("A100")
        # no goodput model yet: the least batch the placement allows
        assert job.batch_size == max(a.init_batch_size, a.min_local_bsz * 8) and job.model("A100") is None
        job.step(600)
        # a model fitted to what it ran, on that type only; the batch re-chosen with it
        assert job.model("A100") is not None and job.model("T4") is None
        assert job.batch_size > max(a.init_batch_size, a.min_local_bsz * 8)
        assert job.batch_size <= a.max_batch_size


def test_the_live_policy_gives_adaptive_jobs_their_sizes(profiles, specs) -> None:
    adaptive = simulate_sia(specs, profiles, "hetflow", default_kind="adaptive")
    rigid = simulate_sia(specs, profiles, "hetflow", default_kind="rigid")
    fifo = simulate_sia(specs, profiles, "fifo", default_kind="adaptive")
    assert not adaptive.unfinished
    # the same jobs finish sooner when the policy picks their GPU counts and they their batch sizes,
    # and hetflow's sizes beat fifo's (which keeps each job at its size)
    assert adaptive.summary()["avg_jct_s"] < 0.9 * rigid.summary()["avg_jct_s"]
    assert adaptive.summary()["avg_jct_s"] < fifo.summary()["avg_jct_s"]


def test_cli_sia_protocol(tmp_path, profiles) -> None:
    from hetflow.cli.main import main

    out = tmp_path / "s"
    args = ["simulate", "--protocol", "sia", "--trace", str(SLICE), "--throughputs", str(FIX / "profiles"),
            "--round-s", "360", "--policies", "fifo,hetflow", "--out", str(out)]
    assert main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary) == {"fifo", "hetflow"}
    got = summary["hetflow"]["workloads"][SLICE.name]
    direct = simulate_sia(load_workload(SLICE), profiles, "hetflow", round_s=360, default_kind="adaptive").summary()
    assert got["avg_jct_s"] == pytest.approx(direct["avg_jct_s"]) and got["completed"] == 19
    assert "reference" not in got  # a slice is not one of Sia's workloads
    lines = (out / "jobs.csv").read_text().splitlines()
    assert lines[0] == "policy,workload,job,arrival_s,jct_s,restarts" and len(lines) == 1 + 2 * 19
    assert json.loads((out / "inputs.json").read_text())["job_kind"]["hetflow"] == "adaptive"  # as Sia runs them
    rigid = tmp_path / "r"
    assert main(args[:-1] + [str(rigid), "--job-kind", "rigid", "--policies", "hetflow"]) == 0
    got = json.loads((rigid / "summary.json").read_text())["hetflow"]["workloads"][SLICE.name]
    assert got["avg_jct_s"] == pytest.approx(simulate_sia(load_workload(SLICE), profiles, "hetflow",
                                                          round_s=360).summary()["avg_jct_s"])


@pytest.mark.parametrize("extra", [
    ["--cluster", "t4:24"],
    ["--window", "0:5"],
    ["--policies", "nope"],
    ["--throughputs", "/nonexistent/profiles"],
])
def test_cli_sia_bad_input_exits_2(tmp_path, extra) -> None:
    from hetflow.cli.main import main

    base = ["simulate", "--protocol", "sia", "--trace", str(SLICE), "--out", str(tmp_path / "o")]
    if "--throughputs" not in extra:
        base += ["--throughputs", str(FIX / "profiles")]
    assert main(base + extra) == 2


def test_cli_sia_rejects_a_file_that_is_not_a_workload(tmp_path) -> None:
    from hetflow.cli.main import main

    bad = tmp_path / "w.csv"
    bad.write_text("a,b\n1,2\n")
    assert main(["simulate", "--protocol", "sia", "--trace", str(bad), "--throughputs", str(FIX / "profiles"),
                 "--out", str(tmp_path / "o")]) == 2
    big = tmp_path / "big.csv"
    big.write_text("name,time,application,num_replicas,batch_size\nbert-0,0,bert,64,384\n")
    assert main(["simulate", "--protocol", "sia", "--trace", str(big), "--throughputs", str(FIX / "profiles"),
                 "--job-kind", "rigid", "--out", str(tmp_path / "o")]) == 2  # a 64-GPU gang fits no type
    cat = tmp_path / "cat.csv"
    cat.write_text("name,time,application,num_replicas,batch_size,category\nbert-0,0,bert,4,384,elastic\n")
    assert main(["simulate", "--protocol", "sia", "--trace", str(cat), "--throughputs", str(FIX / "profiles"),
                 "--out", str(tmp_path / "o")]) == 2
    # --job-kind is Sia's
    assert main(["simulate", "--protocol", "gavel", "--trace", str(SLICE), "--job-kind", "rigid",
                 "--out", str(tmp_path / "o")]) == 2


def test_the_reference_results_file_names_its_source() -> None:
    from hetflow.cli.simulate_protocols import load_sia_reference

    ref = load_sia_reference()
    assert "aaf7a0de7b6cb5eab06ea020467ede5d2fd18e70" in json.dumps(ref["about"])
    for trace in ("philly", "saturn"):
        runs = ref["results"][trace]
        assert runs and all(r["gavel"]["avg_jct_s"] > 0 for r in runs.values())


def test_an_adaptive_job_asks_for_its_fair_share_at_a_size_it_can_run(profiles, specs) -> None:
    from hetflow.sim.live_sia import declared_size

    sim = SiaSimulator(specs, profiles, ReplayPolicy({}), round_s=60, default_kind="adaptive")
    job = sim.jobs[0]
    assert declared_size(sim, job, 1) == 24  # alone: as many as the largest type holds
    assert declared_size(sim, job, 3) == 16  # 64 GPUs over 3 jobs, rounded down to a power of two
    assert declared_size(sim, job, 100) == 1
    rigid = SiaJob(specs[0], profiles, "rigid")
    assert declared_size(sim, rigid, 3) == specs[0].num_replicas
    # where no type runs it at its share (here: nothing above 4 GPUs), it asks for less
    real = job.remaining_s
    job.remaining_s = lambda t, p: real(t, p) if sum(p) <= 4 else math.inf
    assert declared_size(sim, job, 1) == 4


def test_cli_finds_the_profiles_beside_a_linked_workloads_folder(tmp_path) -> None:
    """``--trace DIR/workloads/...`` finds ``DIR/profiles`` even when ``workloads`` is a link to a
    folder elsewhere (the path as given is searched before the links are followed)."""
    import shutil

    from hetflow.cli.main import main

    elsewhere = tmp_path / "elsewhere" / "w"
    elsewhere.mkdir(parents=True)
    shutil.copy(SLICE, elsewhere / SLICE.name)
    (tmp_path / "sia").mkdir()
    (tmp_path / "sia" / "workloads").symlink_to(elsewhere)
    (tmp_path / "sia" / "profiles").symlink_to(FIX / "profiles")
    args = ["simulate", "--protocol", "sia", "--trace", str(tmp_path / "sia" / "workloads" / SLICE.name),
            "--policies", "gavel", "--out", str(tmp_path / "o")]
    assert main(args) == 0
    assert json.loads((tmp_path / "o" / "inputs.json").read_text())["profiles"] == str(tmp_path / "sia" / "profiles")
