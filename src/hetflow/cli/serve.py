"""``hetflow serve CONFIG.yaml`` and ``hetflow bench serve``: serve trained models over HTTP on
Ray Serve, and load-test them.

    hetflow serve examples/serve_digits.yaml            # until Ctrl-C
    hetflow serve examples/serve_digits.yaml --port 8100 --address auto
    hetflow serve examples/serve_digits.yaml --dry-run  # what would be placed and started
    hetflow serve examples/serve_digits.yaml --address auto --detach   # then --stop
    hetflow serve examples/serve_digits.yaml --serve-config > serve.yaml  # for serve deploy
    hetflow bench serve --url http://127.0.0.1:8000/v1/models/digits/predict --rate 50
    hetflow bench serve --url http://127.0.0.1:8000/v1/models/digits/predict --sweep

``serve`` trains a model first when its checkpoint is missing and ``train_if_missing`` is set,
plans the replicas (memory-aware, on the devices hetflow manages), deploys (one Serve
application per replica group with the model replica as ingress, a gateway, and the HAProxy
front door), prints ``ready`` once every model's replicas are routed, and keeps serving until
interrupted (or exits at once with ``--detach``). ``bench serve`` is an open-loop load
generator (Poisson arrivals) bounded in requests and time, loopback only; it prints P50/P95/P99
latency, achieved QPS and errors, and with ``--sweep`` the highest rate whose P99 stays at or
under ``--p99-ms``. Exit codes: 0 done, 2 bad config or arguments, 3 replicas cannot be
placed, 1 the application failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from hetflow.core.errors import InputError


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``serve`` and ``bench`` (with its ``serve`` subcommand) to the CLI."""
    p = sub.add_parser(
        "serve", help="serve trained models over HTTP on Ray Serve (batching, autoscaling, "
                      "placement, reduced precision)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", metavar="CONFIG.yaml", help="serving config (see docs/serving.md)")
    p.add_argument("--host", help="HTTP address to bind (default: http.host, 127.0.0.1)")
    p.add_argument("--port", type=int, help="HTTP port (default: http.port, 8000)")
    p.add_argument("--address", help="Ray cluster to join (default: ray_address, else a running "
                                     "local cluster, else a new local one)")
    p.add_argument("--duration", type=float, metavar="S",
                   help="stop after S seconds (default: serve until interrupted)")
    p.add_argument("--json", action="store_true", help="print the deployment as JSON")
    p.add_argument("--dry-run", action="store_true",
                   help="plan and print what would be placed and started, then exit (nothing "
                        "is deployed or trained)")
    p.add_argument("--detach", action="store_true",
                   help="deploy, print, and exit leaving it serving (needs a running Ray: "
                        "--address or ray_address); stop it with --stop")
    p.add_argument("--stop", action="store_true",
                   help="stop a detached deployment of CONFIG on the cluster (--address)")
    p.add_argument("--serve-config", action="store_true",
                   help="print a Ray Serve config file for CONFIG (serve deploy / serve run / "
                        "a RayService's serveConfigV2, built by hetflow.serve:app) and exit")
    p.set_defaults(func=run_serve)

    bench = sub.add_parser("bench", help="benchmarks of running services",
                           description="Benchmarks of running services.")
    register_bench(bench.add_subparsers(dest="bench_command", metavar="WHAT",
                                        parser_class=type(bench)))
    bench.set_defaults(func=lambda args: _missing_bench(bench))


