"""Ray Serve's own tooling deploys a hetflow serving config: ``serve deploy`` of the file
``hetflow serve --serve-config`` writes, ``serve status``, ``serve run hetflow.serve:app
config=...`` (the application builder), ``serve shutdown``.

One local Ray for the module, with its dashboard (``serve deploy`` and ``serve status`` talk to
its REST API). The Serve CLI runs as a subprocess, as a user runs it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import pytest
import ray
import requests
import yaml

from hetflow.workloads.train.data import load_dataset
from tests.net import free_port as _free_port

pytestmark = pytest.mark.ray

SERVE = str(Path(sys.executable).with_name("serve"))
HETFLOW = str(Path(sys.executable).with_name("hetflow"))


@pytest.fixture(scope="module")
def cluster():
    # Serve's own tooling on a plain cluster: without hetflow's direct-ingress settings, even if
    # an earlier module of this process left them in the environment (the Serve CLI runs below
    # inherit it; a driver and a cluster that disagree on direct ingress hung `serve run`)
    from hetflow.workloads.serve.front import FAST_ENV

    saved = {key: os.environ.pop(key) for key in list(FAST_ENV) if key in os.environ}
    dashboard = _free_port()
    info = ray.init(address="local", num_cpus=4, include_dashboard=True,
                    dashboard_host="127.0.0.1", dashboard_port=dashboard,
                    _node_ip_address="127.0.0.1", log_to_driver=False)
    yield {"dashboard": f"http://{info.dashboard_url}", "gcs": info.address_info["gcs_address"]}
    subprocess.run([SERVE, "shutdown", "-a", f"http://{info.dashboard_url}", "-y"],
                   capture_output=True, timeout=60)
    ray.shutdown()
    os.environ.update(saved)


@pytest.fixture(scope="module")
def serving_file(digits_model, tmp_path_factory) -> tuple[Path, int]:
    port = _free_port()
    path = tmp_path_factory.mktemp("tooling") / "serving.yaml"
    path.write_text(yaml.safe_dump({
        "name": "tooled",
        "http": {"host": "127.0.0.1", "port": port},
        "limits": {"max_rows": 8},
        "gateway": {"status_poll_s": 0.5},
        "models": [
            {"name": "digits", "train": digits_model.train_dict,
             "checkpoint_dir": str(digits_model.checkpoint_dir), "devices": "cpu",
             "replicas": 1, "cpus_per_replica": 0.5, "fallback": "small"},
            {"name": "small", "weights": "random", "devices": "cpu", "cpus_per_replica": 0.25,
             "train": {"model": {"kind": "mlp", "hidden": [16]}}},
            # generative: under Serve's tooling its completions stream through the gateway,
            # which counts them against its queue limit (gateway.CountedStream)
            {"name": "tinygpt", "weights": "random", "devices": "cpu", "cpus_per_replica": 0.25,
             "batching": {"enabled": False}, "queue_limit": 4,
             "train": {"model": {"kind": "gpt", "layers": 1, "dim": 32, "heads": 2, "seq_len": 16}}},
        ],
    }))
    return path, port


def _rows(n: int = 2) -> list[list[float]]:
    data = load_dataset("digits", val_fraction=0.2, seed=0)
    return data.val.inputs[:n].tolist()


def _status(dashboard: str) -> dict:
    out = subprocess.run([SERVE, "status", "-a", dashboard], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout) or {}


def _wait_running(app: str, timeout_s: float = 180) -> None:
    """Until Serve reports ``app`` RUNNING (read in-process; ``serve status`` is checked
    once after)."""
    from ray import serve

    deadline = time.monotonic() + timeout_s
    state = None
    while time.monotonic() < deadline:
        status = serve.status().applications.get(app)
        state = str(status.status).rsplit(".", 1)[-1] if status is not None else None
        if state == "RUNNING":
            return
        assert state not in ("DEPLOY_FAILED", "UNHEALTHY"), status
        time.sleep(0.5)
    raise AssertionError(f"{app} not RUNNING after {timeout_s}s: {state}")


def _cli_app(dashboard: str, app: str) -> dict:
    status = _status(dashboard)
    apps = status.get("applications") or {}
    assert app in apps, status
    return apps[app]


def test_serve_deploy_of_the_written_config_serves_every_endpoint(cluster, serving_file,
                                                                 tmp_path) -> None:
    path, port = serving_file
    written = subprocess.run([HETFLOW, "serve", str(path), "--serve-config"],
                             capture_output=True, text=True, timeout=120)
    assert written.returncode == 0, written.stderr
    serve_file = tmp_path / "serve.yaml"
    serve_file.write_text(written.stdout)
    document = yaml.safe_load(written.stdout)
    assert document["applications"][0]["import_path"] == "hetflow.serve:app"

    deployed = subprocess.run([SERVE, "deploy", str(serve_file), "-a", cluster["dashboard"]],
                              capture_output=True, text=True, timeout=120)
    assert deployed.returncode == 0, deployed.stderr
    _wait_running("tooled")
    # serve status shows the application with hetflow's deployments
    app = _cli_app(cluster["dashboard"], "tooled")
    assert app["status"] == "RUNNING", app
    assert set(app["deployments"]) == {"tooled.gateway", "tooled.digits", "tooled.small", "tooled.tinygpt"}, app
    assert all(d["status"] == "HEALTHY" for d in app["deployments"].values()), app

    base = f"http://127.0.0.1:{port}"
    rows = _rows()
    answer = requests.post(f"{base}/v1/models/digits/predict", json={"inputs": rows}, timeout=30)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["served_by"] == "digits" and len(body["predictions"]) == len(rows)
    # the model as loaded in-process gives the same classes
    from hetflow.workloads.serve.inference import ReplicaSpec, build_runner

    config = yaml.safe_load(path.read_text())["models"][0]
    runner = build_runner(ReplicaSpec("digits", config["train"], config["checkpoint_dir"],
                                      "fp32", "cpu", 1, None))
    import numpy as np

    expected = runner.split_predict([np.asarray(rows, dtype=np.float32)], [False])[0]
    assert body["predictions"] == expected["predictions"]

    assert requests.get(f"{base}/health", timeout=30).json()["ready"] is True
    assert requests.get(f"{base}/v2/health/ready", timeout=30).status_code == 200
    assert requests.get(f"{base}/v2/models/small/ready", timeout=30).status_code == 200
    v2 = requests.post(f"{base}/v2/models/small/infer", timeout=30, json={"inputs": [
        {"name": "input", "shape": [1, 64], "datatype": "FP32", "data": rows[0]}]})
    assert v2.status_code == 200, v2.text
    # bad input is a 4xx with a message, and the next good request is answered
    bad = requests.post(f"{base}/v1/models/digits/predict", json={"inputs": [[1.0, 2.0]]},
                        timeout=30)
    assert 400 <= bad.status_code < 500 and "error" in bad.json()
    assert requests.post(f"{base}/v1/models/digits/predict", json={"inputs": rows},
                         timeout=30).status_code == 200
    listing = requests.get(f"{base}/v1/models", timeout=30).json()["models"]
    assert set(listing) == {"digits", "small", "tinygpt"} and listing["digits"]["fallback"] == ["small"]
    # streamed completions through the gateway, with the usage chunk, many at once: each is
    # counted from its admission to its end, so none is left counted and the next is answered
    import concurrent.futures as cf

    from openai import OpenAI

    client = OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=30)

    def stream() -> list:
        return list(client.completions.create(model="tinygpt", prompt="hi", max_tokens=6, temperature=0,
                                              stream=True, stream_options={"include_usage": True}))

    chunks = stream()
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    import openai

    with cf.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(stream) for _ in range(8)]
    outcomes = []
    for f in futures:
        try:
            outcomes.append(f.result()[-1].usage.completion_tokens)
        except openai.InternalServerError as exc:  # 503: the queue limit (4) held
            outcomes.append(exc.status_code)
    assert outcomes.count(6) >= 4 and set(outcomes) <= {6, 503}, outcomes
    assert stream()[-1].usage.completion_tokens == 6  # every count released


def test_serve_run_builds_from_the_import_path(cluster, serving_file, tmp_path) -> None:
    path, port = serving_file
    # another cluster is recorded on this machine (as `ray start` records the newest one): the
    # builder runs before `serve run` connects and must join the cluster -a names, not "auto"'s
    # (which joined another test process's cluster, whose end then took `serve run` down)
    env = dict(os.environ, RAY_TMPDIR=str(tmp_path / "elsewhere"))
    Path(env["RAY_TMPDIR"], "ray").mkdir(parents=True)
    Path(env["RAY_TMPDIR"], "ray", "ray_current_cluster").write_text(f"127.0.0.1:{_free_port()}")
    run = subprocess.run([SERVE, "run", "--non-blocking", "-a", cluster["gcs"], "--name", "built",
                          "--route-prefix", "/built", "hetflow.serve:app", f"config={path}"],
                         capture_output=True, text=True, timeout=240, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    _wait_running("built")
    # the same Serve instance (the HTTP options of the first deploy), under its route prefix
    base = f"http://127.0.0.1:{port}/built"
    answer = requests.post(f"{base}/v1/models/digits/predict", json={"inputs": _rows(1)},
                           timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["served_by"] == "digits"
    assert requests.get(f"{base}/health", timeout=30).json()["ready"] is True
    assert requests.get(f"{base}/nope", timeout=30).status_code == 404


def test_the_builder_refuses_bad_args_in_one_line(cluster, tmp_path) -> None:
    run = subprocess.run([SERVE, "run", "--non-blocking", "-a", cluster["gcs"], "--name", "bad",
                          "--route-prefix", "/bad", "hetflow.serve:app", "cfg=x.yaml"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "unknown argument(s) cfg" in run.stderr
