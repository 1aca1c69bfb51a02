"""The gateway as a user runs it: keys made with ``hetflow keys``, ``hetflow serve`` on its
embedded default Ray (node IP not pinned), and the unmodified ``openai`` and ``tritonclient``
clients with and without a key. Auth is on (``auth.mode: keys``) while the front door listens
on loopback only. One model is an upstream provider (a stand-in OpenAI-compatible server in this
process that wants its own key, given to ``hetflow serve`` in an environment variable)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import requests
import yaml

from tests.net import free_port
from tests.procs import named_with_env, nice_of, parent_of
from tests.serving.haproxy_run import serve_in_thread
from tests.serving.serve_run import stop, wait_serving
from tests.serving.test_upstream import SECRET, _Provider

pytestmark = pytest.mark.ray

SCRIPT = Path(sys.executable).with_name("hetflow")
HETFLOW = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "hetflow.cli.main"]


def user_env(keys_dir: Path) -> dict[str, str]:
    # a user's environment: no loopback mode for Ray (the test process's own setting)
    out = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    out["HETFLOW_KEYS_DIR"] = str(keys_dir)
    out["HF_GW_UPSTREAM_KEY"] = SECRET
    return out


def keys(keys_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*HETFLOW, "keys", *args], env=user_env(keys_dir), capture_output=True,
                          text=True, timeout=120)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    root = tmp_path_factory.mktemp("gateway")
    keys_dir = root / "keys"
    port = free_port()
    config = root / "serve.yaml"
    provider = serve_in_thread(_Provider)
    _Provider.healthy, _Provider.seen = True, []
    config.write_text(yaml.safe_dump({
        "name": "gw",
        "upstreams": [{"name": "cloud", "model": "gpt-up", "api_key_env": "HF_GW_UPSTREAM_KEY",
                       "url": f"http://127.0.0.1:{provider.server_address[1]}/prov/v1", "fallback": "cloud2"},
                      {"name": "cloud2", "model": "gpt-up2", "api_key_env": "HF_GW_UPSTREAM_KEY",
                       "url": f"http://127.0.0.1:{provider.server_address[1]}/prov/v1"}],
        # the front door's priority, above its actor's 15, and its real-time policy
        "http": {"port": port, "nice": 5, "realtime": 7},
        "auth": {"mode": "keys"},
        "models": [
            {"name": "digits", "weights": "random", "devices": "cpu", "replicas": 1,
             "cpus_per_replica": 0.5, "batching": {"enabled": False},
             "train": {"model": {"kind": "mlp", "hidden": [16]}}},
            {"name": "tinygpt", "weights": "random", "devices": "cpu", "cpus_per_replica": 0.25,
             "batching": {"enabled": False},
             "train": {"model": {"kind": "gpt", "layers": 1, "dim": 32, "heads": 2, "seq_len": 16}}},
        ],
    }))
    # no key yet: the command refuses to start, with one line, before any Ray starts
    refused = subprocess.run([*HETFLOW, "serve", str(config), "--address", "local"],
                             env=user_env(keys_dir), capture_output=True, text=True, timeout=120)
    made = {}
    for name, flags in [("all", ["--rps", "200"]), ("digits-only", ["--models", "digits"]),
                        ("quota", ["--quota", "3/day"]), ("revoked", [])]:
        out = keys(keys_dir, "create", name, *flags)
        assert out.returncode == 0, out.stderr
        made[name] = out.stdout.strip()
    out_path, err_path = root / "serve.out", root / "serve.err"
    with out_path.open("w") as stdout, err_path.open("w") as stderr:
        proc = subprocess.Popen([*HETFLOW, "serve", str(config), "--address", "local",
                                 "--duration", "600"], env=user_env(keys_dir), stdout=stdout,
                                stderr=stderr)
    try:
        wait_serving(proc, out_path, err_path, "gw", timeout_s=240)
        yield {"url": f"http://127.0.0.1:{port}", "port": port, "keys": made, "dir": keys_dir,
               "refused": refused, "out": out_path, "err": err_path}
    finally:
        stop(proc)
        provider.shutdown()
        provider.server_close()


def test_the_front_door_runs_at_its_configured_cpu_priority(gateway) -> None:
    """``http.nice: 5``: HAProxy (master and worker) at 5, above the nice 15 Ray starts its
    workers - the front door's actor among them - with. ``http.realtime: 7``: every thread of
    master and workers under SCHED_FIFO 7 (the worker running now was forked by a reload: the
    server list filled in after the start), the actor under the ordinary policy; where this machine refuses SCHED_FIFO,
    HAProxy runs as usual."""
    haproxies = named_with_env(b"haproxy", f"HETFLOW_KEYS_DIR={gateway['dir']}")
    assert haproxies
    assert {nice_of(p) for p in haproxies} == {5}
    master = next(p for p in haproxies if parent_of(p) not in haproxies)
    assert nice_of(parent_of(master)) == 15  # the actor that started it: Ray's worker niceness
    allowed = subprocess.run(["chrt", "-f", "7", "true"], capture_output=True).returncode == 0
    threads = [int(t) for p in haproxies for t in os.listdir(f"/proc/{p}/task")]
    assert len(threads) > len(haproxies)  # the workers' threads are counted too
    policies = {(os.sched_getscheduler(t), os.sched_getparam(t).sched_priority) for t in threads}
    assert policies == ({(os.SCHED_FIFO, 7)} if allowed else {(os.SCHED_OTHER, 0)})
    assert os.sched_getscheduler(parent_of(master)) == os.SCHED_OTHER


def test_the_replicas_and_gateway_ports_take_only_what_passed_the_front_door(gateway) -> None:
    """Keys on: a request sent straight to a replica's or the gateway's own port (reachable on a
    non-loopback host) skips the front door's keys and limits, so they refuse it (401, one JSON
    line) - with a client's valid key too; through the front door the same request is answered.
    The deployment's token is in HAProxy's environment, never in its config file."""
    haproxies = named_with_env(b"haproxy", f"HETFLOW_KEYS_DIR={gateway['dir']}")
    cmdline = Path(f"/proc/{haproxies[0]}/cmdline").read_bytes().split(b"\0")
    config = Path(cmdline[cmdline.index(b"-f") + 1].decode()).read_text()
    backends = {}  # backend -> (its first server's address, the path prefix HAProxy puts on)
    for block in config.split("\nbackend ")[1:]:
        name, *rows = block.splitlines()
        prefix = next((r.split()[2].split("%[")[0] for r in rows if "http-request set-path" in r), "")
        backends[name.strip()] = (next((r.split()[2] for r in rows if r.strip().startswith("server ")
                                        and " backup" not in r), None), prefix)
    env = Path(f"/proc/{haproxies[0]}/environ").read_bytes().split(b"\0")
    token = next(e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"HETFLOW_FRONT_TOKEN="))
    assert len(token) >= 32 and token not in config and 'x-hetflow-front "${HETFLOW_FRONT_TOKEN}"' in config
    body = {"inputs": [[0.5] * 64]}
    key = {"Authorization": f"Bearer {gateway['keys']['all']}"}
    for backend, path in (("m_digits", "/v1/models/digits/predict"), ("gateway", "/v1/predict")):
        address, prefix = backends[backend]
        for headers in ({}, key, {**key, "x-hetflow-front": "a-guess"}):
            r = requests.post(f"http://{address}{prefix}{path}", json=body, headers=headers, timeout=30)
            assert r.status_code == 401 and "front door" in r.json()["error"], (address, r.text)
            assert "\n" not in r.text.strip() and token not in r.text
    through = requests.post(gateway["url"] + "/v1/models/digits/predict", json=body, headers=key, timeout=30)
    assert through.status_code == 200, through.text


def test_without_keys_serve_refuses_in_one_line(gateway) -> None:
    refused = gateway["refused"]
    assert refused.returncode == 2
    line = refused.stderr.strip()
    assert "\n" not in line and "hetflow keys create" in line and "auth: {mode: none}" in line


def test_openai_client_needs_a_key(gateway) -> None:
    import openai

    client = openai.OpenAI(base_url=gateway["url"] + "/v1", api_key=gateway["keys"]["all"], max_retries=0)
    done = client.completions.create(model="tinygpt", prompt="hello", max_tokens=4, temperature=0)
    assert done.usage.completion_tokens == 4
    streamed = list(client.completions.create(model="tinygpt", prompt="hi", max_tokens=3, stream=True))
    assert streamed and streamed[-1].choices[0].finish_reason == "length"
    # the front door asked the replica for the stream's usage (to charge it at its end) and
    # took that event out again: this client did not ask for it
    assert all(chunk.choices and chunk.usage is None for chunk in streamed)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=gateway["url"] + "/v1", api_key="hf-wrong", max_retries=0
                      ).completions.create(model="tinygpt", prompt="hi", max_tokens=2)
    with pytest.raises(openai.PermissionDeniedError):
        openai.OpenAI(base_url=gateway["url"] + "/v1", api_key=gateway["keys"]["digits-only"],
                      max_retries=0).completions.create(model="tinygpt", prompt="hi", max_tokens=2)


def test_tritonclient_with_a_key(gateway) -> None:
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    client = httpclient.InferenceServerClient(url=f"127.0.0.1:{gateway['port']}")
    rows = np.random.default_rng(0).random((2, 64), dtype=np.float32)
    tensor = httpclient.InferInput("input", list(rows.shape), "FP32")
    tensor.set_data_from_numpy(rows)
    auth = {"Authorization": f"Bearer {gateway['keys']['digits-only']}"}
    answer = client.infer("digits", [tensor], headers=auth)
    assert answer.as_numpy("predictions").shape == (2,)
    with pytest.raises(InferenceServerException, match="401|API key"):
        client.infer("digits", [tensor])
    assert client.is_server_live()  # health stays open to probes


def test_listing_shows_only_the_keys_models(gateway) -> None:
    url = gateway["url"] + "/v1/models"
    only = requests.get(url, headers={"x-api-key": gateway["keys"]["digits-only"]}, timeout=30)
    every = requests.get(url, headers={"x-api-key": gateway["keys"]["all"]}, timeout=30)
    assert sorted(only.json()["models"]) == ["digits"]
    assert sorted(every.json()["models"]) == ["digits", "tinygpt"]
    assert requests.get(url, timeout=30).status_code == 401


def test_quota_and_revocation_on_the_running_front_door(gateway) -> None:
    url = gateway["url"] + "/v1/models/digits/predict"
    body = {"inputs": [[0.5] * 64]}

    def call(name: str) -> requests.Response:
        return requests.post(url, json=body, headers={"Authorization": f"Bearer {gateway['keys'][name]}"},
                             timeout=30)

    assert call("revoked").status_code == 200
    revoked = keys(gateway["dir"], "revoke", "revoked")
    assert revoked.returncode == 0, revoked.stderr
    gone = time.monotonic()
    while call("revoked").status_code == 200:
        assert time.monotonic() - gone < 5, "a revoked key still works after 5 s"
        time.sleep(0.05)
    assert call("revoked").status_code == 401
    codes = [call("quota").status_code for _ in range(3)]
    assert codes == [200, 200, 200]
    r = call("quota")  # the 4th of 3 a day, at once (HAProxy holds the threshold)
    assert r.status_code == 429 and int(r.headers["Retry-After"]) > 0
    deadline = time.monotonic() + 10
    while True:  # the front door's next poll writes the usage
        usage = json.loads(keys(gateway["dir"], "usage", "quota", "--json").stdout)["usage"]["quota"]
        if usage or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert usage and max(c["requests"] for c in usage.values()) == 3


def test_an_upstream_provider_is_a_model_behind_the_same_key(gateway) -> None:
    import openai

    client = openai.OpenAI(base_url=gateway["url"] + "/v1", api_key=gateway["keys"]["all"], max_retries=0)
    out = client.chat.completions.create(model="cloud", messages=[{"role": "user", "content": "hi"}])
    assert out.choices[0].message.content == "from upstream"
    sent = _Provider.seen[-1]
    assert sent["body"]["model"] == "gpt-up" and sent["headers"]["authorization"] == f"Bearer {SECRET}"
    with pytest.raises(openai.PermissionDeniedError):  # a key for digits only may not use it
        openai.OpenAI(base_url=gateway["url"] + "/v1", api_key=gateway["keys"]["digits-only"],
                      max_retries=0).chat.completions.create(model="cloud", messages=[])
    r = requests.get(gateway["url"] + "/metrics", headers={"x-api-key": gateway["keys"]["all"]}, timeout=30)
    lines = [ln for ln in r.text.splitlines() if ln.startswith('hetflow_upstream_requests_total{upstream="cloud"}')]
    assert lines and float(lines[0].split()[-1]) >= 1
    assert SECRET not in r.text and SECRET not in gateway["out"].read_text() + gateway["err"].read_text()
    # `hetflow top` on the cluster `hetflow serve` names (an `auto` lookup scans this machine's
    # Ray processes: on CI another test process's cluster runs too, and it found that one) shows it
    line = re.search(r"Ray cluster \S+: (RAY_AUTH_MODE=token )?hetflow top --address (\S+)",
                     gateway["out"].read_text())
    assert line, gateway["out"].read_text()[-2000:]
    env = {**user_env(gateway["dir"]), **({"RAY_AUTH_MODE": "token"} if line.group(1) else {})}
    top = subprocess.run([*HETFLOW, "top", "--once", "--json", "--no-start", "--address", line.group(2)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert top.returncode == 0, top.stderr
    rows = json.loads(top.stdout)["upstreams"]
    cloud = [r for r in rows if r["app"] == "gw" and r["upstream"] == "cloud"]
    assert cloud and cloud[0]["up"] and cloud[0]["requests"] >= 1 and cloud[0]["errors"] == 0
    assert cloud[0]["fallback"] == "cloud2"  # its own fallback, while it is out
    assert SECRET not in top.stdout + top.stderr


def test_key_counters_and_no_key_material_anywhere(gateway) -> None:
    all_key = gateway["keys"]["all"]
    r = requests.get(gateway["url"] + "/metrics", headers={"x-api-key": all_key}, timeout=30)
    assert r.status_code == 200
    lines = [ln for ln in r.text.splitlines() if ln.startswith('hetflow_key_requests_total{key="all"}')]
    assert lines and float(lines[0].split()[-1]) >= 1
    listing = keys(gateway["dir"], "list")
    texts = [r.text, listing.stdout, listing.stderr, gateway["out"].read_text(), gateway["err"].read_text(),
             json.dumps(keys(gateway["dir"], "list", "--json").stdout)]
    bad = requests.post(gateway["url"] + "/v1/models/digits/predict", data=b"{",
                        headers={"Authorization": f"Bearer {all_key}"}, timeout=30)
    texts.append(bad.text)
    for key in gateway["keys"].values():
        for text in texts:
            assert key not in text and key[3:] not in text
    for path in Path(gateway["dir"]).iterdir():
        assert not any(key.encode() in path.read_bytes() for key in gateway["keys"].values())
