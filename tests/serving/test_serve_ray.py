"""Serving on a real local Ray cluster: routing, batching, bad input, placement, kills, fallback.

One cluster for the module: a CPU head and a hetflow-managed node that declares two L40S GPUs
(48 GB each) it does not have (``ray.cluster_utils.Cluster``). One application serves:

* ``digits``: the conftest's trained MLP, fp32, 2 CPU replicas, batching on, falls back to
* ``digits-int8``: a small MLP trained on the cluster by ``train_if_missing`` (run_training),
  int8 dynamic quantisation, 1 CPU replica;
* ``placed``: random weights, 3 replicas of 20 GiB each placed by the planner on the fake GPU
  node - two share device 0, one is on device 1 - each seeing exactly its device.

The cluster runs with Serve's direct ingress (``front.FAST_ENV``, as ``hetflow serve`` starts
it), so requests take the fast path: front door (HAProxy) -> the model replica. Loads are
bounded in count and time; the kill tests run last (each waits for recovery).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import signal
import socket
import time

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import numpy as np
import pytest
import ray
import requests
from prometheus_client.parser import text_string_to_metric_families

from hetflow.accelerators.synthetic import synthetic_node
from hetflow.workloads.serve.app import deploy
from hetflow.workloads.serve.config import serve_config_from_dict
from hetflow.workloads.serve.front import FAST_ENV
from hetflow.workloads.serve.inference import ReplicaSpec, build_runner
from hetflow.workloads.serve.loadgen import digits_bodies, run_load
from hetflow.workloads.train.checkpoint import latest_checkpoint
from hetflow.workloads.train.data import load_dataset
from tests.ray_cluster import hetflow_cluster
from tests.net import free_port as _free_port

pytestmark = pytest.mark.ray

BODY_LIMIT = 64 * 1024


@pytest.fixture(scope="module")
def served(digits_model, tmp_path_factory):
    small_ckpt = tmp_path_factory.mktemp("int8-ckpt")
    config = serve_config_from_dict({
        "name": "svc",
        "http": {"host": "127.0.0.1", "port": _free_port()},
        "limits": {"max_body_bytes": BODY_LIMIT, "max_rows": 16, "request_timeout_s": 30,
                   "max_new_tokens": 32, "client_timeout_s": 1},
        # two gateway replicas: /metrics must be the sum over replicas whichever one answers
        "gateway": {"status_poll_s": 0.5, "replicas": 2},
        "models": [
            # Queue limit 0 (never refuse): its kill tests check that a replica's death loses no
            # request, not shedding (`queued` checks that); with both cores starved by a test
            # beside it, the surviving replica once held its 64 slots and 24 requests were shed.
            {"name": "digits", "train": digits_model.train_dict,
             "checkpoint_dir": str(digits_model.checkpoint_dir), "devices": "cpu",
             "replicas": 2, "cpus_per_replica": 0.5, "fallback": "digits-int8", "queue_limit": 0,
             "batching": {"max_batch_size": 32, "batch_wait_timeout_s": 0.005}},
            {"name": "digits-int8", "precision": "int8", "replicas": 1, "cpus_per_replica": 0.5,
             "train_if_missing": True,
             "train": {"name": "int8-src", "model": {"kind": "mlp", "hidden": [32]},
                       "train": {"steps": 60, "batch_size": 64, "log_every": 20},
                       "checkpoint": {"dir": str(small_ckpt)},
                       "resources": {"devices": "cpu", "cpus_per_rank": 1}}},
            {"name": "placed", "weights": "random", "devices": {"kind": "auto", "memory": "20GiB"},
             "replicas": 3, "cpus_per_replica": 0.25, "batching": {"enabled": False},
             "train": {"model": {"kind": "mlp", "hidden": [16]}}},
            # A tiny causal LM (random weights) for the OpenAI endpoint.
            {"name": "tinygpt", "weights": "random", "devices": "cpu", "cpus_per_replica": 0.25,
             "batching": {"enabled": False},
             "train": {"model": {"kind": "gpt", "layers": 1, "dim": 32, "heads": 2,
                                 "seq_len": 16}}},
            # Scales with load: any sustained traffic is far above its tiny target. Queue limit 0
            # (never refuse): its test checks that scaling loses no request, not shedding (which
            # `queued` checks), and a busy 2-core CI machine once held 64 of its requests at once.
            {"name": "elastic", "weights": "random", "devices": "cpu", "cpus_per_replica": 0.25,
             "queue_limit": 0,
             "batching": {"enabled": False}, "train": {"model": {"kind": "mlp", "hidden": [16]}},
             "autoscaling": {"min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 0.01,
                             "upscale_delay_s": 0.0, "downscale_delay_s": 600.0}},
            # Autoscaled, so routed through the gateway, which holds its queue limit; slow on
            # purpose (a batch waits 1 s to fill), so requests stay in flight.
            {"name": "queued", "weights": "random", "devices": "cpu", "cpus_per_replica": 0.25,
             "train": {"model": {"kind": "mlp", "hidden": [16]}}, "queue_limit": 2,
             "batching": {"max_batch_size": 64, "batch_wait_timeout_s": 1.0},
             "autoscaling": {"min_replicas": 1, "max_replicas": 1}},
        ],
    })
    gpu_node = synthetic_node("2x L40S", "gpu-node")
    saved = {k: os.environ.get(k) for k in FAST_ENV}
    os.environ.update(FAST_ENV)  # before the cluster starts: Ray's processes read it
    try:
        with hetflow_cluster([gpu_node], head_cpus=6, node_cpus=2, log_to_driver=False):
            app = deploy(config, timeout_s=240)
            app.small_ckpt = small_ckpt
            yield app
            app.shutdown()
            from ray import serve

            serve.shutdown()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def scrape(served) -> tuple[dict[tuple[str, frozenset], float], dict[str, str]]:
    """``GET /metrics`` read by prometheus_client's parser: ({(sample, labels): value},
    {family: type})."""
    r = requests.get(served.url + "/metrics", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    values, types = {}, {}
    for family in text_string_to_metric_families(r.text):
        types[family.name] = family.type
        for sample in family.samples:
            values[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return values, types


def sample(values, name: str, **labels: str) -> float:
    return values.get((name, frozenset(labels.items())), 0.0)


def post(served, path: str, body, **kw) -> requests.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"content-type": "application/json", **kw.pop("headers", {})}
    return requests.post(served.url + path, data=data, headers=headers, timeout=30, **kw)


@pytest.fixture(scope="module")
def held_out(digits_model):
    val = load_dataset("digits", val_fraction=0.2, seed=0).val
    return val.inputs.numpy(), val.targets.numpy()


# --- readiness (first: it runs the moment deploy() said ready) ------------------------------


def test_ready_means_every_request_is_answered(served) -> None:
    """deploy() returned: hit every model at once, with no warm-up, and ask /health."""
    # (not elastic: load scales it, which its own test watches; tinygpt: the OpenAI tests)
    paths = [f"/v1/models/{m}/predict" for m in ("digits", "digits-int8", "placed")]
    jobs = [(path, body) for path in paths for body in digits_bodies(rows=1, count=32)]
    with cf.ThreadPoolExecutor(24) as pool:
        results = list(pool.map(lambda job: post(served, job[0], job[1]), jobs))
    codes = [r.status_code for r in results]
    assert codes.count(200) == len(jobs), {c: codes.count(c) for c in set(codes)}
    assert all(not r.json()["fallback"] for r in results)  # each model answered itself
    health = requests.get(served.url + "/health", timeout=10)
    assert health.status_code == 200 and health.json()["ready"] is True
    assert health.json()["status"] == "ok"


# --- routing --------------------------------------------------------------------------------


def test_predictions_match_the_model_in_process(served, digits_model, held_out) -> None:
    rows = held_out[0][:5]
    r = post(served, "/v1/models/digits/predict", {"inputs": rows.tolist(), "probabilities": True})
    assert r.status_code == 200, r.text
    body = r.json()
    local = build_runner(ReplicaSpec("digits", digits_model.train_dict,
                                     str(digits_model.checkpoint_dir), "fp32", "cpu"))
    assert body["predictions"] == local.predict(rows)["predictions"]
    assert body["served_by"] == "digits" and body["fallback"] is False
    assert np.allclose(np.sum(body["probabilities"], axis=1), 1.0, atol=1e-4)
    # trained classifier: most of 64 held-out digits right
    r = post(served, "/v1/models/digits/predict", {"inputs": held_out[0][:16].tolist()})
    assert np.mean(np.array(r.json()["predictions"]) == held_out[1][:16]) > 0.8


def test_models_by_name_behind_one_endpoint(served, held_out) -> None:
    row = held_out[0][:1].tolist()
    assert post(served, "/v1/predict", {"inputs": row}).json()["served_by"] == "digits"
    int8 = post(served, "/v1/predict", {"inputs": row, "model": "digits-int8"}).json()
    assert int8["served_by"] == "digits-int8" and int8["model"] == "digits-int8"
    assert post(served, "/v1/models/placed/predict", {"inputs": row}).json()["served_by"] == "placed"
    listing = requests.get(served.url + "/v1/models", timeout=10).json()["models"]
    assert sorted(listing) == ["digits", "digits-int8", "elastic", "placed", "queued", "tinygpt"]
    assert listing["digits"]["fallback"] == ["digits-int8"]
    assert listing["digits-int8"]["precision"] == "int8"
    assert listing["digits"]["input"]["width"] == 64
    # batches in flight: 2 per replica by default (digits has 2), as the listing tells clients
    assert listing["digits"]["batching"]["in_flight"] == 4
    assert listing["elastic"]["batching"]["in_flight"] == 4  # autoscaling's max_replicas: 2


def test_train_if_missing_trained_the_int8_source(served) -> None:
    info = latest_checkpoint(served.small_ckpt)
    assert info is not None and info.step == 60


# --- batching -------------------------------------------------------------------------------


def test_batches_form_under_concurrency(served) -> None:
    bodies = digits_bodies(rows=1, count=64)
    with cf.ThreadPoolExecutor(32) as pool:
        results = list(pool.map(lambda b: post(served, "/v1/models/digits/predict", b), bodies))
    assert all(r.status_code == 200 for r in results)
    sizes = [r.json()["batch"]["requests"] for r in results]
    assert max(sizes) > 1, sizes
    metrics = requests.get(served.url + "/metrics?format=json", timeout=10).json()
    hist = metrics["batch_requests"]["digits"]
    assert hist["count"] - hist["buckets"]["1"] > 0  # requests that shared a forward pass


def test_unbatched_model_runs_requests_alone(served) -> None:
    bodies = digits_bodies(rows=1, count=16)
    with cf.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda b: post(served, "/v1/models/placed/predict", b), bodies))
    assert {r.json()["batch"]["requests"] for r in results} == {1}


# --- bad input ------------------------------------------------------------------------------

ROW = [0.5] * 64
BAD_HTTP = [
    ("POST", "/v1/models/digits/predict", b"{oops", {}, 400, "malformed JSON"),
    ("POST", "/v1/models/digits/predict", {"inputs": [ROW[:10]]}, {}, 422, "has 10 values"),
    ("POST", "/v1/models/digits/predict", {"inputs": [["x"] * 64]}, {}, 422, "JSON string"),
    ("POST", "/v1/models/digits/predict", {"inputs": [ROW] * 17}, {}, 413, "17 rows"),
    ("POST", "/v1/models/digits/predict", b"[" + b"0," * 40_000 + b"0]", {}, 413, "limit of 65536"),
    ("POST", "/v1/models/nope/predict", {"inputs": [ROW]}, {}, 404, "unknown model 'nope'"),
    ("POST", "/v1/predict", {"inputs": [ROW], "model": "nope"}, {}, 404, "unknown model"),
    ("POST", "/v1/models/digits/predict", {"inputs": [ROW]}, {"content-type": "text/plain"},
     415, "not JSON"),
    ("GET", "/v1/models/digits/predict", None, {}, 405, "takes POST"),
    ("POST", "/nowhere", {}, {}, 404, "no endpoint /nowhere"),
]


def test_bad_input_gets_4xx_and_never_sticks(served) -> None:
    for method, path, body, headers, status, words in BAD_HTTP:
        data = None if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
        r = requests.request(method, served.url + path, data=data, timeout=30,
                             headers={"content-type": "application/json", **headers})
        assert r.status_code == status, (path, r.status_code, r.text)
        assert words in r.json()["error"], r.text
    started = time.monotonic()
    good = post(served, "/v1/models/digits/predict", {"inputs": [ROW]})
    assert good.status_code == 200 and time.monotonic() - started < 5
    # refused before any model saw them: too many rows, and a body over the limit (the
    # replicas send their counts to the front door every half second)
    deadline = time.monotonic() + 10
    while sample(values := scrape(served)[0], "hetflow_serve_requests_total", model="-", code="413") != 2:
        assert time.monotonic() < deadline, values
        time.sleep(0.3)
    assert not [k for k in values if dict(k[1]).get("code", "").startswith("5")]


# --- standard protocols: KServe v2 (tritonclient) and OpenAI (openai), unmodified clients -----


def _port(served) -> int:
    return int(served.url.rsplit(":", 1)[1])


def test_kserve_v2_with_tritonclient(served, held_out) -> None:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url=f"127.0.0.1:{_port(served)}")
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("digits")
    meta = client.get_model_metadata("digits")
    assert meta["inputs"][0] == {"name": "input", "datatype": "FP32", "shape": [-1, 64]}
    rows = held_out[0][:3].astype(np.float32)
    want = post(served, "/v1/models/digits/predict", {"inputs": rows.tolist()}).json()
    for binary in (True, False):  # tritonclient's default binary tensors, and JSON data
        tensor = httpclient.InferInput("input", list(rows.shape), "FP32")
        tensor.set_data_from_numpy(rows, binary_data=binary)
        outputs = [httpclient.InferRequestedOutput("predictions", binary_data=binary),
                   httpclient.InferRequestedOutput("probabilities", binary_data=binary)]
        result = client.infer("digits", [tensor], outputs=outputs)
        assert result.as_numpy("predictions").tolist() == want["predictions"]
        assert result.as_numpy("probabilities").shape == (3, 10)
        assert np.allclose(result.as_numpy("probabilities").sum(axis=1), 1.0, atol=1e-4)
    result = client.infer("digits", [tensor])  # no outputs named: all of them, binary
    assert result.as_numpy("predictions").tolist() == want["predictions"]
    client.close()


def _openai(served):
    from openai import OpenAI

    return OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def test_openai_completions_stream_with_the_openai_client(served) -> None:
    client = _openai(served)
    stream = client.completions.create(model="tinygpt", prompt="def f(x):", max_tokens=12,
                                       temperature=0, stream=True)
    chunks = list(stream)
    assert len(chunks) >= 2 and chunks[-1].choices[0].finish_reason == "length"
    streamed = "".join(c.choices[0].text for c in chunks)
    whole = client.completions.create(model="tinygpt", prompt="def f(x):", max_tokens=12,
                                      temperature=0)
    assert whole.choices[0].text == streamed  # greedy: the same tokens both ways
    assert whole.usage.completion_tokens == 12 and whole.usage.prompt_tokens == 9
    counted = list(client.completions.create(model="tinygpt", prompt="def f(x):", max_tokens=12, temperature=0,
                                             stream=True, stream_options={"include_usage": True}))
    assert counted[-1].choices == [] and counted[-1].usage.completion_tokens == 12
    assert counted[-1].usage.prompt_tokens == 9


def test_openai_bad_requests_are_400_with_a_message(served) -> None:
    import openai

    client = _openai(served)
    for kwargs, words in [({"max_tokens": 33}, "over the limit of 32"),
                          ({"extra_body": {"frobnicate": 1}}, "unknown field"),
                          ({"model": "digits"}, "not generative"),
                          ({"n": 2}, "not supported")]:
        args = {"model": "tinygpt", "prompt": "x", "max_tokens": 4, **kwargs}
        try:
            client.completions.create(**args)
        except openai.BadRequestError as exc:
            assert words in str(exc), exc
        else:
            raise AssertionError(f"{kwargs} was accepted")
        assert client.completions.create(model="tinygpt", prompt="x", max_tokens=2).choices


V2 = "/v2/models/digits/infer"


def _v2_body(shape, datatype="FP32", data=None):
    count = int(np.prod(shape))
    return {"inputs": [{"name": "input", "shape": shape, "datatype": datatype,
                        "data": data if data is not None else [0.5] * count}]}


BAD_V2 = [
    (_v2_body([1, 64], "BYTES"), 400, "datatype 'BYTES' is not accepted"),
    (_v2_body([1, 64], "INT64", [1] * 64), 400, "send FP32"),
    (_v2_body([1, 63]), 400, "63 values per row"),
    (_v2_body([2, 64], data=[0.5] * 64), 400, "shape [2, 64] needs 128"),
    (_v2_body([1, 64], data=[2.0] * 64), 422, "above 1"),
    (_v2_body([17, 64]), 413, "17 rows"),
    ({"inputs": [], "extra": 1}, 400, "unknown key"),
    (b"[" + b"0," * 40_000 + b"0]", 413, "limit of 65536"),
]


def test_bad_input_on_every_protocol_is_4xx_and_never_sticks(served) -> None:
    def good() -> None:
        started = time.monotonic()
        r = post(served, V2, _v2_body([1, 64]))
        assert r.status_code == 200 and time.monotonic() - started < 5, r.text
        assert post(served, "/v1/models/digits/predict", {"inputs": [ROW]}).status_code == 200

    for body, status, words in BAD_V2:
        r = post(served, V2, body)
        assert r.status_code == status and words in r.json()["error"], (body, r.text)
        good()
    # a slow client: headers never finished within limits.client_timeout_s (1 s) -> 408
    # and a malformed request line or header: HAProxy's own 400 (its HTTP/1 layer answers
    # both itself, with its short page: HAProxy 2.8 cannot replace those)
    for raw, code in ((b"POST /v1/models/digits/predict HTTP/1.1\r\nHost: x\r\n", b"408"),
                      (b"POST /v1/models/digits/predict HTTP/1.1\r\nHost x\r\n\r\n", b"400")):
        with socket.create_connection(("127.0.0.1", _port(served)), timeout=10) as sock:
            sock.sendall(raw)
            reply = _read_reply(sock)
        assert reply.startswith(b"HTTP/1.1 " + code), reply[:80]
        good()
    values, _ = scrape(served)
    assert not [k for k in values if dict(k[1]).get("code", "").startswith("5")]


def _read_reply(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (HAProxy closes after its own errors)."""
    chunks = []
    while chunk := sock.recv(4096):
        chunks.append(chunk)
    return b"".join(chunks)


