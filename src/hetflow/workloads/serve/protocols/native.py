"""hetflow's own JSON API: predictions, health, metrics and the model listing.

Routes (request and answer shapes: :mod:`hetflow.workloads.serve.protocol`)::

    POST /v1/models/{model}/predict   a model's rows (its replicas answer; the gateway as backup)
    POST /v1/predict                  the body names the model (else the default model)
    GET  /health, /healthz            every model's state; 200 once ready, else 503
    GET  /metrics                     Prometheus text (``?format=json``: JSON), every replica summed
    GET  /v1/models, /v1/models/{model*}   the listing (hetflow's under "models", OpenAI's under "data")

Errors are ``{"error": "<what was wrong and how to fix it>"}``.
"""

from __future__ import annotations

import time
from typing import Any, Mapping

from starlette.responses import Response

from hetflow.workloads.serve.headers import MODELS_HEADER, allowed_models, check_allowed
from hetflow.workloads.serve.protocol import RequestError, error_body, parse_predict
from hetflow.workloads.serve.protocols.base import Protocol, Route
from hetflow.workloads.serve.web import json_response, read_body


# --- the gateway ------------------------------------------------------------------------


async def predict(gw: Any, request: Any, path: str, params: Mapping[str, str]) -> Response:
    """A prediction; by the path's model, the gateway answers it only as the front door's
    backup (none of the model's replicas is up): its fallbacks first, then the model."""
    started = time.perf_counter()
    path_model = params.get("model")
    table = gw.table
    body = await read_body(request, table.max_body_bytes)
    parsed = parse_predict(body, table.specs, path_model=path_model, default_model=table.default_model,
                           max_rows=table.max_rows)
    check_allowed(request, parsed.model)
    status, payload = await gw.predict(
        parsed, model_down=path_model is not None and path_model not in table.via_gateway)
    if status == 200:
        gw.metrics.served(parsed.model, payload["served_by"], time.perf_counter() - started,
                          payload["batch"]["requests"])
    else:
        gw.metrics.answered(parsed.model, status)
    return json_response(status, payload)


async def health(gw: Any, request: Any, path: str, params: Mapping[str, str]) -> Response:
    await gw.first_poll()
    models = {m: gw.model_state(m) for m in gw.table.groups}
    if all(s["served_by"] == m for m, s in models.items()):
        status = "ok"
    elif all(s["served_by"] is not None for s in models.values()):
        status = "degraded"
    else:
        status = "down"
    ready = status != "down" and gw.front_ready()
    return json_response(200 if ready else 503, {"status": status if ready or status == "down"
                                                 else "starting", "ready": ready, "models": models})


async def metrics(gw: Any, request: Any, path: str, params: Mapping[str, str]) -> Response:
    merged = await gw.merged_metrics()
    if request.query_params.get("format") == "json":
        return json_response(200, merged.to_dict())
    body, content_type = merged.render(request.headers.get("accept"))
    return Response(body, headers={"content-type": content_type})


def openai_model(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "hetflow"}


async def models(gw: Any, request: Any, path: str, params: Mapping[str, str]) -> Response:
    """The listing; with an API key that may use some models only, those (another model's
    name is answered 404, as if it did not exist)."""
    await gw.first_poll()
    table = gw.table
    name = params.get("model")
    allowed = allowed_models(request.headers.get(MODELS_HEADER))
    visible = sorted(m for m in table.specs if allowed is None or m in allowed)
    others = sorted(m for m in table.openai_models
                    if (allowed is None or m in allowed) and m not in table.specs)
    if name is not None and name in others:  # OpenAI's model object
        return json_response(200, openai_model(name))
    if name is not None and name not in visible:
        raise RequestError(404, f"unknown model {name!r}; served models: {', '.join(visible + others)}")
    names = [name] if name is not None else visible
    listing = {n: {**table.describe.get(n, {}), "input": table.specs[n].to_dict(),
                   "fallback": table.chains[n][1:], **gw.model_state(n)}
               for n in names}
    if name is not None:
        return json_response(200, listing[name])
    # hetflow's listing under "models"; OpenAI's (client.models.list()) under "data"
    return json_response(200, {"models": listing, "object": "list",
                               "data": [openai_model(n) for n in sorted(visible + others)]})


# --- a model's replica ------------------------------------------------------------------


async def replica_predict(server: Any, request: Any, path: str, params: Mapping[str, str]) -> Response:
    started = time.perf_counter()
    settings = server.settings
    body = await read_body(request, settings.max_body_bytes)
    parsed = parse_predict(body, server.specs, path_model=settings.model, default_model=settings.model,
                           max_rows=settings.max_rows)
    result = await server.answer(parsed)
    server.served(started, result)
    result.update(model=settings.model, served_by=settings.model, fallback=False)
    return json_response(200, result)


PROTOCOL = Protocol(
    name="native",
    routes=(
        Route("POST", "/v1/models/{model}/predict", predict, replica=replica_predict),
        Route("POST", "/v1/predict", predict, model_in_body=True),
        Route("GET", "/health", health, probe=True),
        Route("GET", "/healthz", health, probe=True),
        Route("GET", "/metrics", metrics),
        Route("GET", "/v1/models", models),
        Route("GET", "/v1/models/{model*}", models),
    ),
    error_body=lambda message, param=None: error_body(message),
    hint="try POST /v1/models/<name>/predict, GET /v1/models, /health or /metrics",
)
