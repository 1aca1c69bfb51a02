"""A model's replica: :class:`ModelServer`, the Serve ingress of each replica group.

With Serve's direct ingress each replica serves HTTP on its own port: it reads the body
(bounded), checks it (:mod:`.protocol`; bad input -> 4xx with a message, before the model sees
it), gathers concurrent requests with ``@serve.batch`` (by rows) into one forward pass, samples
tokens for generative models, and counts its metrics (sent to the front door every half second
by :class:`MetricsReporter`). The shape of the whole application: :mod:`.app`.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import ray
from ray import serve
from starlette.requests import Request
from starlette.responses import Response

from hetflow.runtime.resources import visible_devices
from hetflow.workloads.serve import protocols
from hetflow.workloads.serve.headers import check_front
from hetflow.workloads.serve.metrics import GatewayMetrics
from hetflow.workloads.serve.protocol import InputSpec, PredictRequest, RequestError
from hetflow.workloads.serve.web import client_path, front_name


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
    # a generative model's cap on new tokens per OpenAI completion (0: it does not generate);
    # the front door sends it the model's /v1/completions (by the body's model) when it is > 0
    max_new_tokens: int = 0
    front_token: str | None = None  # API keys on: requests must carry it (headers.check_front)


class MetricsReporter:
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
        self.reporter = MetricsReporter(settings.app, self.replica, self.metrics,
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
        """A model's own request, by the protocol table's routes a replica answers
        (:mod:`.protocols`)."""
        path = client_path(request)
        model = self.settings.model
        try:
            check_front(request, self.settings.front_token)
            try:
                hit = protocols.match(path, request.method, replica=True)
            except RequestError as exc:
                if exc.status != 404:
                    raise
                hit = None
            if hit is None or hit.params.get("model", model) != model:
                raise RequestError(404, f"no endpoint {path}; try POST " + " or ".join(
                    r.path.replace("{model}", model) for _, r in protocols.routes()
                    if r.replica is not None and not r.model_in_body))
            assert hit.route.replica is not None
            return await hit.route.replica(self, request, path, hit.params)
        except RequestError as exc:
            self.metrics.answered("-", exc.status)
            self.reporter.changed()
            return protocols.error_response(path, exc.status, exc.message, exc.param)

    def served(self, started: float, result: dict[str, Any]) -> None:
        """Count one answered request (its batch's request count, from ``result``)."""
        model = self.settings.model
        self.metrics.served(model, model, time.perf_counter() - started, result["batch"]["requests"])
        self.reporter.changed()

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
            "visible": visible_devices(),
            "assigned_resources": context.get_assigned_resources(),
        }

    def check_health(self) -> None:
        """Serve calls this every ``health_check_period_s``; raising marks the replica bad."""


ModelReplica = ModelServer  # the name earlier releases used


__all__ = ["MetricsReporter", "ModelReplica", "ModelServer", "ServerSettings"]
