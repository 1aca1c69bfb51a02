"""Who may call what, how often: API keys, rate limits, quotas and load shedding in the front
door's HAProxy, so that a refused request is answered without touching a replica.

Per request, HAProxy (rules from :func:`frontend_rules`, data in map files from
:func:`map_entries`):

1. takes the key from ``Authorization: Bearer KEY`` or ``x-api-key`` (exactly one such header),
   hashes it with the store's salt (``sha2(256)``) and looks the hash up in ``keys.map`` (hash ->
   key name): a lookup by hash, so its time does not depend on how much of a key a caller
   guessed. No hit: ``401``. ``/health`` and ``/v2/health/*`` stay open (probes);
2. the model (from the path, or the JSON body's ``model`` on ``/v1/predict`` and
   ``/v1/completions``) not allowed for the key (``allow.map``): ``403``. The gateway checks the
   model it parsed against the same list (``x-hetflow-models``) and filters its listings;
3. a key whose quota is spent (its counter at the threshold in ``quota_req.map`` /
   ``quota_tok.map``, kept by :class:`UsageMeter`): ``429`` with ``Retry-After`` = seconds to
   the quota's reset (``reset.map``);
4. requests per second (``rps.map``; a stick table counting admitted requests per key over a
   sliding second) and generated tokens per sliding minute (``tpm.map``; the tokens come from
   the answer's ``x-hetflow-tokens`` header, a stream's from its usage at its end:
   :mod:`.stream_usage`): over either, ``429`` with ``Retry-After``. A key
   with a burst allows that many requests in any sliding second (``rps.map`` then holds the
   burst) and its rate sustained over :data:`SUSTAIN_S` seconds (``sustain.map``: rate x
   SUSTAIN_S requests in any sliding window that long, a third stick table);
5. the key's name goes to the replicas as ``x-hetflow-key`` (the client's own such headers are
   dropped first).

Load shedding (:func:`shed_rules`, with or without keys): a model whose replicas that are up
each hold ``queue_limit`` requests (their ``maxconn``) answers ``503`` with ``Retry-After: 1`` at
once.

The counters live in HAProxy's stick tables; :class:`UsageMeter` (in the front door actor) reads
them over the admin socket every poll and adds the new counts to the store's per-key usage (day
and month), across the counters' wrap at 2^32 (:func:`counter_delta`); the quota thresholds it
gives HAProxy are exact between polls (except across a wrap: then at the next poll). A token
quota can run over by the tokens of the answers in flight when it is reached.

Why one file of about 460 lines: the access rules HAProxy runs, the map files they read and
the key state that rewrites those maps must agree line by line; one concern.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from hetflow.workloads.serve import protocols
from hetflow.workloads.serve.keys import KeyRecord, KeyStore, open_store, period_end, period_key
from hetflow.workloads.serve.headers import KEY_HEADER, MODELS_HEADER, TOKENS_HEADER, allowed_models, check_allowed
from hetflow.workloads.serve.stream_usage import AT_END_VAR
from hetflow.workloads.serve.upstream import model_var_rules

MAPS = ("keys", "allow", "models", "rps", "sustain", "tpm", "quota_req", "quota_tok", "reset")
REQUESTS_TABLE = "st_requests"  # per key: gpc0 admitted, gpc1 refused over a limit; rate of gpc0 per 1 s
TOKENS_TABLE = "st_tokens"  # per key: gpc0 tokens; its rate per 60 s
SUSTAIN_TABLE = "st_sustain"  # per key: gpc0 admitted; its rate per SUSTAIN_S (keys with a burst)
SUSTAIN_S = 10  # the window a key with a burst must keep its requests-per-second rate over
TPM_RETRY_S = 10


@dataclass(frozen=True)
class AccessPlan:
    """What the front door enforces (plain data, in the FrontPlan)."""

    store: str  # key store: "cluster", "file" or a directory
    default_model: str


def _q(message: str) -> str:
    """A one-line JSON error as an HAProxy ``string`` argument (double-quoted)."""
    body = '{"error":"' + message.replace("\\", "\\\\").replace('"', "'") + '"}'
    return '"' + body.replace('"', '\\"') + '"'


def frontend_rules(access: AccessPlan, map_dir: str, root: str) -> list[str]:
    """The ``http-request``/``http-response`` lines of the frontend for ``access``; ``root``:
    the route prefix without its trailing slash."""
    m = {name: os.path.join(map_dir, f"{name}.map") for name in MAPS}
    json_err = "content-type application/json string"
    lines = [
        "    acl open_path path " + " ".join(root + p for p in protocols.probe_paths()),
        "    acl one_bearer req.hdr_cnt(authorization) eq 1",
        "    acl bearer_form req.hdr(authorization) -m reg -i \"^bearer +[^ ]\"",
        "    acl one_api_key req.hdr_cnt(x-api-key) eq 1",
        '    http-request set-var(txn.tok) req.hdr(authorization),regsub("^bearer[ ]+","",i) if one_bearer bearer_form',
        "    http-request set-var(txn.tok) req.hdr(x-api-key) if !one_bearer one_api_key",
        f"    http-request set-var(txn.kname) var(txn.salt),concat(,txn.tok,),sha2(256),hex,lower,"
        f"map({m['keys']}) if {{ var(txn.tok) -m found }}",
        "    acl has_key var(txn.kname) -m found",
        f"    http-request return status 401 {json_err} "
        + _q("missing, unknown, expired or revoked API key: send Authorization: Bearer KEY "
             "(hetflow keys create NAME makes one)")
        + " unless has_key || open_path",
        # the model asked for: by its path, else the body's model on every OpenAI path
        *model_var_rules(root, access.default_model),
        "    http-request set-var(txn.km) var(txn.kname),concat(/,txn.model,) if has_key",
        "    http-request set-var(txn.kall) var(txn.kname),concat(/*) if has_key",
        f"    acl model_allowed var(txn.km),map({m['allow']}) -m found",
        f"    acl all_models var(txn.kall),map({m['allow']}) -m found",
        f"    http-request return status 403 {json_err} "
        + _q("this API key may not use this model")
        + " if has_key { var(txn.model) -m found } !model_allowed !all_models",
        # rates
        f"    http-request track-sc0 var(txn.kname) table {REQUESTS_TABLE} if has_key",
        f"    http-request track-sc1 var(txn.kname) table {TOKENS_TABLE} if has_key",
        f"    http-request set-var(txn.rs) var(txn.kname),map({m['sustain']},0) if has_key",
        "    acl over_rs var(txn.rs) -m int gt 0",
        f"    http-request track-sc2 var(txn.kname) table {SUSTAIN_TABLE} if has_key over_rs",
        "    http-request set-var(txn.req_n) sc_get_gpc(0,0) if has_key",
        "    http-request set-var(txn.tok_n) sc_get_gpc(0,1) if has_key",
        "    http-request set-var(txn.rps_used) sc_gpc_rate(0,0) if has_key",
        "    http-request set-var(txn.tpm_used) sc_gpc_rate(0,1) if has_key",
        "    http-request set-var(txn.rs_used) sc_gpc_rate(0,2) if has_key over_rs",
        # a quota: the key's counter may grow up to the threshold the front door computed
        # (UsageMeter.thresholds), so the front door's poll adds no overshoot
        f"    http-request set-var(txn.qr) var(txn.kname),map({m['quota_req']}) if has_key",
        "    http-request set-var(txn.qr_left) var(txn.qr),sub(txn.req_n) if { var(txn.qr) -m found }",
        f"    http-request set-var(txn.qt) var(txn.kname),map({m['quota_tok']}) if has_key",
        "    http-request set-var(txn.qt_left) var(txn.qt),sub(txn.tok_n) if { var(txn.qt) -m found }",
        "    acl quota_spent var(txn.qr_left) -m int le 0",
        "    acl quota_spent var(txn.qt_left) -m int le 0",
        f"    http-request set-var(txn.retry) var(txn.kname),map({m['reset']}),sub(txn.now) if quota_spent",
        f"    http-request return status 429 {json_err} "
        + _q("this key's quota is spent; it resets at the start of the next UTC day or month "
             "(Retry-After)")
        + " hdr Retry-After %[var(txn.retry)] if has_key quota_spent",
        f"    http-request set-var(txn.rps) var(txn.kname),map({m['rps']},0) if has_key",
        "    http-request set-var(txn.rps_left) var(txn.rps),sub(txn.rps_used) if has_key",
        f"    http-request set-var(txn.tpm) var(txn.kname),map({m['tpm']},0) if has_key",
        "    http-request set-var(txn.tpm_left) var(txn.tpm),sub(txn.tpm_used) if has_key",
        "    acl over_rps var(txn.rps) -m int gt 0",
        "    acl over_rps_now var(txn.rps_left) -m int le 0",
        "    acl over_tpm var(txn.tpm) -m int gt 0",
        "    acl over_tpm_now var(txn.tpm_left) -m int le 0",
        "    http-request set-var(txn.rs_left) var(txn.rs),sub(txn.rs_used) if has_key over_rs",
        "    acl over_rs_now var(txn.rs_left) -m int le 0",
        "    http-request sc-inc-gpc(1,0) if has_key over_rps over_rps_now || has_key over_tpm over_tpm_now "
        "|| has_key over_rs over_rs_now",
        f"    http-request return status 429 {json_err} "
        + _q("this API key is over its requests per second; retry after Retry-After seconds")
        + " hdr Retry-After 1 if has_key over_rps over_rps_now",
        f"    http-request return status 429 {json_err} "
        + _q(f"this API key is over its requests per second sustained over {SUSTAIN_S} s (its burst is "
             "spent); retry after Retry-After seconds")
        + " hdr Retry-After 1 if has_key over_rs over_rs_now",
        f"    http-request return status 429 {json_err} "
        + _q("this API key is over its tokens per minute; retry after Retry-After seconds")
        + f" hdr Retry-After {TPM_RETRY_S} if has_key over_tpm over_tpm_now",
    ]
    return lines


def admit_rules(map_dir: str) -> list[str]:
    """The last lines (after load shedding): count the request against its key, tell the
    replicas who asked and for which models, count the answer's tokens."""
    models_map = os.path.join(map_dir, "models.map")
    return [
        "    http-request sc-inc-gpc(0,0) if has_key",
        "    http-request sc-inc-gpc(0,2) if has_key { var(txn.rs) -m int gt 0 }",
        f"    http-request set-header {KEY_HEADER} %[var(txn.kname)] if has_key",
        f"    http-request set-var(txn.kmodels) var(txn.kname),map({models_map}) if has_key",
        f"    http-request set-header {MODELS_HEADER} %[var(txn.kmodels)] if has_key",
        # (a stream the usage filter took is charged at its end: stream_usage.py)
        f"    http-response sc-add-gpc(0,1) res.hdr({TOKENS_HEADER}) "
        f"if {{ var(txn.kname) -m found }} {{ res.hdr({TOKENS_HEADER}) -m found }} "
        f"!{{ var({AT_END_VAR}) -m found }}",
    ]


