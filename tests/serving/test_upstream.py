"""Upstream providers at the front door: the real HAProxy with the config hetflow renders, in
front of a small HTTP server standing in for the local replicas and the gateway, and another
standing in for an external provider (an OpenAI-compatible and KServe v2 API that checks its
own key; no external provider is reachable from here). The unmodified `openai` client talks to
the front door. No Ray: `hetflow serve` passes the same plan to the front door actor."""

from __future__ import annotations

import http.client
import http.server
import json
import os
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hetflow.core.errors import InputError
from hetflow.workloads.serve import upstream as up
from hetflow.workloads.serve.config import serve_config_from_dict, upstream_chain, upstream_fallback
from hetflow.workloads.serve.front import (
    FrontPlan,
    Server,
    admin_call,
    haproxy_binary,
    render_config,
    write_error_files,
)
from tests.net import free_port
from tests.serving.haproxy_run import (
    POLL_S,
    PROVIDER_KEY,
    OpenAIProvider,
    StandIn,
    listening,
    serve_in_thread,
    start_haproxy,
    stop_all,
)

SECRET = "sk-upstream-test-secret-0123456789"


class _Local(StandIn):
    """The local replicas and gateway: answers {"by": "local"} (slowly for slow paths)."""

    delay_s = 0.0

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        if self.command == "POST":
            time.sleep(type(self).delay_s)
        self.send_json(200, {"by": "local", "path": self.path})

    do_GET = do_POST = _answer


class _Provider(StandIn):
    """An external OpenAI-compatible + KServe v2 provider that wants its own key."""

    healthy = True
    seen: list[dict] = []

    def _send(self, code: int, payload: dict) -> None:
        # a provider must not charge hetflow keys
        self.send_json(code, payload, {"x-hetflow-tokens": "999999"})

    def do_GET(self) -> None:
        ok = self.headers.get("authorization") == f"Bearer {SECRET}"
        if not type(self).healthy:
            return self._send(500, {"error": "down"})
        if self.path in ("/prov/v1/models", "/kserve/v2/health/ready"):
            return self._send(200 if ok else 401, {"data": [{"id": "gpt-up"}]})
        self._send(404, {"error": self.path})

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        body = json.loads(raw or b"{}")
        type(self).seen.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()},
                                "body": body, "raw": raw})
        if self.headers.get("authorization") != f"Bearer {SECRET}":
            return self._send(401, {"error": "bad upstream key"})
        if self.path == "/prov/v1/chat/completions" and body.get("stream"):
            self.send_events([{"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": body.get("model"),
                               "choices": [{"index": 0, "delta": {"content": "from upstream"},
                                            "finish_reason": "stop"}]}])
            return None
        if self.path == "/prov/v1/chat/completions":
            return self._send(200, {
                "id": "c1", "object": "chat.completion", "created": 1, "model": body.get("model"),
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "from upstream"}}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})
        if self.path.startswith("/kserve/v2/models/"):
            return self._send(200, {"model_name": self.path.split("/")[4], "outputs": []})
        self._send(404, {"error": self.path})


CONFIG = {
    "models": [{"name": "digits", "train": {"model": {"kind": "mlp"}}, "fallback": "cloud-kserve"},
               {"name": "chat", "train": {"model": {"kind": "mlp"}}, "fallback": "cloud"}],
    "upstreams": [
        {"name": "cloud", "url": "http://127.0.0.1:{port}/prov/v1", "model": "gpt-up",
         "api_key_env": "HF_TEST_UPSTREAM_KEY", "check_interval_s": 0.2},
        {"name": "cloud-kserve", "url": "http://127.0.0.1:{port}/kserve", "protocol": "kserve-v2",
         "model": "resnet-up", "api_key_env": "HF_TEST_UPSTREAM_KEY", "check_interval_s": 0.2},
    ],
}


def _config(port: int):
    text = json.dumps(CONFIG).replace("{port}", str(port))
    return serve_config_from_dict(json.loads(text), source="test")


