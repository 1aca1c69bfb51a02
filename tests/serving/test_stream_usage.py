"""A streamed completion's real usage charged to its key when the stream ends
(workloads/serve/stream_usage.py): the real HAProxy with the config hetflow renders (keys on, a
generative model), in front of a small HTTP server that streams OpenAI-shaped server-sent
events as the replicas do - its usage event split across two writes - and says what it was
sent. Every request is real HTTP on loopback; the key's counter is read from HAProxy's own
stick table."""

from __future__ import annotations

import http.client
import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from hetflow.workloads.serve import access as acc
from hetflow.workloads.serve import keys as K
from hetflow.workloads.serve import upstream as up
from hetflow.workloads.serve.access import KeyState
from hetflow.workloads.serve.front import FrontPlan, Server, admin_call, render_config
from tests.net import free_port
from tests.serving.haproxy_run import StandIn, listening, serve_in_thread, start_haproxy

BOUND = 50  # what the stand-in says a stream may use (prompt + max_tokens), as the replicas do
USAGE = {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}


class _Streamer(StandIn):
    seen: list[dict] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)) or b"{}")
        type(self).seen.append(body)
        if not body.get("stream"):
            self.send_json(200, {"choices": [{"text": "whole"}], "usage": USAGE},
                           {acc.TOKENS_HEADER: str(USAGE["total_tokens"])})
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.send_header(acc.TOKENS_HEADER, str(BOUND))
        self.end_headers()
        usage = (body.get("stream_options") or {}).get("include_usage")

        def send(text: str) -> None:
            data = text.encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        try:
            for i in range(5):
                send("data: " + json.dumps({"choices": [{"text": f"t{i}", "index": 0}],
                                            **({"usage": None} if usage else {})}) + "\n\n")
                time.sleep(body.get("pause", 0.01))
            if usage:
                event = "data: " + json.dumps({"id": "c", "choices": [], "usage": USAGE}) + "\n\n"
                send(event[:25])
                time.sleep(0.05)
                send(event[25:])
            send("data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
        except ConnectionError:
            pass

    def do_GET(self) -> None:  # health checks
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()


@contextmanager
def started(root: Path, upstreams: tuple = (), **plan: Any) -> Iterator[dict]:
    """The stand-in server, a key ``team-a``, and HAProxy with the config hetflow renders for a
    keyed plan (``plan``: FrontPlan's model fields; ``upstreams``: UpstreamConfig fields of
    providers at the stand-in, their ``url`` a format with ``{port}``)."""
    server = serve_in_thread(_Streamer)
    _Streamer.seen = []
    backend = server.server_address[1]
    store = K.DirectoryKeyStore(root / "store")
    store.salt(create=True)
    key = K.create_key(store, "team-a")
    port = free_port()
    from hetflow.workloads.serve.config import UpstreamConfig

    ups = [UpstreamConfig(**{**u, "url": u["url"].format(port=backend)}) for u in upstreams]
    front_plan = FrontPlan(app="t", host="127.0.0.1", port=port, gateway_app="t",
                           request_timeout_s=5, retries=1, max_body_bytes=1 << 20,
                           access=acc.AccessPlan(store=str(store.where), default_model=plan.pop("default_model", None)),
                           upstreams=up.plan_upstreams(ups), **plan)
    admin = str(root / "admin.sock")
    keys = KeyState(front_plan.access, str(root / "maps"))
    servers = {app: [Server("r1", "127.0.0.1", backend)] for apps in front_plan.models.values() for app in apps}
    config = render_config(front_plan, {**servers, "t": [Server("g1", "127.0.0.1", backend)]},
                           admin, None, str(root / "maps"), keys.salt, up.write_lua(str(root)))
    proc, log = start_haproxy(root, config, lambda: listening(port))
    try:
        keys.refresh(lambda c: admin_call(admin, c))
        yield {"port": port, "key": key, "admin": admin, "log": log, "config": config}
    finally:
        proc.terminate()
        proc.wait(10)
        server.shutdown()
        server.server_close()


@pytest.fixture()
def front(tmp_path):
    with started(tmp_path, models={"gen": ["t.gen"]}, generative=frozenset({"gen"}),
                 default_model="gen") as f:
        yield f


def charged(front) -> int:
    text = admin_call(front["admin"], f"show table {acc.TOKENS_TABLE}")
    found = re.search(r"key=team-a .*?gpc0=(\d+)", text)
    return int(found.group(1)) if found else 0


def settled(front, want: int, timeout: float = 5) -> int:
    """The key's counter once it reached ``want`` (a charge lands just after the stream)."""
    deadline = time.monotonic() + timeout
    while charged(front) < want and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)  # and nothing more comes after it
    return charged(front)


