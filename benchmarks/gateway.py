"""Gateway benchmark: hetflow's front door with API keys, rate limits and load shedding, against
the same front door open and against LiteLLM's proxy, side by side in one run.

    apt-get install -y hey                       # the external load client (Debian)
    make litellm                                 # LiteLLM's proxy in .venv-litellm (PyPI litellm[proxy])
    .venv/bin/python benchmarks/gateway.py       # about 5 minutes on 2 cores
    .venv/bin/python benchmarks/gateway.py --quick

One server process with its own local Ray (3 logical CPUs on the 2 cores - each application
reserves 1.25 -, Serve's direct ingress) runs two hetflow
applications of the same models (the digits MLP 64-128-128-10, 2 replicas x 0.5 CPU, batching
32 rows / 2 ms; a tiny GPT for ``/v1/completions``), each behind its own front door:

* ``open``: ``auth: {mode: none}`` - the fast path as it was;
* ``keyed``: ``auth: {mode: keys}`` with keys made by ``hetflow keys create``: ``bench`` (a
  1,000,000 req/s limit: every check runs, none binds) and ``limited`` (``--rps 100``).

Measured, with `hey` (closed loop; ``-q`` caps each worker's rate):

* ``auth_over_open``: req/s at 16 concurrent, keyed (Bearer ``bench``) over open, median of
  4 interleaved rounds (ABBA order: neither side always runs first);
* ``limiter_error``: ``limited`` offered 300 req/s for 30 s (``-c 6 -q 50``): |answered 200 per
  second / 100 - 1|;
* ``overload_p99_ms`` / ``shed_p99_ms``: 3x the measured capacity offered to ``open`` with
  ``queue_limit`` 16 per replica (``-c 96``, ``-q`` = 3 x capacity / 96): P99 of the admitted
  (200) and of the refused (503) requests, from hey's per-request CSV;
* ``over_litellm``: req/s at 16 concurrent of ``POST /v1/completions`` (tiny GPT, 1 token)
  through hetflow's keyed front door (key ``bench``) over the same through LiteLLM's proxy
  (``litellm --config``: a master key and an ``rpm`` limit on the model) in front of the open
  front door - the same backend; median of interleaved rounds. Needs ``.venv-litellm``
  (``make litellm``); without it the figure is ``nan`` and the line says why;
* ``revoke_ms``: ``hetflow keys revoke`` returning -> the first 401 for that key;
* ``timing_gap_us``: median time of a 401 for the right key with its last character changed
  minus that for an unrelated wrong key (400 alternating requests each, one connection).

Flags: ``--front-nice N`` / ``--front-realtime N``: the front doors' ``http.nice`` /
``http.realtime`` (HAProxy under SCHED_FIFO); ``--client-realtime N``: ``hey`` under SCHED_FIFO
(``chrt``; root), a client that does not wait for a core the replicas keep busy - on one
machine the closest to a client on cores of its own (docs/benchmarks.md, Gateway runs 17-25).

Last line: ``RESULT auth_over_open=<x> limiter_error=<x> overload_p99_ms=<x> shed_p99_ms=<x>
over_litellm=<x> capacity_rps=<x> revoke_ms=<x> timing_gap_us=<x>``.
"""

from __future__ import annotations

import ray_home  # noqa: F401 - first: Ray's temp folder is this run's own (ray_home.py)

import argparse
import csv
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from side_by_side import ServerProcess, free_port, serve_until_stdin_closes

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
sys.path.insert(0, str(SRC))
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(SRC)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
LITELLM = ROOT / ".venv-litellm" / "bin" / "litellm"
QUEUE_LIMIT = 16
HETFLOW = [sys.executable, "-m", "hetflow.cli.main"]
CLIENT_PREFIX: list[str] = []  # --client-realtime N: ["chrt", "-f", "N"] (hey under SCHED_FIFO)


def _models(queue_limit: int | None) -> list[dict]:
    return [
        {"name": "digits", "weights": "random", "devices": "cpu", "replicas": 2,
         "cpus_per_replica": 0.5, "queue_limit": queue_limit,
         "batching": {"max_batch_size": 32, "batch_wait_timeout_s": 0.002},
         "train": {"model": {"kind": "mlp", "hidden": [128, 128]}}},
        {"name": "tinygpt", "weights": "random", "devices": "cpu", "cpus_per_replica": 0.25,
         "batching": {"enabled": False},
         "train": {"model": {"kind": "gpt", "layers": 1, "dim": 32, "heads": 2, "seq_len": 16}}},
    ]


