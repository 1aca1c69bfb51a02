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
                       ({"top_p": 0, "max_tokens": 4}, "above 0"),
                       ({"stream_options": {"include_usage": True}, "max_tokens": 4}, "only to streamed"),
                       ({"stream": True, "stream_options": {"include_usage": "yes"}, "max_tokens": 4},
                        "include_usage"),
                       ({"stream": True, "stream_options": {"other": 1}, "max_tokens": 4}, "one field"),
                       ({"stream": True, "stream_options": [1], "max_tokens": 4}, "one field")]:
        with pytest.raises(RequestError, match=words):
            parse(**doc)
    assert parse(stream=True, stream_options={"include_usage": True}, max_tokens=4).include_usage
    assert not parse(stream=True, stream_options={}, max_tokens=4).include_usage
    assert not parse(stream=True, max_tokens=4).include_usage


def _sse(body: list[bytes]) -> list:
    events = b"".join(body).decode().split("\n\n")
    return [e[len("data: "):] for e in events if e]


@pytest.mark.parametrize("include_usage", [False, True])
def test_a_stream_ends_with_its_usage_when_the_client_asks(include_usage: bool) -> None:
    """OpenAI's ``stream_options.include_usage``: every chunk carries ``"usage": null`` and one
    last chunk, with no choices, the whole request's usage, before ``[DONE]``."""
    import asyncio

    from hetflow.workloads.serve.web import completion_answer

    doc = {"model": "gpt", "prompt": "hi", "max_tokens": 5, "stream": True}
    if include_usage:
        doc["stream_options"] = {"include_usage": True}
    req = openai_api.parse_completion(json.dumps(doc).encode(), {"gpt": 16}, ["gpt"], default_model="gpt",
                                      max_new_tokens=8)

    async def tokens():
        for t in b"abcde":
            yield t

    async def run() -> list[bytes]:
        response = await completion_answer(req, tokens(), lambda: None, lambda: None, "x-tokens")
        return [part async for part in response.body_iterator]

    events = _sse(asyncio.run(run()))
    assert events[-1] == "[DONE]"
    docs = [json.loads(e) for e in events[:-1]]
    assert "".join(c["text"] for d in docs for c in d["choices"]) == "abcde"
    if include_usage:
        assert all(d["usage"] is None for d in docs[:-1]) and docs[-1]["choices"] == []
        assert docs[-1]["usage"] == {"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7}
    else:
        assert all("usage" not in d for d in docs)