class Front:
    def __init__(self, root: Path, queue_limit: int = 0) -> None:
        _Provider.healthy = True
        _Provider.seen = []
        _Local.delay_s = 0.0
        self.local = serve_in_thread(_Local)
        self.provider = serve_in_thread(_Provider)
        config = _config(self.provider.server_address[1])
        self.port = free_port()
        lp = self.local.server_address[1]
        self.plan = FrontPlan(
            app="t", host="127.0.0.1", port=self.port,
            models={"digits": ["t.digits"], "chat": ["t.chat"]}, gateway_app="t",
            request_timeout_s=5, retries=1, max_body_bytes=1 << 20, check_inter_ms=200,
            queue_limits={"digits": queue_limit, "chat": queue_limit},
            upstreams=up.plan_upstreams(config.upstreams),
            upstream_fallbacks={n: upstream_fallback(config, n) for n in ("digits", "chat")},
            default_model="digits")
        self.admin = str(root / "admin.sock")
        self.servers = {"t.digits": [Server("r1", "127.0.0.1", lp)], "t.chat": [Server("r2", "127.0.0.1", lp)],
                        "t": [Server("g1", "127.0.0.1", lp)]}
        lua = up.write_lua(str(root))
        errors = write_error_files(self.plan, str(root))  # hetflow's one-line JSON errors
        self.config_text = render_config(self.plan, self.servers, self.admin, errors, None, "", lua)
        env = {**os.environ, **up.upstream_secrets(config.upstreams, {"HF_TEST_UPSTREAM_KEY": SECRET})}
        self.proc, self.log = start_haproxy(root, self.config_text, lambda: listening(self.port), env)
        self.wait_upstreams(True)

    def stats(self) -> dict:
        return up.read_upstream_stats(admin_call(self.admin, "show stat"))

    def wait_upstreams(self, want_up: bool, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while True:
            st = self.stats()
            if st and all(v["up"] == want_up for v in st.values()):
                return
            assert time.monotonic() < deadline, (st, self.log.read_text())
            time.sleep(0.05)

    def call(self, path: str, body: dict | bytes, headers: dict | None = None) -> tuple[int, dict]:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        conn.request("POST", path, raw, {"content-type": "application/json", **(headers or {})})
        r = conn.getresponse()
        data = r.read()
        try:
            out = r.status, json.loads(data or b"{}")
        except ValueError:
            out = r.status, {"raw": data.decode(errors="replace")}
        headers_out = {k.lower(): v for k, v in r.getheaders()}
        conn.close()
        self.last_headers = headers_out
        return out

    def close(self) -> None:
        stop_all(self.proc, [self.local, self.provider])


@pytest.fixture
def front(tmp_path):
    f = Front(tmp_path)
    yield f
    f.close()


def test_the_openai_client_calls_an_upstream_by_name_and_the_provider_sees_its_own_key(front):
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{front.port}/v1", api_key="hf-client-key",
                           max_retries=0)
    out = client.chat.completions.create(model="cloud", messages=[{"role": "user", "content": "hi"}])
    assert out.choices[0].message.content == "from upstream"
    seen = _Provider.seen[-1]
    assert seen["path"] == "/prov/v1/chat/completions"
    assert seen["body"]["model"] == "gpt-up"  # renamed to the provider's own name
    assert seen["body"]["messages"] == [{"role": "user", "content": "hi"}]
    assert seen["headers"]["authorization"] == f"Bearer {SECRET}"  # not the client's key
    assert seen["headers"]["host"] == f"127.0.0.1:{front.provider.server_address[1]}"
    assert not any(h.startswith("x-hetflow") for h in seen["headers"])
    # the answer's usage is what a key is charged (the provider's own header is dropped) ...
    front.call("/v1/chat/completions", {"model": "cloud", "messages": [], "max_tokens": 7})
    assert front.last_headers.get("x-hetflow-tokens") == "5"
    # ... and a streamed answer, whose usage comes last, is charged its max_tokens up front
    front.call("/v1/chat/completions", {"model": "cloud", "messages": [], "max_tokens": 7, "stream": True})
    assert front.last_headers.get("x-hetflow-tokens") == "7"


def test_the_key_is_never_in_the_config_file(front):
    assert SECRET not in front.config_text
    assert "${HETFLOW_UPSTREAM_KEY_" in front.config_text


def test_a_local_model_falls_back_to_its_upstream_only_while_no_replica_is_up(front):
    status, body = front.call("/v1/chat/completions", {"model": "chat", "messages": []})
    assert status == 200 and body["by"] == "local"
    status, body = front.call("/v2/models/digits/infer", {"inputs": []})
    assert status == 200 and body["by"] == "local"
    front.local.shutdown()
    front.local.server_close()  # every local replica gone

    def eventually(path: str, body: dict, key: str, want: str) -> None:
        deadline = time.monotonic() + 10  # until the health checks mark the replica down
        while True:
            status, out = front.call(path, body)
            if status == 200 and out.get(key) == want:
                return
            assert time.monotonic() < deadline, (status, out)
            time.sleep(0.1)

    eventually("/v1/chat/completions", {"model": "chat", "messages": []}, "model", "gpt-up")
    assert _Provider.seen[-1]["body"]["model"] == "gpt-up"
    eventually("/v2/models/digits/infer", {"inputs": []}, "model_name", "resnet-up")
    assert _Provider.seen[-1]["path"] == "/kserve/v2/models/resnet-up/infer"


