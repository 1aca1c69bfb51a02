"""KServe v2 and OpenAI request parsing and answers (pure; the HTTP path is in
test_serve_ray.py with the real clients)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hetflow.workloads.serve import kserve, openai_api
from hetflow.workloads.serve.protocol import InputSpec, RequestError

DIGITS = InputSpec("float", 4, 0.0, 1.0, 3, "4 values in 0..1")


def test_v2_binary_input_and_outputs_round_trip() -> None:
    rows = np.array([[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 0.8]], dtype="<f4")
    head = json.dumps({"inputs": [{"name": "input", "shape": [2, 4], "datatype": "FP32",
                                   "parameters": {"binary_data_size": rows.nbytes}}],
                       "parameters": {"binary_data_output": True}}).encode()
    req = kserve.parse_infer(head + rows.tobytes(), str(len(head)), DIGITS, model="m",
                             max_rows=8)
    assert np.array_equal(req.request.rows, rows) and req.binary == set(kserve.OUTPUTS)
    result = {"predictions": [2, 0], "probabilities": [[0.1, 0.2, 0.7], [0.8, 0.1, 0.1]],
              "batch": {"requests": 1, "rows": 2}}
    body, headers = kserve.infer_response("m", req, result, "m")
    n = int(headers["Inference-Header-Content-Length"])
    doc = json.loads(body[:n])
    sizes = [o["parameters"]["binary_data_size"] for o in doc["outputs"]]
    assert np.frombuffer(body[n:n + sizes[0]], "<i8").tolist() == [2, 0]
    assert np.frombuffer(body[n + sizes[0]:], "<f4").reshape(2, 3)[0, 2] == pytest.approx(0.7)


@pytest.mark.parametrize("tensor, words", [
    ({"name": "input", "shape": [1, 4], "datatype": "BOOL", "data": [True] * 4}, "BOOL"),
    ({"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0.1] * 4}, "named 'input'"),
    ({"name": "input", "shape": [1, 4], "datatype": "FP32", "data": ["a"] * 4}, "str"),
    ({"name": "input", "shape": [1, 4], "datatype": "FP32",
      "parameters": {"binary_data_size": 99}}, "does not match"),
    ({"name": "input", "shape": [0, 4], "datatype": "FP32", "data": []}, "positive"),
])
def test_v2_bad_tensors_are_400(tensor, words) -> None:
    with pytest.raises(RequestError, match=words) as err:
        kserve.parse_infer(json.dumps({"inputs": [tensor]}).encode(), None, DIGITS,
                           model="m", max_rows=8)
    assert err.value.status == 400


def test_text_stream_holds_split_characters_and_stops() -> None:
    stream = openai_api.TextStream(("END",))
    out = [stream.push(b) for b in "é!E".encode()]  # é is two bytes
    assert out[0] == "" and out[1] == "é" and "".join(out) == "é!"  # 'E' may start END
    for b in b"ND and more":  # the server stops pushing once stopped
        stream.push(b)
        if stream.stopped:
            break
    assert stream.stopped and stream.text == "é!"


def test_completion_requests_are_checked() -> None:
    parse = lambda **doc: openai_api.parse_completion(  # noqa: E731
        json.dumps({"model": "gpt", "prompt": "hi", **doc}).encode(), {"gpt": 16},
        ["gpt", "digits"], default_model="gpt", max_new_tokens=8)
    req = parse(max_tokens=8, temperature=0, stop=["\n"], stream=True)
    assert req.prompt == [104, 105] and req.stream and req.stop == ("\n",)
    for doc, words in [({"max_tokens": 9}, "over the limit of 8"), ({"n": 3}, "not supported"),
                       ({"model": "digits"}, "not generative"), ({"bogus": 1}, "unknown field"),
                       ({"prompt": ""}, "must not be empty"),
                       ({"top_p": 0, "max_tokens": 4}, "above 0")]:
        with pytest.raises(RequestError, match=words):
            parse(**doc)