def serve_main(ports: list[int]) -> int:
    """Both applications in one local Ray; print ``READY``; serve until stdin closes."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    from hetflow.workloads.serve.front import FAST_ENV

    os.environ.update(FAST_ENV)
    import ray

    from hetflow.workloads.serve.app import deploy
    from hetflow.workloads.serve.config import serve_config_from_dict

    ray.init(address="local", num_cpus=3, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    nice = os.environ.get("HETFLOW_BENCH_FRONT_NICE", "")  # --front-nice
    realtime = os.environ.get("HETFLOW_BENCH_FRONT_REALTIME", "")  # --front-realtime
    http = {"nice": int(nice)} if nice else {}
    if realtime:
        http["realtime"] = int(realtime)
    served = [deploy(serve_config_from_dict({"name": name, "http": {**http, "port": port},
                                             "auth": {"mode": mode},
                                             "models": _models(QUEUE_LIMIT if name == "open" else None)}))
              for name, port, mode in (("open", ports[0], "none"), ("keyed", ports[1], "keys"))]
    return serve_until_stdin_closes(served)


def hey(url: str, body: Path, concurrency: int, seconds: float, headers: dict[str, str],
        qps: float | None = None, per_request: bool = False) -> dict:
    """One run of `hey`: req/s, answers by status, and (``per_request``) each request's
    (status, seconds) from its CSV."""
    cmd = [*CLIENT_PREFIX, "hey", "-z", f"{seconds}s", "-c", str(concurrency), "-m", "POST",
           "-T", "application/json", "-D", str(body)]
    for name, value in headers.items():
        cmd += ["-H", f"{name}: {value}"]
    if qps:
        cmd += ["-q", f"{qps:.2f}"]
    if per_request:
        cmd += ["-o", "csv"]
    out = subprocess.run(cmd + [url], capture_output=True, text=True, timeout=seconds + 120).stdout
    if per_request:
        rows = [(int(r["status-code"]), float(r["response-time"]), float(r["offset"]))
                for r in csv.DictReader(io.StringIO(out)) if r.get("status-code", "").isdigit()]
        span = max((r[2] + r[1] for r in rows), default=seconds)
        return {"rows": rows, "seconds": span}
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    total = float(re.search(r"Total:\s+([\d.]+) secs", out).group(1))
    codes = {int(c): int(n) for c, n in re.findall(r"\[(\d{3})\]\s+(\d+) responses", out)}
    return {"rps": rps, "codes": codes, "seconds": total}


def p99_ms(values: list[float]) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(0.99 * len(values)))] * 1000


def status_of(url: str, key: str, body: bytes) -> int:
    req = urllib.request.Request(url, data=body, headers={"Authorization": f"Bearer {key}",
                                                          "content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:  # noqa: S310 - loopback
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def start_litellm(upstream: str, workdir: Path) -> tuple[subprocess.Popen | None, str, str]:
    if not LITELLM.exists():
        return None, "", "no .venv-litellm (make litellm)"
    port = free_port()
    master = "sk-bench-" + os.urandom(8).hex()
    config = workdir / "litellm.yaml"
    config.write_text(json.dumps({
        "model_list": [{"model_name": "tinygpt",
                        "litellm_params": {"model": "text-completion-openai/tinygpt",
                                           "api_base": upstream, "api_key": "none",
                                           "rpm": 1_000_000}}],
        "general_settings": {"master_key": master},
        "litellm_settings": {"telemetry": False},
    }))
    log = (workdir / "litellm.log").open("w")
    proc = subprocess.Popen([str(LITELLM), "--config", str(config), "--host", "127.0.0.1",
                             "--port", str(port), "--num_workers", "1"], stdout=log, stderr=log,
                            env={**os.environ, "LITELLM_LOG": "ERROR", "DISABLE_SCHEMA_UPDATE": "true"})
    url = f"http://127.0.0.1:{port}/v1/completions"
    body = json.dumps({"model": "tinygpt", "prompt": "hi", "max_tokens": 1}).encode()
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return None, "", f"litellm exited; see {workdir / 'litellm.log'}"
        try:
            if status_of(url, master, body) == 200:
                return proc, url, master
        except OSError:
            pass
        time.sleep(1)
    proc.terminate()
    return None, "", "litellm did not answer in 180 s"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs (2 rounds of 3 s, 10 s limiter)")
    parser.add_argument("--front-nice", type=int, metavar="N",
                        help="the front doors' http.nice (default: unset - the replicas' priority, Ray's "
                             "worker niceness 15)")
    parser.add_argument("--front-realtime", type=int, metavar="N",
                        help="the front doors' http.realtime: HAProxy under SCHED_FIFO at priority N "
                             "(default: unset - the ordinary policy)")
    parser.add_argument("--client-realtime", type=int, metavar="N",
                        help="run the load client (hey) under SCHED_FIFO at priority N (chrt; root), so "
                             "that on a machine whose cores the server saturates it does not wait for "
                             "a core to send or to time an answer (default: the ordinary policy)")
    parser.add_argument("--serve", nargs=2, type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        return serve_main(args.serve)
    if shutil.which("hey") is None:
        print("benchmarks/gateway.py needs `hey`: apt-get install -y hey", file=sys.stderr)
        return 2
    for flag, value in (("--front-realtime", args.front_realtime), ("--client-realtime", args.client_realtime)):
        if value is not None and not 1 <= value <= 99:
            print(f"benchmarks/gateway.py: {flag} {value}: a SCHED_FIFO priority is 1..99", file=sys.stderr)
            return 2
    if args.client_realtime is not None:
        probe = subprocess.run(["chrt", "-f", str(args.client_realtime), "true"], capture_output=True, text=True)
        if probe.returncode != 0:
            print(f"benchmarks/gateway.py: --client-realtime needs chrt and the right to use SCHED_FIFO "
                  f"(root or CAP_SYS_NICE): {probe.stderr.strip()}", file=sys.stderr)
            return 2
        CLIENT_PREFIX[:] = ["chrt", "-f", str(args.client_realtime)]
    rounds, seconds, limiter_s = (2, 3.0, 10.0) if args.quick else (4, 6.0, 30.0)
    work = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    keys_dir = work / "keys"
    env = {**os.environ, "HETFLOW_KEYS_DIR": str(keys_dir),
           "HETFLOW_BENCH_FRONT_NICE": "" if args.front_nice is None else str(args.front_nice),
           "HETFLOW_BENCH_FRONT_REALTIME": "" if args.front_realtime is None else str(args.front_realtime)}

    def make_key(name: str, *flags: str) -> str:
        out = subprocess.run([*HETFLOW, "keys", "create", name, *flags], env=env, capture_output=True,
                             text=True, check=True)
        return out.stdout.strip()

    bench_key = make_key("bench", "--rps", "1000000")
    limited_key = make_key("limited", "--rps", "100")
    revoked_key = make_key("to-revoke")
    ports = [free_port(), free_port()]
    server = ServerProcess(__file__, list(map(str, ports)), work / "server.log", env=env, stop_s=90).start()
    litellm = None
    try:
        server.ready()
        open_url, keyed_url = (f"http://127.0.0.1:{p}" for p in ports)
        predict = work / "predict.json"
        predict.write_text(json.dumps({"inputs": [[0.5] * 64]}))
        complete = work / "complete.json"
        complete.write_text(json.dumps({"model": "tinygpt", "prompt": "hi", "max_tokens": 1}))
        auth = {"Authorization": f"Bearer {bench_key}"}
        path = "/v1/models/digits/predict"
        print(f"# hetflow gateway benchmark: local Ray (3 logical CPUs), hey, {rounds} interleaved rounds "
              f"of {seconds:g} s", flush=True)
        for url, hdr in ((open_url, {}), (keyed_url, auth)):  # warm-up
            hey(url + path, predict, 16, 1.5, hdr)
        runs: dict[str, list[float]] = {"open": [], "keyed": []}
        for r in range(rounds):
            pair = (("open", open_url, {}), ("keyed", keyed_url, auth))
            for name, url, hdr in (pair if r % 2 == 0 else pair[::-1]):  # ABBA: no side always first
                got = hey(url + path, predict, 16, seconds, hdr)
                assert set(got["codes"]) == {200}, (name, got["codes"])
                runs[name].append(got["rps"])
            print(f"round {r + 1}: open {runs['open'][-1]:.0f} req/s, keyed {runs['keyed'][-1]:.0f} req/s",
                  flush=True)
        open_rps, keyed_rps = statistics.median(runs["open"]), statistics.median(runs["keyed"])
        auth_over_open = keyed_rps / open_rps

        # the limiter: 300 req/s offered to a 100 req/s key
        got = hey(keyed_url + path, predict, 6, limiter_s, {"Authorization": f"Bearer {limited_key}"}, qps=50)
        served_rate = got["codes"].get(200, 0) / got["seconds"]
        offered = sum(got["codes"].values()) / got["seconds"]
        limiter_error = abs(served_rate / 100 - 1)
        print(f"limiter: offered {offered:.0f} req/s, answered 200 at {served_rate:.1f} req/s, "
              f"429: {got['codes'].get(429, 0)}", flush=True)

        # overload: 3x capacity against queue_limit 16 per replica
        capacity = open_rps
        over = hey(open_url + path, predict, 96, seconds * 2, {}, qps=3 * capacity / 96, per_request=True)
        ok = [t for s, t, _ in over["rows"] if s == 200]
        shed = [t for s, t, _ in over["rows"] if s == 503]
        other = [s for s, _, _ in over["rows"] if s not in (200, 503)]
        overload_p99, shed_p99 = p99_ms(ok), p99_ms(shed)
        print(f"overload: offered {len(over['rows']) / over['seconds']:.0f} req/s (3 x {capacity:.0f}); "
              f"200: {len(ok)} ({len(ok) / over['seconds']:.0f}/s, P99 {overload_p99:.1f} ms), "
              f"503: {len(shed)} (P99 {shed_p99:.2f} ms), other: {len(other)}", flush=True)

        # revocation: CLI returns -> first 401
        body = predict.read_bytes()
        assert status_of(keyed_url + path, revoked_key, body) == 200
        subprocess.run([*HETFLOW, "keys", "revoke", "to-revoke"], env=env, capture_output=True, check=True)
        gone = time.monotonic()
        while status_of(keyed_url + path, revoked_key, body) == 200 and time.monotonic() - gone < 10:
            time.sleep(0.01)
        revoke_ms = (time.monotonic() - gone) * 1000
        print(f"revocation: 401 after {revoke_ms:.0f} ms", flush=True)

        # a wrong key vs the right key with its last character changed: the same time (the
        # lookup is by hash); medians of 400 alternating requests each, one connection
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", ports[1], timeout=10)
        wrong = {"far": "hf-" + "A" * 43, "near": bench_key[:-1] + ("A" if bench_key[-1] != "A" else "B")}
        times: dict[str, list[float]] = {"far": [], "near": []}
        for i in range(800):
            which = ("far", "near")[i % 2]
            started = time.perf_counter()
            conn.request("POST", path, body=body, headers={"Authorization": f"Bearer {wrong[which]}",
                                                           "content-type": "application/json"})
            answer = conn.getresponse()
            answer.read()
            times[which].append(time.perf_counter() - started)
            assert answer.status == 401
        conn.close()
        timing_gap_us = (statistics.median(times["near"]) - statistics.median(times["far"])) * 1e6
        print(f"wrong key: median {statistics.median(times['far']) * 1e6:.0f} us, right but the last "
              f"character: {statistics.median(times['near']) * 1e6:.0f} us", flush=True)

        # LiteLLM's proxy in front of the open front door vs hetflow's keyed front door
        litellm, litellm_url, master = start_litellm(open_url + "/v1", work)
        if litellm is None:
            over_litellm = float("nan")
            print(f"litellm: not measured ({master})", flush=True)
        else:
            both = {"hetflow": [], "litellm": []}
            hey(litellm_url, complete, 16, 1.5, {"Authorization": f"Bearer {master}"})
            for r in range(rounds):
                pair = (("hetflow", keyed_url + "/v1/completions", bench_key), ("litellm", litellm_url, master))
                for name, url, key in (pair if r % 2 == 0 else pair[::-1]):
                    got = hey(url, complete, 16, seconds, {"Authorization": f"Bearer {key}"})
                    both[name].append(got["rps"])
                    if set(got["codes"]) != {200}:
                        print(f"  {name}: answers {got['codes']}", flush=True)
                print(f"round {r + 1}: completions hetflow {both['hetflow'][-1]:.0f} req/s, "
                      f"litellm {both['litellm'][-1]:.0f} req/s", flush=True)
            over_litellm = statistics.median(both["hetflow"]) / statistics.median(both["litellm"])
    finally:
        if litellm is not None:
            litellm.terminate()
            litellm.wait(30)
        server.stop()
        if sys.exc_info()[0] is None:
            shutil.rmtree(work, ignore_errors=True)
        else:  # the logs of the failed run (server.log, litellm.log)
            print(f"benchmarks/gateway.py: its logs are in {work}", file=sys.stderr)
    print(f"RESULT auth_over_open={auth_over_open:.3f} limiter_error={limiter_error:.3f} "
          f"overload_p99_ms={overload_p99:.1f} shed_p99_ms={shed_p99:.2f} over_litellm={over_litellm:.2f} "
          f"capacity_rps={capacity:.0f} revoke_ms={revoke_ms:.0f} timing_gap_us={timing_gap_us:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
