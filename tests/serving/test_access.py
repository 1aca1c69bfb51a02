"""API keys, limits, quotas and load shedding at the front door: the real HAProxy with the
config hetflow renders, in front of a small HTTP server that stands in for the replicas and the
gateway (it echoes what it was sent; no Ray). Every request is real HTTP on loopback."""

from __future__ import annotations

import http.client
import json
import re
import time
from pathlib import Path

import pytest

from hetflow.core.errors import InputError
from hetflow.workloads.serve import access as acc
from hetflow.workloads.serve import keys as K
from hetflow.workloads.serve.access import KeyState
from hetflow.workloads.serve.front import (
    FrontPlan,
    Server,
    admin_call,
    app_prefix,
    backend_name,
    group_prefix,
    needs_lua,
    render_config,
)
from hetflow.workloads.serve import upstream as up
from tests.net import free_port
from tests.serving.haproxy_run import Held, StandIn, listening, serve_in_thread, start_haproxy

SLOW = Held()  # slow-model's requests (test_a_full_model_is_refused_at_once holds them)


class _Backend(StandIn):
    tokens = "40"  # the tokens each answer says it used

    def _answer(self) -> None:
        n = int(self.headers.get("content-length") or 0)
        self.rfile.read(n)
        if self.path.endswith("/slow-model/predict") or "/slow-model/v1/completions" in self.path:
            SLOW.answer(0.6)  # the model's own backend (the gateway's path has no model in it)
        self.send_json(200, {"path": self.path, "key": self.headers.get(acc.KEY_HEADER),
                             "models": self.headers.get(acc.MODELS_HEADER)},
                       {acc.TOKENS_HEADER: self.tokens})  # as the gateway's completions answer

    do_GET = do_POST = _answer


