"""HTTP pieces the replicas and the gateway share: bounded body reads, the client's path,
JSON and KServe v2 answers, and the names of the front door's actor and URL."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from hetflow.workloads.serve import kserve
from hetflow.workloads.serve.headers import PATH_HEADER
from hetflow.workloads.serve.protocol import (
    RequestError,
)


JSON = "application/json"


# A log line per request costs each replica more CPU than a small model's forward pass.
QUIET = {"enable_access_log": False}


async def read_body(request: Request, limit: int, json_only: bool = True) -> bytes:
    """The body, refused with 413 over ``limit`` (declared or streamed) and 415 when it is
    not JSON (``json_only``)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise RequestError(413, f"the body is {declared} bytes, more than the limit of "
                                f"{limit}; send fewer rows per request")
    media = request.headers.get("content-type", JSON).split(";")[0].strip().lower()
    if json_only and media not in (JSON, "", "text/json") and not media.endswith("+json"):
        raise RequestError(415, f"content-type {media} is not JSON; send application/json")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(413, f"the body is more than the limit of {limit} bytes; "
                                    "send fewer rows per request")
        chunks.append(chunk)
    return b"".join(chunks)


def client_path(request: Request) -> str:
    """The path the client asked for (the front door rewrites the path to Serve's internal
    route prefix and keeps the client's in a header). Without the front door (Serve's own
    proxy, ``builder``), the path under the application's route prefix (Serve's root_path)."""
    path = request.headers.get(PATH_HEADER)
    if path is None:
        path = request.url.path
        root = (request.scope.get("root_path") or "").rstrip("/")
        if root and (path == root or path.startswith(root + "/")):
            path = path[len(root):]
    return path.rstrip("/") or "/"


async def resolve(response: Any) -> Any:
    return await response


def json_response(status: int, payload: dict[str, Any]) -> Response:
    return Response(json.dumps(payload), status_code=status, media_type=JSON)


def v2_response(model: str, infer: Any, result: dict[str, Any], served_by: str) -> Response:
    body, headers = kserve.infer_response(model, infer, result, served_by)
    media = JSON if not headers else "application/octet-stream"
    return Response(body, status_code=200, headers=headers, media_type=media)


async def completion_answer(req: Any, tokens: AsyncIterator[int], stop: Callable[[], Any],
                      ended: Callable[[], None], tokens_header: str) -> Response:
    """The answer to a checked OpenAI completion request (``openai_api.CompletionRequest``)
    from ``tokens``, the model's next tokens (``stop()`` ends them early, at a stop string):
    server-sent events for ``stream: true`` (with ``stream_options.include_usage``, a last
    event with the usage, as OpenAI's), else one JSON body with its usage. ``ended()``
    runs once the last token is out. ``tokens_header`` carries the tokens the key is charged
    (the front door counts them): the prompt and what was generated; for a stream, whose usage
    is known only after the headers, what the request may use (prompt + max_tokens): the front
    door's stream usage filter charges a stream its usage event at its end and falls back to
    this bound only when it saw none (``stream_usage.py``)."""
    from hetflow.workloads.serve import openai_api

    cid, created = openai_api.completion_id(), int(time.time())
    text = openai_api.TextStream(req.stop)
    generated = [0]

    async def pieces():  # (text, finish_reason or None), then the last with a reason
        if req.echo:
            yield req.prompt_text, None
        async for token in tokens:
            generated[0] += 1
            piece = text.push(token)
            if text.stopped:
                stop()
                yield piece, "stop"
                break
            if piece:
                yield piece, None
        else:
            yield text.flush(), "length"
        ended()

    if req.stream:
        async def events():
            async for piece, finish in pieces():
                yield openai_api.chunk(cid, req.model, piece, finish, created, req.include_usage)
            if req.include_usage:
                yield openai_api.usage_chunk(cid, req.model, created, len(req.prompt), generated[0])
            yield openai_api.DONE

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={tokens_header: str(len(req.prompt) + req.max_tokens)})

    out, finish = [], "length"
    async for piece, reason in pieces():
        out.append(piece)
        finish = reason or finish
    response = json_response(200, openai_api.completion(cid, req.model, "".join(out), finish,
                                                        len(req.prompt), generated[0]))
    response.headers[tokens_header] = str(len(req.prompt) + generated[0])
    return response


def front_name(app: str) -> str:
    """The Ray actor name of an application's front door (namespace ``serve``)."""
    return f"hetflow-front-{app}"


def url_of(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


__all__ = ["client_path", "completion_answer", "front_name", "JSON", "json_response", "QUIET", "read_body", "resolve", "url_of", "v2_response"]
