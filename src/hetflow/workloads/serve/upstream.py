"""Upstream providers: external model servers behind the front door, as models of their own
or as local models' fallbacks - all inside HAProxy, no Python on the request path.

For each upstream (:class:`UpstreamPlan`, from the config's ``upstreams``) the front door has a
backend ``u_<name>`` with one server, the upstream's host, and:

* **routing**: a request whose model (path ``/v2/models/NAME/...`` or the body's ``model`` on
  the OpenAI paths) is the upstream's name goes there; a local model whose ``fallback`` is the
  upstream sends it its requests while the model has no replica up, and (on the direct
  ``/v1/models/M`` and ``/v2/models/M`` paths) past its queue limit instead of a 503. Only the
  upstream's protocol's paths are routed to it (OpenAI: ``/v1/completions``,
  ``/v1/chat/completions``, ``/v1/embeddings``; KServe v2: ``/v2/models/...``);
* **rewriting**: the path onto the upstream's base URL; the model to the upstream's own name
  (the path segment, or the body's top-level ``model`` by a small Lua filter when the body
  names another); ``Host``; the client's credentials and hetflow's internal headers removed,
  the upstream's key set as ``Authorization: Bearer`` from an environment variable of HAProxy
  (the config file holds ``${VAR}``, never the key);
* **health**: HAProxy checks it every ``check_interval_s`` (OpenAI: ``GET <base>/models``,
  KServe: ``GET /v2/health/ready``, with the key); 3 failures in a row take it out (requests
  then get the 503 of "no server"), 2 successes bring it back;
* **metrics**: HAProxy's per-server counters (requests, errors, the mean response time of the
  last 1,024, up or down) become ``hetflow_upstream_*`` series and a table in ``hetflow top``.

An OpenAI upstream's answers are charged to the key's tokens per minute and quota like a local
model's: a whole answer its ``usage.total_tokens`` (:func:`openai_token_rules`), a stream its
usage at its end (:mod:`.stream_usage`); a KServe upstream's answers carry no tokens. Requests
are counted and limited as for local models.

Why one file of about 475 lines: an upstream's ACLs, backend, health check, key and Lua
filter are rendered together and must name the same backend; one concern.
"""

from __future__ import annotations

import hashlib
import re
import urllib.parse
from dataclasses import dataclass
from typing import Any, Iterator

from hetflow.workloads.serve import protocols, stream_usage
from hetflow.workloads.serve.headers import FRONT_TOKEN_ENV
from hetflow.workloads.serve.stream_usage import AT_END_VAR

# an upstream's protocol -> the serving protocol (protocols.registry()) whose model paths it takes
UPSTREAM_PROTOCOLS = {"openai": "openai", "kserve-v2": "kserve_v2"}
LUA_FILE = "upstream.lua"


@dataclass(frozen=True)
class UpstreamPlan:
    """What the front door needs to route to one upstream (plain data; no key in it)."""

    name: str
    protocol: str  # openai | kserve-v2
    scheme: str
    host: str
    port: int
    base_path: str  # without a trailing slash
    model: str  # the upstream's own name for it
    key_env: str | None  # HAProxy's environment variable holding the key (set by the front door)
    timeout_s: float = 60.0
    check_interval_s: float = 2.0
    ca_file: str | None = None
    # hetflow's own LLM replicas (llm.py): (server name, host, port, weight) each; the backend
    # then balances by least outstanding requests, weighted by the pools' capacities
    servers: tuple[tuple[str, str, int, int], ...] = ()
    # prefix affinity over those replicas (llm.LLMRouting): hash of the body's first
    # ``affinity_bytes`` bytes (0: least outstanding requests), bounded at ``balance_factor`` %
    affinity_bytes: int = 0
    balance_factor: int = 125
    # the engines' weights follow their measured capacity (llm.LLMRouting.weights)
    measured_weights: bool = True
    queue_limit: int = 0  # requests in flight per replica (server maxconn); 0: never refuse
    # an upstream with a fallback: this many 5xx answers or failed connections in a row take it
    # out at once (HAProxy's observe layer7); 0: only its health checks do
    error_limit: int = 0

    @property
    def local(self) -> bool:
        return bool(self.servers)

    @property
    def backend(self) -> str:
        return backend_name(self.name)

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        return self.host if self.port == default else f"{self.host}:{self.port}"


