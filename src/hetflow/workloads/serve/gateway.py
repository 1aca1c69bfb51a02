"""The gateway: the Serve application that answers what is not one model's POST.

``/v1/predict`` (the model named in the body), ``/health``, ``/metrics`` (the sum of every
replica's counts, as the front door holds them), ``/v1/models``, KServe v2 and OpenAI routes;
and the front door's **backup** server for every model: while none of a model's replicas is up,
the model's requests reach the gateway, which sends them along the model's ``fallback`` chain
over Serve handles (repeating an attempt whose replica died, ``gateway.retries``).
:class:`RouteTable` is everything it is told at deploy time. The shape of the whole
application: :mod:`.app`.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

import ray
from ray import serve
from ray.exceptions import ActorUnavailableError, RayActorError
from starlette.requests import Request
from starlette.responses import Response

from hetflow.workloads.serve import kserve, openai_api
from hetflow.workloads.serve.access import MODELS_HEADER, TOKENS_HEADER, allowed_models
from hetflow.workloads.serve.metrics import GatewayMetrics
from hetflow.workloads.serve.protocol import (
    InputSpec,
    PredictRequest,
    RequestError,
    error_body,
    parse_json,
    parse_predict,
)
from hetflow.workloads.serve.replica import MetricsReporter
from hetflow.workloads.serve.web import JSON, client_path, completion_answer, front_name, json_response, read_body, require, resolve, v2_response


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
    # model names the front door routes on the OpenAI paths elsewhere (engine: vllm pools,
    # OpenAI upstreams): listed by GET /v1/models in OpenAI's shape beside hetflow's own
    openai_models: tuple[str, ...] = ()
    # the models routed here (via_gateway) with a queue limit: requests in flight per running
    # replica past which this gateway answers 503 at once (its share: gateway_replicas split it)
    queue_limits: dict[str, int] = field(default_factory=dict)
    gateway_replicas: int = 1

    def app_of(self, deployment: str) -> str:
        return self.apps.get(deployment, deployment)



def _release(inflight: dict[str, int], deployment: str) -> None:
    inflight[deployment] -= 1


class CountedStream:
    """A streamed answer's tokens, counted in flight on ``deployment`` from the moment it is
    admitted - so a burst of streams cannot pass the queue check together, as when the count
    began at the first token - until it ends, its client leaves, or (never iterated: the client
    gone before the first byte) it is dropped. The count is released exactly once."""

    def __init__(self, inflight: dict[str, int], deployment: str, tokens: Any) -> None:
        self._tokens = tokens.__aiter__()
        inflight[deployment] += 1
        self._release = weakref.finalize(self, _release, inflight, deployment)

    def __aiter__(self) -> "CountedStream":
        return self

    async def __anext__(self) -> Any:
        try:
            return await self._tokens.__anext__()
        except BaseException:  # the end (StopAsyncIteration), the client gone, an error
            self._release()
            raise

    async def aclose(self) -> None:
        self._release()

class _QueueFull(Exception):
    """A model routed through the gateway holds its queue limit: 503 with Retry-After."""

    def __init__(self, model: str, limit: int) -> None:
        super().__init__(f"the model is at its queue limit ({limit} in flight per replica); "
                         "retry after Retry-After seconds")
        self.model = model


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
        self.reporter = MetricsReporter(table.app, self.replica, self.metrics, table.front_door)
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
                require(request.method, "POST", path)
                model = path[len("/v1/models/"):-len("/predict")] if path != "/v1/predict" else None
                return await self._predict_http(request, model)
            if path in ("/health", "/healthz"):
                require(request.method, "GET", path)
                await self._first_poll()
                return self._health()
            if path.startswith("/v2/") or path == "/v2":
                return await self._v2(request, path)
            if path == "/v1/completions":
                require(request.method, "POST", path)
                return await self._completions(request)
            if path in ("/v1/chat/completions", "/v1/embeddings"):
                require(request.method, "POST", path)
                return await self._openai_elsewhere(request, path)
            if path == "/metrics":
                require(request.method, "GET", path)
                merged = await self._merged_metrics()
                if request.query_params.get("format") == "json":
                    return json_response(200, merged.to_dict())
                body, content_type = merged.render(request.headers.get("accept"))
                return Response(body, headers={"content-type": content_type})
            if path == "/v1/models" or path.startswith("/v1/models/"):
                require(request.method, "GET", path)
                await self._first_poll()
                return self._models(path[len("/v1/models/"):] if path != "/v1/models" else None,
                                    allowed_models(request.headers.get(MODELS_HEADER)))
            raise RequestError(404, f"no endpoint {path}; try POST /v1/models/<name>/predict, "
                                    "GET /v1/models, /health or /metrics")
        except RequestError as exc:
            self.metrics.answered("-", exc.status)
            return Response(error_body(exc.message), status_code=exc.status, media_type=JSON)
        except _QueueFull as exc:
            self.metrics.answered(exc.model, 503)
            body = (openai_api.error_body(str(exc)) if path == "/v1/completions"
                    else error_body(str(exc)))
            return Response(body, status_code=503, media_type=JSON, headers={"Retry-After": "1"})

    async def _v2(self, request: Request, path: str) -> Response:
        """KServe v2: health, metadata, readiness; infer while the model is down."""
        await self._first_poll()
        if path in ("/v2/health/live", "/v2/health/ready", "/v2"):
            require(request.method, "GET", path)
            if path == "/v2":
                return json_response(200, {"name": "hetflow", "version": "1", "extensions": ["binary_tensor_data"]})
            ready = path == "/v2/health/live" or self._ready()
            return json_response(200 if ready else 503, {"live": True} if path.endswith("live")
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
            require(request.method, "GET", path)
            return json_response(200, kserve.metadata(model, self.table.specs[model]))
        if action == "ready":
            require(request.method, "GET", path)
            ready = self.model_state(model)["served_by"] is not None
            return json_response(200 if ready else 503, {"name": model, "ready": ready})
        if action == "infer":
            require(request.method, "POST", path)
            started = time.perf_counter()
            header = request.headers.get(kserve.HEADER_LENGTH)
            body = await read_body(request, self.table.max_body_bytes, json_only=header is None)
            infer = kserve.parse_infer(body, header, self.table.specs[model], model=model,
                                       max_rows=self.table.max_rows)
            status, payload = await self.predict(
                infer.request, model_down=model not in self.table.via_gateway)
            if status != 200:
                self.metrics.answered(model, status)
                return json_response(status, payload)
            self.metrics.served(model, payload["served_by"], time.perf_counter() - started,
                                payload["batch"]["requests"])
            return v2_response(model, infer, payload, payload["served_by"])
        raise RequestError(404, f"no endpoint {path}")

    async def _openai_elsewhere(self, request: Request, path: str) -> Response:
        """The front door routes these paths by the body's model to LLM pools and OpenAI
        upstreams; what reaches here names none of them: an OpenAI-shaped 404 / 400."""
        try:
            doc = parse_json(await read_body(request, self.table.max_body_bytes))
        except RequestError as exc:
            self.metrics.answered("-", exc.status)
            return Response(openai_api.error_body(exc.message), status_code=exc.status,
                            media_type=JSON)
        model = doc.get("model") if isinstance(doc, dict) else None
        served = sorted(self.table.openai_models)
        if not isinstance(model, str):
            message, status = "'model' must be a string (a served model's name)", 400
        elif model in self.table.specs:
            message, status = (f"model {model} is hetflow's own model; {path} serves LLMs "
                               f"(engine: vllm) and OpenAI upstreams"
                               + (": " + ", ".join(served) if served else ""), 400)
        else:
            message, status = (f"unknown model {model!r}; models on {path}: "
                               f"{', '.join(served) or 'none (add an engine: vllm model)'}", 404)
        self.metrics.answered("-", status)
        return Response(openai_api.error_body(message, "model"), status_code=status,
                        media_type=JSON)

    async def _completions(self, request: Request) -> Response:
        """OpenAI ``POST /v1/completions`` (:mod:`.openai_api`), from the model or its
        fallback; ``stream: true`` -> server-sent events, a token at a time."""
        await self._first_poll()
        try:
            body = await read_body(request, self.table.max_body_bytes)
            req = openai_api.parse_completion(
                body, self.table.generative,
                list(self.table.specs) + list(self.table.openai_models),
                default_model=next(iter(self.table.generative), None),
                max_new_tokens=self.table.max_new_tokens)
            _check_allowed(request, req.model)
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
        if name == req.model:
            self._check_queue_limit(name)
        deployment = self._pick(name)
        handle = self.handles[name][self.table.groups[name].index(deployment)]
        stream = handle.options(stream=True).generate.remote(
            req.prompt, req.max_tokens, req.temperature, req.top_p, req.seed)
        started = time.perf_counter()

        def ended() -> None:
            self.metrics.served(req.model, name, time.perf_counter() - started, 1)
            self.reporter.changed()  # a stream ends after __call__ returned

        return await completion_answer(req, CountedStream(self.inflight, deployment, stream), stream.cancel,
                                       ended, TOKENS_HEADER)

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
        _check_allowed(request, parsed.model)
        # A model's own URL reaches the gateway only as the front door's backup, i.e. while
        # none of the model's replicas is up there: try its fallbacks first, then itself.
        status, payload = await self.predict(
            parsed, model_down=path_model is not None and path_model not in self.table.via_gateway)
        if status == 200:
            self.metrics.served(parsed.model, payload["served_by"],
                                time.perf_counter() - started, payload["batch"]["requests"])
        else:
            self.metrics.answered(parsed.model, status)
        return json_response(status, payload)

    # --- routing -----------------------------------------------------------------------

    async def predict(self, req: PredictRequest, model_down: bool = False
                      ) -> tuple[int, dict[str, Any]]:
        """Status and JSON payload for a checked request, from the model or along its
        fallback chain."""
        await self._first_poll()
        if not model_down:
            self._check_queue_limit(req.model)
        return (await self._predict_group(req.model, [req], model_down))[0]

    def _check_queue_limit(self, model: str) -> None:
        """Raise :class:`_QueueFull` while ``model`` (one routed here: autoscaled, or every
        model under Serve's own tooling) holds its queue limit per running replica - this
        gateway replica's share of it, as the front door spreads requests evenly over the
        gateway's replicas. Without a running replica the request goes its usual way (the
        fallback chain, or 503 "no running replica")."""
        limit = self.table.queue_limits.get(model, 0)
        if not limit or model not in self.table.via_gateway:
            return
        deployments = self.table.groups[model]
        running = sum(self.running.get(d, 1) for d in deployments)
        if running <= 0:
            return
        share = max(1, -(-limit * running // max(1, self.table.gateway_replicas)))
        if sum(self.inflight[d] for d in deployments) >= share:
            raise _QueueFull(model, limit)


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
        task = asyncio.ensure_future(resolve(response))
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
        return json_response(200 if ready else 503, {"status": status if ready or status == "down"
                                             else "starting", "ready": ready, "models": models})

    def _models(self, name: str | None, allowed: set[str] | None = None) -> Response:
        """The listing; with an API key that may use some models only, those (another
        model's name is answered 404, as if it did not exist)."""
        visible = sorted(m for m in self.table.specs if allowed is None or m in allowed)
        others = sorted(m for m in self.table.openai_models
                        if (allowed is None or m in allowed) and m not in self.table.specs)
        if name is not None and name in others:  # OpenAI's model object
            return json_response(200, _openai_model(name))
        if name is not None and name not in visible:
            raise RequestError(404, f"unknown model {name!r}; served models: "
                                    f"{', '.join(visible + others)}")
        names = [name] if name is not None else visible
        listing = {n: {**self.table.describe.get(n, {}), "input": self.table.specs[n].to_dict(),
                       "fallback": self.table.chains[n][1:], **self.model_state(n)}
                   for n in names}
        if name is not None:
            return json_response(200, listing[name])
        # hetflow's listing under "models"; OpenAI's (client.models.list()) under "data"
        return json_response(200, {"models": listing, "object": "list",
                                   "data": [_openai_model(n) for n in sorted(visible + others)]})


def _openai_model(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "hetflow"}


def _check_allowed(request: Request, model: str) -> None:
    """403 when the request's API key may not use ``model`` (the front door sets the list;
    it checks the model it read too - this is the check on the model the gateway parsed)."""
    allowed = allowed_models(request.headers.get(MODELS_HEADER))
    if allowed is not None and model not in allowed:
        raise RequestError(403, "this API key may not use this model")


__all__ = ["CountedStream", "Gateway", "RouteTable"]
