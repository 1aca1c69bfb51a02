"""Deploying a planned config: the Serve applications (one per replica group, plus the
gateway), the front door, readiness, and stopping (:func:`deploy`, :func:`stop`). The shape of
the whole application: :mod:`.app`.

Why one file of about 430 lines: the deploy lifecycle in its order (applications, front
door, readiness, stop), each step reading the previous one's state.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import ray
from ray import serve
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from hetflow.core.errors import HetflowError, InputError
from hetflow.workloads.serve.config import ServeConfig, fallback_chain, is_loopback
from hetflow.workloads.serve.front import (
    FAST_ENV,
    app_prefix,
    group_prefix,
)
from hetflow.workloads.serve.gateway import Gateway, RouteTable
from hetflow.workloads.serve.headers import FRONT_TOKEN_ENV
from hetflow.workloads.serve.plan import (
    ModelPlan,
    front_plan,
    plan_llm_pools,
    plan_models,
    via_gateway,
)
from hetflow.workloads.serve.replica import ModelServer, ServerSettings
from hetflow.workloads.serve.web import QUIET, front_name, url_of


log = logging.getLogger(__name__)


def route_table(config: ServeConfig, plans: dict[str, ModelPlan],
                front_door: bool = True, front_token: str | None = None) -> RouteTable:
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
        openai_models=tuple(m.name for m in config.models if m.engine == "vllm")
        + tuple(u.name for u in config.upstreams if u.protocol == "openai"),
        queue_limits={n: mp.entry.effective_queue_limit for n, mp in plans.items()
                      if n in gateway_models and mp.entry.effective_queue_limit},
        gateway_replicas=config.gateway.replicas,
        front_token=front_token,
    )


@dataclass
class Served:
    """A deployed application: its Serve applications and the front door's URL."""

    config: ServeConfig
    url: str
    plans: dict[str, ModelPlan]
    started_ray: bool = False
    front: Any = None  # the FrontDoor actor
    llm_replicas: list[tuple[str, int, str, Any]] = field(default_factory=list)
    # (model, pool index, actor name, handle) of the engine: vllm models' replicas
    llm_servers: dict[str, list[tuple[str, str, int, int]]] = field(default_factory=dict)
    # engine: vllm model -> its replicas' (server name, host, port, weight) at the front door

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
        autoscaled = any(p.autoscaling for m in self.config.models if m.engine == "vllm"
                         for p in m.effective_pools)
        _stop_llm_replicas(self.llm_replicas, self.config.name if autoscaled else None)
        self.llm_replicas = []


def _model_servers(config: ServeConfig, plans: dict[str, ModelPlan], front_door: bool = True,
                   front_token: str | None = None) -> list[tuple[str, int, Any]]:
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
                                  config.limits.body_bytes, config.limits.max_rows, front_door,
                                  max_new_tokens=config.limits.max_new_tokens if mp.generative else 0,
                                  front_token=front_token)
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


