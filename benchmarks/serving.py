"""Serving benchmark: hetflow against plain Ray Serve (fastest mode and defaults), side by side.

    apt-get install -y hey                    # the external closed-loop client (Debian)
    .venv/bin/python benchmarks/serving.py            # about 6-8 minutes on 2 cores
    .venv/bin/python benchmarks/serving.py --quick    # 3 rounds of 3 s, a short sweep

Three servers, each in its own process with its own local Ray (2 CPUs) - Serve's mode is a
cluster-wide setting - all up at once, serving the same model (the digits MLP 64-128-128-10,
``@serve.batch`` of up to 32 rows with a 2 ms wait, 2 replicas x 0.5 CPU, one torch thread):

* ``hetflow``: ``hetflow serve``'s path (``deploy``): its front door (HAProxy) -> the model
  replica, which checks the input, batches, counts metrics; fallback and retries configured.
  URL ``/v1/models/digits/predict``.
* ``serve_fastest``: one plain ingress deployment, ``RAY_SERVE_ENABLE_HA_PROXY=1`` +
  ``RAY_SERVE_THROUGHPUT_OPTIMIZED=1`` (Serve's HAProxy in front of the replicas' own ports).
* ``serve_default``: the same deployment with Serve's defaults (the Python HTTP proxy).

The external client `hey` (closed loop: N workers, each sends the next request when the last
is answered) runs against the three in turn, round after round (interleaved, so a burst of
load from the rest of a shared machine hits all three alike), at 16 and at 1 concurrent;
each figure is the median over the rounds. Then hetflow's own open-loop sweep
(`hetflow bench serve --sweep`: Poisson arrivals, the highest rate with P99 <= 80 ms and no
errors) on the hetflow server, and the heavy-model batching figure: a wide MLP
[4096, 4096, 4096] (6 ms a forward pass at one row) served by hetflow batched (16 rows) and
unbatched, one replica each, req/s at 16 concurrent with `hey`.

Last line:
``RESULT hetflow_over_serve_fastest=<x> hetflow_rps=<x> serve_fastest_rps=<x>
serve_default_rps=<x> best_rate_p99_80ms=<x> batched_over_unbatched_heavy=<x>``
(req/s at 16 concurrent; the ratio is hetflow's over Serve's fastest).
"""

from __future__ import annotations

import ray_home  # noqa: F401 - first: Ray's temp folder is this run's own (ray_home.py)

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HIDDEN = [128, 128]
WIDE = [4096, 4096, 4096]
REPLICAS, CPUS_PER_REPLICA, CLUSTER_CPUS = 2, 0.5, 2
MAX_BATCH, WAIT_S = 32, 0.002
P99_TARGET_MS = 80.0
SERVED = None
SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))  # this checkout's hetflow, here and in every Ray worker (below)
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(SRC)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the servers (each in its own process: python benchmarks/serving.py --serve MODE) --------


def _serve_plain(port: int) -> str:
    import numpy as np
    import torch
    from ray import serve
    from starlette.requests import Request

    serve.start(http_options={"host": "127.0.0.1", "port": port}, proxy_location="HeadOnly")

    @serve.deployment(num_replicas=REPLICAS, ray_actor_options={"num_cpus": CPUS_PER_REPLICA},
                      max_ongoing_requests=2 * MAX_BATCH,
                      logging_config={"enable_access_log": False})
    class Plain:
        def __init__(self) -> None:
            from hetflow.workloads.train.models import build_model
            from hetflow.workloads.train.config import config_from_dict

            torch.set_num_threads(1)
            self.model = build_model(config_from_dict(
                {"model": {"kind": "mlp", "hidden": HIDDEN}})).eval()

        @serve.batch(max_batch_size=MAX_BATCH, batch_wait_timeout_s=WAIT_S)
        async def run(self, rows: list[np.ndarray]) -> list[dict]:
            with torch.inference_mode():
                out = self.model(torch.from_numpy(np.concatenate(rows))).argmax(-1).tolist()
            return [{"predictions": [label]} for label in out]

        async def __call__(self, request: Request) -> dict:
            body = await request.json()
            return await self.run(np.asarray(body["inputs"], dtype=np.float32))

    serve.run(Plain.bind(), name="plain", route_prefix="/")
    return f"http://127.0.0.1:{port}/"


