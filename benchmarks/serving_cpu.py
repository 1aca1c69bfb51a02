"""Where a served request's CPU goes: CPU milliseconds per request in each Ray Serve process,
batching on and off, at one fixed request rate.

    .venv/bin/python benchmarks/serving_cpu.py                  # about 1 minute, Linux (/proc)
    .venv/bin/python benchmarks/serving_cpu.py --rate 60 --requests 600

One local Ray, one application with the digits MLP (hidden [128, 128], untrained weights: they
do not change the cost) deployed twice on one CPU replica each, ``batched`` (up to 32 rows,
2 ms wait) and ``unbatched``; both behind hetflow's gateway (proxy -> gateway -> model replica).
For each, alternating and twice, an open-loop Poisson load at ``--rate`` (loopback, bounded)
while the CPU time (utime + stime from ``/proc/<pid>/stat``) of every process the cluster's
raylet started is read before and after; the difference over the requests answered is the
CPU cost per request of that process. The load generator's own CPU is counted apart.

This explains ``benchmarks/serving.py``'s batched/unbatched ratio for a small model: batching
can only save what is paid per call to the model replica; the proxy's and the gateway's work
is paid per request whatever the batching. Last line:
``RESULT cpu_ms_per_request_unbatched=<x> cpu_ms_per_request_batched=<x>
model_replica_share_unbatched=<x>`` (Serve processes only; medians of the two rounds).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

TICK = os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def _cluster_processes(session: str) -> dict[str, list[int]]:
    """The raylet of ``session`` and its children, by process title (``ray::ProxyActor``...)."""
    info: dict[int, tuple[str, int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline") as f:
                cmd = f.read().replace("\0", " ")
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        info[int(d)] = (cmd, ppid)
    raylets = [p for p, (c, _) in info.items() if "raylet/raylet" in c and session in c]
    if len(raylets) != 1:
        raise SystemExit(f"found {len(raylets)} raylets of session {session}; expected one")
    out: dict[str, list[int]] = {"raylet": raylets}
    for pid, (cmd, ppid) in info.items():
        if ppid == raylets[0]:
            title = cmd.split()[0] if cmd.startswith("ray::") else "other"
            out.setdefault(title.removeprefix("ray::").replace("ServeReplica:bench:bench.", ""),
                           []).append(pid)
    return out


def _snapshot(procs: dict[str, list[int]]) -> dict[str, float]:
    out = {}
    for name, pids in procs.items():
        total = 0.0
        for pid in pids:
            try:
                total += _cpu_s(pid)
            except OSError:
                pass  # gone (a worker that exited): its time is lost to both readings
        out[name] = total
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=60.0, help="requests per second")
    parser.add_argument("--requests", type=int, default=600, help="requests per round")
    args = parser.parse_args(argv)
    if not sys.platform.startswith("linux"):
        raise SystemExit("this benchmark reads /proc: Linux only")

    import ray
    from ray import serve

    from hetflow.workloads.serve.app import deploy
    from hetflow.workloads.serve.config import serve_config_from_dict
    from hetflow.workloads.serve.loadgen import digits_bodies, run_load

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    model = lambda name, batching: {  # noqa: E731
        "name": name, "weights": "random", "device": "cpu", "replicas": 1,
        "train": {"model": {"kind": "mlp", "hidden": [128, 128]}},
        "batching": {"enabled": batching, "max_batch_size": 32}}
    config = serve_config_from_dict({"name": "bench", "http": {"port": _free_port()},
                                     "models": [model("batched", True), model("unbatched", False)]})
    served = deploy(config)
    bodies = digits_bodies(rows=1, count=64)
    per_request: dict[str, list[dict[str, float]]] = {"unbatched": [], "batched": []}
    loadgen: dict[str, list[float]] = {"unbatched": [], "batched": []}
    try:
        time.sleep(2)  # replicas settle
        procs = _cluster_processes(ray._private.worker._global_node.session_name)
        for name in ["unbatched", "batched"] * 2:
            url = f"{served.url}/v1/models/{name}/predict"
            run_load(url, bodies, args.rate / 2, max_requests=40, max_duration_s=3)  # warm
            before, mine = _snapshot(procs), sum(os.times()[:2])
            result = run_load(url, bodies, args.rate, max_requests=args.requests,
                              max_duration_s=args.requests / args.rate + 5)
            after, mine_after = _snapshot(procs), sum(os.times()[:2])
            if result.ok == 0:
                raise SystemExit(f"{name}: no request answered ({result.errors})")
            cost = {k: (after[k] - before[k]) * 1000 / result.ok for k in before}
            per_request[name].append(cost)
            loadgen[name].append((mine_after - mine) * 1000 / result.ok)
            print(f"{name:9s} {result.ok}/{result.sent} ok  p50 {result.p50_ms:5.1f}  p99 "
                  f"{result.p99_ms:6.1f} ms  CPU ms per request: "
                  + "  ".join(f"{k} {v:.2f}" for k, v in sorted(cost.items()) if v >= 0.05)
                  + f"  (load generator {loadgen[name][-1]:.2f})", flush=True)
    finally:
        served.shutdown()
        serve.shutdown()
        ray.shutdown()

    def median_of(name: str, key: str | None = None) -> float:
        rounds = per_request[name]
        return statistics.median(sum(r.values()) if key is None else r.get(key, 0.0)
                                 for r in rounds)

    total_u, total_b = median_of("unbatched"), median_of("batched")
    model_u = median_of("unbatched", "unbatched")
    print("median CPU ms per request (Serve processes):")
    for key in sorted(per_request["unbatched"][0]):
        print(f"  {key:18s} unbatched {median_of('unbatched', key):6.2f}   batched "
              f"{median_of('batched', key):6.2f}")
    print(f"  {'total':18s} unbatched {total_u:6.2f}   batched {total_b:6.2f}; the model replica's "
          f"share unbatched {model_u / total_u:.0%}: the most batching can save at this rate")
    print(f"RESULT cpu_ms_per_request_unbatched={total_u:.2f} cpu_ms_per_request_batched="
          f"{total_b:.2f} model_replica_share_unbatched={model_u / total_u:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