def build_applications(config: ServeConfig, plans: dict[str, ModelPlan],
                       front_token: str | None = None) -> list[Any]:
    """The Serve applications (``serve.RunTarget``): one per replica group, whose ingress is
    the model replica itself, and the gateway's; ``front_token``: what their HTTP requests
    must carry (:func:`.headers.check_front`; API keys on)."""
    targets = [serve.RunTarget(app, name=plans[name].groups[index].deployment,
                               route_prefix=group_prefix(config.name, name, index),
                               logging_config=QUIET)
               for name, index, app in _model_servers(config, plans, front_token=front_token)]
    targets.append(serve.RunTarget(_gateway_deployment(config).bind(
                                       route_table(config, plans, front_token=front_token)),
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


def connect_ray(address: str | None) -> bool:
    """Join ``address`` (or a running local cluster, or start one); True when started here.
    A cluster started here gets Serve's fast-path settings (:data:`front.FAST_ENV`): in the
    environment while Ray's processes start (they keep it), and only then - this process's
    environment is as it was afterwards (a later Ray this process starts must not inherit it)."""
    if ray.is_initialized():
        return False
    saved = {key: os.environ.get(key) for key in FAST_ENV}
    for key, value in FAST_ENV.items():
        os.environ.setdefault(key, value)
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return True


def _free_port(host: str) -> int:
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.bind((host if host not in ("0.0.0.0", "::") else "127.0.0.1", 0))
        return int(s.getsockname()[1])


SERVE_START_ATTEMPTS = 2


def _start_serve(serve_host: str, host: str, proxy_location: str) -> None:
    """``serve.start`` on an internal port. A controller or proxy whose process died while
    starting (on a starved machine a worker can miss Ray's registration deadline) is a system
    failure, not a configuration one: Serve is shut down and started once more before the
    failure is reported - with the actor and Ray's reason, not only Ray's first line."""
    for attempt in range(1, SERVE_START_ATTEMPTS + 1):
        try:
            serve.start(http_options={"host": serve_host, "port": _free_port(host)},
                        proxy_location=proxy_location)
            return
        except (ray.exceptions.RayError, TimeoutError) as exc:  # e.g. its proxy not up in time
            died = isinstance(exc, ray.exceptions.ActorDiedError) and not exc.actor_init_failed
            if died and attempt < SERVE_START_ATTEMPTS:
                log.warning("Ray Serve did not start (%s); starting it again", _reason(exc))
                with contextlib.suppress(Exception):
                    serve.shutdown()
                continue
            raise ServeFailed(f"Ray Serve did not start on this cluster ({_reason(exc)}); is the "
                              "machine overloaded? `ray status` shows what runs") from None


def _reason(exc: BaseException) -> str:
    """Ray's error in one line: its first line, plus for a dead actor its class and cause."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    if isinstance(exc, ray.exceptions.ActorDiedError):
        names = [line.split(":", 1)[1].strip() for line in lines[1:] if line.startswith("class_name:")]
        causes = [line for line in lines[1:] if ":" not in line[:20]]  # Ray's own sentence
        if names:
            return f"its {names[0]} actor died" + (f": {causes[0][:300]}" if causes else "")
    return lines[0]


def deploy(config: ServeConfig, *, timeout_s: float = 300.0) -> Served:
    """Deploy ``config`` and return once it is ready: every model (or its fallback) has a
    replica the front door routes to.

    Connects to Ray (``ray_address``, or a running local cluster, or a new one), trains the
    models that need it, plans the replicas, deploys one Serve application per replica group
    (the model replica is the ingress) and the gateway's, and starts the front door
    (HAProxy) on ``http.host:port``. Raises InputError / Unschedulable / ServeFailed.
    """
    from hetflow.workloads.serve.front import FrontDoor, haproxy_binary

    from hetflow.workloads.serve.upstream import upstream_secrets

    upstream_keys = upstream_secrets(config.upstreams, dict(os.environ))  # before Ray, too
    # API keys on: a secret the front door adds to what it sends the replicas, the gateway and
    # the LLM engines, which refuse requests without it - their own ports (reachable on a
    # non-loopback host) do not skip the keys and limits. It travels as actor and deployment
    # arguments and in HAProxy's environment, never in a file or log.
    front_token = secrets.token_urlsafe(32) if config.auth.enabled(config.http.host) else None
    if front_token is not None:
        upstream_keys[FRONT_TOKEN_ENV] = front_token
    if config.auth.store != "cluster":
        _check_keys(config)  # before Ray starts: a missing key is a config to fix, at once
    started = connect_ray(config.ray_address)
    front = None
    llm_replicas: list[tuple[str, int, str, Any]] = []
    scaling: list[Any] = []  # the autoscaled engine: vllm pools (the front door scales them)
    try:
        haproxy_binary()  # no binary: one clear line now, not a failed actor later
        if config.auth.store == "cluster":
            _check_keys(config)
        plans = plan_models(config)
        host = config.http.host
        loopback = is_loopback(host)
        # Serve's own HTTP proxy stays on an internal port (the front door owns http.port);
        # the replicas' own HTTP servers bind Serve's http host - on every node, so a host
        # address (one node's) would fail on the others: they bind all of their node's
        # addresses then, and the front door reaches each at its node's IP.
        serve_host = host if loopback else "0.0.0.0"
        _start_serve(serve_host, host, "HeadOnly" if loopback else "EveryNode")
        _check_host(serve_host)
        try:
            serve.run_many(build_applications(config, plans, front_token),
                           wait_for_applications_running=False)
        except Exception as exc:  # noqa: BLE001 - Serve raises several kinds; say which
            raise ServeFailed(f"application {config.name} failed to deploy: {exc}") from None
        llm_servers = _start_llms(config, llm_replicas, timeout_s, front_token, scaling)
        here = ray.get_runtime_context().get_node_id()
        actor = ray.remote(FrontDoor).options(
            name=front_name(config.name), namespace="serve", num_cpus=0, max_concurrency=64,
            lifetime="detached",  # it outlives `hetflow serve --detach`, like the Serve apps
            scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False))
        try:
            front = actor.remote(front_plan(config, plans, llm_servers),
                                 upstream_keys=upstream_keys, scaling=scaling)
            ray.get(front.run.remote(), timeout=60)
        except ray.exceptions.RayActorError as exc:
            raise ServeFailed(f"the front door (HAProxy on {host}:{config.http.port}) did not "
                              f"start: {exc}; is the port free?") from None
        served = Served(config, url_of(host, config.http.port) + config.http.route_prefix.rstrip("/"),
                        plans, started_ray=started, front=front, llm_replicas=llm_replicas,
                        llm_servers=llm_servers)
        if not ray.get(front.state.remote(), timeout=30).get("direct_ingress", True):
            log.warning("this Ray cluster runs Serve without direct ingress, so requests take "
                        "Serve's proxy (slower); start Ray with %s in its environment for the "
                        "fast path", " ".join(f"{k}={v}" for k, v in FAST_ENV.items()))
        _wait_ready(served, timeout_s)
    except BaseException:
        if front is not None:
            try:  # no autoscaled engine starts after this
                ray.get(front.stop.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - it never started, or died
                pass
            ray.kill(front)
        _stop_llm_replicas(llm_replicas, config.name if scaling else None)
        if started:
            ray.shutdown()
        raise
    return served


def _start_llms(config: ServeConfig, out: list[tuple[str, int, str, Any]], timeout_s: float,
                api_key: str | None = None, scaling: list[Any] | None = None
                ) -> dict[str, list[tuple[str, str, int, int]]]:
    """Start every ``engine: vllm`` model's replicas (appended to ``out`` as they start, so a
    failure stops them) and wait until each engine answers; model -> its front-door servers.
    The autoscaled pools' specs (``scaling.ScaledPool``: their planned slots) go to ``scaling``."""
    llm_groups = plan_llm_pools(config)
    if not llm_groups:
        return {}
    from hetflow.workloads.serve.llm import (INSTALL, pool_slots, server_name, start_pools,
                                             vllm_available)
    from hetflow.workloads.serve.scaling import ScaledPool

    if not vllm_available():
        raise InputError(f"engine: vllm needs vLLM in this environment: {INSTALL}")
    bind = config.http.host if is_loopback(config.http.host) else "0.0.0.0"
    heads: set[str] = set()
    for name, groups in llm_groups.items():
        entry = config.model(name)
        for index, slots in pool_slots(groups).items():
            pool = entry.effective_pools[index]
            if pool.autoscaling is not None and scaling is not None:
                scaling.append(ScaledPool(
                    name, index, pool.autoscaling.model_dump(), slots, entry, pool.weight, bind,
                    startup_timeout_s=entry.vllm.merged(pool.engine).startup_timeout_s,
                    drain_timeout_s=config.limits.request_timeout_s))
        started: list[tuple[int, str, Any, bool]] = []
        try:
            start_pools(config.name, config.model(name), groups, bind, started, api_key=api_key)
        finally:  # what started is stopped by the caller on a failure, even midway
            for p, n, h, head in started:
                out.append((name, p, n, h))
                if head:
                    heads.add(n)
    waits = {n: h.wait_ready.remote() for _, _, n, h in out if n in heads}
    # an engine's other nodes (``<first>.n2``...): checked while their first node starts, so
    # workers that fail there fail the start at once instead of at the timeout
    others = {n: [(s, h) for _, _, s, h in out if s.startswith(n + ".n")] for n in heads}
    servers: dict[str, list[tuple[str, str, int, int]]] = {}
    for model, pool, name, _handle in out:
        if name not in heads:
            continue
        host, port = _wait_engine(model, name, waits[name], others[name], timeout_s)
        weight = config.model(model).effective_pools[pool].weight
        servers.setdefault(model, []).append((server_name(name), host, port, weight))
    return servers


def _wait_engine(model: str, name: str, ready: Any, stages: list[tuple[str, Any]],
                 timeout_s: float) -> tuple[str, int]:
    """An engine's address once it answers; its other nodes' workers checked every 2 s
    meanwhile. Raises ServeFailed naming the actor that failed, with its cause."""
    deadline = time.monotonic() + timeout_s
    current = name
    try:
        while True:
            current = name
            try:
                return ray.get(ready, timeout=2 if stages else timeout_s)
            except ray.exceptions.GetTimeoutError:
                if not stages or time.monotonic() > deadline:
                    raise ServeFailed(f"model {model}: replica {name} (vLLM) not ready in "
                                      f"{timeout_s:.0f} s") from None
            for current, handle in stages:
                ray.get(handle.wait_ready.remote(), timeout=30)
    except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError,
            ray.exceptions.GetTimeoutError) as exc:
        cause = str(getattr(exc, "cause", None) or exc).strip().splitlines()[-1]
        raise ServeFailed(f"model {model}: replica {current} (vLLM) failed to start: "
                          f"{cause}") from None