class Front:
    """HAProxy + maps for a plan, driven as the front door actor drives them."""

    def __init__(self, root: Path, store: K.KeyStore, queue_limits: dict[str, int],
                 keys: bool = True) -> None:
        self.backend = serve_in_thread(_Backend)
        port = self.backend.server_address[1]
        self.port = free_port()
        self.plan = FrontPlan(app="t", host="127.0.0.1", port=self.port,
                              models={"digits": ["t.digits"], "slow-model": ["t.slow-model"]}, gateway_app="t",
                              request_timeout_s=5, retries=1, max_body_bytes=1 << 20,
                              access=(acc.AccessPlan(store=str(store.where), default_model="digits")
                                      if keys else None),
                              queue_limits=queue_limits, generative=frozenset({"slow-model"}))
        self.dir = root
        self.admin = str(root / "admin.sock")
        self.keys = KeyState(self.plan.access, str(root / "maps")) if keys else None
        servers = {"t.digits": [Server("r1", "127.0.0.1", port)],
                   # two replicas of slow-model (the same stand-in server behind both)
                   "t.slow-model": [Server("r2", "127.0.0.1", port), Server("r3", "127.0.0.1", port)],
                   "t": [Server("g1", "127.0.0.1", port)]}
        self.config = render_config(self.plan, servers, self.admin, None, str(root / "maps"),
                                    self.keys.salt if keys else "",
                                    up.write_lua(str(root)) if needs_lua(self.plan) else None)
        # ready once it listens and its admin socket is there (the tests drive it through that)
        self.proc, self.log = start_haproxy(root, self.config,
                                            lambda: listening(self.port) and Path(self.admin).exists())

    def refresh(self) -> None:
        self.keys.refresh(lambda c: admin_call(self.admin, c))

    def call(self, path: str, headers: dict | list | None = None, body: bytes = b"{}",
             method: str = "POST") -> tuple[int, dict, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        conn.putrequest(method, path, skip_accept_encoding=True)
        pairs = headers.items() if isinstance(headers, dict) else (headers or [])
        for name, value in pairs:
            conn.putheader(name, value)
        conn.putheader("content-length", str(len(body)))
        conn.endheaders(body)
        r = conn.getresponse()
        out = r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        conn.close()
        return out

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        self.backend.shutdown()
        self.backend.server_close()


@pytest.fixture()
def store(tmp_path) -> K.DirectoryKeyStore:
    return K.DirectoryKeyStore(tmp_path / "store")


@pytest.fixture()
def front(tmp_path, store):
    store.salt(create=True)
    made = []

    def start(queue_limits=None, keys=True) -> Front:
        f = Front(tmp_path, store, queue_limits or {}, keys)
        made.append(f)
        return f

    yield start
    for f in made:
        f.close()


def bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def test_store_keeps_only_salted_hashes_in_private_files(store) -> None:
    key = K.create_key(store, "team-a", models=["digits"], rps=5)
    assert key.startswith(K.KEY_PREFIX) and len(key) == len(K.KEY_PREFIX) + 43
    files = list(store.path.iterdir())
    assert oct(store.path.stat().st_mode & 0o777) == "0o700"
    assert all(oct(f.stat().st_mode & 0o777) == "0o600" for f in files)
    assert not any(key.encode() in f.read_bytes() or key[3:].encode() in f.read_bytes() for f in files)
    record = store.records()["team-a"]
    assert record.hash == K.key_hash(store.salt(), key) != K.key_hash("", key)
    again = K.rotate_key(store, "team-a")
    assert again != key and store.records()["team-a"].hash == K.key_hash(store.salt(), again)
    assert store.records()["team-a"].rps == 5  # the policy stays
    with pytest.raises(K.InputError, match="exists"):
        K.create_key(store, "team-a")
    K.revoke_key(store, "team-a")
    assert not store.records()["team-a"].usable()
    K.create_key(store, "team-a")  # a revoked name may be made again


@pytest.mark.parametrize("text, want", [("1000/day", ("requests", "day", 1000)),
                                        ("5 requests per month", ("requests", "month", 5)),
                                        ("50000 tokens/month", ("tokens", "month", 50000))])
def test_quota_text(text, want) -> None:
    q = K.parse_quota(text)
    assert (q.unit, q.period, q.limit) == want


def test_a_quota_past_what_haproxy_compares_is_one_line() -> None:
    assert K.parse_quota(f"{K.MAX_QUOTA} tokens/month").limit == K.MAX_QUOTA
    with pytest.raises(InputError, match=r"at most 1,000,000,000,000,000 a day or month"):
        K.parse_quota(f"{K.MAX_QUOTA + 1} tokens/month")


@pytest.mark.parametrize("value, before, grew", [(15, 10, 5), (5, 10, 5), (0, 0, 0),
                                                 (5, 2**32 - 10, 15),  # wrapped past 2^32
                                                 (5, 2**31 - 1, 5)])  # below half: started again
def test_a_counter_that_wrapped_or_started_again(value, before, grew) -> None:
    assert acc.counter_delta(value, before) == grew


def test_quota_period_ends() -> None:
    t = 1796300000.0  # 2026-12-03 10:53 UTC
    assert K.period_end("day", t) == 1796342400.0  # 2026-12-04 00:00
    assert K.period_end("month", t) == 1798761600.0  # 2027-01-01 00:00
    assert K.period_key("month", t) == "2026-12"


def test_keys_are_checked_before_any_replica(front, store) -> None:
    key = K.create_key(store, "team-a", models=["digits"])
    f = front()
    status, _, body = f.call("/v1/models/digits/predict", bearer(key))
    served = json.loads(body)
    assert status == 200 and served["key"] == "team-a" and served["models"] == "digits"
    assert f.call("/v1/models/digits/predict", {"x-api-key": key})[0] == 200
    assert f.call("/v1/models/digits/predict", {"Authorization": f"bearer  {key}"})[0] == 200  # RFC 6750: any case
    bad = [None, {"Authorization": ""}, {"Authorization": "Bearer"}, {"Authorization": f"Basic {key}"},
           {"Authorization": "Bearer " + key[:-1]}, {"Authorization": "Bearer " + key + "x"},
           {"Authorization": "Bearer " + "a" * 6000}, {"Authorization": "Bearer k\xe9y\xff"},
           [("Authorization", f"Bearer {key}"), ("Authorization", f"Bearer {key}")],
           [("x-api-key", key), ("x-api-key", key)], {"x-api-key": key.upper()},
           {"Authorization": key}]  # the key without its scheme
    for headers in bad:
        status, got, body = f.call("/v1/models/digits/predict", headers)
        assert status == 401, (headers, status, body)
        assert got["content-type"] == "application/json" and body.count(b"\n") == 0
        assert "API key" in json.loads(body)["error"] and key.encode() not in body
        assert f.call("/v1/models/digits/predict", bearer(key))[0] == 200  # the next good one
    # health probes stay open; everything else needs a key
    assert f.call("/health", method="GET", body=b"")[0] == 200
    assert f.call("/v2/health/ready", method="GET", body=b"")[0] == 200
    assert f.call("/metrics", method="GET", body=b"")[0] == 401
    # the client cannot pose as a key, nor widen its models
    _, _, body = f.call("/v1/models/digits/predict", {**bearer(key), acc.KEY_HEADER: "admin",
                                                      acc.MODELS_HEADER: "*"})
    assert json.loads(body)["key"] == "team-a" and json.loads(body)["models"] == "digits"
    # the key material is in no file the front door wrote
    for path in f.dir.rglob("*"):
        if path.is_file():
            assert key.encode() not in path.read_bytes(), path


def test_a_model_the_key_may_not_use_is_403(front, store) -> None:
    key = K.create_key(store, "team-a", models=["digits"])
    other = K.create_key(store, "all-models")
    f = front()
    for path, body in [("/v1/models/slow-model/predict", b"{}"), ("/v2/models/slow-model/infer", b"{}"),
                       ("/v1/completions", b'{"model": "slow-model", "prompt": "hi"}'),
                       ("/v1/chat/completions", b'{"model": "slow-model", "messages": []}'),
                       ("/v1/embeddings", b'{"model": "slow-model", "input": "hi"}'),
                       ("/v1/predict", b'{"model": "slow-model", "inputs": []}')]:
        status, _, answer = f.call(path, bearer(key), body)
        assert status == 403 and "may not use" in json.loads(answer)["error"], path
        assert f.call(path, bearer(other), body)[0] == 200, path
    assert f.call("/v1/predict", bearer(key), b'{"inputs": []}')[0] == 200  # the default model
    assert f.call("/v1/models/digits/predict", bearer(key))[0] == 200


def test_rate_limit_answers_429_with_retry_after(front, store) -> None:
    key = K.create_key(store, "limited", rps=5)
    f = front()
    codes = [f.call("/v1/models/digits/predict", bearer(key)) for _ in range(9)]
    assert [c[0] for c in codes[:5]] == [200] * 5 and {c[0] for c in codes[5:]} == {429}
    status, headers, body = codes[-1]
    assert headers["retry-after"] == "1" and "requests per second" in json.loads(body)["error"]
    time.sleep(2.1)  # the sliding second has passed
    assert f.call("/v1/models/digits/predict", bearer(key))[0] == 200
    f.refresh()
    assert f.keys.meter.totals()["limited"]["refused"] == 4



def test_a_burst_is_allowed_at_once_and_the_rate_holds_over_ten_seconds(front, store) -> None:
    key = K.create_key(store, "bursty", rps=2, burst=6)
    f = front()
    codes = [f.call("/v1/models/digits/predict", bearer(key))[0] for _ in range(8)]
    assert codes[:6] == [200] * 6 and set(codes[6:]) == {429}  # 6 at once, not 8
    # then 6 a second again and again: within any 10 s at most 2 x 10 get through
    admitted, sustained = 6, None
    t0 = time.monotonic()
    while time.monotonic() - t0 < 6 and sustained is None:
        time.sleep(1.05)
        for _ in range(6):
            status, _, body = f.call("/v1/models/digits/predict", bearer(key))
            if status == 200:
                admitted += 1
            elif "sustained" in json.loads(body)["error"]:
                sustained = admitted
                break
    assert sustained is not None and 12 <= sustained <= 2 * acc.SUSTAIN_S, sustained
    # a key without a burst keeps the plain sliding second: its rate, not more, at once
    plain = K.create_key(store, "plain", rps=2)
    f.refresh()
    assert [f.call("/v1/models/digits/predict", bearer(plain))[0] for _ in range(3)] == [200, 200, 429]


def test_a_burst_needs_a_rate_at_most_its_size(store) -> None:
    for rps, burst in ((None, 5), (5, 3)):
        with pytest.raises(InputError, match="--burst"):
            K.create_key(store, "b", rps=rps, burst=burst)
    K.create_key(store, "b", rps=5, burst=5)  # a burst the size of the rate is the plain rate


@pytest.mark.parametrize("field", ["rps", "burst", "tokens_per_min"])
def test_a_limit_past_haproxys_counters_is_one_line(store, field) -> None:
    limits = {"rps": 5, field: 2**31}  # HAProxy's counters are 32-bit: 2^31 - 1 is the most
    with pytest.raises(InputError, match=r"past 2,147,483,647.*leave it out for no limit"):
        K.create_key(store, f"big-{field}".replace("_", "-"), **limits)
    assert f"big-{field}".replace("_", "-") not in store.records()
    K.create_key(store, f"top-{field}".replace("_", "-"), **{"rps": 2**31 - 1, field: 2**31 - 1})

def test_tokens_per_minute_count_the_answers_tokens(front, store) -> None:
    key = K.create_key(store, "tpm", tokens_per_min=100)  # each answer says 40 tokens
    f = front()
    codes = [f.call("/v1/completions", bearer(key), b'{"model": "digits"}')[0] for _ in range(5)]
    assert codes == [200, 200, 200, 429, 429]  # 120 tokens counted after the third


def test_quota_blocks_until_reset_and_persists(front, store, tmp_path) -> None:
    key = K.create_key(store, "q", quota=K.parse_quota("3/day"))
    f = front()
    assert [f.call("/v1/models/digits/predict", bearer(key))[0] for _ in range(3)] == [200] * 3
    status, headers, body = f.call("/v1/models/digits/predict", bearer(key))  # no poll between
    assert status == 429 and "quota" in json.loads(body)["error"]
    assert 0 < int(headers["retry-after"]) <= 86400
    f.refresh()  # the front door's poll: counts -> usage (a spent quota is saved at once)
    assert store.usage("q")[K.period_key("day")]["requests"] == 3
    f.close()
    # a new front door (a restart) reads the usage back: still spent
    (tmp_path / "again").mkdir()
    again = Front(tmp_path / "again", store, {})
    try:
        assert again.call("/v1/models/digits/predict", bearer(key))[0] == 429
    finally:
        again.close()


def test_a_token_quota_past_haproxys_32_bit_counter_counts_every_token(front, store, monkeypatch) -> None:
    # HAProxy's gpc counters wrap at 2^32 (4,294,967,296 tokens: days for a busy key on a big
    # quota); answers of 2e9 tokens each get there in three requests
    monkeypatch.setattr(_Backend, "tokens", "2000000000")
    key = K.create_key(store, "big", quota=K.parse_quota("10000000000 tokens/month"))
    f = front()
    for _ in range(3):
        assert f.call("/v1/completions", bearer(key), b'{"model": "digits"}')[0] == 200
        f.refresh()  # the front door's poll between requests
    assert acc.read_table(lambda c: admin_call(f.admin, c), acc.TOKENS_TABLE)["big"][0] == 6_000_000_000 - 2**32
    f.keys.refresh(lambda c: admin_call(f.admin, c), final=True)  # saved now (else once a second)
    assert store.usage("big")[K.period_key("month")]["tokens"] == 6_000_000_000  # the wrap counted
    for _ in range(2):
        assert f.call("/v1/completions", bearer(key), b'{"model": "digits"}')[0] == 200
        f.refresh()
    assert store.usage("big")[K.period_key("month")]["tokens"] == 10_000_000_000  # spent: saved at once
    status, headers, body = f.call("/v1/completions", bearer(key), b'{"model": "digits"}')
    assert status == 429 and "quota" in json.loads(body)["error"]


def test_revoke_rotate_and_expiry_reach_the_running_front_door(front, store) -> None:
    key = K.create_key(store, "team-a")
    f = front()
    assert f.call("/v1/models/digits/predict", bearer(key))[0] == 200
    new = K.rotate_key(store, "team-a")
    f.refresh()
    assert f.call("/v1/models/digits/predict", bearer(key))[0] == 401
    assert f.call("/v1/models/digits/predict", bearer(new))[0] == 200
    K.revoke_key(store, "team-a")
    f.refresh()
    assert f.call("/v1/models/digits/predict", bearer(new))[0] == 401
    soon = K.create_key(store, "short", expires=time.time() + 1.0)
    f.refresh()
    assert f.call("/v1/models/digits/predict", bearer(soon))[0] == 200
    time.sleep(1.1)
    f.refresh()
    assert f.call("/v1/models/digits/predict", bearer(soon))[0] == 401


@pytest.mark.parametrize("keys", [True, False], ids=["keys", "open"])
@pytest.mark.parametrize("path,body", [
    ("/v1/models/slow-model/predict", b"{}"),
    # an OpenAI completion naming a generative model counts against the same limit
    ("/v1/completions", b'{"model": "slow-model", "prompt": "hi", "max_tokens": 4}')],
    ids=["predict", "completions"])
def test_a_full_model_is_refused_at_once(front, store, keys, path, body) -> None:
    """``queue_limit`` 2 per replica, two replicas: while 4 slow requests run, 4 more
    concurrent ones get 503 at once; the 4 are answered."""
    key = K.create_key(store, "team-a")
    f = front(queue_limits={"slow-model": 2}, keys=keys)
    auth = bearer(key) if keys else {}

    def one(_):
        started = time.perf_counter()
        status, headers, _ = f.call(path, auth, body)
        return status, time.perf_counter() - started, headers.get("retry-after")

    ok, shed = SLOW.then_more(one)  # the 4 slots filled and held, then 4 more
    assert [r[0] for r in ok] == [200] * 4, ok
    assert [r[0] for r in shed] == [503] * 4, shed
    assert all(r[1] < 0.5 and r[2] == "1" for r in shed)  # answered without waiting for a slot
    assert f.call(path, auth, body)[0] == 200  # room again


def test_a_replica_that_goes_down_with_requests_in_flight_leaves_the_others_their_limit(front) -> None:
    """The limit counts the free slots of the replicas that are up: requests still in flight on
    a replica just marked down (a dead replica's last connections) must not fill the limit of
    the replica that took over."""
    import concurrent.futures as cf

    f = front(queue_limits={"slow-model": 2}, keys=False)
    admin = lambda command: admin_call(f.admin, command)  # noqa: E731
    backend = backend_name("slow-model")
    admin(f"set server {backend}/r3 state maint")
    call = lambda _: f.call("/v1/models/slow-model/predict")[0]  # noqa: E731
    with cf.ThreadPoolExecutor(3) as pool:
        filling = [pool.submit(call, i) for i in range(2)]  # both on r2 (r3 is in maintenance)
        time.sleep(0.2)
        admin(f"set server {backend}/r3 state ready")
        admin(f"set server {backend}/r2 state maint")  # r2 leaves with its 2 requests in flight
        assert pool.submit(call, 2).result() == 200  # r3 has its own 2 slots
        assert [x.result() for x in filling] == [200, 200]


def test_completions_go_to_the_generative_models_own_backend(front, store) -> None:
    """By the body's model: a generative model's replicas (its route prefix in the path they
    get), anything else - another model, no model, a body HAProxy cannot read - the gateway."""
    f = front(keys=False)
    seen = {}
    for name, body in [("slow", b'{"model": "slow-model", "prompt": "hi"}'),
                       ("digits", b'{"model": "digits", "prompt": "hi"}'),
                       ("none", b'{"prompt": "hi"}'), ("junk", b'{"model": ')]:
        status, _, answer = f.call("/v1/completions", {"content-type": "application/json"}, body)
        assert status == 200, (name, answer)
        seen[name] = json.loads(answer)["path"]
    assert seen["slow"] == f"{group_prefix('t', 'slow-model', 0)}/v1/completions"
    for name in ("digits", "none", "junk"):
        assert seen[name] == f"{app_prefix('t')}/v1/completions", name


def test_fuzzed_auth_headers_are_401_and_never_stick(front, store, capsys) -> None:
    """Random bytes (no CR/LF/NUL, which no HTTP client can send in a header) as
    ``Authorization`` and ``x-api-key``, alone, twice, or as a right key with bytes added or
    cut: every answer 401 (a request HAProxy cannot parse at all: 400), never 5xx, and the next
    good request answered."""
    from hypothesis import strategies as st

    from tests.fuzzing import fuzz, report

    key = K.create_key(store, "team-a")
    f = front()
    value = st.binary(max_size=300).map(lambda b: bytes(c for c in b if c not in b"\r\n\0")
                                        .decode("latin-1"))
    edits = st.one_of(value, st.builds(lambda v: key + v, value), st.builds(lambda n: key[:n], st.integers(0, len(key) - 1)),
                      st.builds(lambda v: v + key, value.filter(lambda v: v.strip() != ""))
                      ).filter(lambda e: e.strip(" \t") != key  # (the key itself, spaces around it, is right)
                               and not re.fullmatch(r"(?i)\s*bearer +" + re.escape(key) + r"\s*", e))
    headers = st.one_of(
        st.builds(lambda v: [("Authorization", v)], edits),
        st.builds(lambda v: [("Authorization", "Bearer " + v)], edits),
        st.builds(lambda v: [("x-api-key", v)], edits),
        st.builds(lambda v: [("Authorization", f"Bearer {key}"), ("Authorization", v)], edits))

    def check(pairs) -> None:
        status, _, body = f.call("/v1/models/digits/predict", pairs)
        assert status in (400, 401), (pairs, status, body)
        assert key.encode() not in body
        assert f.call("/v1/models/digits/predict", bearer(key))[0] == 200

    tried = fuzz(check, headers, examples=150)
    report(capsys, f"fuzz: {tried} auth headers to the front door, every answer 401/400, none stuck")
