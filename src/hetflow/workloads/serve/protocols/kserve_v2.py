"""KServe v2 (the Open Inference Protocol), as Triton's and KServe's clients speak it.

Routes (tensor parsing and answers, JSON and binary: :mod:`hetflow.workloads.serve.kserve`)::

    GET  /v2                          server metadata
    GET  /v2/health/live              200 while the gateway runs
    GET  /v2/health/ready             200 once every model is served
    GET  /v2/models/{model}           model metadata (its input tensor)
    GET  /v2/models/{model}/ready     200 while the model (or its fallback) is served
    POST /v2/models/{model}/infer     inference (its replicas answer; the gateway as backup)

Errors are ``{"error": "<message>"}`` (the protocol's own shape).
"""

from __future__ import annotations

import time
from typing import Any, Mapping

from starlette.responses import Response

from hetflow.workloads.serve import kserve
from hetflow.workloads.serve.protocol import RequestError, error_body
from hetflow.workloads.serve.protocols.base import Protocol, Route
from hetflow.workloads.serve.web import json_response, read_body, v2_response


async def server(gw: Any, request: Any, path: str, params: Mapping[str, str]) -> Response:
    await gw.first_poll()
    return json_response(200, {"name": "hetflow", "version": "1", "extensions": ["binary_tensor_data"]})


async def live(gw: Any, request: Any, path: str, params: Mapping[str, str]) -> Response:
    return json_response(200, {"live": True})


async def ready(gw: Any, request: Any, path: str, params: Mapping[str, str]) -> Response:
    await gw.first_poll()
    ok = gw.ready()
    return json_response(200 if ok else 503, {"ready": ok})


def _model(gw: Any, params: Mapping[str, str]) -> str:
    model = params["model"]
    if model not in gw.table.specs:
        raise RequestError(404, f"unknown model {model!r}; served models: {', '.join(sorted(gw.table.specs))}")
    return model


async def model_metadata(gw: Any, request: Any, path: str, params: Mapping[str, str]) -> Response:
    await gw.first_poll()
    model = _model(gw, params)
    return json_response(200, kserve.metadata(model, gw.table.specs[model]))


async def model_ready(gw: Any, request: Any, path: str, params: Mapping[str, str]) -> Response:
    await gw.first_poll()
    model = _model(gw, params)
    ok = gw.model_state(model)["served_by"] is not None
    return json_response(200 if ok else 503, {"name": model, "ready": ok})


async def infer(gw: Any, request: Any, path: str, params: Mapping[str, str]) -> Response:
    """Inference at the gateway: the front door's backup while none of the model's replicas is
    up (its fallbacks first), or a model routed through the gateway."""
    await gw.first_poll()
    model = _model(gw, params)
    table = gw.table
    started = time.perf_counter()
    header = request.headers.get(kserve.HEADER_LENGTH)
    body = await read_body(request, table.max_body_bytes, json_only=header is None)
    req = kserve.parse_infer(body, header, table.specs[model], model=model, max_rows=table.max_rows)
    status, payload = await gw.predict(req.request, model_down=model not in table.via_gateway)
    if status != 200:
        gw.metrics.answered(model, status)
        return json_response(status, payload)
    gw.metrics.served(model, payload["served_by"], time.perf_counter() - started, payload["batch"]["requests"])
    return v2_response(model, req, payload, payload["served_by"])


async def replica_infer(server: Any, request: Any, path: str, params: Mapping[str, str]) -> Response:
    started = time.perf_counter()
    settings = server.settings
    header = request.headers.get(kserve.HEADER_LENGTH)
    body = await read_body(request, settings.max_body_bytes, json_only=header is None)
    req = kserve.parse_infer(body, header, settings.input, model=settings.model, max_rows=settings.max_rows)
    result = await server.answer(req.request)
    server.served(started, result)
    return v2_response(settings.model, req, result, settings.model)


PROTOCOL = Protocol(
    name="kserve_v2",
    routes=(
        Route("GET", "/v2", server),
        Route("GET", "/v2/health/live", live, probe=True),
        Route("GET", "/v2/health/ready", ready, probe=True),
        Route("GET", "/v2/models/{model}", model_metadata),
        Route("GET", "/v2/models/{model}/ready", model_ready),
        Route("POST", "/v2/models/{model}/infer", infer, replica=replica_infer),
    ),
    error_body=lambda message, param=None: error_body(message),
    prefix="/v2",
    hint="try GET /v2/models/<name>, /v2/models/<name>/ready or POST /v2/models/<name>/infer",
)
