"""The serving protocols, one module each, and the one table every router is generated from.

A protocol module (:mod:`.native`, :mod:`.kserve_v2`, :mod:`.openai`) declares ``PROTOCOL``: its
routes, its error body and its handlers. The routers read nothing else:

- the **gateway** (:class:`~hetflow.workloads.serve.gateway.Gateway`) answers a request with
  the handler of the route :func:`match` finds (``Route.gateway``);
- a **replica** (:class:`~hetflow.workloads.serve.replica.ModelServer`) answers its model's own
  routes (``Route.replica``: the handler it runs; a route without one never reaches a replica);
- the **front door** (HAProxy, :mod:`~hetflow.workloads.serve.front`) sends a model's own
  requests to its replicas by the path prefixes of :func:`model_prefixes` (or, on routes that
  name the model in the body, by the body: :func:`body_model_paths`), leaves the
  :func:`probe_paths` open without an API key, and reads the model (and routes an upstream's
  protocol) by :func:`model_paths`.

Adding a protocol is one module with a ``PROTOCOL`` and one line in :func:`registry`
(CONTRIBUTING.md, "Adding a serving protocol").

Paths are templates: ``{model}`` is one path segment (a served model's name), ``{model*}`` the
rest of the path (an OpenAI model id may hold a ``/``). :func:`match` prefers a route whose
template has no ``*`` and, of the routes whose path matches, the first whose method does;
when none does the answer is 405, and when no path matches 404 with the hint of the protocol
that owns the path's prefix.
"""

from __future__ import annotations

import functools
from types import MappingProxyType
from typing import Any, Mapping

from hetflow.workloads.serve.protocol import RequestError
from hetflow.workloads.serve.protocols import kserve_v2, native, openai
from hetflow.workloads.serve.protocols.base import Match, Protocol, Route


@functools.cache
def registry() -> tuple[Protocol, ...]:
    """Every protocol, in the order their routes are matched."""
    return (
        native.PROTOCOL,  # hetflow's JSON API, health, metrics, the model listing
        kserve_v2.PROTOCOL,  # KServe v2 (Open Inference Protocol)
        openai.PROTOCOL,  # OpenAI completions (and the LLM paths the front door routes)
    )


def routes() -> list[tuple[Protocol, Route]]:
    return [(p, r) for p in registry() for r in p.routes]


def owner(path: str) -> Protocol:
    """The protocol whose routes or prefix the path falls under (its error body answers any
    error on it); hetflow's native one when none."""
    for p, r in routes():
        if not r.greedy and r.params(path) is not None:
            return p
    for p, r in routes():
        if r.params(path) is not None:
            return p
    prefixed = [p for p in registry() if p.prefix and (path == p.prefix or path.startswith(p.prefix + "/"))]
    return prefixed[0] if prefixed else registry()[0]


_MATCHED: dict[tuple, Match | tuple[int, str]] = {}  # (registry id, path, method, replica) -> answer
_MATCHED_MAX = 4096  # distinct paths remembered (a model's requests repeat one path)


def match(path: str, method: str, *, replica: bool = False) -> Match:
    """The route answering ``method`` on ``path`` (only routes a replica answers when
    ``replica``); RequestError 405 when the path is known under another method, else 404.

    Every request of every replica and gateway calls it, so answers are remembered per path."""
    table = registry()
    key = (id(table), path, method, replica)
    answer = _MATCHED.get(key)
    if answer is None:
        answer = _match(table, path, method, replica)
        if len(_MATCHED) >= _MATCHED_MAX:
            _MATCHED.clear()
        _MATCHED[key] = answer
    if isinstance(answer, Match):
        return answer
    raise RequestError(*answer)


def _match(table: tuple[Protocol, ...], path: str, method: str, replica: bool) -> Match | tuple[int, str]:
    candidates = [(p, r) for p in table for r in p.routes if not replica or r.replica is not None]
    for exact in (True, False):
        hits = [(p, r, got) for p, r in candidates if r.greedy != exact
                for got in [r.params(path)] if got is not None]
        if not hits:
            continue
        for p, r, got in hits:
            if r.method == method:
                return Match(p, r, MappingProxyType(got))  # shared: read-only
        wanted = " or ".join(dict.fromkeys(r.method for _, r, _ in hits))
        return 405, f"{path} takes {wanted}, not {method}"
    return 404, f"no endpoint {path}; {owner(path).hint}"


def model_prefixes() -> list[str]:
    """The path templates up to ``{model}`` of the routes a replica answers by path, e.g.
    ``/v1/models/{model}``: the front door sends a model's POSTs under them to its replicas."""
    out: dict[str, None] = {}
    for _, r in routes():
        if r.replica is not None and "{model}" in r.segments:
            out["/" + "/".join(r.segments[: r.segments.index("{model}") + 1])] = None
    return list(out)


def body_model_paths(*, replica: bool | None = None) -> list[str]:
    """The paths whose model is the body's ``"model"`` (``replica``: only those a replica
    answers, or only those it does not)."""
    return list(dict.fromkeys(r.path for _, r in routes() if r.model_in_body
                              and (replica is None or (r.replica is not None) == replica)))


def probe_paths() -> list[str]:
    return [r.path for _, r in routes() if r.probe]


def model_paths(name: str | None = None) -> tuple[list[str], list[str]]:
    """The paths whose requests name a model - ``(exact, prefixes)``: the paths that name it
    in the body, and the path prefixes before ``{model}`` (``/v2/models/``) - of one protocol
    (by name) or of all: the front door reads the model there, and routes an upstream's
    protocol by them."""
    protos = [p for p in registry() if name is None or p.name == name]
    if not protos:
        raise KeyError(name)
    exact: dict[str, None] = {}
    prefixes: dict[str, None] = {}
    for p in protos:
        for r in p.routes:
            if r.model_in_body:
                exact[r.path] = None
            elif "{model" in r.path:
                prefixes[r.path[: r.path.index("{model")]] = None
    return list(exact), list(prefixes)


def model_segment() -> int:
    """The index (0-based, after the leading ``/``) of the ``{model}`` segment: the same in
    every route that has one (the front door reads it by position)."""
    found = {r.segments.index(seg) for _, r in routes() for seg in r.segments if seg.startswith("{model")}
    assert len(found) == 1, f"routes put the model at different depths: {sorted(found)}"
    return found.pop()


def error_response(path: str, status: int, message: str, param: str | None = None,
                   headers: Mapping[str, str] | None = None) -> Any:
    """The error answer in the format of the protocol the path belongs to."""
    from starlette.responses import Response

    return Response(owner(path).error_body(message, param), status_code=status,
                    media_type="application/json", headers=dict(headers or {}))


__all__ = ["Match", "Protocol", "Route", "body_model_paths", "error_response", "match", "model_paths",
           "model_prefixes", "model_segment", "owner", "probe_paths", "registry", "routes"]