def stream(front, body: dict, read_all: bool = True) -> list[str]:
    conn = http.client.HTTPConnection("127.0.0.1", front["port"], timeout=10)
    data = json.dumps(body).encode()
    conn.request("POST", "/v1/completions", data, {"Authorization": f"Bearer {front['key']}",
                                                   "content-type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200 and r.getheader(acc.TOKENS_HEADER) is None
    if not read_all:
        first = r.read(10)
        conn.close()
        return [first.decode()]
    events = [e for e in r.read().decode().split("\n\n") if e]
    conn.close()
    return events


def test_a_stream_is_charged_its_usage_at_its_end_and_the_client_asked_for_it_sees_it(front) -> None:
    events = stream(front, {"model": "gen", "prompt": "x", "stream": True, "max_tokens": 45,
                            "stream_options": {"include_usage": True}})
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][len("data: "):])["usage"] == USAGE  # as the server sent it
    assert _Streamer.seen[-1]["stream_options"] == {"include_usage": True}
    assert settled(front, 8) == 8  # its usage, not the bound of 50


def test_a_stream_whose_client_did_not_ask_is_charged_its_usage_and_sees_none(front) -> None:
    events = stream(front, {"model": "gen", "prompt": "x", "stream": True, "max_tokens": 45})
    assert _Streamer.seen[-1]["stream_options"] == {"include_usage": True}  # asked for the front door
    assert _Streamer.seen[-1]["max_tokens"] == 45 and _Streamer.seen[-1]["prompt"] == "x"
    assert events[-1] == "data: [DONE]" and len(events) == 6  # 5 pieces, [DONE]: no usage event
    assert [json.loads(e[len("data: "):])["choices"][0]["text"] for e in events[:-1]] == \
        [f"t{i}" for i in range(5)]
    # (its pieces carry "usage": null, as a stream with usage asked for has them)
    assert not any(json.loads(e[len("data: "):]).get("usage") for e in events[:-1])
    assert settled(front, 8) == 8


def test_a_stream_without_usage_is_charged_what_it_could_use(front) -> None:
    # the client's own stream_options stand (include_usage false: no usage event to read)
    events = stream(front, {"model": "gen", "prompt": "x", "stream": True,
                            "stream_options": {"include_usage": False}})
    assert _Streamer.seen[-1]["stream_options"] == {"include_usage": False}
    assert len(events) == 6
    assert settled(front, BOUND) == BOUND


def test_a_client_that_leaves_mid_stream_is_charged_once_the_stream_ends(front) -> None:
    first = stream(front, {"model": "gen", "prompt": "x", "stream": True, "pause": 0.3},
                   read_all=False)
    assert first[0].startswith("data: ")
    assert settled(front, BOUND, timeout=10) == BOUND  # no usage seen: the bound, once


def test_whole_answers_are_charged_as_before_and_streams_add_to_them(front) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", front["port"], timeout=10)
    conn.request("POST", "/v1/completions", json.dumps({"model": "gen", "prompt": "x"}),
                 {"Authorization": f"Bearer {front['key']}"})
    r = conn.getresponse()
    assert r.status == 200 and json.loads(r.read())["usage"] == USAGE
    conn.close()
    assert settled(front, 8) == 8
    stream(front, {"model": "gen", "prompt": "x", "stream": True})
    assert settled(front, 16) == 16
    assert "stream_options" not in _Streamer.seen[0]  # a whole answer's body is left alone