# --- fuzzed requests on every protocol (after the bad-input tests: their counts are exact) ----

FUZZ_TIMEOUT_S = 10  # an answer later than this is a hang (the test fails)
CONTENT_TYPES = ["application/json", "application/json; charset=utf-8", "text/plain", "",
                 "application/x-www-form-urlencoded", "application/vnd.api+json", "*/*",
                 "multipart/form-data; boundary=x", "application/json\u00e9"]
# printable latin-1 (what an HTTP header value can carry), '²' and friends included; not
# U+00A0, which requests takes for leading whitespace and refuses
HEADER_TEXT = "".join(map(chr, [*range(0x21, 0x7F), *range(0xA1, 0x100)]))


def _fuzz_answer(r: requests.Response, what: str) -> int | str:
    """The invariant: 200, or a 4xx whose body is hetflow's JSON error of one line (or, for
    what the HTTP layer itself refuses, its short page: counted as "<code> http"); never a
    5xx. The status, as counted."""
    from tests.fuzzing import one_line_message

    code = r.status_code
    assert code == 200 or 400 <= code < 500, (what, code, r.text[:300])
    if code == 200 or r.request.method == "HEAD":
        return code
    if not r.headers.get("content-type", "").startswith("application/json"):
        assert len(r.content) < 300 and b"Traceback" not in r.content, (what, r.text[:300])
        return f"{code} http"
    error = r.json()["error"]
    message = error["message"] if isinstance(error, dict) else error  # OpenAI's, ours
    assert isinstance(message, str) and one_line_message(message), (what, r.text[:300])
    return code


