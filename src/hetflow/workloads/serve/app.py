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

Where each part lives: :mod:`.replica` (:class:`ModelServer`), :mod:`.gateway`
(:class:`Gateway`, :class:`RouteTable`), :mod:`.plan` (:func:`plan_models`,
:func:`describe_plan`), :mod:`.deploy` (:func:`deploy`, :func:`stop`, the Serve applications),
:mod:`.web` (HTTP helpers both servers use), :mod:`.front` (HAProxy). This module is their
one public face.
"""


from hetflow.workloads.serve.deploy import (
    Served,
    ServeFailed,
    build_applications,
    build_single_application,
    connect_ray,
    deploy,
    route_table,
    stop,
)
from hetflow.workloads.serve.gateway import Gateway, RouteTable
from hetflow.workloads.serve.plan import ModelPlan, describe_plan, ensure_checkpoint, plan_models
from hetflow.workloads.serve.replica import ModelReplica, ModelServer, ServerSettings
from hetflow.workloads.serve.web import front_name

__all__ = ["Gateway", "ModelPlan", "ModelReplica", "ModelServer", "RouteTable", "Served",
           "ServeFailed", "ServerSettings", "build_applications", "build_single_application",
           "connect_ray", "deploy", "describe_plan", "ensure_checkpoint", "front_name",
           "plan_models", "route_table", "stop"]
