"""One policy everywhere: under Gavel's protocol ``hetflow`` is the class the live controller
and hetflow's own engine run (through an adapter), and one scenario gets the same decision from
each.

The scenario makes the matching step visible: two fast and two slow devices, two short jobs
that run nearly as fast on the slow type and two long ones that crawl there. Shortest-first
alone would give the short jobs the fast devices; hetflow's assignment program gives the fast
devices to the long jobs that gain 10x from them and runs the short ones on the slow type.
"""

from __future__ import annotations

from hetflow.scheduling.policies.capacity import ClusterModel, FreeCapacity
from hetflow.scheduling.policies.registry import make_policy
from hetflow.scheduling.policies.rounds import DemandMix, build_round, check_decision
from hetflow.sim.cluster import parse_shorthand
from hetflow.sim.engine import SimClock, SimJob
from hetflow.sim.gavel import GavelJob, GavelSimulator, make_gavel_policy
from hetflow.sim.traces import Job

MODEL = ClusterModel.from_snapshot(parse_shorthand("1 * 2x V100 + 1 * 2x K80"))
FAST, SLOW = MODEL.device_types  # ("V100-16GB", "K80")
# name: (steps, steps/s on the fast type, on the slow type)
SCENARIO = {"short-0": (100, 1.0, 0.9), "short-1": (100, 1.0, 0.9),
            "long-0": (400, 1.0, 0.1), "long-1": (400, 1.0, 0.1)}
EXPECTED = {"short-0": SLOW, "short-1": SLOW, "long-0": FAST, "long-1": FAST}


def test_the_gavel_protocol_runs_the_registry_class() -> None:
    adapter = make_gavel_policy("hetflow")
    assert type(adapter.policy) is type(make_policy("hetflow"))
    assert adapter.name == "hetflow"


def test_hetflows_engine_decides_the_scenario() -> None:
    clock = SimClock()
    jobs = [SimJob(i, Job(name, "scenario", 0.0, 1, steps), 0.0, {FAST: fast, SLOW: slow}, clock)
            for i, (name, (steps, fast, slow)) in enumerate(SCENARIO.items())]
    demand = DemandMix()
    for j in jobs:
        demand.add(j.request)
    inputs = build_round(0.0, True, MODEL, FreeCapacity(MODEL), {}, jobs, lambda j: j.idx, demand, 360.0, None)
    decision = make_policy("hetflow").schedule(inputs.view)
    check_decision(decision, inputs)
    assert {jid: a.device_type for jid, a in decision.items()} == EXPECTED


def test_gavels_protocol_decides_the_scenario_the_same_way() -> None:
    names = list(SCENARIO)
    jobs = [GavelJob(i, "scenario", 1, steps, 0.0, {FAST: fast, SLOW: slow})
            for i, (steps, fast, slow) in enumerate(SCENARIO.values())]
    run = GavelSimulator(jobs, make_gavel_policy("hetflow"), {FAST: 2, SLOW: 2}).run()
    assert all(run.completion_s[j.job_id] is not None for j in jobs)
    # the short jobs finish within the first round on the slow type; the long ones never leave
    # the fast type (so the first round's decision was the engine's)
    on = {names[j]: {t for t, s in times.items() if s > 0} for j, times in run.type_time.items()}
    assert on == {name: {t} for name, t in EXPECTED.items()}


def test_sias_protocol_decides_like_the_live_scheduler() -> None:
    """One scenario on Sia's protocol (its cluster, its job model and profiles: two BERT and two
    DeepSpeech2 jobs at once, of 4 and 8 GPUs) and on the live scheduler's own path (hetflow's
    engine jobs with the same remaining work, speeds per GPU type, sizes and restart costs, on
    the same pools): the registry's ``hetflow`` gives every job the same GPU type and count."""
    from pathlib import Path

    from hetflow.sim.live_sia import LiveSiaRounds, sia_cluster_model
    from hetflow.sim.sia import SiaJobSpec, SiaProfiles, SiaSimulator

    seen: dict = {}

    class Recording(LiveSiaRounds):
        def decide_on(self, inputs):
            decision = super().decide_on(inputs)
            if not seen:
                seen["jobs"], seen["decision"] = list(inputs.view.jobs), dict(decision)
            return decision

    profiles = SiaProfiles(Path(__file__).resolve().parents[1] / "fixtures" / "sia" / "profiles")
    specs = [SiaJobSpec("bert-a", 0.0, "bert", 8, 384), SiaJobSpec("bert-b", 0.0, "bert", 4, 384),
             SiaJobSpec("ds2-a", 0.0, "deepspeech2", 8, 640), SiaJobSpec("ds2-b", 0.0, "deepspeech2", 4, 320)]
    sim = SiaSimulator(specs, profiles, Recording(make_policy("hetflow")), round_s=60)
    sim.run()
    protocol = {jid: (a.device_type, len(a.slots)) for jid, a in seen["decision"].items()}
    assert len({t for t, _n in protocol.values()}) >= 2, protocol  # the types matter here

    model, _where = sia_cluster_model(sim)
    clock = SimClock()
    jobs = []
    for i, info in enumerate(sorted(seen["jobs"], key=lambda j: (j.arrival_s, j.index))):
        job = Job(info.job_id, info.job_type, info.arrival_s, info.num_gpus, info.remaining_work)
        sim_job = SimJob(i, job, info.restore_s, dict(info.ideal_rates), clock)
        sim_job.needs_restore = True  # Sia charges the restart on a job's first start too
        jobs.append(sim_job)
    demand = DemandMix()
    for j in jobs:
        demand.add(j.request)
    inputs = build_round(60.0, True, model, FreeCapacity(model), {}, jobs, lambda j: (j.arrival_s, j.idx),
                         demand, 60.0, None)
    decision = make_policy("hetflow").schedule(inputs.view)
    check_decision(decision, inputs)
    live = {jid: (a.device_type, len(a.slots)) for jid, a in decision.items()}
    assert live == protocol