def _good_requests_answered(served) -> None:
    """Right after bad input: the v1, v2 and OpenAI endpoints answer good requests, at once."""
    started = time.monotonic()
    v1 = post(served, "/v1/models/digits/predict", {"inputs": [ROW, [0.0] * 64]})
    v2 = post(served, V2, _v2_body([2, 64], data=ROW + [0.0] * 64))
    assert v1.status_code == 200 and v2.status_code == 200, (v1.text, v2.text)
    by_v2 = [o for o in v2.json()["outputs"] if o["name"] == "predictions"][0]["data"]
    assert v1.json()["predictions"] == by_v2  # the same rows, the same answers both ways
    done = post(served, "/v1/completions", {"model": "tinygpt", "prompt": "ab", "max_tokens": 2,
                                            "temperature": 0})
    assert done.status_code == 200 and done.json()["usage"]["completion_tokens"] == 2, done.text
    assert time.monotonic() - started < 10


def test_fuzzed_requests_on_every_protocol_get_4xx_or_200(served, capsys) -> None:
    """Hypothesis-drawn requests - valid bodies with parts broken (edge numbers, NaN, wrong
    types and shapes, unicode, unknown keys), raw bytes, wrong content types, odd header
    values, paths and methods - to every endpoint: each answered 200 or 4xx with a one-line
    JSON error, none later than FUZZ_TIMEOUT_S; good requests answered right after each
    batch; no 5xx counted anywhere."""
    from hypothesis import strategies as st

    from tests.fuzzing import fuzz, json_bytes, mutated, raw_bodies, report

    def send(method: str, path: str, body: bytes | None = None, **headers: str) -> int | str:
        r = requests.request(method, served.url + path, data=body, timeout=FUZZ_TIMEOUT_S,
                             headers={"content-type": "application/json", **headers})
        code = _fuzz_answer(r, f"{method} {path} {headers} {(body or b'')[:200]!r}")
        if code == 200 and path.endswith("/predict"):
            predictions = r.json()["predictions"]
            assert all(type(p) is int and 0 <= p < 10 for p in predictions), r.text[:300]
        return code

    lines = []

    def batch(name: str, check, strategy, examples: int, sweep=()) -> None:
        codes: dict[int | str, int] = {}

        def counted(case) -> None:
            code = check(case)
            codes[code] = codes.get(code, 0) + 1

        tried = fuzz(counted, strategy, examples, sweep)
        _good_requests_answered(served)
        lines.append(f"fuzz: {tried} inputs to {name}, every answer 4xx or 200 "
                     f"({', '.join(f'{n} x {c}' for c, n in sorted(codes.items(), key=str))}), a good "
                     "request answered after")

    # v1 predict: by the model's URL (its replicas) and by name (the gateway)
    good_v1 = {"inputs": [ROW, [0.0] * 64], "probabilities": True}
    v1_bodies = st.one_of(mutated(good_v1).map(json_bytes), raw_bodies(json.dumps(good_v1).encode()))
    batch("/v1/models/<m>/predict and /v1/predict",
          lambda c: send("POST", c[0], c[1], **{"content-type": c[2]}),
          st.tuples(st.sampled_from(["/v1/models/digits/predict", "/v1/models/placed/predict",
                                     "/v1/predict"]), v1_bodies,
                    st.one_of(st.just("application/json"), st.sampled_from(CONTENT_TYPES))), 110,
          # (first, what the fuzzers found: a whole number past float64 was a 500)
          [(path, json_bytes({"inputs": [[10**400] + ROW[1:]]}), "application/json")
           for path in ("/v1/models/digits/predict", "/v1/predict")])

    # KServe v2 infer: JSON tensors, and binary ones with any Inference-Header-Content-Length
    good_v2 = _v2_body([2, 64], data=[ROW, [0.0] * 64])
    tensor = np.full((1, 64), 0.5, dtype="<f4").tobytes()
    head = {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32",
                        "parameters": {"binary_data_size": len(tensor)}}],
            "parameters": {"binary_data_output": True}}
    binary = st.tuples(mutated(head).map(json_bytes), st.binary(max_size=300),
                       st.one_of(st.none(), st.text(HEADER_TEXT, min_size=1, max_size=8))).map(
        lambda t: (t[0] + t[1], t[2] if t[2] is not None else str(len(t[0]))))
    v2_json = st.one_of(mutated(good_v2).map(json_bytes),
                        raw_bodies(json.dumps(good_v2).encode())).map(lambda b: (b, None))

    def infer(case) -> int | str:
        body, length = case
        extra = {"inference-header-content-length": length} if length is not None else {}
        if length is not None:
            extra["content-type"] = "application/octet-stream"
        return send("POST", V2, body, **extra)

    head_bytes = json_bytes(head)
    batch("/v2/models/<m>/infer (JSON and binary)", infer, st.one_of(v2_json, binary), 110,
          [(json_bytes(_v2_body([1, 64], data=[10**400] + ROW[1:])), None),
           (head_bytes + tensor, str(len(head_bytes))), (head_bytes + tensor, "\u00b2")])

    # OpenAI completions, streamed and not
    good_cmpl = {"model": "tinygpt", "prompt": "def f(x):", "max_tokens": 2, "temperature": 0.7,
                 "top_p": 0.9, "stream": True, "stop": ["\n"], "seed": 1}

    def completion(body: bytes) -> int | str:
        r = requests.post(served.url + "/v1/completions", data=body, timeout=FUZZ_TIMEOUT_S,
                          headers={"content-type": "application/json"})
        code = _fuzz_answer(r, f"/v1/completions {body[:200]!r}")
        if code == 200:
            if r.headers["content-type"].startswith("text/event-stream"):
                assert r.text.endswith("data: [DONE]\n\n"), r.text[-300:]
            else:
                assert r.json()["choices"][0]["finish_reason"] in ("length", "stop"), r.text
        return code

    batch("/v1/completions (streamed and not)", completion,
          st.one_of(mutated(good_cmpl).map(json_bytes),
                    raw_bodies(json.dumps(good_cmpl).encode())), 80,
          [json_bytes({**good_cmpl, "temperature": 1e-300, "seed": 2**64 - 1}),
           json_bytes({**good_cmpl, "stream": False, "temperature": 5e-324}),
           json_bytes({**good_cmpl, "seed": 2**64})])

    # everything else: metadata, health, metrics, listings, unknown paths; any method
    names = st.one_of(st.sampled_from(["digits", "digits-int8", "tinygpt", "nope", ""]),
                      st.text(st.characters(codec="utf-8", exclude_characters="/?#"), max_size=8))
    paths = st.one_of(
        st.sampled_from(["/health", "/healthz", "/metrics", "/metrics?format=json",
                         "/metrics?format=x", "/v1/models", "/v2", "/v2/health/live",
                         "/v2/health/ready", "/", "/v1", "/v2/models"]),
        names.map(lambda n: f"/v2/models/{n}"), names.map(lambda n: f"/v2/models/{n}/ready"),
        names.map(lambda n: f"/v1/models/{n}"),
        st.text(st.characters(codec="utf-8", exclude_characters="?#"), max_size=30).map(
            lambda p: "/" + p.lstrip("/")))
    accept = st.one_of(st.just("*/*"), st.sampled_from(
        ["application/openmetrics-text; version=abc", "application/openmetrics-text",
         "text/plain; version=0.0.4", "application/json"]),
        st.text(HEADER_TEXT, min_size=1, max_size=40))
    batch("metadata, /health, /metrics, listings and unknown paths (any method)",
          lambda c: send(c[0], c[1], None, accept=c[2]),
          st.tuples(st.sampled_from(["GET", "GET", "POST", "PUT", "DELETE", "PATCH", "HEAD",
                                     "OPTIONS"]), paths, accept), 90,
          [("GET", "/metrics", "application/openmetrics-text; version=abc")])

    # malformed HTTP itself (HAProxy answers these, with its own short HTML page)
    raw_http = [b"GET /\x01 HTTP/1.1\r\nHost: x\r\n\r\n", b"BREW /health HTTP/1.1\r\n\r\n",
                b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Length: \xb2\r\n\r\n",
                b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
                b"POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                b"Transfer-Encoding: chunked\r\n\r\nzz\r\n",
                b"GET /health HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 20000 + b"\r\n\r\n",
                b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(32) + b"\r\n\r\n"]
    for data in raw_http:
        with socket.create_connection(("127.0.0.1", _port(served)), timeout=FUZZ_TIMEOUT_S) as s:
            s.sendall(data)
            reply = s.recv(4096)
        status = int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.") else None
        assert status is None or 400 <= status < 500, (data[:80], reply[:200])
    _good_requests_answered(served)
    lines.append(f"fuzz: {len(raw_http)} malformed HTTP requests (request line, Content-Length, "
                 "chunking, 20 KB header, TLS bytes): 4xx or closed, a good request answered after")

    values, _ = scrape(served)
    assert not [k for k in values if dict(k[1]).get("code", "").startswith("5")]
    for line in lines:
        report(capsys, line)