def preamble_rules(access: AccessPlan | None, salt: str) -> list[str]:
    """First lines of the frontend: the client may not set hetflow's own headers; with keys,
    the salt and the current rates in variables (read by :func:`frontend_rules`)."""
    lines = [f"    http-request del-header {KEY_HEADER}", f"    http-request del-header {MODELS_HEADER}"]
    if access is not None:
        lines += [f"    http-request set-var(txn.salt) str({salt})",
                  "    http-request set-var(txn.now) date"]
    return lines


def table_sections() -> list[str]:
    return [f"backend {REQUESTS_TABLE}",
            "    stick-table type string len 64 size 100k expire 48h store gpc(2),gpc_rate(1,1s)",
            f"backend {TOKENS_TABLE}",
            "    stick-table type string len 64 size 100k expire 48h store gpc(1),gpc_rate(1,60s)",
            f"backend {SUSTAIN_TABLE}",
            f"    stick-table type string len 64 size 100k expire 1h store gpc(1),gpc_rate(1,{SUSTAIN_S}s)"]


def shed_rules(backend: str, acl: str, queue_limit: int, unless: str | None = None) -> list[str]:
    """503 at once while no server of ``backend`` that is up has a free slot for a request of
    ``acl`` (``unless``: an ACL whose requests go elsewhere then, e.g. to an upstream). The
    servers carry ``maxconn queue_limit`` (:func:`queue_limit_server_option`)."""
    return [shed_return(c + (f" !{unless}" if unless else ""), queue_limit)
            for c in over_limit_conditions(backend, acl)]


