"""Fault benchmark on real hosts (network namespaces, tests/hosts/netns.py): how long hetflow
takes to recover from a lost worker host and from a head restart, and what is lost.

    .venv/bin/python benchmarks/faults.py          # root; about 3-4 min on 2 cores

1. **Worker host lost**: built-in training (two data-parallel CPU ranks on one worker host,
   checkpoint every 40 steps, ``max_failures 2``) runs from a driver on the head host; at step
   100 every process of the ranks' host is SIGKILLed at once. ``node_loss_recovery_s`` = kill
   -> the first step of the resumed attempt reaching the driver (Ray's node-death detection
   with the hosts' health-check settings, a new placement group on the other host, process
   start, checkpoint load). ``steps_lost`` = steps of the run with no loss in the final
   result (goal 0); a step recorded twice would count in ``steps_twice``.
2. **Head restart** with Ray's GCS fault tolerance on Debian's ``redis-server`` (the head
   started by ``hetflow node start --gcs-redis``): a training job and a sleeping job run on the
   worker hosts under the controller, a third waits in the queue; the head host loses every
   process and is started again. ``head_restart_s`` = kill -> ``hetflow status`` (run on a
   worker host) answering with every job's record; the run checks every job then ends
   SUCCEEDED and the training job's checkpoint holds each step once (``head_steps_lost``).
3. **Replica host lost under load**: ``hetflow serve`` with two replicas, one per worker host,
   its front door on the head; ``hey`` sends requests for 12 s and a replica host loses every
   process 4 s in. ``requests_lost`` = requests not answered 200 (goal 0: the front door
   retries a request whose replica connection broke); the dead replica is replaced once the
   host rejoins.

There is no baseline run beside these: plain Ray Train's own recovery differs in what it
resumes from (the user's checkpoint callback), and without GCS fault tolerance a head loss
loses the cluster. Last line: ``RESULT node_loss_recovery_s=.. head_restart_s=.. steps_lost=..
...`` (goals: recovery and restart < 60 s, nothing lost).
"""

from __future__ import annotations

import ray_home  # noqa: F401 - first: Ray's temp folder is this run's own (ray_home.py)

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.hosts.netns import HostCluster, available  # noqa: E402


def node_loss(steps: int) -> dict[str, float]:
    from tests.hosts.test_node_loss import DRIVER, _live_groups, _train_config, _train_host

    with HostCluster(workers=2, worker_cpus=2) as hosts, tempfile.TemporaryDirectory() as tmp:
        code = DRIVER.replace("{CONFIG!r}", repr(_train_config(hosts, Path(tmp), steps)))
        proc = hosts.popen(hosts.head, [sys.executable, "-c", f"ADDRESS = {hosts.address!r}\n" + code],
                           cwd=tmp)
        lines, killed_at, resumed_at = [], None, None
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            found = re.match(r"STEP (\d+) attempt (\d+)", line)
            if not found:
                continue
            if killed_at is None and int(found.group(1)) >= 100:
                hosts.kill_host(_train_host(hosts))
                killed_at = time.monotonic()
            elif killed_at is not None and resumed_at is None and int(found.group(2)) > 0:
                resumed_at = time.monotonic()
        if proc.wait(timeout=120) != 0:
            raise SystemExit("the training run failed:\n" + "".join(lines[-40:]))
        result = json.loads(next(l for l in lines if l.startswith("RESULT_JSON "))[12:])
        done = result["steps"]
        groups = _live_groups(hosts)
    if killed_at is None or resumed_at is None:
        raise SystemExit("no resumed attempt was seen:\n" + "".join(lines[-40:]))
    return {"node_loss_recovery_s": resumed_at - killed_at,
            "steps_lost": steps - len(set(done)), "steps_twice": len(done) - len(set(done)),
            "groups_left": groups}