# --- placement ------------------------------------------------------------------------------


def test_an_autoscaled_model_is_refused_at_once_past_its_queue_limit(served) -> None:
    """``queued`` is autoscaled, so its requests go through the gateway (the front door cannot
    count its replicas): queue limit 2 per replica, one replica, two gateway replicas holding
    one each. Of 8 concurrent requests (each waits 1 s in its batch) at most 2 run; the rest
    get 503 with Retry-After at once; then there is room again."""
    def one(body):
        started = time.perf_counter()
        r = post(served, "/v1/models/queued/predict", body)
        return r.status_code, time.perf_counter() - started, r.headers.get("retry-after"), r.text

    with cf.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, digits_bodies(rows=1, count=8)))
    ok = [r for r in results if r[0] == 200]
    shed = [r for r in results if r[0] == 503]
    assert 1 <= len(ok) <= 2 and len(ok) + len(shed) == 8, results
    assert all(r[2] == "1" and "queue limit" in r[3] for r in shed), shed
    assert all(r[1] < 0.8 for r in shed), shed  # refused without waiting out a batch (1 s)
    assert post(served, "/v1/models/queued/predict", digits_bodies(rows=1, count=1)[0]).status_code == 200


def test_placed_replicas_see_exactly_their_device(served) -> None:
    infos = served.replica_infos("placed")
    assert len(infos) == 3
    by_device: dict[str, int] = {}
    for info in infos:
        assert info["node"] == "gpu-node"
        device = info["deployment"].rsplit("-d", 1)[1]
        assert info["visible"]["CUDA_VISIBLE_DEVICES"] == device
        assert info["assigned_resources"][f"hetflow_dev_{device}"] == 20480
        assert info["device"] == "cpu"  # CPU build of torch: computes on the CPU
        by_device[device] = by_device.get(device, 0) + 1
    assert by_device == {"0": 2, "1": 1}  # two 20 GiB replicas share a 48 GB device
    for info in served.replica_infos("digits", calls=4):  # CPU replicas: no device, wherever
        assert info["visible"]["CUDA_VISIBLE_DEVICES"] == ""
        assert not any(k.startswith("hetflow_dev_") for k in info["assigned_resources"])