def shed_return(condition: str, queue_limit: int) -> str:
    """The 503 + ``Retry-After: 1`` answer of a model at its queue limit, under ``condition``."""
    return ("    http-request return status 503 content-type application/json string "
            + _q(f"the model is at its queue limit ({queue_limit} in flight per replica); "
                 "retry after Retry-After seconds")
            + f" hdr Retry-After 1 if {condition}")


def over_limit_conditions(backend: str, acl: str) -> list[str]:
    """Conditions (any one true) for a request of ``acl`` while ``backend`` has no free slot
    (:func:`no_free_slot`)."""
    return [f"is_{acl} METH_POST {branch}" for branch in no_free_slot(backend)]


def no_free_slot(backend: str) -> list[str]:
    """Conditions (any one true: an HAProxy rule per condition) while no server of ``backend``
    that is up has a free slot, or a request already waits for one.

    ``be_conn_free`` sums ``maxconn - current`` over the servers that are up, so a replica that
    died is out of the sum the moment it is marked down (counting ``be_conn`` against the
    servers up, as before, let a dead replica's last connections fill the limit of the live
    ones for an instant). It is -1 when a server without ``maxconn`` counts: the gateway
    backups, which count only once every replica is down - the fallback path, never shed. A
    server's count moves when its connection is made, a moment after the check: in a burst one
    request per HAProxy thread can pass in that moment; it waits in the server's queue for a
    slot, and while any request waits (``queue``) the next ones are refused."""
    up = f"{{ nbsrv({backend}) -m int gt 0 }}"
    return [f"{up} {{ be_conn_free({backend}) -m int eq 0 }}",
            f"{up} {{ queue({backend}) -m int gt 0 }}"]


