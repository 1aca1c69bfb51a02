"""The request checks, case by case: every bad input is a 4xx with a message (pure, no Ray).

The same table runs over HTTP against a live deployment in test_serve_ray.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from hetflow.workloads.serve.protocol import InputSpec, RequestError, parse_predict

DIGITS = InputSpec("float", 64, low=0.0, high=1.0, description="64 pixel values in 0..1")
TOKENS = InputSpec("int", 4, low=0, high=255, outputs=256, description="4 byte tokens")
FREE = InputSpec("float", 2, description="2 numbers")
SPECS = {"digits": DIGITS, "free": FREE, "text": TOKENS}
ROW = [0.5] * 64


def parse(body, path_model="digits", max_rows=4):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_predict(raw, SPECS, path_model=path_model, default_model="digits",
                         max_rows=max_rows)


# (body, URL model, status, words the message must hold)
BAD = [
    (b"{not json", "digits", 400, "malformed JSON at line 1 column 2"),
    (b"", "digits", 400, "malformed JSON"),
    (b'{"inputs": "\xc3\x28"}', "digits", 400, "not UTF-8"),
    (b'{"inputs": [[NaN]]}', "digits", 400, "NaN is not a JSON number"),
    (b"[" * 100_000, "digits", 400, "malformed JSON"),
    ([ROW], "digits", 400, "expected a JSON object"),
    ({"inputs": [ROW], "extra": 1}, "digits", 400, "unknown key(s) 'extra'"),
    ({"inputs": [ROW], "model": 3}, None, 400, "'model' must be a string"),
    ({"inputs": [ROW], "model": "text"}, "digits", 400, "the body names model 'text'"),
    ({"inputs": [ROW], "probabilities": "yes"}, "digits", 400, "'probabilities' must be"),
    ({}, "digits", 400, "missing 'inputs'"),
    ({"inputs": [ROW]}, "nope", 404, "unknown model 'nope'; served models: digits, free, text"),
    ({"inputs": [ROW], "model": "nope"}, None, 404, "unknown model 'nope'"),
    ({"inputs": [ROW] * 5}, "digits", 413, "5 rows is more than the limit of 4"),
    ({"inputs": []}, "digits", 422, "non-empty list of rows"),
    ({"inputs": [0.5, 0.5]}, "digits", 422, "inputs[0] must be a list of 64 numbers, got a JSON number"),
    ({"inputs": [ROW[:63]]}, "digits", 422, "inputs[0] has 63 values; model digits takes 64"),
    ({"inputs": [ROW, ROW + [0.1]]}, "digits", 422, "inputs[1] has 65 values"),
    ({"inputs": [["0.5"] * 64]}, "digits", 422, "inputs[0][0] is a JSON string; expected a number"),
    ({"inputs": [[True] * 64]}, "digits", 422, "inputs[0][0] is a JSON boolean"),
    ({"inputs": [[None] * 64]}, "digits", 422, "inputs[0][0] is a JSON null"),
    ({"inputs": [[[0.5]] * 64]}, "digits", 422, "inputs[0][0] is a JSON list"),
    ({"inputs": [[2.0] * 64]}, "digits", 422, "value above 1"),
    ({"inputs": [[-0.5] * 64]}, "digits", 422, "value below 0"),
    ({"inputs": [[1e300, 1]]}, "free", 422, "too large for float32"),
    ({"inputs": [[10 ** 30] * 4]}, "text", 422, "value above 255"),
    ({"inputs": [[1.5, 2, 3, 4]]}, "text", 422, "inputs[0][0] is a JSON number; expected a whole"),
    ({"inputs": [[1, 2, 3, 256]]}, "text", 422, "value above 255"),
]


@pytest.mark.parametrize("body, path_model, status, words", BAD,
                         ids=[f"{i}-{b[2]}" for i, b in enumerate(BAD)])
def test_bad_input_is_a_4xx_with_a_message(body, path_model, status, words) -> None:
    with pytest.raises(RequestError) as err:
        parse(body, path_model)
    assert err.value.status == status
    assert words in err.value.message


def test_good_requests() -> None:
    req = parse({"inputs": [ROW, [0, 1] * 32]})
    assert req.model == "digits" and req.rows.shape == (2, 64) and req.rows.dtype == np.float32
    assert req.rows[1, 1] == 1.0 and not req.probabilities
    req = parse({"inputs": [[1, 2, 3, 255]], "model": "text", "probabilities": True}, None)
    assert req.model == "text" and req.rows.dtype == np.int64 and req.probabilities
    assert parse({"inputs": [ROW]}, None).model == "digits"  # the default model
    assert parse({"inputs": [ROW], "model": "digits"}, "digits").model == "digits"


def test_request_error_is_never_5xx() -> None:
    with pytest.raises(AssertionError):
        RequestError(500, "no")