# --- health, metrics, load generator ---------------------------------------------------------


def test_health_and_metrics(served) -> None:
    for body in digits_bodies(rows=1, count=3):  # traffic of its own (run alone, too)
        assert post(served, "/v1/models/digits/predict", body).status_code == 200
    health = requests.get(served.url + "/health", timeout=10)
    assert health.status_code == 200
    body = health.json()
    assert body["status"] == "ok"
    assert body["models"]["digits"]["running_replicas"] == 2
    assert body["models"]["placed"]["running_replicas"] == 3
    deadline = time.monotonic() + 10  # the gateway replicas report their counts in a moment
    while sample((values := scrape(served))[0], "hetflow_serve_requests_total", model="digits",
                 code="200") < 3:
        assert time.monotonic() < deadline
        time.sleep(0.3)
    values, types = values
    assert types == {"hetflow_serve_requests": "counter", "hetflow_serve_fallbacks": "counter",
                     "hetflow_serve_retries": "counter",
                     "hetflow_serve_request_duration_seconds": "histogram",
                     "hetflow_serve_request_batch_size": "histogram",
                     "hetflow_serve_replicas_running": "gauge", "hetflow_key_requests": "counter",
                     "hetflow_key_tokens": "counter", "hetflow_key_refused": "counter",
                     "hetflow_upstream_requests": "counter", "hetflow_upstream_errors": "counter",
                     "hetflow_upstream_response_duration_seconds": "gauge", "hetflow_upstream_up": "gauge",
                     # engine: vllm pools (none in this config: the families are there, empty)
                     "hetflow_llm_replicas": "gauge", "hetflow_llm_replicas_wanted": "gauge",
                     "hetflow_llm_replicas_answering": "gauge", "hetflow_llm_requests_running": "gauge",
                     "hetflow_llm_requests_waiting": "gauge", "hetflow_llm_kv_cache_usage_ratio": "gauge",
                     "hetflow_llm_routing_weight": "gauge",
                     "hetflow_llm_capacity_tokens_per_second": "gauge",
                     "hetflow_llm_generation_tokens": "counter", "hetflow_llm_prompt_tokens": "counter",
                     "hetflow_llm_engine_restarts": "counter",
                     "hetflow_llm_first_token_duration_seconds": "summary",
                     "hetflow_llm_output_token_duration_seconds": "summary"}
    assert sample(values, "hetflow_serve_replicas_running", model="placed",
                  deployment="svc.placed-gpu-node-d0") == 2
    answered = sample(values, "hetflow_serve_requests_total", model="digits", code="200")
    timed = sample(values, "hetflow_serve_request_duration_seconds_count", model="digits")
    assert answered >= 3 and timed == answered  # every answered request was timed
    assert sample(values, "hetflow_serve_request_duration_seconds_bucket", model="digits",
                  le="+Inf") == timed


