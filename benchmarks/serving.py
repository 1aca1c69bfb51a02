"""Serving benchmark: dynamic batching on vs off, and what the HTTP path costs.

    .venv/bin/python benchmarks/serving.py            # about 4-6 minutes on 2 cores
    .venv/bin/python benchmarks/serving.py --quick    # shorter steps, noisier
    python benchmarks/serving.py --device gpu --address auto   # replicas on a hetflow GPU node

One local Ray cluster, one Serve application with the digits MLP (hidden [128, 128], the
network of examples/serve_digits.yaml; its weights do not change the cost, so they are the
untrained initial ones) deployed twice on one CPU replica each: ``batched`` (the default
batching: up to 32 rows, 2 ms wait) and ``unbatched`` (batching off); and the same pair for a
wide MLP [4096, 4096, 4096] (batches of up to 16 rows), whose forward pass costs about as much
as Serve's own per-request work. In the same run:

1. a rate sweep per model with the open-loop load generator (Poisson arrivals, bounded count
   and time, loopback): the highest offered rate whose P99 stays at or under 80 ms with no
   errors; ``batched_over_unbatched`` in the RESULT line is the digits pair's ratio (the
   served example's model; the wide pair's ratio is printed on the line before);
2. single-request latency, one request at a time: the model called directly in this process,
   through a Serve handle (no HTTP), and over HTTP (proxy -> gateway -> replica);
   ``http_overhead_ms`` = HTTP P50 - direct P50.

Last line: ``RESULT batched_over_unbatched=<x> best_rate_p99_80ms=<x> http_overhead_ms=<x>``
(best_rate = the batched model's rate). The machine's load average is printed: on a shared
2-core host the tails move with whatever else runs.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

P99_TARGET_MS = 80.0
HIDDEN = [128, 128]
WIDE = [4096, 4096, 4096]  # 34M parameters: 6 ms per forward pass at 1 row, 20 ms at 16, 1 core


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _p50(samples_ms: list[float]) -> float:
    return statistics.median(samples_ms)


def _timed(fn, count: int) -> list[float]:
    out = []
    for _ in range(count):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1000.0)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter sweep steps")
    parser.add_argument("--cpus", type=int, default=4, help="logical CPUs of the local Ray")
    parser.add_argument("--digits-only", action="store_true",
                        help="skip the wide model (half the time)")
    parser.add_argument("--device", choices=["cpu", "gpu"], default="cpu",
                        help="where the replicas compute (gpu: they share the node's device by "
                             "memory, as hetflow's planner places them)")
    parser.add_argument("--address", help="join this Ray cluster (e.g. `auto` after "
                                          "`hetflow node start`) instead of a local one")
    args = parser.parse_args(argv)
    step_s, min_requests = (3.0, 60) if args.quick else (5.0, 150)

    import numpy as np
    import ray
    import requests
    from ray import serve

    from hetflow.workloads.serve.app import deploy
    from hetflow.workloads.serve.config import serve_config_from_dict
    from hetflow.workloads.serve.inference import ReplicaSpec, build_runner
    from hetflow.workloads.serve.loadgen import digits_bodies, sweep

    if args.address:
        ray.init(address=args.address, log_to_driver=False)
    else:
        ray.init(address="local", num_cpus=args.cpus, include_dashboard=False,
                 log_to_driver=False)
    train = {"model": {"kind": "mlp", "hidden": HIDDEN}}
    model = lambda name, batching, hidden=HIDDEN, rows=32: {  # noqa: E731
        "name": name, "weights": "random", "train": {"model": {"kind": "mlp", "hidden": hidden}},
        "device": args.device, "replicas": 1,
        "batching": {"enabled": batching, "max_batch_size": rows}}
    pairs = [("unbatched", "batched")]
    models = [model("batched", True), model("unbatched", False)]
    if not args.digits_only:
        # A model whose forward pass costs about as much as Serve's per-request work.
        models += [model("wide-batched", True, WIDE, 16), model("wide-unbatched", False, WIDE)]
        pairs.append(("wide-unbatched", "wide-batched"))
    config = serve_config_from_dict({
        "name": "bench", "http": {"port": _free_port()}, "models": models})
    served = deploy(config)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"model: digits MLP hidden {HIDDEN}, 1 {args.device.upper()} replica each; batched: up to "
          f"{config.models[0].batching.max_batch_size} rows, "
          f"{config.models[0].batching.batch_wait_timeout_s * 1000:g} ms wait")
    for name, plan in served.plans.items():
        infos = served.replica_infos(name, calls=2)
        seen = sorted({f"{i['device']} CUDA_VISIBLE_DEVICES={i['visible']['CUDA_VISIBLE_DEVICES']}"
                       for i in infos})
        print(f"  {name}: {'; '.join(g.describe() for g in plan.groups)} -> {', '.join(seen)}")
    bodies = digits_bodies(rows=1, count=64)
    try:
        # --- 2. single-request latency (first: the sweeps leave queues and caches warm) -----
        runner = build_runner(ReplicaSpec("direct", {"model": train["model"]}, None, "fp32",
                                            args.device))
        row = np.asarray([[0.5] * 64], dtype=np.float32)
        direct = _timed(lambda: runner.predict(row), 300)
        print(f"direct calls compute on {runner.device}")
        # On hetflow devices a model is one deployment per device it uses: take the first.
        handle = serve.get_deployment_handle(served.plans["unbatched"].groups[0].deployment,
                                             "bench")
        _timed(lambda: handle.predict.remote(row).result(), 20)
        via_handle = _timed(lambda: handle.predict.remote(row).result(), 200)
        session = requests.Session()
        url = served.url + "/v1/models/unbatched/predict"
        post = lambda: session.post(url, data=bodies[0],  # noqa: E731
                                    headers={"content-type": "application/json"}).raise_for_status()
        _timed(post, 20)
        via_http = _timed(post, 200)
        batched_url = served.url + "/v1/models/batched/predict"
        post_b = lambda: session.post(batched_url, data=bodies[0],  # noqa: E731
                                      headers={"content-type": "application/json"}).raise_for_status()
        _timed(post_b, 20)
        via_http_batched = _timed(post_b, 200)
        print("single requests, one at a time (P50 / P90 ms):")
        for label, xs in (("model called directly", direct), ("Serve handle (no HTTP)", via_handle),
                          ("HTTP, batching off", via_http), ("HTTP, batching on", via_http_batched)):
            print(f"  {label:24s} {_p50(xs):7.2f} / {np.percentile(xs, 90):7.2f}")
        overhead = _p50(via_http) - _p50(direct)

        # --- 1. rate sweeps -----------------------------------------------------------------
        best = {}
        for name in [n for pair in pairs for n in pair]:
            print(f"sweep {name} (P99 target {P99_TARGET_MS:g} ms):")
            result = sweep(served.url + f"/v1/models/{name}/predict", bodies,
                           p99_target_ms=P99_TARGET_MS, start_rate=15.0, factor=1.4,
                           max_rate=1000.0, refine=2, duration_s=step_s, max_requests=5000,
                           min_requests=min_requests, timeout_s=10.0,
                           on_step=lambda r: print("  " + r.line(), flush=True))
            best[name] = result.best_rate or 0.0
            print(f"  -> highest rate with P99 <= {P99_TARGET_MS:g} ms: {best[name]:.1f} req/s")
    finally:
        served.shutdown()
        serve.shutdown()
        ray.shutdown()
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if not args.digits_only:
        wide = (best["wide-batched"] / best["wide-unbatched"] if best["wide-unbatched"]
                else float("inf"))
        print(f"wide MLP {WIDE}: batched {best['wide-batched']:.1f} req/s, unbatched "
              f"{best['wide-unbatched']:.1f} req/s, ratio {wide:.2f}")
    print(f"digits MLP {HIDDEN}: batched {best['batched']:.1f} req/s, unbatched "
          f"{best['unbatched']:.1f} req/s")
    ratio = best["batched"] / best["unbatched"] if best["unbatched"] else float("inf")
    print(f"RESULT batched_over_unbatched={ratio:.2f} best_rate_p99_80ms={best['batched']:.1f} "
          f"http_overhead_ms={overhead:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