def queue_limit_server_option(queue_limit: int) -> str:
    """The ``server`` option of a queue-limited model's replicas: at most ``queue_limit``
    requests each (HAProxy then also never sends one to a full replica while another has room)."""
    return f" maxconn {queue_limit}"


def map_entries(records: dict[str, KeyRecord], salt: str, thresholds: dict[str, int],
                now: float | None = None) -> dict[str, list[tuple[str, str]]]:
    """Each map's (key, value) lines for the usable keys. ``thresholds``: name -> the value of
    its HAProxy counter (requests or tokens, as its quota counts) at which its quota is spent
    (:meth:`UsageMeter.thresholds`)."""
    now = time.time() if now is None else now
    out: dict[str, list[tuple[str, str]]] = {name: [] for name in MAPS}
    for name, r in sorted(records.items()):
        if not r.usable(now):
            continue
        out["keys"].append((r.hash, name))
        if r.models:
            out["allow"] += [(f"{name}/{model}", "1") for model in r.models]
            out["models"].append((name, ",".join(r.models)))
        else:
            out["allow"].append((f"{name}/*", "1"))
            out["models"].append((name, "*"))
        if r.rps:
            out["rps"].append((name, str(r.burst or r.rps)))  # any sliding second
            if r.burst:
                out["sustain"].append((name, str(r.rps * SUSTAIN_S)))
        if r.tokens_per_min:
            out["tpm"].append((name, str(r.tokens_per_min)))
        if r.quota is not None:
            which = "quota_req" if r.quota.unit == "requests" else "quota_tok"
            out[which].append((name, str(thresholds.get(name, r.quota.limit))))
            out["reset"].append((name, str(int(period_end(r.quota.period, now)))))
    return out


def write_maps(map_dir: str, entries: dict[str, list[tuple[str, str]]]) -> None:
    """The map files (read by HAProxy at start and at every reload), each written atomically."""
    os.makedirs(map_dir, mode=0o700, exist_ok=True)
    for name in MAPS:
        path = os.path.join(map_dir, f"{name}.map")
        tmp = path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.writelines(f"{k} {v}\n" for k, v in entries.get(name, []))
        os.replace(tmp, path)


def apply_maps(admin: Callable[[str], str], map_dir: str,
               entries: dict[str, list[tuple[str, str]]]) -> None:
    """Replace the running HAProxy's maps at once (``prepare map`` / ``add map @ver`` /
    ``commit map``: a request sees the old map or the new one, never half of it)."""
    for name in MAPS:
        path = os.path.join(map_dir, f"{name}.map")
        answer = admin(f"prepare map {path}")
        found = re.search(r"version(?: created:)? (\d+)", answer)
        if not found:
            raise RuntimeError(f"haproxy refused 'prepare map' for {name}: {answer.strip()[:200]}")
        version = found.group(1)
        rows = entries.get(name, [])
        for start in range(0, len(rows), 200):  # one admin call per 200 lines
            commands = ";".join(f"add map @{version} {path} {k} {v}" for k, v in rows[start:start + 200])
            admin(commands)
        answer = admin(f"commit map @{version} {path}")
        if answer.strip() and "error" in answer.lower():
            raise RuntimeError(f"haproxy refused 'commit map' for {name}: {answer.strip()[:200]}")