def test_metrics_are_the_sum_over_gateway_replicas(served) -> None:
    """Requests by name (``/v1/predict``) are answered by the two gateway replicas in turn;
    every scrape - whichever gateway replica answers it - shows all of them."""
    key = ("hetflow_serve_requests_total", frozenset({"model": "digits-int8", "code": "200"}.items()))
    before, deadline = None, time.monotonic() + 10
    while before != (now := scrape(served)[0].get(key, 0.0)):  # earlier tests' reports are in
        assert time.monotonic() < deadline, (before, now)
        before = now
        time.sleep(0.6)
    count = 12
    for body in digits_bodies(rows=1, count=count):
        r = post(served, "/v1/predict", {**json.loads(body), "model": "digits-int8"})
        assert r.status_code == 200 and r.json()["served_by"] == "digits-int8"
    deadline = time.monotonic() + 10
    while (seen := scrape(served)[0].get(key, 0.0)) != before + count:
        assert seen <= before + count and time.monotonic() < deadline, (before, seen)
        time.sleep(0.3)
    # HAProxy balances the scrapes over both gateway replicas too: each one sums them all
    assert {scrape(served)[0][key] for _ in range(6)} == {before + count}


def test_dry_run_prints_what_would_start_and_starts_nothing(served, capsys) -> None:
    import argparse

    from ray import serve

    from hetflow.cli.serve import register

    before = set(serve.status().applications)
    # (not "placed": its running replicas hold the fake GPUs' memory, so a second copy of it
    # would not fit - the plan reads the live cluster)
    models = [m.model_dump(mode="json") for m in served.config.models if m.name != "placed"]
    # an LLM's pool is planned too (no engine starts: the model path need not even exist)
    models.append({"name": "chat", "engine": "vllm", "vllm": {"model": "org/some-model"},
                   "pools": [{"devices": "cpu", "replicas": 2, "cpus_per_replica": 0.5}]})
    config = served.config.with_overrides(name="dry", models=models)
    path = served.small_ckpt / "dry.yaml"
    import yaml

    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    parser = argparse.ArgumentParser(prog="hetflow")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve", str(path), "--dry-run", "--json"])
    assert args.func(args) == 0
    plan = json.loads(capsys.readouterr().out)
    names = {a["name"] for a in plan["applications"]}
    assert {"dry", "dry.digits", "dry.digits-int8", "dry.tinygpt", "dry.elastic", "dry.queued"} == names
    assert {a["path"] for a in plan["applications"] if a.get("model") == "elastic"} == {"gateway"}
    assert [(e["pool"], e["replicas"], e["compute"]) for e in plan["llm"]["chat"]["engines"]] == [(1, 2, "cpu")]
    assert set(serve.status().applications) == before  # nothing deployed