def head_restart(steps: int) -> dict[str, float]:
    import yaml

    from tests.hosts.test_head_restart import SLEEP_JOB, _jobs, _submit, _wait
    from hetflow.workloads.train.checkpoint import latest_checkpoint

    ended = {"SUCCEEDED", "FAILED", "CANCELLED"}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        jobs = {
            "train": {"name": "train", "kind": "train", "preemptible": True,
                      "train": {"name": "bench-head", "model": {"kind": "mlp", "hidden": [256, 256]},
                                "train": {"steps": steps, "batch_size": 256, "log_every": 10},
                                "checkpoint": {"dir": str(tmp / "ckpt"), "interval": 40},
                                "resources": {"devices": "cpu", "cpus_per_rank": 1}}},
            "sleeper": {"name": "sleeper", "kind": "python", "cpus": 2, "devices": {"count": 0}, "work": {"seconds": 45},
                        "python": {"script": str(SLEEP_JOB), "args": ["45"]}},
            "queued": {"name": "queued", "kind": "python", "cpus": 2, "devices": {"count": 0}, "work": {"seconds": 2},
                       "python": {"script": str(SLEEP_JOB), "args": ["2"]}},
        }
        for key, data in jobs.items():
            (tmp / f"{key}.yaml").write_text(yaml.safe_dump(data))
        with HostCluster(workers=2, worker_cpus=2, gcs_redis=True) as hosts:
            client = hosts.worker_hosts[0]
            ids = {k: _submit(hosts, client, tmp / f"{k}.yaml") for k in ("train", "sleeper")}
            _wait(lambda: (j := _jobs(hosts, client)) and all(j[i]["status"] == "RUNNING"
                                                               for i in ids.values()), 120, "jobs to run")
            ids["queued"] = _submit(hosts, client, tmp / "queued.yaml")
            _wait(lambda: ((_jobs(hosts, client) or {}).get(ids["train"], {}).get("progress_step")
                           or 0) >= 60, 120, "step 60")
            started = time.monotonic()
            hosts.restart_head()
            after = _wait(lambda: _jobs(hosts, client, timeout=20), 90, "the controller")
            restart_s = time.monotonic() - started
            kept = sum(i in after for i in ids.values())
            final = _wait(lambda: (j := _jobs(hosts, client)) and all(j[i]["status"] in ended
                                                                      for i in ids.values()) and j,
                          400, "every job to end")
            succeeded = sum(final[i]["status"] == "SUCCEEDED" for i in ids.values())
        ckpt = latest_checkpoint(tmp / "ckpt")
        recorded = {int(k) for k in ckpt.meta["losses"]} if ckpt else set()
    return {"head_restart_s": restart_s, "records_kept": kept, "jobs_succeeded": succeeded,
            "jobs": len(ids), "head_steps_lost": steps - len(recorded & set(range(1, steps + 1)))}


def serving_loss() -> dict[str, float]:
    from tests.hosts.test_serving_host_loss import lose_a_replica_host, serve_env

    with HostCluster(workers=2, worker_cpus=2, env=serve_env()) as hosts, \
            tempfile.TemporaryDirectory() as tmp:
        return lose_a_replica_host(hosts, Path(tmp))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=600, help="training steps per run")
    args = parser.parse_args()
    why = available()
    if why:
        print(f"faults benchmark: no namespace hosts here: {why}", file=sys.stderr)
        return 2
    loss = node_loss(args.steps)
    print(f"worker host lost: first resumed step after {loss['node_loss_recovery_s']:.1f} s; "
          f"steps lost {loss['steps_lost']}, recorded twice {loss['steps_twice']}, placement "
          f"groups left {loss['groups_left']}", flush=True)
    head = head_restart(max(args.steps, 1500))
    print(f"head restart (GCS on Redis): controller answering after {head['head_restart_s']:.1f} s; "
          f"records kept {head['records_kept']}/{head['jobs']}, jobs succeeded "
          f"{head['jobs_succeeded']}/{head['jobs']}, training steps lost {head['head_steps_lost']}",
          flush=True)
    serving = serving_loss()
    print(f"serving host lost under load (hey, 8 connections): {serving['requests_ok']} answered, "
          f"{serving['requests_lost']} failed; replicas {serving['replicas_before']} -> "
          f"{serving['replicas_after']} after the host rejoined "
          f"({serving['replaced_after_rejoin_s']:.1f} s)", flush=True)
    print(f"RESULT node_loss_recovery_s={loss['node_loss_recovery_s']:.1f} "
          f"head_restart_s={head['head_restart_s']:.1f} requests_lost={serving['requests_lost']} "
          f"steps_lost={loss['steps_lost']} "
          f"steps_twice={loss['steps_twice']} head_jobs_lost={head['jobs'] - head['jobs_succeeded']} "
          f"head_steps_lost={head['head_steps_lost']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
