"""The request parsers of every protocol, fuzzed in-process: whatever the body, a checked
request or a RequestError (4xx, one line), never another exception.

The same parsers answer over HTTP (the fuzz of the served endpoints is in test_serve_ray.py,
fewer inputs because each is a real request); here each input costs microseconds, so many
more are tried. Each test prints how many inputs it tried (docs/reliability.md).
"""

from __future__ import annotations

import json
import math

import numpy as np
from hypothesis import strategies as st

from hetflow.workloads.serve import kserve, openai_api
from hetflow.workloads.serve.metrics import GatewayMetrics
from hetflow.workloads.serve.protocol import InputSpec, RequestError, parse_predict
from tests.fuzzing import (fuzz, json_bytes, leaf_edits, mutated, one_line_message, raw_bodies,
                           report)

FLOAT = InputSpec("float", 4, 0.0, 1.0, 3, "4 values in 0..1")
TOKENS = InputSpec("int", 4, 0, 255, 256, "4 byte tokens 0..255")
SPECS = {"f": FLOAT, "t": TOKENS}
MAX_ROWS = 8

GOOD_PREDICT = {"inputs": [[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 1.0]], "probabilities": True}
GOOD_INFER = {"id": "r1", "inputs": [{"name": "input", "shape": [2, 4], "datatype": "FP32",
                                      "data": [[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 1.0]]}],
              "outputs": [{"name": "predictions"}, {"name": "probabilities",
                                                    "parameters": {"binary_data": True}}],
              "parameters": {"binary_data_output": False}}
GOOD_COMPLETION = {"model": "g", "prompt": "def f(x):", "max_tokens": 4, "temperature": 0.5,
                   "top_p": 0.9, "stream": True, "stop": ["\n"], "seed": 3, "echo": False}


# header values a length parser trips on: digits int() refuses ('²'), or takes (' 12', '+1')
TRICKY_LENGTHS = ["\u00b2", "\u00b9\u00b3", "\u0661\u0662", " 12", "+12", "-1", "1e2", "0x10", "", "12 "]


def _refused(exc: RequestError) -> None:
    assert 400 <= exc.status < 500 and one_line_message(exc.message), (exc.status, exc.message)


def _bodies(good: dict) -> st.SearchStrategy[bytes]:
    return st.one_of(mutated(good).map(json_bytes), raw_bodies(json.dumps(good).encode()))


def _check_rows(rows: np.ndarray, spec: InputSpec) -> None:
    assert rows.ndim == 2 and rows.shape[1] == spec.width and 1 <= len(rows) <= MAX_ROWS
    assert rows.dtype == spec.dtype and np.isfinite(rows).all()
    assert (rows >= spec.low).all() and (rows <= spec.high).all()


def test_fuzzed_predict_bodies_are_checked_or_refused(capsys) -> None:
    def check(case: tuple[str, bytes]) -> None:
        model, body = case
        try:
            req = parse_predict(body, SPECS, path_model=model, default_model="f",
                                max_rows=MAX_ROWS)
        except RequestError as exc:
            _refused(exc)
            return
        _check_rows(req.rows, SPECS[req.model])

    sweep = [(m, json_bytes(doc)) for m in SPECS for doc in leaf_edits(GOOD_PREDICT)]
    tried = fuzz(check, st.tuples(st.sampled_from(["f", "t"]), _bodies(GOOD_PREDICT)), 200,
                 sweep)
    report(capsys, f"fuzz: {tried} bodies to parse_predict (/v1/models/<m>/predict), every one checked "
           "or refused with a 4xx and one line")


