"""The protocol table (hetflow.workloads.serve.protocols): one module per protocol, and every
router - the gateway, a replica, the front door's HAProxy config - generated from it."""

from __future__ import annotations

import pytest

from hetflow.workloads.serve import protocols
from hetflow.workloads.serve.front import backend_name, render_config
from hetflow.workloads.serve.protocol import RequestError
from hetflow.workloads.serve.protocols import Protocol, Route
from tests.serving.test_front import PLAN, SERVERS, assert_valid


def _acl_paths(text: str, model: str) -> list[str]:
    acl = backend_name(model)
    out = []
    for line in text.splitlines():
        words = line.split()
        if words[:2] == ["acl", f"is_{acl}"] and words[2] in ("path", "path_beg"):
            out += words[3:]
    return out


def test_the_table_holds_the_three_protocols_and_each_route_once() -> None:
    names = [p.name for p in protocols.registry()]
    assert names == ["native", "kserve_v2", "openai"]
    keys = [(r.method, r.path) for _, r in protocols.routes()]
    assert len(keys) == len(set(keys))
    for _, r in protocols.routes():
        # a route a replica answers names its model: in the path, or in the body
        assert r.replica is None or "{model}" in r.path or r.model_in_body


@pytest.mark.parametrize("path, method, protocol, params", [
    ("/v1/models/digits/predict", "POST", "native", {"model": "digits"}),
    ("/v1/predict", "POST", "native", {}),
    ("/v1/models/meta-llama/Llama-3", "GET", "native", {"model": "meta-llama/Llama-3"}),
    ("/v2/models/digits/infer", "POST", "kserve_v2", {"model": "digits"}),
    ("/v2/health/ready", "GET", "kserve_v2", {}),
    ("/v1/chat/completions", "POST", "openai", {}),
])
def test_a_path_matches_its_protocols_route(path, method, protocol, params) -> None:
    hit = protocols.match(path, method)
    assert hit.protocol.name == protocol and hit.params == params and hit.route.method == method


def test_a_wrong_method_is_405_and_an_unknown_path_404_with_its_protocols_hint() -> None:
    with pytest.raises(RequestError) as e:  # a fixed route beats the listing's greedy one
        protocols.match("/v1/models/digits/predict", "GET")
    assert e.value.status == 405 and "takes POST, not GET" in e.value.message
    with pytest.raises(RequestError) as e:
        protocols.match("/v2/models/digits/explain", "POST")
    assert e.value.status == 404 and "/v2/models/<name>/infer" in e.value.message
    with pytest.raises(RequestError) as e:
        protocols.match("/nowhere", "GET")
    assert e.value.status == 404 and "GET /v1/models" in e.value.message
    # a replica answers only its model's own routes
    with pytest.raises(RequestError) as e:
        protocols.match("/v1/predict", "POST", replica=True)
    assert e.value.status == 404
    assert protocols.owner("/v1/completions").name == "openai"  # its errors in OpenAI's shape
    assert b'"type": "invalid_request_error"' in protocols.owner("/v1/completions").error_body("x")


def test_the_front_door_routes_a_models_own_paths_from_the_table() -> None:
    text = render_config(PLAN, SERVERS, "/tmp/x.sock")
    assert _acl_paths(text, "digits") == ["/v1/models/digits/", "/v2/models/digits/",
                                          "/v1/models/digits", "/v2/models/digits"]


async def _echo(host, request, path, params):  # pragma: no cover - never called here
    raise AssertionError


def test_a_new_protocol_is_one_module_and_one_registry_line(monkeypatch, tmp_path) -> None:
    """What CONTRIBUTING.md promises: a protocol declared once reaches the gateway's and the
    replica's dispatch and the front door's routing, with nothing else changed."""
    echo = Protocol(name="echo", routes=(
        Route("POST", "/echo/{model}/run", _echo, replica=_echo),
        Route("GET", "/echo/health", _echo, probe=True),
    ), error_body=lambda message, param=None: message.encode(), prefix="/echo", hint="try /echo/<name>/run")
    base = protocols.registry()
    monkeypatch.setattr(protocols, "registry", lambda: (*base, echo))
    hit = protocols.match("/echo/digits/run", "POST", replica=True)
    assert hit.protocol is echo and hit.params == {"model": "digits"}
    with pytest.raises(RequestError, match="try /echo/<name>/run"):
        protocols.match("/echo/x", "GET")
    assert "/echo/health" in protocols.probe_paths()
    text = render_config(PLAN, SERVERS, "/tmp/x.sock")
    assert "/echo/digits/" in _acl_paths(text, "digits") and "/echo/placed" in _acl_paths(text, "placed")
    assert_valid(tmp_path, text)
