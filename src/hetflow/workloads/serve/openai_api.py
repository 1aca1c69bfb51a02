"""OpenAI-compatible text completions (``POST /v1/completions``) for generative models. Pure.

A generative model is one whose spec's serving output is ``sequence_logits`` (the built-in
``gpt``, or a user's causal LM): it maps ``(rows, seq)`` tokens to ``(rows, seq, vocab)``.
Tokens are bytes (the built-in ``gpt``'s vocabulary: 256): the prompt is encoded as UTF-8, the
answer decoded incrementally (a character split over two tokens is held back until it is
whole). The request takes OpenAI's fields; ``n``, ``logprobs``, ``best_of``, ``suffix``,
``logit_bias`` and the penalties are refused with a 400 unless left at their defaults, and an
unknown field is a 400 too. ``stream: true`` answers with server-sent events (``data: {chunk}``
per token, then ``data: [DONE]``), as the ``openai`` client reads them.
"""

from __future__ import annotations

import codecs
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from hetflow.workloads.serve.protocol import RequestError, parse_json

KNOWN = {"model", "prompt", "suffix", "max_tokens", "temperature", "top_p", "n", "stream",
         "stream_options", "logprobs", "echo", "stop", "presence_penalty", "frequency_penalty",
         "best_of", "logit_bias", "user", "seed"}
DEFAULTS_ONLY = {"suffix": (None,), "n": (None, 1), "logprobs": (None,), "best_of": (None, 1),
                 "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
                 "logit_bias": (None, {})}


@dataclass(frozen=True)
class CompletionRequest:
    model: str
    prompt: list[int]
    prompt_text: str
    max_tokens: int
    temperature: float
    top_p: float
    stream: bool
    echo: bool
    seed: int | None
    stop: tuple[str, ...] = field(default_factory=tuple)
    include_usage: bool = False  # stream_options.include_usage: a last chunk with the usage


def error_body(message: str, param: str | None = None) -> bytes:
    """OpenAI's error shape (the ``openai`` client reads ``error.message``)."""
    return json.dumps({"error": {"message": message, "type": "invalid_request_error",
                                 "param": param, "code": None}}).encode()