def _sections(config: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    name = ""
    for line in config.splitlines():
        if line and not line.startswith(" "):
            name = line.strip()
            out[name] = []
        elif name:
            out[name].append(line.strip())
    return out


def test_the_filter_is_where_streams_pass_and_only_with_keys(tmp_path) -> None:
    store = K.DirectoryKeyStore(tmp_path / "store")
    store.salt(create=True)
    base = dict(app="t", host="127.0.0.1", port=8000, gateway_app="t", request_timeout_s=5,
                retries=1, max_body_bytes=1 << 20,
                models={"gen": ["t.gen"], "auto-gen": ["t.auto-gen"], "digits": ["t.digits"]},
                generative=frozenset({"gen", "auto-gen"}))
    servers = {"t.gen": [Server("r1", "127.0.0.1", 9001)], "t": [Server("g1", "127.0.0.1", 9000)]}
    access = acc.AccessPlan(store=str(store.where), default_model="gen")
    lua = up.write_lua(str(tmp_path))
    keyed = _sections(render_config(FrontPlan(**base, access=access, via_gateway=frozenset({"auto-gen"})),
                                     servers, "/tmp/a.sock", None, str(tmp_path / "maps"), "s", lua))
    filt = "filter lua.hetflow_usage"
    assert filt in keyed["backend m_gen"] and filt not in keyed["backend m_digits"]
    assert filt in keyed["backend gateway"]  # auto-gen's completions go through the gateway
    assert f"bind unix@{tmp_path}/charge.sock mode 600" in keyed["frontend hetflow_charge"]
    assert f"lua-load {lua}" in keyed["global"]
    # no generative model behind the gateway: the gateway's requests pass no filter
    direct = _sections(render_config(FrontPlan(**base, access=access), servers, "/tmp/a.sock",
                                     None, str(tmp_path / "maps"), "s", lua))
    assert filt not in direct["backend gateway"] and filt in direct["backend m_auto-gen"]
    # keys off: nothing to charge, no filter, no Lua, no charging frontend
    open_ = render_config(FrontPlan(**base), servers, "/tmp/a.sock")
    assert "hetflow_usage" not in open_ and "lua-load" not in open_ and "hetflow_charge" not in open_


def test_an_openai_upstreams_stream_is_charged_its_usage_too(tmp_path) -> None:
    """An external OpenAI-compatible provider (``upstreams:``) streams through the same
    filter: the key is charged the stream's usage at its end, and the provider got the usage
    request (with its own model name)."""
    upstream = {"name": "cloud", "model": "gpt-up", "url": "http://127.0.0.1:{port}/prov/v1"}
    with started(tmp_path, upstreams=(upstream,), models={}) as front:
        port, key = front["port"], front["key"]
        deadline = time.monotonic() + 10
        while True:  # the upstream's first health check
            try:
                events = stream(front, {"model": "cloud", "prompt": "x", "stream": True, "max_tokens": 40})
                break
            except AssertionError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        assert _Streamer.seen[-1]["model"] == "gpt-up"
        assert _Streamer.seen[-1]["stream_options"] == {"include_usage": True}
        assert len(events) == 6 and events[-1] == "data: [DONE]"
        assert settled(front, 8) == 8  # its usage, not max_tokens (40)
        # a whole answer: renamed at the top level only, charged by its body's usage
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("POST", "/v1/completions",
                     json.dumps({"metadata": {"model": "keep"}, "model": "cloud", "prompt": "x"}),
                     {"Authorization": f"Bearer {key}", "content-type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200 and json.loads(r.read())["usage"] == USAGE
        conn.close()
        assert _Streamer.seen[-1]["model"] == "gpt-up" and _Streamer.seen[-1]["metadata"] == {"model": "keep"}
        assert "stream_options" not in _Streamer.seen[-1]
        assert settled(front, 16) == 16