def test_past_its_queue_limit_a_model_sends_the_overflow_to_its_upstream(tmp_path):
    f = Front(tmp_path, queue_limit=1)
    try:
        _Local.delay_s = 0.5
        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(lambda _: f.call("/v2/models/digits/infer", {"inputs": []}), range(6)))
        by = [("local" if b.get("by") == "local" else b.get("model_name")) for s, b in answers]
        assert all(s == 200 for s, _ in answers), answers
        assert "local" in by and "resnet-up" in by, by  # admitted locally, the rest upstream
    finally:
        f.close()


def test_an_unhealthy_upstream_is_taken_out_and_brought_back(front):
    _Provider.healthy = False
    front.wait_upstreams(False)
    status, body = front.call("/v1/chat/completions", {"model": "cloud", "messages": []})
    assert status == 503 and "error" in body
    _Provider.healthy = True
    front.wait_upstreams(True)
    status, body = front.call("/v1/chat/completions", {"model": "cloud", "messages": []})
    assert status == 200 and body["model"] == "gpt-up"
    st = front.stats()["u_cloud"]
    assert st["requests"] >= 1 and st["up"]


def test_an_upstream_gets_only_its_own_protocol(front):
    # a KServe path naming the OpenAI upstream is not sent there
    front.call("/v2/models/cloud/infer", {"inputs": []})
    assert all(s["path"] != "/v2/models/cloud/infer" for s in _Provider.seen)
    assert not any("/kserve/" in s["path"] and "cloud" in s["path"].split("/")[4:5] for s in _Provider.seen)


def test_a_body_too_big_to_rename_is_refused_in_one_line_and_the_own_name_passes(front):
    big = {"model": "cloud", "messages": [{"role": "user", "content": "x" * 40000}]}
    status, body = front.call("/v1/chat/completions", big)
    assert status == 413 and "upstream" in body["error"]
    assert not any(len(s["raw"]) > 40000 for s in _Provider.seen)  # nothing was sent
    status, body = front.call("/v1/chat/completions", {**big, "model": "gpt-up"})
    # the provider's own name needs no rename; it is not a model of this front door, so
    # the gateway (the stand-in) answers it
    assert status == 200


def test_the_model_rewrite_touches_only_the_top_level_model(front):
    body = (b'{"messages": [{"role": "user", "content": "say \\"model\\": \\"x\\"", "model": "inner"}],'
            b' "model" : "cloud", "n": 1}')
    status, out = front.call("/v1/chat/completions", body)
    assert status == 200
    sent = _Provider.seen[-1]
    assert sent["body"]["model"] == "gpt-up"
    assert sent["body"]["messages"][0] == {"role": "user", "content": 'say "model": "x"', "model": "inner"}
    assert sent["body"]["n"] == 1


def test_upstream_config_errors_are_one_line():
    with pytest.raises(Exception, match="url must be http"):
        serve_config_from_dict({"models": [{"name": "m", "train": {"model": {"kind": "mlp"}}}],
                                "upstreams": [{"name": "u", "url": "ftp://x"}]}, source="t")
    with pytest.raises(Exception, match="unique"):
        serve_config_from_dict({"models": [{"name": "m", "train": {"model": {"kind": "mlp"}}}],
                                "upstreams": [{"name": "m", "url": "http://x"}]}, source="t")
    with pytest.raises(Exception, match="not a model or upstream"):
        serve_config_from_dict({"models": [{"name": "m", "train": {"model": {"kind": "mlp"}},
                                            "fallback": "nope"}]}, source="t")
    config = _config(1)
    with pytest.raises(InputError, match="HF_TEST_UPSTREAM_KEY"):
        up.upstream_secrets(config.upstreams, {})


