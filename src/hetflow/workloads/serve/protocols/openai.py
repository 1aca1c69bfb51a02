"""OpenAI's API: text completions of hetflow's generative models, and the LLM paths.

Routes (request parsing and answers, streamed or not: :mod:`hetflow.workloads.serve.openai_api`)::

    POST /v1/completions        the body's model: a generative model's replicas answer it (the
                                gateway as backup, from the model or its fallback); an LLM
                                pool's or upstream's, the front door sends there
    POST /v1/chat/completions   LLM pools (``engine: vllm``) and OpenAI upstreams only: the front
    POST /v1/embeddings         door sends them there by the body's model; the gateway answers
                                what names none (404, or 400 for hetflow's own models)

The model listing (``GET /v1/models``) is the native protocol's, in both shapes. Errors are
OpenAI's ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

from starlette.responses import Response

from hetflow.workloads.serve import openai_api
from hetflow.workloads.serve.headers import TOKENS_HEADER, check_allowed
from hetflow.workloads.serve.protocol import RequestError, parse_json
from hetflow.workloads.serve.protocols.base import Protocol, Route
from hetflow.workloads.serve.web import completion_answer, read_body


async def completions(gw: Any, request: Any, path: str, params: Mapping[str, str]) -> Response:
    """From the model or its fallback; ``stream: true`` -> server-sent events."""
    await gw.first_poll()
    table = gw.table
    body = await read_body(request, table.max_body_bytes)
    req = openai_api.parse_completion(body, table.generative, list(table.specs) + list(table.openai_models),
                                      default_model=next(iter(table.generative), None),
                                      max_new_tokens=table.max_new_tokens)
    check_allowed(request, req.model)
    chain = [m for m in table.chains[req.model] if m in table.generative]
    name = next((m for m in chain if gw.pick(m) is not None), None)
    if name is None:
        gw.metrics.answered(req.model, 503)
        return Response(openai_api.error_body(f"model {req.model} has no running replica; retry later"),
                        status_code=503, media_type="application/json")
    if name == req.model:
        gw.check_queue_limit(name)
    deployment = gw.pick(name)
    stream = gw.handle(name, deployment).options(stream=True).generate.remote(
        req.prompt, req.max_tokens, req.temperature, req.top_p, req.seed)
    started = time.perf_counter()

    def ended() -> None:
        gw.metrics.served(req.model, name, time.perf_counter() - started, 1)
        gw.reporter.changed()  # a stream ends after the request's call returned

    return await completion_answer(req, gw.counted(deployment, stream), stream.cancel, ended, TOKENS_HEADER)


async def elsewhere(gw: Any, request: Any, path: str, params: Mapping[str, str]) -> Response:
    """The front door routes these paths by the body's model to LLM pools and OpenAI
    upstreams; what reaches the gateway names none of them."""
    doc = parse_json(await read_body(request, gw.table.max_body_bytes))
    model = doc.get("model") if isinstance(doc, dict) else None
    served = sorted(gw.table.openai_models)
    if not isinstance(model, str):
        raise RequestError(400, "'model' must be a string (a served model's name)", param="model")
    if model in gw.table.specs:
        raise RequestError(400, f"model {model} is hetflow's own model; {path} serves LLMs (engine: vllm) "
                                "and OpenAI upstreams" + (": " + ", ".join(served) if served else ""),
                           param="model")
    raise RequestError(404, f"unknown model {model!r}; models on {path}: "
                            f"{', '.join(served) or 'none (add an engine: vllm model)'}", param="model")


async def replica_completions(server: Any, request: Any, path: str, params: Mapping[str, str]) -> Response:
    """A generative model's completion, answered by its replica (the front door sends a
    completion naming the model straight to its replicas, where its queue limit counts it)."""
    started = time.perf_counter()
    settings = server.settings
    if not settings.max_new_tokens:
        raise RequestError(404, f"model {settings.model} does not generate text; "
                                f"try POST /v1/models/{settings.model}/predict")
    body = await read_body(request, settings.max_body_bytes)
    req = openai_api.parse_completion(body, {settings.model: settings.input.width}, [settings.model],
                                      default_model=settings.model, max_new_tokens=settings.max_new_tokens)
    check_allowed(request, req.model)
    tokens = server.generate(req.prompt, req.max_tokens, req.temperature, req.top_p, req.seed)

    def ended() -> None:
        server.served(started, {"batch": {"requests": 1}})
        server.reporter.changed()

    # stop: the loop over the tokens ends, and this replica's generator with it
    return await completion_answer(req, tokens, lambda: None, ended, TOKENS_HEADER)


PROTOCOL = Protocol(
    name="openai",
    routes=(
        Route("POST", "/v1/completions", completions, replica=replica_completions, model_in_body=True),
        Route("POST", "/v1/chat/completions", elsewhere, model_in_body=True),
        Route("POST", "/v1/embeddings", elsewhere, model_in_body=True),
    ),
    error_body=openai_api.error_body,
    hint="try POST /v1/completions or /v1/chat/completions",
)
