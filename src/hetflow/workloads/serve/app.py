"""The Ray Serve application: a gateway in front of batched model replicas.

    from hetflow.workloads.serve.app import deploy
    from hetflow.workloads.serve.config import load_serve_config
    served = deploy(load_serve_config("examples/serve_digits.yaml"))
    print(served.url)            # http://127.0.0.1:8000

Shape of the application (one Serve application, route prefix ``/``)::

    HTTP proxy (127.0.0.1:port) -> Gateway (ingress) -> ModelReplica deployments, one per
                                                        (model, planned device) group

* :class:`Gateway` reads the body (bounded by ``limits.max_body_bytes``), checks it with
  :mod:`~hetflow.workloads.serve.protocol` (bad input -> 4xx with a message, before any replica
  sees it), and gathers concurrent requests for the same model with ``@serve.batch`` (one
  queue per model: ``batching.max_batch_size`` rows, ``batching.batch_wait_timeout_s``). Each
  batch goes to the least busy of the model's groups as **one** call, so batching saves the
  gateway -> replica hop and the replica's per-request work as well as forward passes (on a
  small model those hops cost far more than the model). An attempt whose replica died under
  it is repeated (``gateway.retries``); while none of the model's replicas runs, the batch goes
  along the model's ``fallback`` chain. The gateway learns which replicas run by polling
  Serve's status every ``gateway.status_poll_s``; a batch waiting on a model that goes down
  meanwhile is moved to the fallback rather than left waiting. It also serves ``/health``,
  ``/metrics`` and ``/v1/models``.
* :class:`ModelReplica` holds one :class:`~hetflow.workloads.serve.inference.ModelRunner` and
  runs each batch it is sent in one forward pass (``predict_many``).

Endpoints: ``POST /v1/models/<name>/predict``, ``POST /v1/predict``, ``GET /v1/models``,
``GET /v1/models/<name>``, ``GET /health`` (200 ok/degraded, 503 when no model can answer),
``GET /metrics`` (Prometheus text; ``?format=json``). Serve's own ``/-/healthz`` and
``/-/routes`` remain.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray
from ray import serve
from ray.exceptions import ActorUnavailableError, RayActorError
from starlette.requests import Request
from starlette.responses import Response

from hetflow.core.errors import HetflowError
from hetflow.workloads.serve.config import ServeConfig, fallback_chain
from hetflow.workloads.serve.inference import ReplicaSpec, build_runner
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


def _rows_of(requests: list[PredictRequest]) -> int:
    return sum(len(r.rows) for r in requests)


class ModelReplica:
    """One replica of one model: loads the weights once, answers batches of requests with one
    forward pass each (the gateway forms the batches)."""

    def __init__(self, spec: ReplicaSpec, batching: dict[str, Any]) -> None:
        self.spec = spec
        self.runner = build_runner(spec)
        self.batching = bool(batching["enabled"])
        context = serve.get_replica_context()
        self.replica = context.replica_id.unique_id
        self.deployment = context.deployment

    def predict_many(self, batches: list[np.ndarray],
                     probabilities: list[bool]) -> list[dict[str, Any]]:
        """One result per request; all requests' rows (already checked) in one forward pass."""
        results = self.runner.split_predict(batches, probabilities)
        batch = {"requests": len(batches), "rows": sum(len(rows) for rows in batches)}
        for result in results:
            result.update(batch=batch, replica=self.replica)
        return results

    def predict(self, rows: np.ndarray, probabilities: bool = False) -> dict[str, Any]:
        """One request's answer (for handle callers; the gateway uses ``predict_many``)."""
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


class _ReplicaLost(Exception):
    """The replica a request went to died under it (the request may be repeated)."""


class _ModelDown(Exception):
    """The model has no running replica (the request goes to the fallback)."""


