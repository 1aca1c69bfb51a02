"""The gateway: the Serve application that answers what is not one model's POST.

Every route of the protocol table (:mod:`.protocols`: hetflow's JSON API, KServe v2, OpenAI),
answered by the route's handler - ``/v1/predict`` (the model named in the body), ``/health``,
``/metrics`` (the sum of every replica's counts, as the front door holds them), ``/v1/models``,
the KServe v2 and OpenAI routes - and the front door's **backup** server for every model: while
none of a model's replicas is up, the model's requests reach the gateway, which sends them along the model's ``fallback`` chain
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

from hetflow.workloads.serve import protocols
from hetflow.workloads.serve.headers import check_front
from hetflow.workloads.serve.metrics import GatewayMetrics
from hetflow.workloads.serve.protocol import InputSpec, PredictRequest, RequestError
from hetflow.workloads.serve.replica import MetricsReporter
from hetflow.workloads.serve.web import client_path, front_name, resolve


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
    front_token: str | None = None  # API keys on: HTTP requests must carry it (headers.check_front)

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
        """The route's handler from the protocol table (:mod:`.protocols`)."""
        self._ensure_poller()
        path = client_path(request)
        try:
            check_front(request, self.table.front_token)
            hit = protocols.match(path, request.method)
            return await hit.route.gateway(self, request, path, hit.params)
        except RequestError as exc:
            self.metrics.answered("-", exc.status)
            return protocols.error_response(path, exc.status, exc.message, exc.param)
        except _QueueFull as exc:
            self.metrics.answered(exc.model, 503)
            return protocols.error_response(path, 503, str(exc), headers={"Retry-After": "1"})

    # --- for the protocols' handlers ----------------------------------------------------

    def handle(self, model: str, deployment: str) -> Any:
        """The Serve handle of one of ``model``'s deployments."""
        return self.handles[model][self.table.groups[model].index(deployment)]

    def counted(self, deployment: str, stream: Any) -> "CountedStream":
        """A stream from ``deployment`` counted in flight until it ends."""
        return CountedStream(self.inflight, deployment, stream)

    def front_ready(self) -> bool:
        return bool(self.front.get("ready")) or not self.table.front_door

    def ready(self) -> bool:
        return self.front_ready() and all(
            self.model_state(m)["served_by"] is not None for m in self.table.groups)

    async def merged_metrics(self) -> GatewayMetrics:
        """The sum of every replica's latest report, as the front door holds them (this
        replica's own counts recorded there first, in the same call). Every scrape, through
        whichever gateway replica, reads the same reports, so no counter goes down between
        scrapes; the other replicas' counts are up to half a second old."""
        await self.first_poll()  # replicas running: from this replica's first status poll on
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

    # --- routing -----------------------------------------------------------------------

    async def predict(self, req: PredictRequest, model_down: bool = False
                      ) -> tuple[int, dict[str, Any]]:
        """Status and JSON payload for a checked request, from the model or along its
        fallback chain."""
        await self.first_poll()
        if not model_down:
            self.check_queue_limit(req.model)
        return (await self._predict_group(req.model, [req], model_down))[0]

    def check_queue_limit(self, model: str) -> None:
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
                group = self.pick(name)
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

    def pick(self, model: str) -> str | None:
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

    async def first_poll(self) -> None:
        self._ensure_poller()
        try:
            await asyncio.wait_for(self._polled_once.wait(), timeout=5.0)
        except asyncio.TimeoutError:
            pass  # route optimistically; a dead replica still shows up as an error

    async def _poll_forever(self) -> None:
        while True:
            # Serve's status lists the replicas of the models Serve runs; an application of
            # engine: vllm models only has none to count (each poll asks Serve's controller
            # for a full description of every application)
            if self.table.groups:
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


__all__ = ["CountedStream", "Gateway", "RouteTable"]