def _serve_hetflow(port: int, heavy: bool) -> str:
    from hetflow.workloads.serve.app import deploy
    from hetflow.workloads.serve.config import serve_config_from_dict

    def model(name: str, hidden: list[int], **kw) -> dict:
        return {"name": name, "weights": "random", "devices": "cpu",
                "train": {"model": {"kind": "mlp", "hidden": hidden}}, **kw}

    if heavy:
        models = [model("wide-batched", WIDE, replicas=1, cpus_per_replica=1,
                        batching={"max_batch_size": 16, "batch_wait_timeout_s": WAIT_S}),
                  model("wide-unbatched", WIDE, replicas=1, cpus_per_replica=1,
                        batching={"enabled": False})]
    else:
        models = [model("digits", HIDDEN, replicas=REPLICAS, cpus_per_replica=CPUS_PER_REPLICA,
                        fallback="digits-small",
                        batching={"max_batch_size": MAX_BATCH, "batch_wait_timeout_s": WAIT_S}),
                  model("digits-small", [16], replicas=1, cpus_per_replica=0)]
    global SERVED  # keep the deployment (and its front door's handle) alive
    SERVED = deploy(serve_config_from_dict({"name": "bench", "http": {"port": port},
                                            "models": models}))
    return SERVED.url + "/v1/models/"