def test_fuzzed_infer_bodies_are_checked_or_refused(capsys) -> None:
    binary = np.array([[0.1, 0.2, 0.3, 0.4]], dtype="<f4").tobytes()
    head = json.dumps({"inputs": [{"name": "input", "shape": [1, 4], "datatype": "FP32",
                                   "parameters": {"binary_data_size": len(binary)}}]}).encode()
    # the binary extension: a header length (any text, as a client may send) and a tail
    with_tail = st.tuples(mutated(json.loads(head)).map(json_bytes), st.binary(max_size=40),
                          st.one_of(st.none(), st.text(max_size=6), st.integers(-2, 400).map(str),
                                    st.sampled_from(TRICKY_LENGTHS))
                          ).map(lambda t: (t[0] + t[1], t[2] if t[2] is not None else str(len(t[0]))))
    plain = _bodies(GOOD_INFER).map(lambda b: (b, None))
    exact = st.just((head + binary, str(len(head))))

    def check(case: tuple[str, tuple[bytes, str | None]]) -> None:
        model, (body, header) = case
        spec = SPECS[model]
        try:
            req = kserve.parse_infer(body, header, spec, model=model, max_rows=MAX_ROWS)
        except RequestError as exc:
            _refused(exc)
            return
        _check_rows(req.request.rows, spec)
        assert set(req.outputs) <= set(kserve.OUTPUTS) and req.binary <= set(req.outputs)

    sweep = [(m, (json_bytes(doc), None)) for m in SPECS for doc in leaf_edits(GOOD_INFER)]
    sweep += [(m, (head + binary, h)) for m in SPECS for h in TRICKY_LENGTHS]
    tried = fuzz(check, st.tuples(st.sampled_from(["f", "t"]),
                                  st.one_of(plain, with_tail, exact)), 200, sweep)
    report(capsys, f"fuzz: {tried} bodies to parse_infer (/v2/models/<m>/infer, JSON and binary), every "
           "one checked or refused with a 4xx and one line")


def test_fuzzed_completion_bodies_are_checked_or_refused(capsys) -> None:
    def check(body: bytes) -> None:
        try:
            req = openai_api.parse_completion(body, {"g": 16}, ["g", "f"], default_model="g",
                                              max_new_tokens=32)
        except RequestError as exc:
            _refused(exc)
            return
        assert req.model == "g" and req.prompt and all(0 <= t < 256 for t in req.prompt)
        assert 1 <= req.max_tokens <= 32 and 0 <= req.temperature <= 2 and 0 < req.top_p <= 1
        assert math.isfinite(req.temperature) and math.isfinite(req.top_p)
        if req.seed is not None:
            assert -2**63 <= req.seed < 2**64  # what torch.Generator.manual_seed takes

    sweep = [json_bytes(doc) for doc in leaf_edits(GOOD_COMPLETION)]
    tried = fuzz(check, _bodies(GOOD_COMPLETION), 200, sweep)
    report(capsys, f"fuzz: {tried} bodies to parse_completion (/v1/completions), every one checked or "
           "refused with a 4xx and one line")


def test_fuzzed_accept_headers_on_metrics_always_render(capsys) -> None:
    metrics = GatewayMetrics()
    metrics.served("f", "f", 0.01, 1)
    metrics.answered("-", 400)
    media = ["application/openmetrics-text", "text/plain", "*/*", "", "application/json"]
    params = ["version=abc", "version=1.0.0", "version=", "version=9.9.9", "escaping=allow-utf-8",
              "escaping=junk", "q=0.5", "q=x", "charset=utf-8", ";", ",", "="]
    accept = st.one_of(st.text(max_size=60), st.tuples(st.sampled_from(media), st.lists(
        st.sampled_from(params), max_size=4)).map(lambda t: "; ".join([t[0], *t[1]])))
    sweep = [f"{m}; {p}" for m in media for p in params]

    def check(header: str) -> None:
        body, content_type = metrics.render(header)
        assert content_type.startswith(("text/plain", "application/openmetrics-text"))
        assert b"hetflow_serve_requests" in body

    tried = fuzz(check, accept, 150, sweep)
    report(capsys, f"fuzz: {tried} Accept headers to /metrics's renderer, every one answered with a "
           "Prometheus exposition")