class Gateway:
    """The ingress: checks, routes, falls back, and answers health and metrics."""

    def __init__(self, handles: dict[str, list[Any]], table: RouteTable) -> None:
        self.handles = {m: list(hs) for m, hs in handles.items()}
        self.table = table
        self.metrics = GatewayMetrics()
        self.running: dict[str, int] = {}  # deployment -> RUNNING replicas (last poll)
        self.inflight: dict[str, int] = {d: 0 for ds in table.groups.values() for d in ds}
        self._poller: asyncio.Task | None = None
        self._polled_once = asyncio.Event()
        # One @serve.batch queue per batched model, so each keeps its own size and wait.
        # Up to ``in_flight`` batches at once, so that every replica of the model has work
        # (Serve's default, 1, would run one batch at a time over all the replicas).
        self._batchers = {model: serve.batch(max_batch_size=int(b["max_batch_size"]),
                                             batch_wait_timeout_s=float(b["batch_wait_timeout_s"]),
                                             max_concurrent_batches=int(b["in_flight"]),
                                             batch_size_fn=_rows_of)(self._batch_runner(model))
                          for model, b in table.batching.items() if b["enabled"]}

    def _batch_runner(self, model: str) -> Any:
        async def run(requests: list[PredictRequest]) -> list[tuple[int, dict[str, Any]]]:
            return await self._predict_group(model, requests)

        return run

    # --- HTTP --------------------------------------------------------------------------

    async def __call__(self, request: Request) -> Response:
        self._ensure_poller()
        path = request.url.path.rstrip("/") or "/"
        try:
            if path == "/v1/predict" or (path.startswith("/v1/models/")
                                         and path.endswith("/predict")):
                _require(request.method, "POST", path)
                model = path[len("/v1/models/"):-len("/predict")] if path != "/v1/predict" else None
                return await self._predict_http(request, model)
            if path in ("/health", "/healthz"):
                _require(request.method, "GET", path)
                return self._health()
            if path == "/metrics":
                _require(request.method, "GET", path)
                if request.query_params.get("format") == "json":
                    return _json(200, self.metrics.to_dict())
                return Response(self.metrics.render(), media_type="text/plain; version=0.0.4")
            if path == "/v1/models" or path.startswith("/v1/models/"):
                _require(request.method, "GET", path)
                return self._models(path[len("/v1/models/"):] if path != "/v1/models" else None)
            raise RequestError(404, f"no endpoint {path}; try POST /v1/models/<name>/predict, "
                                    "GET /v1/models, /health or /metrics")
        except RequestError as exc:
            self.metrics.answered("-", exc.status)
            return Response(error_body(exc.message), status_code=exc.status, media_type=JSON)

    async def _predict_http(self, request: Request, path_model: str | None) -> Response:
        started = time.perf_counter()
        body = await self._read_body(request)
        parsed = parse_predict(body, self.table.specs, path_model=path_model,
                               default_model=self.table.default_model,
                               max_rows=self.table.max_rows)
        status, payload = await self.predict(parsed)
        if status == 200:
            self.metrics.served(parsed.model, payload["served_by"],
                                time.perf_counter() - started, payload["batch"]["requests"])
        else:
            self.metrics.answered(parsed.model, status)
        return _json(status, payload)

    async def _read_body(self, request: Request) -> bytes:
        limit = self.table.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise RequestError(413, f"the body is {declared} bytes, more than the limit of "
                                    f"{limit}; send fewer rows per request")
        media = request.headers.get("content-type", JSON).split(";")[0].strip().lower()
        if media not in (JSON, "", "text/json") and not media.endswith("+json"):
            raise RequestError(415, f"content-type {media} is not JSON; send application/json")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise RequestError(413, f"the body is more than the limit of {limit} bytes; "
                                        "send fewer rows per request")
            chunks.append(chunk)
        return b"".join(chunks)

    # --- routing -----------------------------------------------------------------------

    async def predict(self, req: PredictRequest) -> tuple[int, dict[str, Any]]:
        """Status and JSON payload for a checked request: batched with concurrent requests
        for the same model (when its batching is on and it fits in a batch), then routed."""
        await self._first_poll()
        batcher = self._batchers.get(req.model)
        if batcher is not None and len(req.rows) <= self.table.batching[req.model]["max_batch_size"]:
            return await batcher(req)
        return (await self._predict_group(req.model, [req]))[0]

    async def _predict_group(self, model: str, reqs: list[PredictRequest]
                             ) -> list[tuple[int, dict[str, Any]]]:
        """One forward pass for ``reqs`` (all for ``model``) on the model, or along its
        fallback chain while it has no running replica."""
        reasons = []
        deadline = time.monotonic() + self.table.request_timeout_s
        for name in self.table.chains[model]:
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
        response = self.handles[model][index].predict_many.remote(
            [r.rows for r in reqs], [r.probabilities for r in reqs])
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

    # --- Serve status ------------------------------------------------------------------

    def _ensure_poller(self) -> None:
        if self._poller is None or self._poller.done():
            self._poller = asyncio.get_running_loop().create_task(self._poll_forever())

    async def _first_poll(self) -> None:
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
            self._polled_once.set()
            await asyncio.sleep(self.table.status_poll_s)

    def _update_running(self, status: Any) -> None:
        app = status.applications.get(self.table.app)
        if app is None:
            return
        running = {}
        for model, deployments in self.table.groups.items():
            for name in deployments:
                dep = app.deployments.get(name)
                states = dep.replica_states if dep is not None else {}
                running[name] = int(sum(n for s, n in states.items() if str(s).endswith("RUNNING")))
        self.running = running
        self.metrics.set_replicas({(m, d): running.get(d, 0)
                                   for m, ds in self.table.groups.items() for d in ds})

    # --- health and listing ------------------------------------------------------------

    def model_state(self, model: str) -> dict[str, Any]:
        replicas = {d: self.running.get(d) for d in self.table.groups[model]}
        up = sum(n or 0 for n in replicas.values())
        serving = next((name for name in self.table.chains[model]
                        if any(self._may_serve(d) for d in self.table.groups[name])), None)
        return {"running_replicas": up, "deployments": replicas, "served_by": serving}

    def _health(self) -> Response:
        models = {m: self.model_state(m) for m in self.table.groups}
        if all(s["served_by"] == m for m, s in models.items()):
            status = "ok"
        elif any(s["served_by"] is not None for s in models.values()):
            status = "degraded"
        else:
            status = "down"
        return _json(503 if status == "down" else 200, {"status": status, "models": models})

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