def serve_main(mode: str, port: int) -> int:
    """Start one server, print ``URL <url>``, serve until stdin closes."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    if mode == "serve_fastest":
        os.environ.update(RAY_SERVE_ENABLE_HA_PROXY="1", RAY_SERVE_THROUGHPUT_OPTIMIZED="1")
    elif mode.startswith("hetflow"):
        from hetflow.workloads.serve.front import FAST_ENV

        os.environ.update(FAST_ENV)
    import ray

    ray.init(address="local", num_cpus=CLUSTER_CPUS, include_dashboard=False,
             log_to_driver=False, configure_logging=False)
    url = _serve_plain(port) if mode.startswith("serve_") else \
        _serve_hetflow(port, heavy=mode == "hetflow_heavy")
    print(f"URL {url}", flush=True)
    sys.stdin.read()
    from ray import serve

    serve.shutdown()  # stops Serve's HAProxy too (killed with Ray, it would outlive it)
    ray.shutdown()
    os._exit(0)  # Serve handles leave native threads; see RAY-NOTES


# --- the driver ------------------------------------------------------------------------------


class Server:
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.log = tempfile.NamedTemporaryFile(prefix=f"bench-{mode}-", suffix=".log",
                                               delete=False)
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", mode, "--port", str(_free_port())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.url = ""

    def wait(self, timeout_s: float = 400) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if line.startswith("URL "):
                self.url = line.split()[1]
                return self.url
            if not line and self.proc.poll() is not None:
                break
        raise RuntimeError(f"{self.mode} did not start; see {self.log.name}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def hey(url: str, body: Path, concurrency: int, seconds: float) -> dict:
    """One closed-loop run of `hey`: req/s, p50, p99 (ms) and non-200 answers."""
    out = subprocess.run(
        ["hey", "-z", f"{seconds}s", "-c", str(concurrency), "-m", "POST",
         "-T", "application/json", "-D", str(body), url],
        capture_output=True, text=True, timeout=seconds + 120).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))

    def pct(p: str) -> float:
        m = re.search(rf"{p}% in ([\d.]+) secs", out)
        return float(m.group(1)) * 1000 if m else float("nan")

    codes = {int(c): int(n) for c, n in re.findall(r"\[(\d{3})\]\s+(\d+) responses", out)}
    errors = sum(n for c, n in codes.items() if c != 200)
    errors += sum(int(n) for n in re.findall(r"^\s+\[(\d+)\]\s+(?:Get|Post)", out, re.M))
    return {"rps": rps, "p50": pct(50), "p99": pct(99), "non200": errors,
            "ok": codes.get(200, 0)}


def _median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds of 3 s, short sweep")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 5, quick 3)")
    parser.add_argument("--seconds", type=float, help="seconds per hey run (default 6)")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        return serve_main(args.serve, args.port)
    if shutil.which("hey") is None:
        print("benchmarks/serving.py needs the `hey` HTTP load generator: apt-get install -y hey",
              file=sys.stderr)
        return 2
    rounds = args.rounds or (3 if args.quick else 5)
    seconds = args.seconds or (3.0 if args.quick else 6.0)

    from hetflow.workloads.serve.loadgen import digits_bodies, sweep

    work = Path(tempfile.mkdtemp(prefix="bench-serving-"))
    body = work / "digits.json"
    body.write_bytes(digits_bodies(rows=1, count=1)[0])
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"model: digits MLP 64-{'-'.join(map(str, HIDDEN))}-10, {REPLICAS} replicas x "
          f"{CPUS_PER_REPLICA} CPU, @serve.batch {MAX_BATCH} rows / {WAIT_S * 1000:g} ms, "
          f"each server its own Ray ({CLUSTER_CPUS} CPUs); client hey, {rounds} interleaved "
          f"rounds of {seconds:g} s per figure")
    modes = ["hetflow", "serve_fastest", "serve_default"]
    servers: dict[str, Server] = {}
    results: dict[str, dict[int, list[dict]]] = {m: {16: [], 1: []} for m in modes}
    try:
        urls = {}
        for m in modes:  # one at a time: three Rays starting at once overload 2 cores
            servers[m] = Server(m)
            urls[m] = servers[m].wait()
        urls["hetflow"] += "digits/predict"
        for m in modes:  # warm up: connections, replicas' first batches
            hey(urls[m], body, 16, 1.5)
        for r in range(rounds):
            order = modes[r % 3:] + modes[:r % 3]
            for concurrency in (16, 1):
                for m in order:
                    results[m][concurrency].append(hey(urls[m], body, concurrency, seconds))
            print(f"round {r + 1}: " + "  ".join(
                f"{m} {results[m][16][-1]['rps']:.0f}/s" for m in modes), flush=True)
        print(f"\n{'server':<15} {'16 conc req/s':>13} {'p50 ms':>7} {'p99 ms':>7} "
              f"{'1 conc req/s':>12} {'p50 ms':>7}  non-200")
        for m in modes:
            a, b = results[m][16], results[m][1]
            print(f"{m:<15} {_median(a, 'rps'):>13.0f} {_median(a, 'p50'):>7.1f} "
                  f"{_median(a, 'p99'):>7.1f} {_median(b, 'rps'):>12.0f} {_median(b, 'p50'):>7.1f}"
                  f"  {sum(x['non200'] for x in a + b)}")
        for m in modes:
            print(f"  {m} req/s at 16, every round: "
                  + ", ".join(f"{x['rps']:.0f}" for x in results[m][16]))
        servers["serve_fastest"].stop()
        servers["serve_default"].stop()
        step_s = 3.0 if args.quick else 5.0
        best = sweep(urls["hetflow"], digits_bodies(rows=1, count=64),
                     p99_target_ms=P99_TARGET_MS, start_rate=100.0, max_rate=3000.0,
                     duration_s=step_s, max_requests=20_000, timeout_s=10.0, min_requests=150,
                     refine=1 if args.quick else 2,
                     on_step=lambda s: print(f"  sweep: {s.line()}", flush=True))
        best_rate = best.best_rate or 0.0
        print(f"hetflow open-loop: highest rate with P99 <= {P99_TARGET_MS:g} ms: "
              f"{best_rate:.1f} req/s")
    finally:
        for s in servers.values():
            s.stop()

    heavy = Server("hetflow_heavy")
    try:
        base = heavy.wait()
        wide_body = work / "wide.json"
        wide_body.write_text(json.dumps({"inputs": [[0.5] * 64]}))
        heavy_runs: dict[str, list[dict]] = {"wide-batched": [], "wide-unbatched": []}
        for name in heavy_runs:
            hey(base + f"{name}/predict", wide_body, 16, 1.5)
        for r in range(max(2, rounds - 2)):
            for name in (list(heavy_runs) if r % 2 == 0 else list(heavy_runs)[::-1]):
                heavy_runs[name].append(hey(base + f"{name}/predict", wide_body, 16, seconds))
        batched = _median(heavy_runs["wide-batched"], "rps")
        unbatched = _median(heavy_runs["wide-unbatched"], "rps")
        print(f"wide MLP {WIDE}, 1 replica x 1 CPU, 16 concurrent: batched (16 rows) "
              f"{batched:.1f} req/s (p99 {_median(heavy_runs['wide-batched'], 'p99'):.0f} ms), "
              f"unbatched {unbatched:.1f} req/s "
              f"(p99 {_median(heavy_runs['wide-unbatched'], 'p99'):.0f} ms)")
    finally:
        heavy.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    h = _median(results["hetflow"][16], "rps")
    f = _median(results["serve_fastest"][16], "rps")
    d = _median(results["serve_default"][16], "rps")
    print(f"RESULT hetflow_over_serve_fastest={h / f:.3f} hetflow_rps={h:.0f} "
          f"serve_fastest_rps={f:.0f} serve_default_rps={d:.0f} best_rate_p99_80ms="
          f"{best_rate:.1f} batched_over_unbatched_heavy={batched / unbatched:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