def backend_name(name: str) -> str:
    return "u_" + "".join(c if c.isalnum() or c in "_-." else "_" for c in name)


def key_env_name(name: str) -> str:
    """The variable in HAProxy's environment for upstream ``name``'s key (letters, digits, _)."""
    return "HETFLOW_UPSTREAM_KEY_" + hashlib.sha1(name.encode()).hexdigest()[:12].upper()


def llm_backend(name: str, servers: list[tuple[str, str, int, int]], timeout_s: float,
                routing: Any = None, queue_limit: int = 0) -> UpstreamPlan:
    """The front door's plan for an ``engine: vllm`` model: its replicas' vLLM servers, picked
    as ``routing`` (an ``llm.LLMRouting``; None: its defaults) says, each taking at most
    ``queue_limit`` requests at once (0: no limit), past which the model answers 503."""
    from hetflow.workloads.serve.llm import LLMRouting

    routing = routing or LLMRouting()
    return UpstreamPlan(name=name, protocol="openai", scheme="http", host="", port=0,
                        base_path="/v1", model=name, key_env=None, timeout_s=timeout_s,
                        check_interval_s=1.0, servers=tuple(servers),
                        affinity_bytes=routing.prefix_bytes if routing.affinity == "prefix" else 0,
                        balance_factor=routing.balance_factor, queue_limit=queue_limit,
                        measured_weights=routing.weights == "measured")


ERROR_LIMIT = 3  # an upstream with a fallback: bad answers in a row that take it out at once