def register_bench(sub: argparse._SubParsersAction) -> None:
    """Add ``serve`` to a ``bench`` command's subcommands (a shared ``bench`` module may
    call this)."""
    b = sub.add_parser(
        "serve", help="open-loop load test of a served model (loopback only)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("--url", default="http://127.0.0.1:8000/v1/models/digits/predict",
                   help="predict URL (loopback only; default: %(default)s)")
    b.add_argument("--rate", type=float, default=50.0, help="offered requests/s (default 50)")
    b.add_argument("--requests", type=int, default=2000, help="at most this many requests "
                                                               "per run (default 2000)")
    b.add_argument("--duration", type=float, default=20.0,
                   help="at most this many seconds of sending per run (default 20)")
    b.add_argument("--timeout", type=float, default=10.0,
                   help="seconds to wait for answers after the last send (default 10)")
    b.add_argument("--rows", type=int, default=1, help="input rows per request (default 1)")
    b.add_argument("--body", help="a JSON request body file to send instead of generated rows")
    b.add_argument("--sweep", action="store_true",
                   help="find the highest rate whose P99 stays at or under --p99-ms")
    b.add_argument("--p99-ms", type=float, default=80.0, help="P99 target of --sweep (ms)")
    b.add_argument("--start-rate", type=float, default=None,
                   help="first rate of --sweep (default 20) or --profile (default 1)")
    b.add_argument("--max-rate", type=float, default=None,
                   help="last rate of --sweep (default 2000) or --profile (default 256)")
    b.add_argument("--seed", type=int, default=0, help="seed of the arrival times")
    b.add_argument("--json", action="store_true", help="print the result as JSON")
    prof = b.add_argument_group(
        "LLM throughput profiles (--profile): per request-size bucket, the highest rate an OpenAI-compatible "
        "endpoint (--url http://127.0.0.1:PORT) sustains within a TTFT/TPOT SLO, written into the profiles "
        "file `hetflow capacity serve` reads; the load is vLLM's benchmark client (the llm extra)")
    prof.add_argument("--profile", type=Path, metavar="FILE", help="search each bucket's best rate; merge it into FILE")
    prof.add_argument("--device", metavar="LABEL", help="the device model the figures are for (e.g. MI300X)")
    prof.add_argument("--price", type=float, metavar="USD", help="its price per hour, written beside them")
    prof.add_argument("--model", help="the model name the endpoint serves")
    prof.add_argument("--tokenizer", help="the model's tokenizer, a path or hub id (default: --model)")
    prof.add_argument("--buckets", metavar="NAME=IN:OUT,...", default="short=256:128",
                      help="request sizes in tokens (default short=256:128), e.g. short=256:128,long=4096:512")
    prof.add_argument("--slo", default="ttft<=1s,tpot<=100ms", help='latency SLO (default "ttft<=1s,tpot<=100ms")')
    prof.add_argument("--percentile", type=float, default=99.0, help="the SLO's percentile (default 99)")
    prof.add_argument("--prompts", type=int, default=32, help="requests per probe (default 32; more at high rates)")
    prof.add_argument("--steps", type=int, default=3, help="bisection steps after the bracket (default 3)")
    b.set_defaults(func=run_bench)