# --- building and deploying --------------------------------------------------------------


@dataclass(frozen=True)
class ModelPlan:
    """One model ready to deploy: its replicas' spec and where they go."""

    entry: Any  # ModelServeConfig
    spec: ReplicaSpec
    input: InputSpec
    groups: list[ReplicaGroup]
    memory_bytes: int


@dataclass
class Served:
    """A deployed application."""

    config: ServeConfig
    url: str
    plans: dict[str, ModelPlan]
    started_ray: bool = False

    def replica_infos(self, model: str, calls: int = 8) -> list[dict[str, Any]]:
        """``info()`` of the model's replicas, gathered over several calls per deployment
        (Serve picks the replica; distinct replicas are returned once each)."""
        seen: dict[str, dict[str, Any]] = {}
        for group in self.plans[model].groups:
            handle = serve.get_deployment_handle(group.deployment, self.config.name)
            for info in [handle.info.remote().result(timeout_s=60) for _ in range(calls)]:
                seen[info["replica"]] = info
        return list(seen.values())

    def shutdown(self) -> None:
        serve.delete(self.config.name)


def build_application(config: ServeConfig, plans: dict[str, ModelPlan]) -> Any:
    """The bound Serve application (gateway + one deployment per replica group)."""
    handles: dict[str, list[Any]] = {}
    for name, mp in plans.items():
        entry = mp.entry
        replica = serve.deployment(ModelReplica).options(
            max_ongoing_requests=entry.ongoing_limit,
            health_check_period_s=entry.health_check_period_s,
            graceful_shutdown_timeout_s=5.0,
            logging_config=QUIET,
        )
        batching = entry.batching.model_dump()
        handles[name] = [replica.options(**g.serve_options()).bind(mp.spec, batching)
                         for g in mp.groups]
    # the batching settings, with the batches in flight that take effect (default resolved)
    batching = {n: {**mp.entry.batching.model_dump(), "in_flight": mp.entry.batches_in_flight}
                for n, mp in plans.items()}
    table = RouteTable(
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
                      "placement": [g.describe() for g in mp.groups]}
                  for n, mp in plans.items()},
    )
    gateway = serve.deployment(Gateway).options(
        name=f"{config.name}.gateway", num_replicas=config.gateway.replicas,
        ray_actor_options={"num_cpus": config.gateway.cpus},
        max_ongoing_requests=10_000,  # the gateway only waits; the replicas' limits bound work
        graceful_shutdown_timeout_s=5.0,
        logging_config=QUIET,
    )
    return gateway.bind(handles, table)


def plan_models(config: ServeConfig) -> dict[str, ModelPlan]:
    """Checkpoints found (or trained), input specs and replica groups for every model.
    Needs a connected Ray (it reads the live hetflow snapshot)."""
    from hetflow.runtime.binding import live_snapshot
    from hetflow.workloads.serve.inference import estimate_memory_bytes, input_spec, train_config_of
    from hetflow.workloads.serve.placement import check_memory, plan_replica_groups

    snapshot = live_snapshot()
    ray_gpus = float(ray.cluster_resources().get("GPU", 0))
    plans: dict[str, ModelPlan] = {}
    for entry in config.models:
        train = train_config_of(entry)
        checkpoint = ensure_checkpoint(entry, train)
        memory = check_memory(entry, estimate_memory_bytes(train, entry.precision))
        groups = plan_replica_groups(config.name, entry, snapshot, ray_gpus, memory)
        # Slots planned for this model hold memory for the next model's plan too.
        device = "cpu" if groups[0].compute == "cpu" else entry.device
        spec = ReplicaSpec(entry.name, train.model_dump(mode="json"), checkpoint,
                           entry.precision, device, entry.threads_per_replica)
        plans[entry.name] = ModelPlan(entry, spec, input_spec(train), groups, memory)
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