def parse_completion(body: bytes, generative: dict[str, int], all_models: list[str], *,
                     default_model: str | None, max_new_tokens: int,
                     vocab: int = 256) -> CompletionRequest:
    """A checked completion request, or RequestError (400 / 404). ``generative``: model ->
    context length (tokens)."""
    doc = parse_json(body)
    if not isinstance(doc, dict):
        raise RequestError(400, "a completion request is a JSON object with model and prompt")
    unknown = sorted(set(doc) - KNOWN)
    if unknown:
        raise RequestError(400, f"unknown field(s) {', '.join(map(repr, unknown))}; "
                                "/v1/completions takes OpenAI's completion fields")
    for key, allowed in DEFAULTS_ONLY.items():
        if key in doc and doc[key] not in allowed:
            raise RequestError(400, f"{key}={doc[key]!r} is not supported here; leave it out")
    model = doc.get("model", default_model)
    if not isinstance(model, str):
        raise RequestError(400, "'model' must be a string (a served model's name)")
    if model not in all_models:
        raise RequestError(404, f"unknown model {model!r}; served models: "
                                f"{', '.join(sorted(all_models))}")
    if model not in generative:
        raise RequestError(400, f"model {model} is not generative (its spec's serving output "
                                "is not sequence_logits); /v1/completions serves causal LMs "
                                f"such as {', '.join(sorted(generative)) or 'the built-in gpt'}")
    prompt_text, tokens = _prompt(doc.get("prompt"), vocab)
    max_tokens = doc.get("max_tokens", 16)
    if type(max_tokens) is not int or max_tokens < 1:
        raise RequestError(400, "'max_tokens' must be a whole number >= 1")
    if max_tokens > max_new_tokens:
        raise RequestError(400, f"max_tokens {max_tokens} is over the limit of {max_new_tokens} "
                                "(limits.max_new_tokens); ask for fewer")
    temperature = _number(doc, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(doc, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0:
        raise RequestError(400, "'top_p' must be above 0")
    stream, echo = doc.get("stream", False), doc.get("echo", False)
    for key, value in (("stream", stream), ("echo", echo)):
        if not isinstance(value, bool) and value is not None:
            raise RequestError(400, f"'{key}' must be true or false")
    options = doc.get("stream_options")
    if options is not None:
        if not stream:
            raise RequestError(400, "'stream_options' applies only to streamed completions; "
                                    "set 'stream': true or leave it out")
        if not isinstance(options, dict) or set(options) - {"include_usage"} or not isinstance(
                options.get("include_usage", False), bool):
            raise RequestError(400, "'stream_options' takes one field, include_usage (true or false)")
    include_usage = bool((options or {}).get("include_usage", False))
    seed = doc.get("seed")
    if seed is not None and (type(seed) is not int or not -2**63 <= seed < 2**64):
        raise RequestError(400, "'seed' must be a whole number from -2**63 to 2**64-1")
    stop = doc.get("stop")
    stops: tuple[str, ...] = ()
    if isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and len(stop) <= 4 and all(isinstance(s, str) for s in stop):
        stops = tuple(stop)
    elif stop is not None:
        raise RequestError(400, "'stop' must be a string or a list of up to 4 strings")
    if any(not s for s in stops):
        raise RequestError(400, "'stop' strings must not be empty")
    return CompletionRequest(model, tokens, prompt_text, max_tokens, temperature, top_p,
                             bool(stream), bool(echo), seed, stops, include_usage)


def _prompt(prompt: Any, vocab: int) -> tuple[str, list[int]]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise RequestError(400, "'prompt' must not be empty")
        return prompt, list(prompt.encode("utf-8"))
    if (isinstance(prompt, list) and prompt
            and all(type(t) is int and 0 <= t < vocab for t in prompt)):
        return bytes(prompt).decode("utf-8", errors="replace"), list(prompt)
    raise RequestError(400, f"'prompt' must be a string (one prompt), or a list of token ids "
                            f"0..{vocab - 1}")


def _number(doc: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = doc.get(key, default)
    if value is None:
        return default
    if type(value) not in (int, float) or not low <= value <= high:
        raise RequestError(400, f"'{key}' must be a number in {low:g}..{high:g}")
    return float(value)


class TextStream:
    """Byte tokens -> text pieces, holding back split characters and honouring stops."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.stops = stops
        self.text = ""  # what was sent
        self.pending = ""  # decoded but held back: it may start a stop string
        self.stopped = False

    def push(self, token: int) -> str:
        """The text this token lets out (may be empty)."""
        self.pending += self.decoder.decode(bytes([token]))
        for stop in self.stops:
            at = self.pending.find(stop)
            if at >= 0:
                self.stopped = True
                out, self.pending = self.pending[:at], ""
                self.text += out
                return out
        hold = max((len(s) - 1 for s in self.stops), default=0)
        keep = 0
        for k in range(min(hold, len(self.pending)), 0, -1):
            if any(s.startswith(self.pending[-k:]) for s in self.stops):
                keep = k
                break
        out = self.pending[:len(self.pending) - keep]
        self.pending = self.pending[len(self.pending) - keep:]
        self.text += out
        return out

    def flush(self) -> str:
        out = self.pending + self.decoder.decode(b"", final=True)
        self.pending = ""
        self.text += out
        return out


def completion_id() -> str:
    return f"cmpl-{uuid.uuid4().hex[:24]}"


def chunk(cid: str, model: str, text: str, finish: str | None, created: int,
          with_usage: bool = False) -> bytes:
    """One server-sent event of a streamed completion (``"usage": null`` in it when the client
    asked for the usage chunk: OpenAI's shape)."""
    doc: dict[str, Any] = {"id": cid, "object": "text_completion", "created": created, "model": model,
                           "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}]}
    if with_usage:
        doc["usage"] = None
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


def usage_chunk(cid: str, model: str, created: int, prompt_tokens: int, completion_tokens: int) -> bytes:
    """The last event of a stream whose client set ``stream_options.include_usage``: no
    choices, the whole request's usage (as OpenAI sends it, before ``[DONE]``)."""
    doc = {"id": cid, "object": "text_completion", "created": created, "model": model, "choices": [],
           "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                     "total_tokens": prompt_tokens + completion_tokens}}
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


def completion(cid: str, model: str, text: str, finish: str, prompt_tokens: int,
               completion_tokens: int) -> dict[str, Any]:
    return {"id": cid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


DONE = b"data: [DONE]\n\n"

__all__ = ["CompletionRequest", "DONE", "TextStream", "chunk", "completion", "completion_id",
           "error_body", "parse_completion", "usage_chunk"]