def _stop_llm_replicas(replicas: list[tuple[str, int, str, Any]], app: str | None = None) -> None:
    """Stop the engines started with the deployment; with ``app``, every engine of the
    application too (an autoscaled pool's, which the front door started)."""
    from hetflow.workloads.serve.llm import kill_replicas, remove_spreads, stop_actors

    stop_actors([handle for _model, _pool, _name, handle in replicas])
    if replicas:  # the placement groups of engines over several nodes (named as their first)
        remove_spreads(names={name for _m, _p, name, _h in replicas})
    replicas.clear()
    if app is not None:
        kill_replicas(app)


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
    from hetflow.workloads.serve.llm import kill_replicas

    kill_replicas(config.name)
    return apps


def _check_keys(config: ServeConfig) -> None:
    """With keys on, at least one usable key in the store, else refuse to start (a front door
    that answers 401 to everyone is a misconfiguration, and no keys must not mean open)."""
    if not config.auth.enabled(config.http.host):
        return
    from hetflow.core.errors import InputError
    from hetflow.workloads.serve.keys import open_store

    store = open_store(config.auth.store)
    if not any(r.usable() for r in store.records().values()):
        why = ("http.host " + config.http.host + " is not loopback" if config.auth.mode == "auto"
               else "auth.mode is keys")
        raise InputError(f"API keys are required ({why}) and {store.where} holds none: create one "
                         f"with `hetflow keys create NAME`"
                         + (" --address ADDRESS" if config.auth.store == "cluster" else "")
                         + ", or set auth: {mode: none} to serve without keys")


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


__all__ = ["build_applications", "build_single_application", "connect_ray", "deploy", "route_table", "Served", "ServeFailed", "stop"]