class Chain:
    """Local model ``chat`` -> upstream ``cloud`` (provider A, model gpt-a) -> its fallback
    ``cloud2`` (provider B, gpt-b): the real HAProxy in front of stand-ins."""

    def __init__(self, root: Path) -> None:
        self.a = type("A", (OpenAIProvider,), {"seen": []})
        self.b = type("B", (OpenAIProvider,), {"seen": []})
        self.local, self.servers = serve_in_thread(_Local), [serve_in_thread(self.a), serve_in_thread(self.b)]
        (pa, pb), lp = (s.server_address[1] for s in self.servers), self.local.server_address[1]
        config = serve_config_from_dict({
            "models": [{"name": "chat", "train": {"model": {"kind": "mlp"}}, "fallback": "cloud"}],
            "upstreams": [
                {"name": "cloud", "url": f"http://127.0.0.1:{pa}/prov/v1", "model": "gpt-a",
                 "api_key_env": "HF_TEST_KEY", "check_interval_s": 0.2, "fallback": "cloud2"},
                {"name": "cloud2", "url": f"http://127.0.0.1:{pb}/prov/v1", "model": "gpt-b",
                 "api_key_env": "HF_TEST_KEY", "check_interval_s": 0.2}]}, source="test")
        self.port = free_port()
        plan = FrontPlan(
            app="t", host="127.0.0.1", port=self.port, models={"chat": ["t.chat"]}, gateway_app="t",
            request_timeout_s=5, retries=1, max_body_bytes=1 << 20, check_inter_ms=200,
            upstreams=up.plan_upstreams(config.upstreams),
            upstream_fallbacks={"chat": upstream_fallback(config, "chat")},
            upstream_chains={"cloud": tuple(upstream_chain(config, "cloud")[1:])})
        self.admin = str(root / "admin.sock")
        self.config_text = render_config(plan, {"t.chat": [Server("r1", "127.0.0.1", lp)],
                                                "t": [Server("g1", "127.0.0.1", lp)]},
                                         self.admin, write_error_files(plan, str(root)), None, "",
                                         up.write_lua(str(root)))
        env = {**os.environ, **up.upstream_secrets(config.upstreams, {"HF_TEST_KEY": PROVIDER_KEY})}
        self.proc, self.log = start_haproxy(root, self.config_text, lambda: listening(self.port), env)
        self.wait_up("u_cloud", True)
        self.wait_up("u_cloud2", True)

    def wait_up(self, backend: str, want: bool, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while (st := up.read_upstream_stats(admin_call(self.admin, "show stat")).get(backend, {})).get("up") != want:
            assert time.monotonic() < deadline, (backend, st, self.log.read_text())
            time.sleep(0.05)

    def chat(self, model: str) -> tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        conn.request("POST", "/v1/chat/completions", json.dumps({"model": model, "messages": []}),
                     {"content-type": "application/json"})
        r = conn.getresponse()
        body = json.loads(r.read() or b"{}")
        conn.close()
        return r.status, body.get("by", "")

    def close(self) -> None:
        stop_all(self.proc, [self.local, *self.servers])


@pytest.fixture
def chain(tmp_path):
    c = Chain(tmp_path)
    yield c
    c.close()


def test_an_upstream_that_is_out_sends_its_requests_and_its_models_along_its_fallback(chain):
    assert chain.chat("cloud") == (200, "upstream:gpt-a")
    assert chain.chat("chat") == (200, "local")  # the local replica
    chain.a.health_status = 500  # provider A fails its checks: out
    chain.wait_up("u_cloud", False)
    assert chain.chat("cloud") == (200, "upstream:gpt-b")  # renamed to B's model, B's key
    assert chain.b.seen[-1]["body"]["model"] == "gpt-b"
    assert chain.b.seen[-1]["authorization"] == f"Bearer {PROVIDER_KEY}"
    chain.local.shutdown()
    chain.local.server_close()  # the local model's replicas gone too: chat -> cloud (out) -> cloud2
    deadline = time.monotonic() + 10
    while (answer := chain.chat("chat")) != (200, "upstream:gpt-b"):
        assert time.monotonic() < deadline, answer
        time.sleep(0.1)
    chain.a.health_status = 200
    chain.wait_up("u_cloud", True)
    assert chain.chat("chat") == (200, "upstream:gpt-a") and chain.chat("cloud") == (200, "upstream:gpt-a")


def test_an_upstream_answering_5xx_in_a_row_is_taken_out_at_once_and_comes_back(chain):
    chain.a.post_status = 502  # its model list still answers: only its answers say it is failing
    answers = [chain.chat("cloud") for _ in range(up.ERROR_LIMIT + 4)]
    assert answers[:up.ERROR_LIMIT] == [(502, "")] * up.ERROR_LIMIT, answers
    # out at once: B answers (HAProxy applies a server's new state in its next loop, so on a
    # loaded machine one more request may reach A first)
    assert answers.count((502, "")) <= up.ERROR_LIMIT + 1, answers
    assert answers[-3:] == [(200, "upstream:gpt-b")] * 3, answers
    chain.a.post_status = 200
    chain.wait_up("u_cloud", True)  # its checks bring it back
    assert chain.chat("cloud") == (200, "upstream:gpt-a")


@pytest.mark.parametrize("upstreams, words", [
    ([{"name": "u", "url": "http://x", "fallback": "u"}], "upstream u cannot be its own fallback"),
    ([{"name": "u", "url": "http://x", "fallback": "m"}], "upstream u: fallback 'm' is not an upstream"),
    ([{"name": "u", "url": "http://x", "fallback": "k"},
      {"name": "k", "url": "http://y", "protocol": "kserve-v2"}], "fallback 'k' speaks kserve-v2, u openai"),
    ([{"name": "u", "url": "http://x", "fallback": "v"}, {"name": "v", "url": "http://y", "fallback": "u"}],
     "upstream fallbacks form a cycle: u -> v -> u"),
])
def test_an_upstream_fallback_that_cannot_be_is_one_line(upstreams, words):
    with pytest.raises(InputError) as err:
        serve_config_from_dict({"models": [{"name": "m", "train": {"model": {"kind": "mlp"}}}],
                                "upstreams": upstreams}, source="t")
    assert words in str(err.value) and "\n" not in str(err.value).strip()


def _self_signed(root: Path) -> tuple[Path, Path]:
    """A certificate for ``localhost`` (and its key), made here: the test's own CA."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = root / "cert.pem", root / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def _tls_front(root: Path, provider_port: int, ca_file: Path) -> tuple[subprocess.Popen, int]:
    config = serve_config_from_dict({
        "models": [{"name": "m", "train": {"model": {"kind": "mlp"}}}],
        "upstreams": [{"name": "secure", "url": f"https://localhost:{provider_port}/prov/v1",
                       "model": "gpt-up", "api_key_env": "K", "check_interval_s": 0.2,
                       "ca_file": str(ca_file)}]}, source="test")
    port = free_port()
    plan = FrontPlan(app="t", host="127.0.0.1", port=port, models={"m": ["t.m"]}, gateway_app="t",
                     request_timeout_s=5, retries=1, max_body_bytes=1 << 20,
                     upstreams=up.plan_upstreams(config.upstreams), default_model="m")
    text = render_config(plan, {}, str(root / "admin.sock"), write_error_files(plan, str(root)), None, "",
                         up.write_lua(str(root)))
    (root / "haproxy.cfg").write_text(text)
    env = {**os.environ, **up.upstream_secrets(config.upstreams, {"K": SECRET})}
    proc = subprocess.Popen([haproxy_binary(), "-W", "-db", "-f", str(root / "haproxy.cfg")],
                            stdout=subprocess.DEVNULL, stderr=(root / "haproxy.log").open("wb"), env=env)
    return proc, port


def _wait_status(root: Path, want_up: bool, timeout: float = 10) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        try:
            st = up.read_upstream_stats(admin_call(str(root / "admin.sock"), "show stat")).get("u_secure")
        except OSError:
            st = None
        if st is not None and st["up"] == want_up:
            return st
        assert time.monotonic() < deadline, (st, (root / "haproxy.log").read_text())
        time.sleep(0.05)


def test_an_https_upstream_is_verified_against_its_ca(tmp_path):
    import ssl

    import openai

    cert, key = _self_signed(tmp_path)
    provider = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Provider)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    provider.socket = context.wrap_socket(provider.socket, server_side=True)
    threading.Thread(target=provider.serve_forever, kwargs={"poll_interval": POLL_S}, daemon=True).start()
    _Provider.healthy, _Provider.seen = True, []
    good, bad = tmp_path / "good", tmp_path / "bad"
    good.mkdir()
    bad.mkdir()
    other, _ = _self_signed(bad)  # a CA that did not sign the provider's certificate
    procs = []
    try:
        proc, port = _tls_front(good, provider.server_address[1], cert)
        procs.append(proc)
        _wait_status(good, True)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0)
        out = client.chat.completions.create(model="secure", messages=[{"role": "user", "content": "hi"}])
        assert out.choices[0].message.content == "from upstream"
        assert _Provider.seen[-1]["headers"]["authorization"] == f"Bearer {SECRET}"
        proc, _ = _tls_front(bad, provider.server_address[1], other)
        procs.append(proc)
        time.sleep(1.5)  # several checks: none may pass against the wrong CA
        assert _wait_status(bad, False)["up"] is False
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)
        provider.shutdown()
        provider.server_close()