def test_bench_serve_command(served, capsys) -> None:
    import argparse

    from hetflow.cli.serve import register

    parser = argparse.ArgumentParser(prog="hetflow")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "serve", "--url", served.url + "/v1/models/digits/predict",
                              "--rate", "20", "--requests", "20", "--duration", "3"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "sent    20  ok    20" in out and "errors 0" in out


# --- failures (last: each waits for the replicas to come back) ------------------------------


def _replica_pids(served, model: str) -> dict[str, int]:
    return {i["replica"]: i["pid"] for i in served.replica_infos(model, calls=6)}


def _wait_two_serving(served, old: set[str], started: float, limit_s: float = 120) -> float:
    """Seconds from ``started`` until /health shows 2 digits replicas and answers come from
    2 distinct replicas, one of them new."""
    seen: set[str] = set()
    while time.monotonic() - started < limit_s:
        health = requests.get(served.url + "/health", timeout=10).json()
        if health["models"]["digits"]["running_replicas"] == 2:
            for body in digits_bodies(count=8):
                r = post(served, "/v1/models/digits/predict", body)
                if r.status_code == 200 and r.json()["served_by"] == "digits":
                    seen.add(r.json()["replica"])
            if len(seen) >= 2 and seen - old:
                return time.monotonic() - started
        time.sleep(0.3)
    raise AssertionError(f"two replicas did not serve again within {limit_s}s (saw {seen})")


