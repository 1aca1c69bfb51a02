"""An autoscaled LLM pool as a user serves it: ``hetflow serve`` (embedded default Ray, node IP
not pinned) of one ``engine: vllm`` model whose pool has ``autoscaling`` (1 to 2 engines, 2
ongoing requests each). Load past one engine's target starts a second engine, which joins the
routing and answers; without load it is taken out of the routing and stopped, and the model
keeps answering on the first; the stop leaves no engine process.

The model is the tiny Llama made here (``load_format: dummy``), so nothing is downloaded.
Needs vLLM (``make llm``; ``make test`` installs it)."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests
import yaml

from tests.net import free_port
from tests.serving.serve_run import HETFLOW, NEEDS_VLLM, stop, wait_serving

pytestmark = NEEDS_VLLM
TARGET = 2  # ongoing requests per engine the pool aims at


@pytest.fixture(scope="module")
def scaled(tmp_path_factory):
    from hetflow.workloads.serve.llm import build_tiny_llama

    root = tmp_path_factory.mktemp("llm-scale")
    model = build_tiny_llama(root / "tiny-scale", max_positions=1024)
    port = free_port()
    config = root / "serve.yaml"
    config.write_text(yaml.safe_dump({
        "name": "llms", "http": {"port": port},
        "models": [{
            "name": "tiny", "engine": "vllm",
            "vllm": {"model": str(model), "load_format": "dummy", "dtype": "float32",
                     "max_model_len": 1024, "max_num_seqs": 2, "enforce_eager": True},
            "pools": [{"devices": "cpu", "cpus_per_replica": 0.5,
                       "autoscaling": {"min_replicas": 1, "max_replicas": 2,
                                       "target_ongoing_requests": TARGET,
                                       "upscale_delay_s": 2, "downscale_delay_s": 15}}],
        }],
    }))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # as test_llm_ray.py: one process fewer an engine
    out_path, err_path = root / "serve.out", root / "serve.err"
    with out_path.open("w") as stdout, err_path.open("w") as stderr:
        proc = subprocess.Popen([*HETFLOW, "serve", str(config), "--duration", "900"],
                                env=env, stdout=stdout, stderr=stderr)
    state = {"proc": proc, "url": f"http://127.0.0.1:{port}", "model": str(model), "err": err_path,
             "config": config, "env": env, "out": out_path}
    try:
        wait_serving(proc, out_path, err_path, "llms")
        line = re.search(r"Ray cluster \S+: (RAY_AUTH_MODE=token )?hetflow top --address (\S+)",
                         out_path.read_text())
        state["ray"], state["token"] = line.group(2), bool(line.group(1))
        yield state
    finally:
        stop(proc)


def engine_ports(model: str) -> set[int]:
    """The ports of the vLLM servers running the test's model (their command lines)."""
    out = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if model in argv and "--port" in argv and any("vllm" in a for a in argv[:3]):
                out.add(int(argv[argv.index("--port") + 1]))
    return out


def served_by(port: int) -> float:
    """Requests the engine on ``port`` has finished (its own /metrics)."""
    text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total"))


def pool_gauge(scaled, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = requests.get(scaled["url"] + "/metrics", timeout=60).text
    return next(s.value for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == name and s.labels.get("model") == "tiny" and s.labels.get("pool") == "1")


def complete(scaled, prompt: str, tokens: int) -> int:
    reply = requests.post(scaled["url"] + "/v1/completions", timeout=120, json={
        "model": "tiny", "prompt": prompt, "max_tokens": tokens, "ignore_eos": True})
    return reply.status_code


def test_the_dry_run_says_the_pool_scales(scaled) -> None:
    # (against the running cluster hetflow serve names: a dry run of its own would start one)
    env = {**scaled["env"], **({"RAY_AUTH_MODE": "token"} if scaled["token"] else {})}
    dry = subprocess.run([*HETFLOW, "serve", str(scaled["config"]), "--dry-run", "--address",
                          scaled["ray"]], env=env, capture_output=True, text=True, timeout=300)
    assert dry.returncode == 0, dry.stderr
    # two engine slots planned (the maximum), one started
    assert ("pool 1: 2 engine slot(s) of 1-2 autoscaled (starts with 1, 2 ongoing requests each) "
            "on CPU") in dry.stdout


def test_load_starts_a_second_engine_that_then_answers(scaled) -> None:
    first = engine_ports(scaled["model"])
    assert len(first) == 1 and pool_gauge(scaled, "hetflow_llm_replicas") == 1
    stop = threading.Event()
    codes: list[int] = []

    def load(i: int) -> None:  # 4 streams at once: 2 engines' worth at 2 ongoing each
        while not stop.is_set():
            codes.append(complete(scaled, f"load {i}", 64))

    workers = [threading.Thread(target=load, args=(i,), daemon=True) for i in range(2 * TARGET)]
    for w in workers:
        w.start()
    try:
        deadline = time.monotonic() + 300
        while len(engine_ports(scaled["model"])) < 2:  # the new engine's server has started
            assert time.monotonic() < deadline, scaled["err"].read_text()[-3000:]
            time.sleep(0.5)
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=150)
    assert codes and set(codes) <= {200, 503}, codes  # 503: past an engine's queue limit
    (new,) = engine_ports(scaled["model"]) - first
    # it joins the routing once it answers (the want stays above one engine meanwhile: the
    # front door does not scale down while an engine is starting), then takes requests
    deadline = time.monotonic() + 300
    while pool_gauge(scaled, "hetflow_llm_replicas") < 2:
        assert time.monotonic() < deadline, scaled["err"].read_text()[-3000:]
        time.sleep(0.5)
    before = served_by(new)
    for _ in range(5):
        with_new = []
        threads = [threading.Thread(target=lambda i=i: with_new.append(complete(scaled, f"more {i}", 16)))
                   for i in range(2 * TARGET)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert with_new == [200] * (2 * TARGET)
        if served_by(new) > before:
            break
    assert served_by(new) > before, "the added engine never answered a request"
    assert pool_gauge(scaled, "hetflow_llm_replicas_answering") == 2


def test_without_load_the_added_engine_leaves_the_routing_and_stops(scaled) -> None:
    deadline = time.monotonic() + 120  # downscale_delay_s 15, then its requests drain
    while len(engine_ports(scaled["model"])) > 1 or pool_gauge(scaled, "hetflow_llm_replicas") > 1:
        assert time.monotonic() < deadline, scaled["err"].read_text()[-3000:]
        time.sleep(0.5)
    assert pool_gauge(scaled, "hetflow_llm_replicas_wanted") == 1
    # hetflow serve says what the front door did, as it happens
    said = ["starting engine p1-r1", "engine p1-r1 answers at", "engine p1-r1 out of the routing",
            "engine p1-r1 stopped (1 running)"]

    def told() -> bool:
        lines = [line for line in scaled["out"].read_text().splitlines()
                 if line.startswith("model tiny: pool 1: ")]
        return all(any(w in line for line in lines) for w in said)

    deadline = time.monotonic() + 10
    while not told():
        assert time.monotonic() < deadline, scaled["out"].read_text()[-2000:]
        time.sleep(0.5)
    # the model answers on the engine left, every request
    assert [complete(scaled, f"after {i}", 4) for i in range(6)] == [200] * 6


def test_the_stop_leaves_no_engine_running(scaled) -> None:
    assert stop(scaled["proc"]) == 0, scaled["err"].read_text()[-2000:]
    deadline = time.monotonic() + 30
    while engine_ports(scaled["model"]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not engine_ports(scaled["model"])
