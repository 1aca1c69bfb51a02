r"""The Ray Serve applications of one hetflow serving config, behind one front door.

    from hetflow.workloads.serve.app import deploy
    from hetflow.workloads.serve.config import load_serve_config
    served = deploy(load_serve_config("examples/serve_digits.yaml"))
    print(served.url)            # http://127.0.0.1:8000

Shape (one Python process per request on the fast path, as in Ray Serve's fastest mode)::

    client -> front door (HAProxy, http.host:port) -> ModelServer replica (its own HTTP port)
                          \-- backup, /v1/predict, /health, ... -> Gateway -> ModelServer (handle)

* Every replica group of a model (one per planned device, :mod:`.placement`) is a Serve
  application whose ingress is :class:`ModelServer`: with Serve's direct ingress
  (``RAY_SERVE_THROUGHPUT_OPTIMIZED=1``) each replica serves HTTP on its own port, reads the
  body (bounded), checks it (:mod:`.protocol`; bad input -> 4xx with a message, before the
  model sees it), gathers concurrent requests with ``@serve.batch`` (by rows) into one forward
  pass, and counts its metrics (sent to the front door every half second).
* :class:`Gateway` (its own application) answers what is not one model's POST:
  ``/v1/predict`` (the model named in the body), ``/health``, ``/metrics`` (the sum of every
  replica's counts, model and gateway replicas alike, as the front door holds them),
  ``/v1/models``; and it is the front door's **backup** server for every model: while none
  of a model's replicas is up, the model's requests reach the gateway, which sends them along
  the model's ``fallback`` chain over Serve handles (repeating an attempt whose replica died,
  ``gateway.retries``).
* The front door (:mod:`.front`) is HAProxy with hetflow's config: per-model backends over the
  replicas' ports (from Serve's controller), L7 retries of requests whose replica died, the
  gateway as backup, readiness from HAProxy's own health checks.

Endpoints: ``POST /v1/models/<name>/predict``, ``POST /v1/predict``, ``GET /v1/models``,
``GET /v1/models/<name>``, ``GET /health`` (200 ok/degraded when ready, 503 while starting or
when no model can answer), ``GET /metrics`` (Prometheus text or OpenMetrics, written by
prometheus_client; ``?format=json``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import ray
from ray import serve
from ray.exceptions import ActorUnavailableError, RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from hetflow.core.errors import HetflowError
from hetflow.workloads.serve import kserve, openai_api
from hetflow.workloads.serve.config import ServeConfig, fallback_chain, is_loopback
from hetflow.workloads.serve.front import (
    FAST_ENV,
    PATH_HEADER,
    FrontPlan,
    app_prefix,
    group_prefix,
)
from hetflow.workloads.serve.metrics import GatewayMetrics
from hetflow.workloads.serve.placement import ReplicaGroup
from hetflow.workloads.serve.protocol import (
    InputSpec,
    PredictRequest,
    RequestError,
    error_body,
    parse_predict,
)

JSON = "application/json"
# A log line per request costs each replica more CPU than a small model's forward pass.
QUIET = {"enable_access_log": False}

log = logging.getLogger(__name__)


if TYPE_CHECKING:  # torch is imported where a model is built, not by the gateway's replicas
    from hetflow.workloads.serve.inference import ReplicaSpec


def _rows_of(requests: list[PredictRequest]) -> int:
    return sum(len(r.rows) for r in requests)


@dataclass(frozen=True)
class ServerSettings:
    """What a model's ingress replica needs besides its weights (plain data)."""

    app: str  # the hetflow application (its front door's name)
    model: str
    input: InputSpec
    batching: dict[str, Any]  # BatchingConfig, as a dict
    max_body_bytes: int
    max_rows: int
    front_door: bool = True  # False under Serve's own tooling (``builder``): nothing to report to


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


class _MetricsReporter:
    """Sends a replica's cumulative metrics to the front door every half second, when they
    changed (one small actor call, off the request path)."""

    def __init__(self, app: str, source: str, metrics: GatewayMetrics,
                 enabled: bool = True) -> None:
        self.app, self.source, self.metrics = app, source, metrics
        self.enabled = enabled
        self._sent = -1
        self._task: asyncio.Task | None = None
        self._front: Any = None

    def changed(self) -> None:
        """Make sure the latest counts reach the front door (call after counting)."""
        if not self.enabled:
            return
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        while self._sent != self.metrics.version:
            await asyncio.sleep(0.5)
            version = self.metrics.version
            try:
                if self._front is None:
                    self._front = ray.get_actor(front_name(self.app), namespace="serve")
                await self._front.report.remote(self.source, self.metrics)
                self._sent = version
            except Exception:  # noqa: BLE001 - the front door may be starting; next time
                self._front = None
                await asyncio.sleep(1.0)