_ROW = re.compile(r"key=(\S+) .*?gpc0=(\d+)(?: gpc1=(\d+))?")


def read_table(admin: Callable[[str], str], table: str) -> dict[str, tuple[int, int]] | None:
    """key name -> (gpc0, gpc1) of a stick table; None when HAProxy did not answer with the
    table (its header line missing), so an empty answer is never read as "no entries"."""
    answer = admin(f"show table {table}")
    if f"# table: {table}," not in answer:
        return None
    out = {}
    for line in answer.splitlines():
        found = _ROW.search(line)
        if found:
            out[found.group(1)] = (int(found.group(2)), int(found.group(3) or 0))
    return out


COUNTER_WRAP = 2**32  # HAProxy's gpc counters are unsigned 32-bit: 4,294,967,295 + 1 is 0


def counter_delta(value: int, before: int) -> int:
    """How much a gpc counter grew since it read ``before``. Below ``before`` it either wrapped
    past 2^32 (billions of tokens: a big token quota reaches it in days) or its entry started
    again at 0 (it expired; a new HAProxy process is :meth:`UsageMeter.counters_restart`). A
    wrap leaves a counter read in its upper half (growing by 2^31 between two polls a second
    apart is beyond any front door); a counter that fell from below half started again."""
    if value >= before:
        return value - before
    if before >= COUNTER_WRAP // 2:
        return value + COUNTER_WRAP - before
    return value