def test_killed_replica_under_load(served, capsys) -> None:
    pids = _replica_pids(served, "digits")
    assert len(pids) == 2
    retries_before = _retries(served)
    with cf.ThreadPoolExecutor(1) as pool:  # the load runs while this thread kills a replica
        load = pool.submit(run_load, served.url + "/v1/models/digits/predict",
                           digits_bodies(count=32), rate=25, max_requests=300,
                           max_duration_s=10, timeout_s=30, seed=7)
        time.sleep(3)
        victim = sorted(pids)[0]
        os.kill(pids[victim], signal.SIGKILL)
        killed_at = time.monotonic()
        result = load.result(60)
    recovery_s = _wait_two_serving(served, set(pids), killed_at)
    retried = _retries(served) - retries_before
    with capsys.disabled():
        print(f"\nreplica kill under load: {result.line()}; requests cut off by the kill and "
              f"repeated on the other replica: {retried}; two replicas serving again after "
              f"{recovery_s:.1f}s")
    assert result.sent == result.ok + result.error_count
    # Requests cut off by the kill before any answer came are repeated on the other replica
    # (not failed). Known, not fixable in a proxy: a response the dying replica had begun to
    # write (headers out, body cut) cannot be repeated - seen once in a CI run (1 of 260);
    # docs/serving.md says so.
    assert result.error_count <= 1, result.errors
    assert set(result.errors) <= {"ClientPayloadError", "ServerDisconnectedError"}, result.errors


def _retries(served) -> int:
    return int(requests.get(served.url + "/metrics?format=json", timeout=10)
               .json()["retries"].get("digits", 0))


def test_fallback_while_all_replicas_are_down(served, capsys) -> None:
    """Every digits replica killed (SIGKILL) under an open-loop load on the fast path: no
    request fails - the front door sends the model's requests to the gateway, which has the
    fallback answer them - and the fallback counter and /health show it."""
    pids = _replica_pids(served, "digits")
    assert len(pids) == 2
    fallbacks_before = _fallbacks(served)
    health_states: set[str] = set()
    with cf.ThreadPoolExecutor(1) as pool:  # the load runs while this thread kills
        load = pool.submit(run_load, served.url + "/v1/models/digits/predict",
                           digits_bodies(count=32), rate=25, max_requests=250,
                           max_duration_s=8, timeout_s=30, seed=5)
        time.sleep(2)
        for pid in pids.values():
            os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        while not load.done():
            # /health shares the gateway with the fallback's requests: on a busy 2-core CI
            # machine one took over 10 s while the gateway answered the whole load
            health_states.add(requests.get(served.url + "/health", timeout=60).json()["status"])
            time.sleep(0.2)
        result = load.result()
    answered_by_fallback = _fallbacks(served) - fallbacks_before
    recovery_s = _wait_two_serving(served, set(pids), killed_at)
    with capsys.disabled():
        print(f"\nboth replicas killed under load: {result.line()}; {answered_by_fallback} "
              f"answered by the fallback; two replicas serving again after {recovery_s:.1f}s")
    # Known, not yet fixed: in some runs one request in flight at the moment of the kill comes
    # back as a closed connection, a cut body (a response the replica had begun to write) or a
    # 502 (not retried by HAProxy); every other is answered. (A 503 from the queue limit, once
    # seen here when a dead replica's connections still counted against it, is no longer
    # possible: the limit counts only the free slots of replicas that are up.)
    assert result.error_count <= 1 and result.ok >= result.sent - 1, result.errors
    assert set(result.errors) <= {"ServerDisconnectedError", "ClientPayloadError", "502"}, \
        result.errors
    assert answered_by_fallback > 0
    assert "degraded" in health_states


def _fallbacks(served) -> int:
    fallbacks = requests.get(served.url + "/metrics?format=json", timeout=10).json()["fallbacks"]
    return sum(f["count"] for f in fallbacks
               if f["model"] == "digits" and f["served_by"] == "digits-int8")


def test_autoscaling_adds_a_replica_under_load(served, capsys) -> None:
    """Serve's autoscaler, configured through hetflow (min 1, max 2 replicas, target ongoing
    requests 0.01), starts a second replica while an open-loop load runs; no request fails.
    The load is light (8 req/s): any traffic is far above the target, and a busy 2-core CI
    machine answered only 9.8 req/s of 20 through one replica, so half the requests waited
    out HAProxy's 10 s queue timeout (503) before the second replica was up."""
    def running() -> int:
        return requests.get(served.url + "/health", timeout=10).json()["models"]["elastic"][
            "running_replicas"]

    assert running() == 1
    with cf.ThreadPoolExecutor(1) as pool:  # the load runs while this thread watches replicas
        started = time.monotonic()
        load = pool.submit(run_load, served.url + "/v1/models/elastic/predict",
                           digits_bodies(count=16), rate=8, max_requests=160,
                           max_duration_s=20, timeout_s=30, seed=11)
        scaled_after = None
        # The decision comes within seconds; the new replica's start (a worker process that
        # imports torch and loads the model) took 47 s on a busy 2-core CI machine.
        while time.monotonic() - started < 120 and scaled_after is None:
            if running() == 2:
                scaled_after = time.monotonic() - started
            time.sleep(0.5)
        result = load.result(60)
    with capsys.disabled():
        print(f"\nautoscaling: {result.line()}; second replica running after "
              f"{scaled_after if scaled_after is None else round(scaled_after, 1)} s")
    assert scaled_after is not None, "the autoscaler never added the second replica"
    assert result.error_count == 0 and result.ok == result.sent
    # And it stays (downscale_delay_s 600), never more than max_replicas. Each of the two
    # gateway replicas answers /health from its own status poll, and on a busy 2-core CI
    # machine one poll lagged the other past the load's end (a read said 1 right after one
    # said 2): the count must settle at 2 on every replica, read several times in a row.
    reads: list[int] = []
    settle_by = time.monotonic() + 30
    while time.monotonic() < settle_by and reads[-4:] != [2] * 4:
        reads.append(running())
        time.sleep(0.25)
    assert reads[-4:] == [2] * 4 and max(reads) <= 2, reads