class ModelServer:
    """One replica of one model, and the ingress of its own Serve application: it answers
    HTTP itself (the front door sends it the model's POSTs), checks the input, batches
    concurrent requests (``@serve.batch``, by rows) into one forward pass, and counts."""

    def __init__(self, spec: ReplicaSpec, settings: ServerSettings) -> None:
        self.spec = spec
        self.settings = settings
        from hetflow.workloads.serve.inference import build_runner

        self.runner = build_runner(spec)
        context = serve.get_replica_context()
        self.replica = context.replica_id.unique_id
        self.deployment = context.deployment
        self.metrics = GatewayMetrics()
        self.reporter = _MetricsReporter(settings.app, self.replica, self.metrics,
                                         settings.front_door)
        self.specs = {settings.model: settings.input}
        b = settings.batching
        self.batching = bool(b["enabled"])
        self.max_batch = int(b["max_batch_size"])
        self._batcher = None
        if self.batching:
            self._batcher = serve.batch(
                max_batch_size=self.max_batch, batch_wait_timeout_s=float(b["batch_wait_timeout_s"]),
                max_concurrent_batches=1, batch_size_fn=_rows_of)(self._run_batch)

    async def _run_batch(self, requests: list[PredictRequest]) -> list[dict[str, Any]]:
        return self.predict_many([r.rows for r in requests], [r.probabilities for r in requests])

    async def __call__(self, request: Request) -> Response:
        started = time.perf_counter()
        path = client_path(request)
        model = self.settings.model
        try:
            if request.method != "POST":
                raise RequestError(405, f"{path} takes POST, not {request.method}")
            if path == f"/v1/models/{model}/predict":
                body = await read_body(request, self.settings.max_body_bytes)
                parsed = parse_predict(body, self.specs, path_model=model, default_model=model,
                                       max_rows=self.settings.max_rows)
                infer = None
            elif path == f"/v2/models/{model}/infer":
                header = request.headers.get(kserve.HEADER_LENGTH)
                body = await read_body(request, self.settings.max_body_bytes,
                                       json_only=header is None)
                infer = kserve.parse_infer(body, header, self.settings.input, model=model,
                                           max_rows=self.settings.max_rows)
                parsed = infer.request
            else:
                raise RequestError(404, f"no endpoint {path}; try POST /v1/models/{model}/predict "
                                        f"or /v2/models/{model}/infer")
        except RequestError as exc:
            self.metrics.answered("-", exc.status)
            self.reporter.changed()
            return Response(error_body(exc.message), status_code=exc.status, media_type=JSON)
        result = await self.answer(parsed)
        self.metrics.served(model, model, time.perf_counter() - started,
                            result["batch"]["requests"])
        self.reporter.changed()
        if infer is not None:
            return _v2_response(model, infer, result, model)
        result.update(model=model, served_by=model, fallback=False)
        return _json(200, result)

    async def answer(self, parsed: PredictRequest) -> dict[str, Any]:
        """A checked request's result, batched with concurrent ones when batching is on."""
        if self._batcher is not None and len(parsed.rows) <= self.max_batch:
            return await self._batcher(parsed)
        return self.predict_many([parsed.rows], [parsed.probabilities])[0]

    async def predict_batched(self, rows: np.ndarray, probabilities: bool) -> list[dict[str, Any]]:
        """One checked request from the gateway (the fallback, ``/v1/predict``, autoscaled
        models), batched with this replica's other requests; a list of one result."""
        return [await self.answer(PredictRequest(self.settings.model, rows, probabilities))]

    async def generate(self, tokens: list[int], max_tokens: int, temperature: float,
                       top_p: float, seed: int | None) -> Any:
        """Next tokens after ``tokens``, one at a time (a streaming handle call): the model
        sees the last ``width`` tokens (its context); greedy at temperature 0, else sampled
        from the top-p share of the softmax."""
        import torch

        context = self.settings.input.width
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        window = list(tokens)[-context:]
        for _ in range(max_tokens):
            x = torch.tensor([window], dtype=torch.long, device=self.runner.device)
            with torch.inference_mode():
                logits = self.runner.model(x)[0, -1].float().cpu()
            if temperature == 0:
                token = int(logits.argmax())
            else:
                # float64, the largest logit at 0: any temperature above 0 (down to 5e-324)
                # gives finite weights (in float32, 1e-300 is 0: logits / 0 are infinities,
                # and their softmax NaN, which torch.multinomial refuses)
                probs = torch.softmax((logits.double() - logits.max()) / temperature, -1)
                if top_p < 1:
                    ordered, index = probs.sort(descending=True)
                    keep = ordered.cumsum(-1) - ordered < top_p
                    probs = torch.zeros_like(probs).scatter(0, index[keep], ordered[keep])
                token = int(torch.multinomial(probs, 1, generator=generator))
            window = (window + [token])[-context:]
            yield token
            await asyncio.sleep(0)  # let other requests of this replica run between tokens

    def predict_many(self, batches: list[np.ndarray],
                     probabilities: list[bool]) -> list[dict[str, Any]]:
        """One result per request; all requests' rows (already checked) in one forward pass."""
        results = self.runner.split_predict(batches, probabilities)
        batch = {"requests": len(batches), "rows": sum(len(rows) for rows in batches)}
        for result in results:
            result.update(batch=batch, replica=self.replica)
        return results

    def predict(self, rows: np.ndarray, probabilities: bool = False) -> dict[str, Any]:
        """One request's answer (for handle callers)."""
        return self.predict_many([rows], [probabilities])[0]

    def info(self) -> dict[str, Any]:
        """Where this replica runs and what it sees (tests and ``hetflow serve`` use it)."""
        context = ray.get_runtime_context()
        labels = context.get_node_labels() if hasattr(context, "get_node_labels") else {}
        return {
            "model": self.spec.model, "deployment": self.deployment, "replica": self.replica,
            "pid": os.getpid(), "node": labels.get("hetflow.io/node"),
            "device": str(self.runner.device), "precision": self.runner.precision,
            "batching": self.batching,
            "visible": {k: os.environ.get(k) for k in
                        ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")},
            "assigned_resources": context.get_assigned_resources(),
        }

    def check_health(self) -> None:
        """Serve calls this every ``health_check_period_s``; raising marks the replica bad."""


ModelReplica = ModelServer  # the name earlier releases used


@dataclass(frozen=True)
class RouteTable:
    """What the gateway knows about the models (plain data)."""

    app: str
    specs: dict[str, InputSpec]
    chains: dict[str, list[str]]  # model -> [model, fallback, fallback's fallback, ...]
    groups: dict[str, list[str]]  # model -> its deployments' names
    default_model: str
    max_body_bytes: int
    max_rows: int
    request_timeout_s: float
    status_poll_s: float
    retries: int
    batching: dict[str, dict[str, Any]] = field(default_factory=dict)  # model -> BatchingConfig
    describe: dict[str, dict[str, Any]] = field(default_factory=dict)  # for GET /v1/models
    via_gateway: frozenset[str] = frozenset()  # models routed here, not to their replicas
    generative: dict[str, int] = field(default_factory=dict)  # causal LMs -> context tokens
    max_new_tokens: int = 256
    # deployment -> its Serve application (absent: the application of the deployment's name)
    apps: dict[str, str] = field(default_factory=dict)
    front_door: bool = True  # False under Serve's own tooling: every request comes here

    def app_of(self, deployment: str) -> str:
        return self.apps.get(deployment, deployment)


class _ReplicaLost(Exception):
    """The replica a request went to died under it (the request may be repeated)."""


class _ModelDown(Exception):
    """The model has no running replica (the request goes to the fallback)."""


class Gateway:
    """Everything but a model's own POSTs: ``/v1/predict`` (model named in the body), the
    fallback (the front door's backup server for every model: it gets a model's requests
    while none of the model's replicas is up), ``/health``, ``/metrics``, ``/v1/models``."""

    def __init__(self, table: RouteTable, replicas: dict[str, Any] | None = None) -> None:
        # ``replicas``: handles of the model deployments, when they are bound into this
        # application (Serve's own tooling, ``builder``); else looked up in their own apps.
        self.table = table
        bound = replicas or {}
        self.handles = {m: [bound[d] if d in bound else
                            serve.get_deployment_handle(d, table.app_of(d)) for d in ds]
                        for m, ds in table.groups.items()}
        self.metrics = GatewayMetrics()
        # Every gateway replica's counts go to the front door too, so /metrics is the sum over
        # all replicas whichever gateway replica a scrape reaches.
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.reporter = _MetricsReporter(table.app, self.replica, self.metrics, table.front_door)
        self.running: dict[str, int] = {}  # deployment -> RUNNING replicas (last poll)
        self.front: dict[str, Any] = {}  # the front door's state (last poll)
        self.inflight: dict[str, int] = {d: 0 for ds in table.groups.values() for d in ds}
        self._poller: asyncio.Task | None = None
        self._polled_once = asyncio.Event()
        self._front_actor: Any = None

    # --- HTTP --------------------------------------------------------------------------

    async def __call__(self, request: Request) -> Response:
        try:
            return await self._answer(request)
        finally:
            self.reporter.changed()

    async def _answer(self, request: Request) -> Response:
        self._ensure_poller()
        path = client_path(request)
        try:
            if path == "/v1/predict" or (path.startswith("/v1/models/")
                                         and path.endswith("/predict")):
                _require(request.method, "POST", path)
                model = path[len("/v1/models/"):-len("/predict")] if path != "/v1/predict" else None
                return await self._predict_http(request, model)
            if path in ("/health", "/healthz"):
                _require(request.method, "GET", path)
                await self._first_poll()
                return self._health()
            if path.startswith("/v2/") or path == "/v2":
                return await self._v2(request, path)
            if path == "/v1/completions":
                _require(request.method, "POST", path)
                return await self._completions(request)
            if path == "/metrics":
                _require(request.method, "GET", path)
                merged = await self._merged_metrics()
                if request.query_params.get("format") == "json":
                    return _json(200, merged.to_dict())
                body, content_type = merged.render(request.headers.get("accept"))
                return Response(body, headers={"content-type": content_type})
            if path == "/v1/models" or path.startswith("/v1/models/"):
                _require(request.method, "GET", path)
                await self._first_poll()
                return self._models(path[len("/v1/models/"):] if path != "/v1/models" else None)
            raise RequestError(404, f"no endpoint {path}; try POST /v1/models/<name>/predict, "
                                    "GET /v1/models, /health or /metrics")
        except RequestError as exc:
            self.metrics.answered("-", exc.status)
            return Response(error_body(exc.message), status_code=exc.status, media_type=JSON)

    async def _v2(self, request: Request, path: str) -> Response:
        """KServe v2: health, metadata, readiness; infer while the model is down."""
        await self._first_poll()
        if path in ("/v2/health/live", "/v2/health/ready", "/v2"):
            _require(request.method, "GET", path)
            if path == "/v2":
                return _json(200, {"name": "hetflow", "version": "1", "extensions": ["binary_tensor_data"]})
            ready = path == "/v2/health/live" or self._ready()
            return _json(200 if ready else 503, {"live": True} if path.endswith("live")
                         else {"ready": ready})
        parts = path.split("/")  # "", "v2", "models", name, [ready|infer]
        if len(parts) < 4 or parts[2] != "models" or len(parts) > 5:
            raise RequestError(404, f"no endpoint {path}; try GET /v2/models/<name>, "
                                    "/v2/models/<name>/ready or POST /v2/models/<name>/infer")
        model = parts[3]
        if model not in self.table.specs:
            raise RequestError(404, f"unknown model {model!r}; served models: "
                                    f"{', '.join(sorted(self.table.specs))}")
        action = parts[4] if len(parts) == 5 else ""
        if action == "":
            _require(request.method, "GET", path)
            return _json(200, kserve.metadata(model, self.table.specs[model]))
        if action == "ready":
            _require(request.method, "GET", path)
            ready = self.model_state(model)["served_by"] is not None
            return _json(200 if ready else 503, {"name": model, "ready": ready})
        if action == "infer":
            _require(request.method, "POST", path)
            started = time.perf_counter()
            header = request.headers.get(kserve.HEADER_LENGTH)
            body = await read_body(request, self.table.max_body_bytes, json_only=header is None)
            infer = kserve.parse_infer(body, header, self.table.specs[model], model=model,
                                       max_rows=self.table.max_rows)
            status, payload = await self.predict(
                infer.request, model_down=model not in self.table.via_gateway)
            if status != 200:
                self.metrics.answered(model, status)
                return _json(status, payload)
            self.metrics.served(model, payload["served_by"], time.perf_counter() - started,
                                payload["batch"]["requests"])
            return _v2_response(model, infer, payload, payload["served_by"])
        raise RequestError(404, f"no endpoint {path}")

    async def _completions(self, request: Request) -> Response:
        """OpenAI ``POST /v1/completions`` (:mod:`.openai_api`), from the model or its
        fallback; ``stream: true`` -> server-sent events, a token at a time."""
        await self._first_poll()
        try:
            body = await read_body(request, self.table.max_body_bytes)
            req = openai_api.parse_completion(
                body, self.table.generative, list(self.table.specs),
                default_model=next(iter(self.table.generative), None),
                max_new_tokens=self.table.max_new_tokens)
        except RequestError as exc:
            self.metrics.answered("-", exc.status)
            return Response(openai_api.error_body(exc.message), status_code=exc.status,
                            media_type=JSON)
        chain = [m for m in self.table.chains[req.model] if m in self.table.generative]
        name = next((m for m in chain if self._pick(m) is not None), None)
        if name is None:
            self.metrics.answered(req.model, 503)
            return Response(openai_api.error_body(f"model {req.model} has no running replica; "
                                                  "retry later"), status_code=503,
                            media_type=JSON)
        handle = self.handles[name][self.table.groups[name].index(self._pick(name))]
        tokens = handle.options(stream=True).generate.remote(
            req.prompt, req.max_tokens, req.temperature, req.top_p, req.seed)
        cid, created, started = openai_api.completion_id(), int(time.time()), time.perf_counter()
        text = openai_api.TextStream(req.stop)
        generated = [0]  # tokens the model produced (for usage)

        async def pieces():  # (text, finish_reason or None), then the last with a reason
            count = 0
            if req.echo:
                yield req.prompt_text, None
            async for token in tokens:
                count += 1
                generated[0] = count
                piece = text.push(token)
                if text.stopped:
                    tokens.cancel()
                    yield piece, "stop"
                    break
                if piece:
                    yield piece, None
            else:
                yield text.flush(), "length"
            self.metrics.served(req.model, name, time.perf_counter() - started, 1)
            self.reporter.changed()  # a stream ends after __call__ returned

        if req.stream:
            async def events():
                async for piece, finish in pieces():
                    yield openai_api.chunk(cid, req.model, piece, finish, created)
                yield openai_api.DONE

            return StreamingResponse(events(), media_type="text/event-stream")
        out, finish = [], "length"
        async for piece, reason in pieces():
            out.append(piece)
            finish = reason or finish
        return _json(200, openai_api.completion(cid, req.model, "".join(out), finish,
                                                len(req.prompt), generated[0]))

    def _front_ready(self) -> bool:
        return bool(self.front.get("ready")) or not self.table.front_door

    def _ready(self) -> bool:
        return self._front_ready() and all(
            self.model_state(m)["served_by"] is not None for m in self.table.groups)

    async def _merged_metrics(self) -> GatewayMetrics:
        """The sum of every replica's latest report, as the front door holds them (this
        replica's own counts recorded there first, in the same call). Every scrape, through
        whichever gateway replica, reads the same reports, so no counter goes down between
        scrapes; the other replicas' counts are up to half a second old."""
        try:
            if not self.table.front_door:
                raise LookupError("no front door")
            merged = await self._front_door().metrics.remote(self.replica, self.metrics)
        except Exception:  # noqa: BLE001 - without the front door: this replica's own
            self._front_actor = None
            merged = GatewayMetrics()
            merged.merge(self.metrics)
        merged.set_replicas({(m, d): self.running.get(d, 0)
                             for m, ds in self.table.groups.items() for d in ds})
        return merged

    async def _predict_http(self, request: Request, path_model: str | None) -> Response:
        started = time.perf_counter()
        body = await read_body(request, self.table.max_body_bytes)
        parsed = parse_predict(body, self.table.specs, path_model=path_model,
                               default_model=self.table.default_model,
                               max_rows=self.table.max_rows)
        # A model's own URL reaches the gateway only as the front door's backup, i.e. while
        # none of the model's replicas is up there: try its fallbacks first, then itself.
        status, payload = await self.predict(
            parsed, model_down=path_model is not None and path_model not in self.table.via_gateway)
        if status == 200:
            self.metrics.served(parsed.model, payload["served_by"],
                                time.perf_counter() - started, payload["batch"]["requests"])
        else:
            self.metrics.answered(parsed.model, status)
        return _json(status, payload)

    # --- routing -----------------------------------------------------------------------

    async def predict(self, req: PredictRequest, model_down: bool = False
                      ) -> tuple[int, dict[str, Any]]:
        """Status and JSON payload for a checked request, from the model or along its
        fallback chain."""
        await self._first_poll()
        return (await self._predict_group(req.model, [req], model_down))[0]

    async def _predict_group(self, model: str, reqs: list[PredictRequest],
                             model_down: bool = False) -> list[tuple[int, dict[str, Any]]]:
        reasons = []
        deadline = time.monotonic() + self.table.request_timeout_s
        chain = self.table.chains[model]
        if model_down and len(chain) > 1:
            chain = chain[1:] + chain[:1]
        for name in chain:
            for attempt in range(1 + self.table.retries):
                group = self._pick(name)
                if group is None:
                    reasons.append(f"{name} has no running replica")
                    break
                try:
                    results = await self._call(name, group, reqs, deadline)
                except _ReplicaLost:
                    for _ in reqs:
                        self.metrics.retried(model)
                    reasons.append(f"a replica of {name} died during the request")
                    continue
                except _ModelDown:
                    reasons.append(f"{name} went down during the request")
                    break
                except asyncio.TimeoutError:
                    error = {"error": f"model {name} did not answer within "
                                      f"{self.table.request_timeout_s:g}s (limits."
                                      "request_timeout_s); the service is overloaded"}
                    return [(504, error)] * len(reqs)
                for result in results:
                    result.update(model=model, served_by=name, fallback=name != model)
                return [(200, result) for result in results]
        error = {"error": f"model {model} cannot answer now: {'; '.join(reasons)}; retry later"}
        return [(503, error)] * len(reqs)

    def _pick(self, model: str) -> str | None:
        """The model's least busy deployment among those with a running replica."""
        candidates = [d for d in self.table.groups[model] if self._may_serve(d)]
        if not candidates:
            return None
        return min(candidates, key=lambda d: self.inflight[d])

    def _may_serve(self, deployment: str) -> bool:
        # Before the first status poll answers, assume the deployment is up.
        return self.running.get(deployment, 1) > 0

    async def _call(self, model: str, deployment: str, reqs: list[PredictRequest],
                    deadline: float) -> list[dict[str, Any]]:
        index = self.table.groups[model].index(deployment)
        assert len(reqs) == 1, "the gateway sends one request at a time; replicas batch"
        response = self.handles[model][index].predict_batched.remote(reqs[0].rows,
                                                                      reqs[0].probabilities)
        task = asyncio.ensure_future(_resolve(response))
        self.inflight[deployment] += 1
        try:
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise asyncio.TimeoutError
                done, _ = await asyncio.wait({task}, timeout=min(remaining, self.table.status_poll_s))
                if done:
                    return task.result()
                if not self._may_serve(deployment):
                    raise _ModelDown
        except (RayActorError, ActorUnavailableError):
            raise _ReplicaLost from None
        except BaseException:
            if not task.done():
                response.cancel()
                task.cancel()
            raise
        finally:
            self.inflight[deployment] -= 1

    # --- Serve status and the front door -----------------------------------------------

    def _front_door(self) -> Any:
        if self._front_actor is None:
            self._front_actor = ray.get_actor(front_name(self.table.app), namespace="serve")
        return self._front_actor

    def _ensure_poller(self) -> None:
        if self._poller is None or self._poller.done():
            self._poller = asyncio.get_running_loop().create_task(self._poll_forever())

    async def _first_poll(self) -> None:
        self._ensure_poller()
        try:
            await asyncio.wait_for(self._polled_once.wait(), timeout=5.0)
        except asyncio.TimeoutError:
            pass  # route optimistically; a dead replica still shows up as an error

    async def _poll_forever(self) -> None:
        while True:
            try:
                status = await asyncio.to_thread(serve.status)
                self._update_running(status)
            except Exception:  # noqa: BLE001 - the controller may be restarting; try again
                pass
            try:
                self.front = (await self._front_door().state.remote()
                              if self.table.front_door else {})
            except Exception:  # noqa: BLE001 - the front door starts after the gateway
                self._front_actor = None
                self.front = {}
            self._polled_once.set()
            await asyncio.sleep(self.table.status_poll_s)

    def _update_running(self, status: Any) -> None:
        running = {}
        for model, deployments in self.table.groups.items():
            for name in deployments:
                app = status.applications.get(self.table.app_of(name))
                dep = app.deployments.get(name) if app is not None else None
                states = dep.replica_states if dep is not None else {}
                running[name] = int(sum(n for s, n in states.items() if str(s).endswith("RUNNING")))
        self.running = running

    # --- health and listing ------------------------------------------------------------

    def model_state(self, model: str) -> dict[str, Any]:
        replicas = {d: self.running.get(d) for d in self.table.groups[model]}
        up = sum(n or 0 for n in replicas.values())
        routed = self.front.get("up", {})
        serving = next((name for name in self.table.chains[model]
                        if any(self._may_serve(d) for d in self.table.groups[name])
                        and routed.get(name, 1) > 0), None)
        return {"running_replicas": up, "routed_replicas": routed.get(model),
                "deployments": replicas, "served_by": serving}

    def _health(self) -> Response:
        models = {m: self.model_state(m) for m in self.table.groups}
        if all(s["served_by"] == m for m, s in models.items()):
            status = "ok"
        elif all(s["served_by"] is not None for s in models.values()):
            status = "degraded"
        else:
            status = "down"
        ready = status != "down" and self._front_ready()
        return _json(200 if ready else 503, {"status": status if ready or status == "down"
                                             else "starting", "ready": ready, "models": models})

    def _models(self, name: str | None) -> Response:
        if name is not None and name not in self.table.specs:
            raise RequestError(404, f"unknown model {name!r}; served models: "
                                    f"{', '.join(sorted(self.table.specs))}")
        names = [name] if name is not None else sorted(self.table.specs)
        listing = {n: {**self.table.describe.get(n, {}), "input": self.table.specs[n].to_dict(),
                       "fallback": self.table.chains[n][1:], **self.model_state(n)}
                   for n in names}
        return _json(200, listing[name] if name is not None else {"models": listing})


async def _resolve(response: Any) -> Any:
    return await response


def _require(method: str, wanted: str, path: str) -> None:
    if method != wanted:
        raise RequestError(405, f"{path} takes {wanted}, not {method}")


def _json(status: int, payload: dict[str, Any]) -> Response:
    return Response(json.dumps(payload), status_code=status, media_type=JSON)


def _v2_response(model: str, infer: Any, result: dict[str, Any], served_by: str) -> Response:
    body, headers = kserve.infer_response(model, infer, result, served_by)
    media = JSON if not headers else "application/octet-stream"
    return Response(body, status_code=200, headers=headers, media_type=media)


def front_name(app: str) -> str:
    """The Ray actor name of an application's front door (namespace ``serve``)."""
    return f"hetflow-front-{app}"


# --- building and deploying --------------------------------------------------------------


@dataclass(frozen=True)
class ModelPlan:
    """One model ready to deploy: its replicas' spec and where they go."""

    entry: Any  # ModelServeConfig
    spec: ReplicaSpec
    input: InputSpec
    groups: list[ReplicaGroup]
    memory_bytes: int
    generative: bool = False  # its spec's serving output is sequence_logits (a causal LM)


@dataclass
class Served:
    """A deployed application: its Serve applications and the front door's URL."""

    config: ServeConfig
    url: str
    plans: dict[str, ModelPlan]
    started_ray: bool = False
    front: Any = None  # the FrontDoor actor

    @property
    def applications(self) -> list[str]:
        return [self.config.name] + [g.deployment for mp in self.plans.values()
                                     for g in mp.groups]

    def replica_infos(self, model: str, calls: int = 8) -> list[dict[str, Any]]:
        """``info()`` of the model's replicas, gathered over several calls per deployment
        (Serve picks the replica; distinct replicas are returned once each)."""
        seen: dict[str, dict[str, Any]] = {}
        for group in self.plans[model].groups:
            handle = serve.get_deployment_handle(group.deployment, group.deployment)
            for info in [handle.info.remote().result(timeout_s=60) for _ in range(calls)]:
                seen[info["replica"]] = info
        return list(seen.values())

    def expected_replicas(self) -> dict[str, int]:
        """Replicas each model starts with (fixed counts, or autoscaling's initial ones)."""
        return {m: sum(g.num_replicas if g.num_replicas is not None
                       else g.autoscaling["initial_replicas"] for g in mp.groups)
                for m, mp in self.plans.items()}

    def state(self) -> dict[str, Any]:
        """The front door's view: servers up per model, who answers, ready or not."""
        return ray.get(self.front.state.remote(), timeout=30)

    def shutdown(self) -> None:
        # Every application's deletion at once (each drains its replicas for up to
        # graceful_shutdown_timeout_s), then wait until Serve lists none of them.
        for app in reversed(self.applications):
            try:
                serve.delete(app, _blocking=False)
            except Exception:  # noqa: BLE001 - already gone
                pass
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                left = set(serve.status().applications) & set(self.applications)
            except Exception:  # noqa: BLE001 - Serve itself is gone: nothing is left
                break
            if not left:
                break
            time.sleep(0.2)
        if self.front is not None:
            try:
                ray.get(self.front.stop.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - the actor died: its HAProxy died with it
                pass
            ray.kill(self.front)
            self.front = None


def route_table(config: ServeConfig, plans: dict[str, ModelPlan],
                front_door: bool = True) -> RouteTable:
    """The gateway's table. ``front_door=False`` (Serve's own tooling): every deployment is in
    the one application ``config.name`` and every request reaches the gateway."""
    batching = {n: {**mp.entry.batching.model_dump(), "in_flight": mp.entry.batches_in_flight}
                for n, mp in plans.items()}
    gateway_models = via_gateway(plans) if front_door else set(plans)
    return RouteTable(
        app=config.name,
        specs={n: mp.input for n, mp in plans.items()},
        chains={n: fallback_chain(config, n) for n in plans},
        groups={n: [g.deployment for g in mp.groups] for n, mp in plans.items()},
        default_model=config.default,
        max_body_bytes=config.limits.body_bytes,
        max_rows=config.limits.max_rows,
        request_timeout_s=config.limits.request_timeout_s,
        status_poll_s=config.gateway.status_poll_s,
        retries=config.gateway.retries,
        batching=batching,
        describe={n: {"precision": mp.entry.precision, "batching": batching[n],
                      "placement": [g.describe() for g in mp.groups],
                      "path": "gateway" if n in gateway_models else "direct"}
                  for n, mp in plans.items()},
        via_gateway=frozenset(gateway_models),
        generative={n: mp.input.width for n, mp in plans.items() if mp.generative},
        max_new_tokens=config.limits.max_new_tokens,
        apps={} if front_door else {g.deployment: config.name for mp in plans.values()
                                    for g in mp.groups},
        front_door=front_door,
    )


def _model_servers(config: ServeConfig, plans: dict[str, ModelPlan], front_door: bool = True
                   ) -> list[tuple[str, int, Any]]:
    """(model, group index, bound ModelServer deployment) for every replica group."""
    out = []
    for name, mp in plans.items():
        entry = mp.entry
        server = serve.deployment(ModelServer).options(
            max_ongoing_requests=entry.ongoing_limit,
            health_check_period_s=entry.health_check_period_s,
            graceful_shutdown_timeout_s=5.0,
            logging_config=QUIET,
        )
        settings = ServerSettings(config.name, name, mp.input, entry.batching.model_dump(),
                                  config.limits.body_bytes, config.limits.max_rows, front_door)
        for index, group in enumerate(mp.groups):
            out.append((name, index, server.options(**group.serve_options()).bind(mp.spec, settings)))
    return out


def _gateway_deployment(config: ServeConfig) -> Any:
    return serve.deployment(Gateway).options(
        name=f"{config.name}.gateway", num_replicas=config.gateway.replicas,
        ray_actor_options={"num_cpus": config.gateway.cpus},
        max_ongoing_requests=10_000,  # the gateway only waits; the replicas' limits bound work
        graceful_shutdown_timeout_s=5.0,
        logging_config=QUIET,
    )


def build_applications(config: ServeConfig, plans: dict[str, ModelPlan]) -> list[Any]:
    """The Serve applications (``serve.RunTarget``): one per replica group, whose ingress is
    the model replica itself, and the gateway's."""
    targets = [serve.RunTarget(app, name=plans[name].groups[index].deployment,
                               route_prefix=group_prefix(config.name, name, index),
                               logging_config=QUIET)
               for name, index, app in _model_servers(config, plans)]
    targets.append(serve.RunTarget(_gateway_deployment(config).bind(route_table(config, plans)),
                                   name=config.name, route_prefix=app_prefix(config.name),
                                   logging_config=QUIET))
    return targets


def build_single_application(config: ServeConfig, plans: dict[str, ModelPlan]) -> Any:
    """One Serve application for Serve's own tooling (``serve run``/``serve deploy``, KubeRay's
    RayService; see :mod:`.builder`): the gateway is its ingress and holds the model
    deployments' handles; requests go Serve's proxy -> gateway -> model replica (no HAProxy
    front door: the fast path is ``hetflow serve``'s)."""
    replicas = {plans[name].groups[index].deployment: app
                for name, index, app in _model_servers(config, plans, front_door=False)}
    return _gateway_deployment(config).bind(route_table(config, plans, front_door=False), replicas)


def front_plan(config: ServeConfig, plans: dict[str, ModelPlan]) -> FrontPlan:
    return FrontPlan(
        app=config.name, host=config.http.host, port=config.http.port,
        models={n: [g.deployment for g in mp.groups] for n, mp in plans.items()},
        gateway_app=config.name, request_timeout_s=config.limits.request_timeout_s,
        retries=config.gateway.retries, max_body_bytes=config.limits.body_bytes,
        client_timeout_s=config.limits.client_timeout_s,
        route_prefix=config.http.route_prefix,
        fallbacks={n: fallback_chain(config, n)[1:] for n in plans},
        via_gateway=frozenset(via_gateway(plans)))


def via_gateway(plans: dict[str, ModelPlan]) -> set[str]:
    """Models served through the gateway rather than straight to their replicas (see
    ``FrontPlan.via_gateway``): the autoscaled ones."""
    return {n for n, mp in plans.items() if mp.entry.autoscaling is not None}


def plan_models(config: ServeConfig, dry_run: bool = False,
                may_train: bool = True) -> dict[str, ModelPlan]:
    """Checkpoints found (or trained, unless ``dry_run`` or not ``may_train``), input specs
    and replica groups for every model. Needs a connected Ray (it reads the live hetflow
    snapshot)."""
    from hetflow.runtime.binding import live_snapshot
    from hetflow.workloads.serve.inference import (
        ReplicaSpec,
        entry_input_spec,
        entry_output,
        estimate_memory_bytes,
        source_of,
        train_config_of,
    )
    from hetflow.workloads.serve.placement import check_memory, plan_replica_groups

    snapshot = live_snapshot()
    ray_gpus = float(ray.cluster_resources().get("GPU", 0))
    plans: dict[str, ModelPlan] = {}
    for entry in config.models:
        train = train_config_of(entry)
        checkpoint = ensure_checkpoint(entry, train, dry_run, may_train) \
            if train is not None and not entry.safetensors else None
        memory = check_memory(entry, estimate_memory_bytes(
            train, entry.precision, entry.torchscript or entry.exported))
        groups = plan_replica_groups(config.name, entry, snapshot, ray_gpus, memory)
        # Slots planned for this model hold memory for the next model's plan too.
        device = "cpu" if groups[0].compute == "cpu" else entry.device
        spec = ReplicaSpec(entry.name, train.model_dump(mode="json") if train else None,
                           checkpoint, entry.precision, device, entry.threads_per_replica,
                           source_of(entry))
        plans[entry.name] = ModelPlan(entry, spec, entry_input_spec(entry, train), groups,
                                      memory, entry_output(train) == "sequence_logits")
        snapshot = _with_groups(snapshot, config.name, entry, groups, memory)
    _check_fallback_inputs(config, plans)
    return plans


def _with_groups(snapshot: Any, app: str, entry: Any, groups: list[ReplicaGroup],
                 memory: int) -> Any:
    """The snapshot with the model's planned replicas allocated (for the next model's plan)."""
    from dataclasses import replace

    from hetflow.core.topology import Allocation

    allocs = []
    for group in groups:
        if group.device is None:
            continue
        count = group.num_replicas or group.autoscaling["max_replicas"]
        for i in range(count):
            allocs.append(Allocation(f"{group.deployment}-{i}", group.device.node,
                                     group.device.device, memory,
                                     exclusive=not entry.share_devices))
    return replace(snapshot, allocations=snapshot.allocations + tuple(allocs))


def _check_fallback_inputs(config: ServeConfig, plans: dict[str, ModelPlan]) -> None:
    from hetflow.core.errors import InputError

    for entry in config.models:
        if entry.fallback and plans[entry.fallback].input != plans[entry.name].input:
            raise InputError(f"model {entry.name}: fallback {entry.fallback} takes different "
                             f"input ({plans[entry.fallback].input.description}) than "
                             f"{entry.name} ({plans[entry.name].input.description})")


def ensure_checkpoint(entry: Any, train: Any, dry_run: bool = False,
                      may_train: bool = True) -> str | None:
    """The checkpoint directory to load (None for random weights); trains first when
    ``train_if_missing`` and no complete checkpoint exists (not with ``dry_run``; refused
    when not ``may_train``: Serve's application builder does not train)."""
    from pathlib import Path

    from hetflow.core.errors import InputError
    from hetflow.workloads.train.checkpoint import latest_checkpoint

    if entry.weights == "random":
        return None
    directory = Path(entry.checkpoint_dir).absolute() if entry.checkpoint_dir else train.checkpoint_dir
    if latest_checkpoint(directory) is None:
        if not may_train and not dry_run:
            raise InputError(f"model {entry.name}: no complete checkpoint in {directory}; "
                             "train it first (hetflow train, or hetflow serve once with "
                             "train_if_missing) - Serve's application builder does not train")
        if not entry.train_if_missing:
            raise InputError(f"model {entry.name}: no complete checkpoint in {directory}; train "
                             "it first (hetflow train) or set train_if_missing: true")
        if dry_run:
            return str(directory)  # it would be trained first
        from hetflow.workloads.train.job import run_training

        if entry.checkpoint_dir:
            train = train.with_overrides(checkpoint={"dir": str(directory)})
        run_training(train)
    return str(directory)


def connect_ray(address: str | None) -> bool:
    """Join ``address`` (or a running local cluster, or start one); True when started here.
    A cluster started here gets Serve's fast-path settings (:data:`front.FAST_ENV`)."""
    if ray.is_initialized():
        return False
    for key, value in FAST_ENV.items():
        os.environ.setdefault(key, value)
    ray.init(address=address, include_dashboard=False, log_to_driver=False)
    return True


def _free_port(host: str) -> int:
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.bind((host if host not in ("0.0.0.0", "::") else "127.0.0.1", 0))
        return int(s.getsockname()[1])


def deploy(config: ServeConfig, *, timeout_s: float = 300.0) -> Served:
    """Deploy ``config`` and return once it is ready: every model (or its fallback) has a
    replica the front door routes to.

    Connects to Ray (``ray_address``, or a running local cluster, or a new one), trains the
    models that need it, plans the replicas, deploys one Serve application per replica group
    (the model replica is the ingress) and the gateway's, and starts the front door
    (HAProxy) on ``http.host:port``. Raises InputError / Unschedulable / ServeFailed.
    """
    from hetflow.workloads.serve.front import FrontDoor, haproxy_binary

    started = connect_ray(config.ray_address)
    front = None
    try:
        haproxy_binary()  # no binary: one clear line now, not a failed actor later
        plans = plan_models(config)
        host = config.http.host
        loopback = is_loopback(host)
        # Serve's own HTTP proxy stays on an internal port (the front door owns http.port);
        # the replicas' own HTTP servers bind Serve's http host - on every node, so a host
        # address (one node's) would fail on the others: they bind all of their node's
        # addresses then, and the front door reaches each at its node's IP.
        serve_host = host if loopback else "0.0.0.0"
        serve.start(http_options={"host": serve_host, "port": _free_port(host)},
                    proxy_location="HeadOnly" if loopback else "EveryNode")
        _check_host(serve_host)
        try:
            serve.run_many(build_applications(config, plans),
                           wait_for_applications_running=False)
        except Exception as exc:  # noqa: BLE001 - Serve raises several kinds; say which
            raise ServeFailed(f"application {config.name} failed to deploy: {exc}") from None
        here = ray.get_runtime_context().get_node_id()
        actor = ray.remote(FrontDoor).options(
            name=front_name(config.name), namespace="serve", num_cpus=0, max_concurrency=64,
            lifetime="detached",  # it outlives `hetflow serve --detach`, like the Serve apps
            scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False))
        try:
            front = actor.remote(front_plan(config, plans))
            ray.get(front.run.remote(), timeout=60)
        except ray.exceptions.RayActorError as exc:
            raise ServeFailed(f"the front door (HAProxy on {host}:{config.http.port}) did not "
                              f"start: {exc}; is the port free?") from None
        served = Served(config, _url(host, config.http.port) + config.http.route_prefix.rstrip("/"),
                        plans, started_ray=started, front=front)
        if not ray.get(front.state.remote(), timeout=30).get("direct_ingress", True):
            log.warning("this Ray cluster runs Serve without direct ingress, so requests take "
                        "Serve's proxy (slower); start Ray with %s in its environment for the "
                        "fast path", " ".join(f"{k}={v}" for k, v in FAST_ENV.items()))
        _wait_ready(served, timeout_s)
    except BaseException:
        if front is not None:
            ray.kill(front)
        if started:
            ray.shutdown()
        raise
    return served


def stop(config: ServeConfig) -> list[str]:
    """Stop a (detached) deployment of ``config`` on the connected cluster: its Serve
    applications and its front door. Returns the applications deleted."""
    apps = [a for a in serve.status().applications
            if a == config.name or a.startswith(config.name + ".")]
    for app in apps:
        serve.delete(app)
    try:
        front = ray.get_actor(front_name(config.name), namespace="serve")
        ray.get(front.stop.remote(), timeout=30)
        ray.kill(front)
    except ValueError:
        pass  # no front door
    return apps


def describe_plan(config: ServeConfig, plans: dict[str, ModelPlan]) -> dict[str, Any]:
    """What ``deploy`` would place and start (``hetflow serve --dry-run``)."""
    fast = set(plans) - via_gateway(plans)
    return {
        "front_door": {"url": _url(config.http.host, config.http.port), "haproxy": None},
        "applications": [
            *[{"name": g.deployment, "model": n, "route_prefix": group_prefix(config.name, n, i),
               "ingress": "ModelServer", "replicas": g.num_replicas,
               "autoscaling": g.autoscaling, "compute": g.compute,
               "device": str(g.device) if g.device else None,
               "path": "direct" if n in fast else "gateway"}
              for n, mp in plans.items() for i, g in enumerate(mp.groups)],
            {"name": config.name, "route_prefix": app_prefix(config.name), "ingress": "Gateway",
             "replicas": config.gateway.replicas}],
        "models": {n: {"input": mp.input.description, "precision": mp.entry.precision,
                       "checkpoint": mp.spec.checkpoint, "source": mp.spec.source or None,
                       "memory_bytes": mp.memory_bytes, "fallback": mp.entry.fallback,
                       "generative": mp.generative,
                       "placement": [g.describe() for g in mp.groups]}
                   for n, mp in plans.items()},
    }


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _check_host(host: str) -> None:
    """Warn when Serve already ran with another HTTP host: its replicas bind that one."""
    from ray.serve.context import _get_global_client

    try:
        actual = _get_global_client().http_config.host
    except Exception:  # noqa: BLE001 - private API; without it, trust what we asked for
        return
    if actual != host:
        log.warning("Serve was already running on this cluster with HTTP host %s, so the "
                    "replicas listen there, not on %s (run `serve shutdown` to change it)",
                    actual, host)


class ServeFailed(HetflowError):
    """The application did not come up (a replica failed to start, or time ran out)."""


def _wait_ready(served: Served, timeout_s: float) -> None:
    """Until the front door routes every model (or its fallback) to a running replica;
    a failed deployment or time running out raises ServeFailed."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        apps = serve.status().applications
        for name in served.applications:
            status = apps.get(name)
            if status is not None and str(status.status).endswith("DEPLOY_FAILED"):
                raise ServeFailed(f"application {name} failed to deploy: {status.message}")
        state = served.state()
        # Ready for hetflow serve: every model's own planned replicas routed (stricter than
        # /health's ready, which a fallback also satisfies).
        # Without direct ingress the servers are Serve's proxies, routed once the model's
        # application is RUNNING (all its replicas up).
        waiting = [m for m, n in served.expected_replicas().items()
                   if state["up"].get(m, 0) < (n if state.get("direct_ingress", True) else 1)]
        if state["ready"] and not waiting:
            return
        last = (f"waiting for {', '.join(waiting) or 'the gateway'}"
                + (f"; front door: {state['error']}" if state.get("error") else ""))
        time.sleep(0.1)
    raise ServeFailed(f"application {served.config.name} was not ready after {timeout_s:g}s "
                      f"({last}); check `ray status` for resources the replicas wait on")


__all__ = ["Gateway", "ModelPlan", "ModelReplica", "ModelServer", "RouteTable", "Served",
           "ServeFailed", "ServerSettings", "build_applications", "connect_ray", "deploy",
           "describe_plan", "ensure_checkpoint", "front_name", "plan_models", "stop"]