def plan_upstreams(upstreams: list[Any]) -> tuple[UpstreamPlan, ...]:
    """UpstreamConfig entries -> plans."""
    out = []
    for u in upstreams:
        parts = urllib.parse.urlsplit(u.url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        out.append(UpstreamPlan(
            name=u.name, protocol=u.protocol, scheme=parts.scheme, host=parts.hostname or "",
            port=port, base_path=parts.path.rstrip("/"), model=u.upstream_model,
            key_env=key_env_name(u.name) if u.api_key_env else None, timeout_s=u.timeout_s,
            check_interval_s=u.check_interval_s, ca_file=u.ca_file,
            error_limit=ERROR_LIMIT if u.fallback else 0))
    return tuple(out)


def upstream_secrets(upstreams: list[Any], environ: dict[str, str]) -> dict[str, str]:
    """HAProxy environment variable -> key, read from ``hetflow serve``'s environment; a
    variable that is not set is one line to fix."""
    from hetflow.core.errors import InputError

    out = {}
    for u in upstreams:
        if not u.api_key_env:
            continue
        value = environ.get(u.api_key_env, "")
        if not value.strip():
            raise InputError(f"upstream {u.name}: environment variable {u.api_key_env} (its "
                             f"api_key_env) is not set; export {u.api_key_env}=KEY before "
                             "hetflow serve, or drop api_key_env for an upstream without a key")
        if any(c in value for c in '"\r\n\\'):
            raise InputError(f"upstream {u.name}: the key in {u.api_key_env} holds a quote, "
                             "backslash or line break; an API key has none")
        out[key_env_name(u.name)] = value.strip()
    return out


def _hq(text: str) -> str:
    """An HAProxy double-quoted argument (``$`` escaped: no environment expansion)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def model_var_rules(root: str, default_model: str | None) -> list[str]:
    """``txn.model``: the model a request asks for (path segment, else the body's ``model``
    on the JSON/OpenAI paths, else the default model on ``/v1/predict``); a rule that
    finds it set leaves it."""
    depth = root.count("/")
    in_body, prefixes = protocols.model_paths()
    under = "|".join(re.escape(p) for p in prefixes)
    lines = [
        f"    http-request set-var(txn.model) path,field({depth + protocols.model_segment() + 2},/) "
        f"if !{{ var(txn.model) -m found }} {{ path_reg ^{re.escape(root)}({under})[^/]+ }}",
        "    http-request set-var(txn.model) req.body,json_query('$.model') "
        "if !{ var(txn.model) -m found } { path " + " ".join(root + p for p in in_body) + " }",
    ]
    if default_model:
        lines.append(f"    http-request set-var(txn.model) str({default_model}) "
                     f"if !{{ var(txn.model) -m found }} {{ path {root}/v1/predict }}")
    return lines


def protocol_acl_name(up: UpstreamPlan) -> str:
    return f"proto_{up.backend}"


def protocol_acls(ups: tuple[UpstreamPlan, ...], root: str) -> list[str]:
    """One ACL per upstream: the request is of the upstream's protocol."""
    lines = []
    for up in ups:
        exact, prefixes = protocols.model_paths(UPSTREAM_PROTOCOLS[up.protocol])
        if exact:
            lines.append(f"    acl {protocol_acl_name(up)} path " + " ".join(root + p for p in exact))
        if prefixes:
            lines.append(f"    acl {protocol_acl_name(up)} path_beg " + " ".join(root + p for p in prefixes))
    return lines


def system_ca_file() -> str:
    """The system's CA bundle (HAProxy's own ``@system-ca`` follows its bundled OpenSSL's
    directory, which need not be the system's), else certifi's."""
    import os
    import ssl

    for path in (ssl.get_default_verify_paths().cafile, "/etc/ssl/certs/ca-certificates.crt",
                 "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/cert.pem"):
        if path and os.path.isfile(path):
            return path
    import certifi

    return certifi.where()


def _down(backend: str) -> str:
    return f"{{ nbsrv({backend}) -m int eq 0 }}"


def routing_rules(ups: tuple[UpstreamPlan, ...], fallbacks: dict[str, str], root: str,
                  local_backend: Any, over_limit: dict[str, list[str]],
                  chains: dict[str, tuple[str, ...]] | None = None) -> list[str]:
    """``use_backend`` lines, before the local models' own: each local model whose fallback
    an upstream is, to it while that model has no server up or is over its queue limit
    (``over_limit``: model -> ACL conditions, any one true past the limit), and on along the
    upstream's own fallbacks (``chains``: upstream -> its fallbacks in order) while those
    before are out; each upstream with fallbacks, to them while it is out; then each
    upstream's own name, an ``engine: vllm`` model's engines among them (so the fallbacks'
    lines come before its own). The deepest step of a chain comes first: HAProxy takes the
    first rule that matches."""
    chains = chains or {}
    lines = []
    by_name = {u.name: u for u in ups}
    for model, name in sorted(fallbacks.items()):
        be = by_name[model].backend if model in by_name else local_backend(model)
        path = [name, *chains.get(name, ())]
        for i in reversed(range(len(path))):
            up = by_name[path[i]]
            cond = (f"proto_{up.backend} {{ var(txn.model) -m str {model} }}"
                    + "".join(" " + _down(by_name[p].backend) for p in path[:i]))
            lines.append(f"    use_backend {up.backend} if {cond} {_down(be)}")
            for condition in over_limit.get(model, []):
                lines.append(f"    use_backend {up.backend} if {cond} {condition}")
    for name, after in sorted(chains.items()):
        path = [name, *after]
        for i in reversed(range(1, len(path))):
            up = by_name[path[i]]
            lines.append(f"    use_backend {up.backend} if {protocol_acl_name(up)} "
                         f"{{ var(txn.model) -m str {name} }}"
                         + "".join(" " + _down(by_name[p].backend) for p in path[:i]))
    for up in ups:
        lines.append(f"    use_backend {up.backend} if {protocol_acl_name(up)} "
                     f"{{ var(txn.model) -m str {up.name} }}")
    return lines


def backend_sections(ups: tuple[UpstreamPlan, ...], root: str, usage: bool = False,
                     front_token: bool = False) -> list[str]:
    """The upstreams' backends; ``usage``: streamed OpenAI answers charged at their end
    (:mod:`.stream_usage`; keys on); ``front_token``: hetflow's LLM engines want the
    deployment's token as their Bearer key (keys on)."""
    lines: list[str] = []
    for up in ups:
        if up.local:
            section = _llm_backend_section(up, root, front_token)
            lines += section[:1] + ([usage_filter_line()] if usage else []) + section[1:]
            continue
        if up.protocol == "openai":
            path = f"    http-request replace-path ^{re.escape(root)}/v1/(.*) {up.base_path}/\\1"
            check_uri = f"{up.base_path}/models"
        else:
            path = (f"    http-request replace-path ^{re.escape(root)}/v2/models/[^/]+(.*) "
                    f"{up.base_path}/v2/models/{up.model}\\1")
            check_uri = f"{up.base_path}/v2/health/ready"
        auth = f'"Bearer ${{{up.key_env}}}"' if up.key_env else None
        check_headers = f"hdr Host {_hq(up.host_header)}" + (f" hdr Authorization {auth}" if auth else "")
        tls = ""
        if up.scheme == "https":
            ca = up.ca_file or system_ca_file()
            tls = (f" ssl verify required ca-file {ca} sni str({up.host}) "
                   f"check-sni {up.host} check-ssl")
        inter_ms = max(100, int(up.check_interval_s * 1000))
        eject = (f" observe layer7 error-limit {up.error_limit} on-error mark-down"
                 if up.error_limit else "")
        # a name is resolved (libc: /etc/hosts, DNS) when HAProxy (re)loads; one that does
        # not resolve then leaves this server down and the front door still starts
        dns = "" if _is_ip(up.host) else " init-addr last,libc,none"
        lines += [
            f"backend {up.backend}",
            f"    timeout server {max(1, int(up.timeout_s + 0.999))}s",
            "    option httpchk",
            f"    http-check send meth GET uri {check_uri} {check_headers}",
            "    http-check expect status 200",
            "    http-reuse safe",
            "    retries 1",
            # (with keys, an OpenAI upstream's usage filter renames the model too: one filter
            # may rewrite a request's body)
            (usage_filter_line() if usage and up.protocol == "openai" else "    filter lua.hetflow_model"),
            f"    http-request set-var(txn.up_model) str({up.model})",
            # a body the filter cannot rewrite whole (larger than one buffer) is not sent
            # with another model's name
            "    http-request set-var(txn.up_blen) req.body_len",
            "    http-request return status 413 content-type application/json string "
            + _hq('{"error":"a request body over 16 KiB cannot be renamed to the upstream\'s '
                  'model; call the upstream by its own name"}')
            + f" if !{{ var(txn.model) -m str {up.model} }} "
              "{ req.body_size,sub(txn.up_blen) -m int gt 0 }",
            path,
            f"    http-request set-header Host {_hq(up.host_header)}",
            "    http-request del-header x-api-key",
            "    http-request del-header x-hetflow-key",
            "    http-request del-header x-hetflow-models",
            "    http-request del-header x-hetflow-client-path",
            (f"    http-request set-header Authorization {auth}" if auth
             else "    http-request del-header Authorization"),
            *(openai_token_rules(up.timeout_s) if up.protocol == "openai"
              else ["    http-response del-header x-hetflow-tokens"]),
            f"    server {_safe_server(up.name)} {up.host}:{up.port} check inter {inter_ms} "
            f"fall 3 rise 2{eject}{dns}{tls}",
        ]
    return lines


def openai_token_rules(timeout_s: float) -> list[str]:
    """An OpenAI-protocol answer's tokens, for the key's tokens-per-minute and quota (the
    frontend adds ``x-hetflow-tokens`` to the key's counter): ``usage.total_tokens`` of a
    whole JSON answer (HAProxy waits for its body, up to one buffer); a streamed answer, or a
    body whose usage is past the buffer, is charged the request's ``max_tokens`` up front -
    except a stream that :mod:`.stream_usage`'s filter charges at its end (with keys on).
    Whatever the server itself says in the header is dropped first."""
    json = "{ res.hdr(content-type) -m beg -i application/json }"
    return [
        "    http-request set-var(txn.max_tokens) req.body,json_query('$.max_tokens')",
        "    http-response del-header x-hetflow-tokens",
        f"    http-response wait-for-body time {max(1, int(timeout_s + 0.999))}s if {json}",
        f"    http-response set-var(txn.used) res.body,json_query('$.usage.total_tokens') if {json}",
        "    http-response set-header x-hetflow-tokens %[var(txn.used)] if { var(txn.used) -m found }",
        "    http-response set-header x-hetflow-tokens %[var(txn.max_tokens)] "
        "if !{ var(txn.used) -m found } { var(txn.max_tokens) -m found } { status 200 } "
        f"!{{ var({AT_END_VAR}) -m found }}",
    ]


LLM_MIN_TIMEOUT_S = 600  # the least time an LLM replica gets to answer (or between streamed tokens)


def _llm_backend_section(up: UpstreamPlan, root: str, front_token: bool = False) -> list[str]:
    """hetflow's vLLM replicas: the client's own path and model (the served name), least
    outstanding requests weighted by pool capacity, health from vLLM's ``/health``; the
    client's credentials never reach them (``front_token``: the deployment's token instead,
    which the engines want then - vLLM's ``VLLM_API_KEY``)."""
    if up.affinity_bytes:  # (the frontend buffers request bodies: option http-buffer-request)
        balance = [f"    balance hash req.body,bytes(0,{up.affinity_bytes})",
                   "    hash-type consistent",
                   f"    hash-balance-factor {up.balance_factor}"]
    else:
        balance = ["    balance leastconn"]
    lines = [
        f"backend {up.backend}",
        *balance,
        # a whole (not streamed) answer of a long generation takes minutes on a slow device
        f"    timeout server {max(LLM_MIN_TIMEOUT_S, int(up.timeout_s + 0.999))}s",
        "    option httpchk",
        "    http-check send meth GET uri /health",
        "    http-check expect status 200",
        "    http-reuse safe",
        "    retries 1",
        "    option redispatch",
        f"    http-request replace-path ^{re.escape(root)}/v1/(.*) /v1/\\1" if root else "",
        "    http-request del-header x-api-key",
        "    http-request del-header x-hetflow-key",
        "    http-request del-header x-hetflow-models",
        "    http-request del-header x-hetflow-client-path",
        (f'    http-request set-header Authorization "Bearer ${{{FRONT_TOKEN_ENV}}}"' if front_token
         else "    http-request del-header Authorization"),
        *openai_token_rules(max(LLM_MIN_TIMEOUT_S, up.timeout_s)),
    ]
    inter_ms = max(100, int(up.check_interval_s * 1000))
    maxconn = f" maxconn {up.queue_limit}" if up.queue_limit else ""
    for name, host, port, weight in up.servers:
        lines.append(f"    server {_safe_server(name)} {host}:{port} weight {weight}{maxconn} check "
                     f"inter {inter_ms} fall 2 rise 1")
    return [line for line in lines if line]


def _is_ip(host: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def _safe_server(name: str) -> str:
    return "up-" + "".join(c if c.isalnum() or c in "_-." else "_" for c in name)


haproxy_server_name = _safe_server  # an upstream's or engine's server name in HAProxy


# The body's top-level "model" rewritten to the upstream's name (HAProxy's actions cannot
# change a body; a filter can, once the whole body is buffered - option http-buffer-request).
# A body larger than one buffer (tune.bufsize) cannot be rewritten: such a request is refused
# with 413 before it is sent (rule in the backend, below the filter's variable).
LUA = r'''
local function model_span(body)
  -- the quotes of the top-level "model" string value, or nil
  local keys = hetflow_top_level(body)
  local i = keys and keys["model"]
  if i == nil or body:sub(i, i) ~= '"' then return nil end
  local j = hetflow_string_end(body, i)
  if j == nil then return nil end
  return i, j
end

HetflowModel = {}
HetflowModel.id = "hetflow model rewrite"
HetflowModel.flags = filter.FLT_CFG_FL_HTX
HetflowModel.__index = HetflowModel
function HetflowModel:new() return setmetatable({}, HetflowModel) end
function HetflowModel:start_analyze(txn, chn)
  if not chn:is_resp() then filter.register_data_filter(self, chn) end
end
function HetflowModel:http_headers(txn, msg)
  if msg.channel:is_resp() then return end
  local name = txn:get_var("txn.up_model")
  if name == nil then return end
  if txn.sf:req_body_len() ~= txn.sf:req_body_size() then return end
  local body = txn.sf:req_body() or ""
  local a, b = model_span(body)
  if a == nil or body:sub(a + 1, b - 1) == name then return end
  self.body = body:sub(1, a) .. name .. body:sub(b)
  self.old = #body
  msg:set_body_len(#self.body)
end
function HetflowModel:http_payload(txn, msg)
  if self.body == nil or msg.channel:is_resp() then return end
  msg:set(self.body, 0, self.old)
  self.body = nil
end
core.register_filter("hetflow_model", HetflowModel, function(f, args) return f end)
'''


def write_lua(directory: str) -> str:
    """The front door's Lua (the model rewrite, and :mod:`.stream_usage`'s filter charging
    through a socket in ``directory``) written there; its path."""
    import os

    path = os.path.join(directory, LUA_FILE)
    with open(path, "w") as f:
        f.write(stream_usage.JSON_LUA + LUA + stream_usage.lua_source(directory))
    return path


def usage_filter_line() -> str:
    return stream_usage.FILTER


def server_rows(show_stat: str) -> Iterator[dict[str, str]]:
    """HAProxy's ``show stat`` CSV -> one dict per server row (not the FRONTEND/BACKEND sums)."""
    header: list[str] = []
    for line in show_stat.splitlines():
        if line.startswith("# "):
            header = line[2:].split(",")
            continue
        if not line or not header:
            continue
        row = dict(zip(header, line.split(",")))
        if row.get("svname") not in ("FRONTEND", "BACKEND"):
            yield row


def read_upstream_stats(show_stat: str) -> dict[str, dict[str, Any]]:
    """``show stat`` -> upstream backend -> requests, errors, response_ms, up."""
    out: dict[str, dict[str, Any]] = {}
    for row in server_rows(show_stat):
        if not row.get("pxname", "").startswith("u_"):
            continue

        def num(key: str) -> int:
            try:
                return int(row.get(key) or 0)
            except ValueError:
                return 0

        server = {
            "requests": num("stot"),
            "errors": num("econ") + num("eresp") + num("hrsp_5xx"),
            "response_ms": num("rtime"),
            "up": row.get("status", "").startswith("UP"),
            "status": row.get("status", ""),
            "in_flight": num("scur"),
        }
        entry = out.get(row["pxname"])
        if entry is None:
            out[row["pxname"]] = {**server, "servers": {row["svname"]: server}}
            continue
        # several servers (an LLM model's replicas): sums, up when any is, the mean time
        # weighted by requests
        total = entry["requests"] + server["requests"]
        entry["response_ms"] = (round((entry["response_ms"] * entry["requests"]
                                       + server["response_ms"] * server["requests"]) / total)
                                if total else 0)
        entry["requests"] = total
        entry["errors"] += server["errors"]
        entry["in_flight"] += server["in_flight"]
        entry["up"] = entry["up"] or server["up"]
        entry["status"] = "UP" if entry["up"] else server["status"]
        entry["servers"][row["svname"]] = server
    return out


__all__ = ["LUA", "UPSTREAM_PROTOCOLS", "haproxy_server_name", "UpstreamPlan", "backend_name", "backend_sections", "key_env_name", "llm_backend",
           "model_var_rules", "plan_upstreams", "protocol_acl_name", "protocol_acls", "system_ca_file", "read_upstream_stats", "routing_rules", "server_rows",
           "upstream_secrets", "write_lua"]
