"""Controller benchmark: how long one live scheduling decision takes on a 1,024-GPU cluster,
against the policy's own share of it.

    .venv/bin/python benchmarks/controller.py               # about 1-2 minutes on 2 cores
    .venv/bin/python benchmarks/controller.py --queued 500 --decisions 30

The cluster controller (``hetflow submit``) decides with
:class:`hetflow.control.scheduler.LiveScheduler`: job records and a live snapshot in, stops,
launches and a reason per job out. The decision is pure (no Ray), so it is measured here on its
own, as the controller's loop runs it, without a cluster:

* the cluster: 32 nodes each of 8x H100, 8x MI300X, 8x A100-80GB and 8x L40S (1,024 GPUs,
  catalog topologies), as ``benchmarks/scheduling.py``'s mixed-1024;
* the state: jobs of 1, 2, 4 and 8 devices (some pinned to a vendor or a type) are submitted to
  the empty cluster and the policy's first decision starts as many as fit: those become
  running records holding their devices; then ``--queued`` more jobs wait;
* each decision is a round boundary (``boundary=True``, every lease expired: the most work a
  decision does - preemptive policies may move any running job).

Side by side for each policy, the same decisions: **decide** = the whole of
``LiveScheduler.decide`` (cluster model from the snapshot, the policy's view, the policy, the
checks, the diff, a reason for every job); **policy** = the policy's ``schedule(view)`` alone
(what the simulator also pays). ``decide_over_policy`` is the controller's overhead.

Last line: ``RESULT decide_p99_ms=<x> decide_over_policy=<x> devices=1024 jobs=<running+queued>``
for the default policy (``hetflow``).
"""

from __future__ import annotations

import ray_home  # noqa: F401 - first: Ray's temp folder is this run's own (ray_home.py)

import argparse
import random
import statistics
import sys
import time
from typing import Any

from hetflow.control.jobspec import JobSpec, job_from_dict
from hetflow.control.scheduler import ControllerSettings, LiveScheduler
from hetflow.control.state import JobRecord, Status
from hetflow.scheduling.policies.registry import DEFAULT_POLICY, make_policy
from hetflow.sim.cluster import synthetic_cluster

SIZES = (1, 1, 1, 2, 2, 4, 8)
PINS: tuple[dict[str, Any], ...] = ({}, {}, {}, {"vendor": "amd"}, {"vendor": "nvidia"},
                                    {"model": "H100"}, {"model": "MI300X"})


class TimedPolicy:
    """The policy, with the time of each ``schedule`` call kept."""

    def __init__(self, policy: Any) -> None:
        self.policy, self.name, self.preemptive = policy, policy.name, policy.preemptive
        self.times: list[float] = []

    def schedule(self, view: Any) -> Any:
        t0 = time.perf_counter()
        out = self.policy.schedule(view)
        self.times.append(time.perf_counter() - t0)
        return out


def job(rng: random.Random, i: int) -> JobSpec:
    devices = {"count": rng.choice(SIZES), **rng.choice(PINS)}
    return job_from_dict({"name": f"j{i}", "kind": "python", "python": {"script": "/bin/true"},
                          "devices": devices, "work": {"seconds": rng.uniform(600, 36_000)}})


def state(policy: str, running_target: int, queued: int, seed: int) -> tuple[Any, list[JobRecord]]:
    """The snapshot and the records: running jobs holding devices, then ``queued`` waiting."""
    snapshot = synthetic_cluster([(32, "8x H100"), (32, "8x MI300X"), (32, "8x A100-80GB"),
                                  (32, "8x L40S")])
    rng = random.Random(seed)
    first = [JobRecord(f"j{i}-{i}", i, job(rng, i).model_dump(mode="json"), 0.0)
             for i in range(running_target)]
    plan = LiveScheduler(ControllerSettings(policy=policy)).decide(first, snapshot, 0.0, False,
                                                                   force=True)
    started = {launch.job_id: launch.held for launch in plan.launches}
    records = []
    for r in first:
        if r.job_id in started:
            r.status, r.held, r.token, r.seg_start = Status.RUNNING, started[r.job_id], 1, 0.0
            records.append(r)
    n = len(records)
    for i in range(running_target, running_target + queued):
        records.append(JobRecord(f"j{i}-{i}", i, job(rng, i).model_dump(mode="json"), float(i)))
    return snapshot, records if n else []


def measure(policy_name: str, decisions: int, queued: int, seed: int) -> dict[str, float]:
    snapshot, records = state(policy_name, running_target=400, queued=queued, seed=seed)
    devices = sum(len(n.accelerators) for n in snapshot.nodes)
    held = sum(len(r.held.slots) for r in records if r.held is not None)
    timed = TimedPolicy(make_policy(policy_name))
    scheduler = LiveScheduler(ControllerSettings(policy=policy_name, round_s=360.0), policy=timed)
    whole = []
    for k in range(decisions):
        now = 360.0 * (k + 1)
        t0 = time.perf_counter()
        plan = scheduler.decide(records, snapshot, now, boundary=True, force=True)
        whole.append(time.perf_counter() - t0)
        assert plan.decided, "the policy was not asked"
    pol = timed.times[-decisions:]
    running = sum(r.status == Status.RUNNING for r in records)
    out = {
        "devices": devices, "held": held, "running": running, "queued": len(records) - running,
        "decide_p50": statistics.median(whole) * 1000,
        "decide_p99": sorted(whole)[min(len(whole) - 1, int(0.99 * len(whole)))] * 1000,
        "policy_p50": statistics.median(pol) * 1000,
    }
    out["ratio"] = out["decide_p50"] / out["policy_p50"]
    print(f"{policy_name:17s} {devices} GPUs, {held} held by {running} running jobs, "
          f"{out['queued']} queued: decide p50 {out['decide_p50']:7.1f} ms  p99 "
          f"{out['decide_p99']:7.1f} ms; policy alone p50 {out['policy_p50']:7.1f} ms; "
          f"decide / policy {out['ratio']:.2f}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queued", type=int, default=300, help="waiting jobs (default 300)")
    parser.add_argument("--decisions", type=int, default=20, help="decisions per policy")
    parser.add_argument("--policies", default="fifo,srtf,hetflow",
                        help="comma-separated policies (default fifo,srtf,hetflow)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.policies.split(",") if n.strip()]
    results = {name: measure(name, args.decisions, args.queued, args.seed) for name in names}
    main_policy = DEFAULT_POLICY if DEFAULT_POLICY in results else names[-1]
    r = results[main_policy]
    print(f"RESULT decide_p99_ms={r['decide_p99']:.1f} decide_over_policy={r['ratio']:.2f} "
          f"devices={r['devices']} jobs={r['running'] + r['queued']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