def ensure_checkpoint(entry: Any, train: Any) -> str | None:
    """The checkpoint directory to load (None for random weights); trains first when
    ``train_if_missing`` and no complete checkpoint exists."""
    from pathlib import Path

    from hetflow.core.errors import InputError
    from hetflow.workloads.train.checkpoint import latest_checkpoint

    if entry.weights == "random":
        return None
    directory = Path(entry.checkpoint_dir).absolute() if entry.checkpoint_dir else train.checkpoint_dir
    if latest_checkpoint(directory) is None:
        if not entry.train_if_missing:
            raise InputError(f"model {entry.name}: no complete checkpoint in {directory}; train "
                             "it first (hetflow train) or set train_if_missing: true")
        from hetflow.workloads.train.job import run_training

        if entry.checkpoint_dir:
            train = train.with_overrides(checkpoint={"dir": str(directory)})
        run_training(train)
    return str(directory)


def connect_ray(address: str | None) -> bool:
    """Join ``address`` (or a running local cluster, or start one); True when started here."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    if ray.is_initialized():
        return False
    ray.init(address=address, include_dashboard=False, log_to_driver=False)
    return True


def deploy(config: ServeConfig, *, timeout_s: float = 300.0) -> Served:
    """Deploy ``config`` and return once every deployment is running.

    Connects to Ray (``ray_address``, or a running local cluster, or a new one), trains the
    models that need it, plans the replicas and starts Serve's proxy on ``http.host:port``.
    Raises InputError / Unschedulable / ServeFailed with what to change.
    """
    started = connect_ray(config.ray_address)
    try:
        plans = plan_models(config)
        host, port = config.http.host, config.http.port
        loopback = host in ("127.0.0.1", "localhost", "::1")
        serve.start(http_options={"host": host, "port": port},
                    proxy_location="HeadOnly" if loopback else "EveryNode")
        host, port = _proxy_address(host, port)
        app = build_application(config, plans)
        try:
            serve.run(app, name=config.name, route_prefix="/", blocking=False)
            _wait_running(config.name, timeout_s)
        except ServeFailed:
            raise
        except Exception as exc:  # noqa: BLE001 - Serve raises several kinds; say which
            raise ServeFailed(f"application {config.name} failed to deploy: {exc}") from None
    except BaseException:
        if started:
            ray.shutdown()
        raise
    url_host = f"[{host}]" if ":" in host else host
    return Served(config, f"http://{url_host}:{port}", plans, started_ray=started)


def _proxy_address(host: str, port: int) -> tuple[str, int]:
    """Where Serve's HTTP proxy really listens. A cluster has one proxy: when Serve was already
    running (an earlier application, another ``hetflow serve``), ``serve.start`` keeps its host
    and port and ignores ours, so the application is reachable there - say so, and use it."""
    from ray.serve.context import _get_global_client

    try:
        config = _get_global_client().http_config
        actual = (config.host, int(config.port))
    except Exception:  # noqa: BLE001 - private API; without it, trust what we asked for
        return host, port
    if actual != (host, port):
        log.warning("Serve was already running on this cluster at %s:%d, so the application "
                       "is served there, not at %s:%d (one HTTP proxy per cluster; run `serve "
                       "shutdown` first to move it)", actual[0], actual[1], host, port)
    return actual


class ServeFailed(HetflowError):
    """The application did not come up (a replica failed to start, or time ran out)."""


def _wait_running(app: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        status = serve.status().applications.get(app)
        if status is not None:
            if str(status.status).endswith("RUNNING"):
                return
            if str(status.status).endswith("DEPLOY_FAILED"):
                raise ServeFailed(f"application {app} failed to deploy: {status.message}")
            last = status.message or str(status.status)
        time.sleep(0.2)
    raise ServeFailed(f"application {app} was not running after {timeout_s:g}s ({last}); "
                      "check `ray status` for resources the replicas wait on")


__all__ = ["Gateway", "ModelPlan", "ModelReplica", "RouteTable", "Served", "ServeFailed",
           "build_application", "connect_ray", "deploy", "ensure_checkpoint", "plan_models"]