@dataclass
class UsageMeter:
    """Turns HAProxy's per-key counters into durable usage and quota blocks."""

    store: KeyStore
    last: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # name -> admitted, refused, tokens
    usage: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    counted: dict[str, dict[str, int]] = field(default_factory=dict)  # since the front door started
    dirty: set[str] = field(default_factory=set)
    saved_at: float = 0.0

    def _usage_of(self, name: str) -> dict[str, dict[str, int]]:
        if name not in self.usage:
            self.usage[name] = self.store.usage(name)
        return self.usage[name]

    def observe(self, admin: Callable[[str], str], now: float | None = None) -> None:
        """Add the counts since the last call to each key's day and month."""
        now = time.time() if now is None else now
        requests = read_table(admin, REQUESTS_TABLE)
        tokens = read_table(admin, TOKENS_TABLE)
        if requests is None or tokens is None:
            return  # not read this time: counted at the next poll
        for name in set(self.last) - set(requests) - set(tokens):
            del self.last[name]  # its entries expired (idle 48 h): a new one starts at 0
        for name in set(requests) | set(tokens):
            admitted, refused = requests.get(name, (0, 0))
            used = tokens.get(name, (0, 0))[0]
            before = self.last.get(name, (0, 0, 0))
            d_req = counter_delta(admitted, before[0])
            d_ref = counter_delta(refused, before[1])
            d_tok = counter_delta(used, before[2])
            self.last[name] = (admitted, refused, used)
            seen = self.counted.setdefault(name, {"requests": 0, "tokens": 0, "refused": 0})
            seen["requests"] += d_req
            seen["tokens"] += d_tok
            seen["refused"] += d_ref
            if not (d_req or d_tok):
                continue
            usage = self._usage_of(name)
            for period in ("day", "month"):
                slot = usage.setdefault(period_key(period, now), {"requests": 0, "tokens": 0})
                slot["requests"] += d_req
                slot["tokens"] += d_tok
            self.dirty.add(name)

    def thresholds(self, records: dict[str, KeyRecord], now: float | None = None,
                   counters_reset: bool = False) -> dict[str, int]:
        """name -> the HAProxy counter value at which its quota is spent: the counter now plus
        what the quota has left (limit - this period's usage, which includes the counter's
        counts). Between polls it stays the same (both grow together); it moves when HAProxy's
        counters restart (``counters_reset``: as a new HAProxy process will start them, at 0)
        or a new period begins."""
        now = time.time() if now is None else now
        out = {}
        for name, r in records.items():
            if r.quota is None or not r.usable(now):
                continue
            used = self._usage_of(name).get(period_key(r.quota.period, now), {}).get(r.quota.unit, 0)
            last = self.last.get(name, (0, 0, 0))
            counter = 0 if counters_reset else (last[0] if r.quota.unit == "requests" else last[2])
            out[name] = counter + max(0, r.quota.limit - used)
        return out

    def counters_restart(self) -> None:
        """HAProxy is about to start a new process (its counters start at 0)."""
        self.last = {}

    def save(self, every_s: float = 1.0, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if not self.dirty or now - self.saved_at < every_s:
            return
        for name in sorted(self.dirty):
            usage = self.usage[name]
            keep = sorted(usage)[-40:]  # the last 40 days/months
            self.store.put_usage(name, {k: usage[k] for k in keep})
        self.dirty.clear()
        self.saved_at = now

    def totals(self) -> dict[str, dict[str, int]]:
        """name -> requests, tokens, refused since the front door started (for /metrics)."""
        return {name: dict(v) for name, v in sorted(self.counted.items())}


class KeyState:
    """The front door's API keys: the maps HAProxy reads, kept in step with the key store
    (a revocation, rotation or expiry reaches HAProxy within a poll), and usage."""

    def __init__(self, plan: AccessPlan, map_dir: str) -> None:
        self.store = open_store(plan.store)
        self.map_dir = map_dir
        self.meter = UsageMeter(self.store)
        self.salt = self.store.salt()
        self.version = self.store.version()
        self.records = self.store.records()
        self.usable = self._usable(time.time())
        self.spent: set[str] = set()
        self.thresholds = self.meter.thresholds(self.records, counters_reset=True)
        write_maps(map_dir, map_entries(self.records, self.salt, self.thresholds))

    def before_reload(self, admin: Any) -> None:
        """HAProxy is about to start a new process, with its counters at 0: count what the
        old one counted, and write the maps (the new process reads them) for counters at 0."""
        try:
            self.meter.observe(admin)
        except OSError:
            pass  # HAProxy is gone: its counts are lost
        self.meter.counters_restart()
        self.thresholds = self.meter.thresholds(self.records, counters_reset=True)
        write_maps(self.map_dir, map_entries(self.records, self.salt, self.thresholds))

    def _usable(self, now: float) -> frozenset[str]:
        return frozenset(n for n, r in self.records.items() if r.usable(now))

    def salt_changed(self) -> bool:
        salt = self.store.salt()
        if salt == self.salt:
            return False
        self.salt = salt
        return True

    def _spent(self, name: str, now: float) -> bool:
        quota = self.records[name].quota
        assert quota is not None
        slot = self.meter.usage.get(name, {}).get(period_key(quota.period, now), {})
        return slot.get(quota.unit, 0) >= quota.limit

    def refresh(self, admin: Any, final: bool = False) -> None:
        now = time.time()
        changed = False
        version = self.store.version()
        if version != self.version:
            self.version, self.records = version, self.store.records()
            changed = True
        usable = self._usable(now)
        if usable != self.usable:
            self.usable, changed = usable, True
        self.meter.observe(admin, now)
        thresholds = self.meter.thresholds(self.records, now)
        if thresholds != self.thresholds:
            changed = True
        spent = {n for n, t in thresholds.items() if self._spent(n, now)}
        if spent - self.spent:
            final = True  # a spent quota is written at once (it must survive a restart)
        self.spent = spent
        self.thresholds = thresholds
        if changed:
            entries = map_entries(self.records, self.salt, thresholds, now)
            write_maps(self.map_dir, entries)
            apply_maps(admin, self.map_dir, entries)
        self.meter.save(every_s=0.0 if final else 1.0)


__all__ = ["AccessPlan", "COUNTER_WRAP", "KEY_HEADER", "KeyState", "MAPS", "MODELS_HEADER", "TOKENS_HEADER", "UsageMeter", "admit_rules", "allowed_models", "check_allowed", "counter_delta",
           "apply_maps", "frontend_rules", "map_entries", "over_limit_conditions", "preamble_rules", "read_table",
           "no_free_slot", "queue_limit_server_option", "shed_return", "shed_rules", "table_sections", "write_maps"]