def _missing_bench(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def run_serve(args: argparse.Namespace) -> int:
    from hetflow.cli.main import require
    from hetflow.runtime.session import check_reachable, ray_loopback_mode

    require("torch")
    if args.serve_config:
        return _serve_config(args)
    # Before the config, whose reading imports the serving code (seconds): a cluster nobody
    # answers on is one line at once. The config's ray_address is read raw here for that only.
    check_reachable(args.address or _raw_address(args.config))
    ray_loopback_mode(args.address or _raw_address(args.config))
    from hetflow.workloads.serve.config import load_serve_config

    config = load_serve_config(args.config)
    http = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    overrides: dict[str, Any] = {"http": http} if http else {}
    if args.address:
        overrides["ray_address"] = args.address
    if overrides:
        config = config.with_overrides(**overrides)

    if args.dry_run or args.stop:
        return _plan_or_stop(config, args)
    if args.detach and not config.ray_address:
        raise InputError("--detach needs a running Ray cluster (--address auto, or ray_address "
                         "in the file): an embedded one stops with this command")

    from hetflow.workloads.serve.app import deploy

    served = deploy(config)
    if args.detach:
        _print(served, args)
        print(f"detached; stop with: hetflow serve {args.config} --stop --address "
              f"{config.ray_address}")
        return 0
    try:
        import signal

        signal.signal(signal.SIGTERM, _interrupt)  # a service manager's stop: as Ctrl-C
        _print(served, args)
        _wait(args.duration, served)
    except KeyboardInterrupt:
        pass
    finally:
        served.shutdown()
        if served.started_ray:
            import ray

            ray.shutdown()
    return 0


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _serve_config(args: argparse.Namespace) -> int:
    """``--serve-config``: the Serve config file, on stdout; nothing connects or deploys."""
    from hetflow.workloads.serve.builder import serve_config_document
    from hetflow.workloads.serve.config import load_serve_config

    clashes = [flag for flag, on in (("--dry-run", args.dry_run), ("--detach", args.detach),
                                     ("--stop", args.stop), ("--json", args.json),
                                     ("--address", args.address),
                                     ("--duration", args.duration is not None)) if on]
    if clashes:
        raise InputError(f"--serve-config only prints a Serve config file; drop {', '.join(clashes)}")
    import yaml

    document = serve_config_document(load_serve_config(args.config), args.host, args.port)
    sys.stdout.write(yaml.safe_dump(document, sort_keys=False))
    return 0


def _print(served: Any, args: argparse.Namespace) -> None:
    config = served.config
    if args.json:
        json.dump(describe(served), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(f"ready: serving {config.name} at {served.url} (every model has a running "
              "replica the front door routes to)")
        for name, mp in served.plans.items():
            fallback = f", fallback {mp.entry.fallback}" if mp.entry.fallback else ""
            print(f"  {name}: {mp.entry.precision}, input {mp.input.description}{fallback}")
            for group in mp.groups:
                print(f"    {group.describe()}")
        for name, servers in served.llm_servers.items():
            print(f"  {name}: vLLM, {len(servers)} replica(s)")
            for server, host, port, weight in servers:
                print(f"    {server}: {host}:{port} weight {weight}")
        if served.plans:
            print(f"  POST {served.url}/v1/models/<name>/predict  {{\"inputs\": [[...], ...]}}")
            print(f"  POST {served.url}/v2/models/<name>/infer    (KServe v2)")
        if served.llm_servers:
            print(f"  POST {served.url}/v1/chat/completions       (OpenAI: "
                  f"{', '.join(served.llm_servers)}; stream: true)")
        if any(mp.generative for mp in served.plans.values()) or served.llm_servers:
            print(f"  POST {served.url}/v1/completions            (OpenAI, stream: true)")
        print(f"  GET  {served.url}/v1/models")
        print(f"  GET  {served.url}/health  {served.url}/metrics")
        address = _ray_address()
        if address:
            token = "RAY_AUTH_MODE=token " if os.environ.get("RAY_AUTH_MODE", "").lower() == "token" else ""
            print(f"  Ray cluster {address}: {token}hetflow top --address {address}")
    sys.stdout.flush()


def _ray_address() -> str | None:
    """The GCS address of the Ray cluster this process joined (for `hetflow top --address`)."""
    try:
        import ray

        return ray.get_runtime_context().gcs_address
    except Exception:  # noqa: BLE001 - not connected, or an older Ray
        return None


def _plan_or_stop(config: Any, args: argparse.Namespace) -> int:
    import ray

    from hetflow.workloads.serve.app import connect_ray, describe_plan, plan_models, stop
    from hetflow.workloads.serve.plan import plan_llm_pools

    started = connect_ray(config.ray_address)
    try:
        if args.stop:
            apps = stop(config)
            print(f"stopped {config.name}: {', '.join(apps) or 'nothing was running'}")
            return 0
        plan = describe_plan(config, plan_models(config, dry_run=True), plan_llm_pools(config))
        if args.json:
            print(json.dumps(plan, indent=2))
            return 0
        print(f"would serve {config.name} at {plan['front_door']['url']} (front door: HAProxy)")
        for app in plan["applications"]:
            where = f" on {app['device'] or app.get('compute', 'cpu').upper()}" \
                if app["ingress"] == "ModelServer" else ""
            count = app["replicas"] if app["replicas"] is not None else \
                f"{app['autoscaling']['min_replicas']}-{app['autoscaling']['max_replicas']}"
            path = f", {app['path']} path" if "path" in app else ""
            print(f"  application {app['name']} ({app['route_prefix']}): {app['ingress']} x "
                  f"{count}{where}{path}")
        for name, m in plan["models"].items():
            print(f"  {name}: {m['precision']}, input {m['input']}, "
                  f"{m['memory_bytes'] / 2**20:.0f} MiB per replica"
                  + (f", fallback {m['fallback']}" if m["fallback"] else ""))
        for name, m in plan["llm"].items():
            print(f"  {name} (engine: vllm, routing: {m['routing']['affinity']}"
                  + (f", fallback {m['fallback']}" if m.get("fallback") else "") + "):")
            for e in m["engines"]:
                where = (", ".join(e["devices"]) if e["devices"] else
                         f"{e['ray_gpus']:g} Ray GPU(s)" if e["ray_gpus"] else e["compute"].upper())
                tp = f", tensor parallel {e['tensor_parallel_size']}" if e["tensor_parallel_size"] > 1 else ""
                if e.get("nodes"):
                    pp = e["pipeline_parallel_size"]
                    tp += (f", pipeline parallel {pp}" if pp > 1 else "") + f", each over {e['nodes']} nodes"
                    if e.get("layer_split"):
                        tp += f" (layers {'/'.join(map(str, e['layer_split']))})"
                scale = e.get("autoscaling")
                count = (f"{e['replicas']} engine slot(s) of {scale['min_replicas']}-"
                         f"{scale['max_replicas']} autoscaled (starts with {scale['initial_replicas']}, "
                         f"{scale['target_ongoing_requests']:g} ongoing requests each)"
                         if scale else f"{e['replicas']} engine(s)")
                print(f"    pool {e['pool']}: {count} on {where}{tp}, weight {e['weight']}")
        return 0
    finally:
        if started:
            ray.shutdown()


def _raw_address(path: str) -> str | None:
    """The config file's top-level ``ray_address``, if it is readable (errors come later)."""
    import yaml

    try:
        data = yaml.safe_load(open(path, encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError):
        return None
    address = data.get("ray_address") if isinstance(data, dict) else None
    return address if isinstance(address, str) else None


def _wait(duration: float | None, served: Any = None) -> None:
    """Until ``duration`` has passed (None: until interrupted); meanwhile what the front door
    did to autoscaled LLM pools (an engine started or stopped) is printed as it happens."""
    deadline = None if duration is None else time.monotonic() + duration
    scaled = served is not None and any(
        p.autoscaling for m in served.config.models if m.engine == "vllm" for p in m.effective_pools)
    said: dict[tuple[str, int], int] = {}
    looked = time.monotonic()
    while deadline is None or time.monotonic() < deadline:
        time.sleep(0.5 if deadline is None else max(0.0, min(0.5, deadline - time.monotonic())))
        if scaled and time.monotonic() - looked >= 2.0:
            looked = time.monotonic()
            try:
                pools = served.state().get("llm_scaling", {})
            except Exception:  # noqa: BLE001 - the front door busy or restarting: next look
                continue
            for model, by_pool in pools.items():
                for pool, st in by_pool.items():
                    new = st["said"] - said.get((model, pool), 0)
                    for line in st["events"][-new:] if new > 0 else []:
                        print(line.removeprefix("hetflow front door: "), flush=True)
                    said[(model, pool)] = st["said"]


def describe(served: Any) -> dict[str, Any]:
    """The JSON form of a deployment."""
    return {
        "name": served.config.name, "url": served.url,
        "models": {name: {"precision": mp.entry.precision, "input": mp.input.to_dict(),
                          "checkpoint": mp.spec.checkpoint, "memory_bytes": mp.memory_bytes,
                          "fallback": mp.entry.fallback,
                          "groups": [{"deployment": g.deployment, "replicas": g.num_replicas,
                                      "autoscaling": g.autoscaling, "compute": g.compute,
                                      "device": str(g.device) if g.device else None,
                                      "env": g.env} for g in mp.groups]}
                   for name, mp in served.plans.items()},
        "llms": {name: {"engine": "vllm",
                        "servers": [{"name": n, "host": h, "port": p, "weight": w}
                                    for n, h, p, w in servers]}
                 for name, servers in served.llm_servers.items()},
    }


def run_bench(args: argparse.Namespace) -> int:
    from hetflow.workloads.serve.loadgen import check_loopback, run_load, sweep

    check_loopback(args.url)
    if args.profile is not None:
        from hetflow.cli.bench import run_profile

        code = run_profile(args)
        # vLLM's client leaves native bindings that print leak reports at interpreter exit (noise
        # after the answer): the profile is written (atomically) and printed, so end here
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    profile_only = [f"--{n.replace('_', '-')}" for n in ("device", "price", "model", "tokenizer")
                    if getattr(args, n) is not None]
    if profile_only:
        raise InputError(f"{', '.join(profile_only)}: only with --profile FILE (an LLM throughput profile)")
    args.start_rate = 20.0 if args.start_rate is None else args.start_rate
    args.max_rate = 2000.0 if args.max_rate is None else args.max_rate
    from hetflow.cli.bench import check_bench_bounds

    check_bench_bounds(args, ("rate", "requests", "duration", "timeout", "rows", "p99_ms",
                              "start_rate", "max_rate"))
    bodies = _bodies(args)
    if not args.sweep:
        result = run_load(args.url, bodies, args.rate, max_requests=args.requests,
                          max_duration_s=args.duration, timeout_s=args.timeout, seed=args.seed)
        if args.json:
            print(json.dumps(result.to_dict(), indent=2))
        else:
            print(result.line())
        return 0 if result.ok else 1

    def show(step: Any) -> None:
        if not args.json:
            mark = "ok " if step.passes(args.p99_ms) else "too slow" if not step.error_count \
                else "errors"
            print(f"{step.line()}  [{mark}]", flush=True)

    result = sweep(args.url, bodies, p99_target_ms=args.p99_ms, start_rate=args.start_rate,
                   max_rate=args.max_rate, duration_s=args.duration,
                   max_requests=args.requests, timeout_s=args.timeout, seed=args.seed,
                   on_step=show)
    if args.json:
        print(json.dumps({"p99_target_ms": args.p99_ms, "best_rate": result.best_rate,
                          "steps": [s.to_dict() for s in result.steps]}, indent=2))
    elif result.best is None:
        print(f"no rate tried kept P99 <= {args.p99_ms:g} ms without errors; "
              f"lower --start-rate")
    else:
        print(f"highest rate with P99 <= {args.p99_ms:g} ms: {result.best_rate:.1f} req/s "
              f"(achieved {result.best.achieved_qps:.1f}/s, P99 {result.best.p99_ms:.1f} ms)")
    return 0


def _bodies(args: argparse.Namespace) -> list[bytes]:
    from pathlib import Path

    from hetflow.workloads.serve.loadgen import bodies_for

    if args.body:
        try:
            data = Path(args.body).read_bytes()
        except OSError as exc:
            raise InputError(f"cannot read --body {args.body}: {exc.strerror}") from None
        try:
            json.loads(data)
        except ValueError as exc:
            raise InputError(f"--body {args.body} is not JSON: {exc}") from None
        return [data]
    return bodies_for(_model_input(args.url), rows=args.rows, seed=args.seed)


def _model_input(url: str) -> dict[str, Any]:
    """The model's input description, from ``GET /v1/models/<name>`` of the same server."""
    import requests

    base, _, rest = url.partition("/v1/")
    name = rest.removeprefix("models/").removesuffix("/predict") if rest.startswith("models/") \
        else None
    try:
        if name:
            info = requests.get(f"{base}/v1/models/{name}", timeout=10).json()
        else:
            models = requests.get(f"{base}/v1/models", timeout=10).json()["models"]
            info = next(iter(models.values()))
        return info["input"]
    except (requests.RequestException, ValueError, KeyError, StopIteration) as exc:
        raise InputError(f"cannot read the model's input description from {base}/v1/models "
                         f"({exc}); is `hetflow serve` running there? or pass --body") from None


def main(argv: list[str] | None = None) -> int:
    """``python -m hetflow.cli.serve ...`` = ``hetflow serve ...`` (same parser, same errors)."""
    from hetflow.cli.main import main as hetflow_main

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("serve", "bench", "-h", "--help"):
        argv.insert(0, "serve")  # also `python -m hetflow.cli.serve bench serve ...`
    return hetflow_main(argv)


if __name__ == "__main__":
    sys.exit(main())
