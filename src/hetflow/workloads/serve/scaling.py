"""Autoscaling of ``engine: vllm`` pools, run by the front door (:class:`~hetflow.workloads.
serve.front.FrontDoor`): Ray Serve scales hetflow's own replicas, but an LLM pool's engines are
hetflow's actors behind HAProxy, which Serve's autoscaler never sees.

The rule is Ray Serve's, on what an LLM engine reports itself: every ``EVERY_S`` the front door
reads each engine's ongoing requests (``vllm:num_requests_running`` + ``vllm:num_requests_
waiting``, its own ``/metrics``) and sums them per pool; the pool wants ``ceil(ongoing /
target_ongoing_requests)`` engines, within ``[min_replicas, max_replicas]``. A want above the
engines running for ``upscale_delay_s`` starts one more engine on the next device slot the
planner set aside for the pool (``max_replicas`` are planned up front, exactly as fixed
replicas are); it joins the routing once it answers. A want below for ``downscale_delay_s``
takes the newest engine out of the routing (HAProxy reloaded without it: no new request
reaches it), lets its requests finish (at most the model's request timeout), then stops it.
One start or stop at a time per pool; an engine's start takes tens of seconds, so the delays
count from the last change.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

EVERY_S = 2.0
"""How often the front door reads the engines and decides."""
START_GRACE_S = 120.0
"""Beyond the engine's own ``startup_timeout_s``: how long an engine's actor may wait for its
devices (Ray queues an actor it cannot place yet) before the start is given up."""


def _engines(n: int) -> str:
    return f"{n} engine{'' if n == 1 else 's'}"


def wanted_engines(ongoing: float, target: float, low: int, high: int) -> int:
    """Engines a pool wants for ``ongoing`` requests at ``target`` per engine, within
    ``[low, high]``."""
    return max(low, min(high, math.ceil(ongoing / target - 1e-9)))


class ScaleClock:
    """A want above or below the engines running is acted on once it has held for its delay
    (measured from when it began, or from the last step taken)."""

    def __init__(self) -> None:
        self.direction = 0
        self.since = 0.0

    def step(self, running: int, wanted: int, now: float, up_delay_s: float,
             down_delay_s: float) -> int:
        """+1 (start one engine), -1 (stop one) or 0."""
        direction = (wanted > running) - (wanted < running)
        if direction != self.direction:
            self.direction, self.since = direction, now
        if direction == 0 or now - self.since < (up_delay_s if direction > 0 else down_delay_s):
            return 0
        self.since = now  # the next step of the same direction waits a whole delay again
        return direction


@dataclass
class ScaledPool:
    """What the front door needs to scale one pool (plain data, sent to its actor)."""

    model: str
    pool: int  # from 0, as ``effective_pools`` counts
    autoscaling: dict[str, Any]  # AutoscalingConfig.model_dump()
    slots: list[Any]  # the planned replica group of each engine, by replica index
    entry: Any  # the model's ModelServeConfig (its engine arguments)
    weight: int  # the pool's configured HAProxy weight
    bind_host: str
    startup_timeout_s: float = 600.0  # the engine's own (VLLMEngine.startup_timeout_s)
    drain_timeout_s: float = 600.0  # the model's request timeout: a stopped engine's requests


@dataclass
class _Change:
    replica: int
    handle: Any
    began: float
    ready: Any = None  # a start: the engine's wait_ready() reference
    server: tuple[str, str, int] | None = None  # a stop: the engine's (name, host, port)


@dataclass
class PoolScaler:
    """One pool's engines, scaled. The front door calls :meth:`tick` every ``EVERY_S`` with the
    pool's servers now and each one's ongoing requests; ``apply(add=server)`` /
    ``apply(remove=name)`` puts an engine into the routing or takes it out (the front door
    rewrites and reloads HAProxy)."""

    spec: ScaledPool
    app: str
    api_key: str | None = None
    clock: ScaleClock = field(default_factory=ScaleClock)
    starting: _Change | None = None
    draining: _Change | None = None
    wanted: int = 0
    ongoing: float = 0.0
    events: list[str] = field(default_factory=list)  # what it did, newest last (the last 20)
    said: int = 0  # events so far (hetflow serve prints those it has not printed)

    @property
    def where(self) -> str:
        return f"model {self.spec.model}: pool {self.spec.pool + 1}"

    def _say(self, text: str) -> None:
        import sys

        line = f"hetflow front door: {self.where}: {text}"
        self.events = (self.events + [line])[-20:]
        self.said += 1
        print(line, file=sys.stderr, flush=True)

    def tick(self, servers: list[tuple[str, str, int, int]], ongoing: dict[str, float | None],
             apply: Callable[..., None], now: float | None = None,
             stopped: Callable[[], bool] = lambda: False,
             creating: Any = contextlib.nullcontext()) -> None:
        """One look: ``servers`` are the pool's engines in the routing now (front-door server
        name, host, port, weight), ``ongoing`` each one's running + waiting requests (None: it
        did not answer its metrics). A new engine's actor is created under ``creating`` (a
        lock) and only while ``stopped()`` is false."""
        import ray

        from hetflow.workloads.serve.llm import (replica_actor_name, replica_of, scrape_engine,
                                                 start_engine, stop_actors)

        now = time.monotonic() if now is None else now
        a = self.spec.autoscaling
        if self.starting is not None:
            self._check_start(servers, apply, now)
            return
        if self.draining is not None:
            name, host, port = self.draining.server
            stats = scrape_engine(host, port)
            left = None if stats is None else stats.get("running", 0) + stats.get("waiting", 0)
            if not left or now - self.draining.began > self.spec.drain_timeout_s:
                stop_actors([self.draining.handle])
                self._say(f"engine {name} stopped ({len(servers)} running)")
                self.draining = None
            return
        self.ongoing = sum(v for v in ongoing.values() if v is not None)
        self.wanted = wanted_engines(self.ongoing, a["target_ongoing_requests"],
                                     a["min_replicas"], a["max_replicas"])
        step = self.clock.step(len(servers), self.wanted, now, a["upscale_delay_s"],
                               a["downscale_delay_s"])
        if step > 0 and len(servers) < a["max_replicas"]:
            used = {replica_of(name)[1] for name, *_ in servers}
            replica = min(r for r in range(a["max_replicas"]) if r not in used)
            with creating:  # the front door's stop waits for a start under way, then none begins
                if stopped():
                    return
                handle = start_engine(self.app, self.spec.entry, self.spec.pool, replica,
                                      self.spec.slots[replica], self.spec.bind_host, self.api_key)
            self.starting = _Change(replica, handle, now, ready=handle.wait_ready.remote())
            self._say(f"{self.ongoing:g} ongoing requests over {_engines(len(servers))} (target "
                      f"{a['target_ongoing_requests']:g} each): starting engine "
                      f"p{self.spec.pool + 1}-r{replica}")
        elif step < 0 and len(servers) > a["min_replicas"]:
            name, host, port, _w = max(servers, key=lambda s: replica_of(s[0])[1])
            replica = replica_of(name)[1]
            try:
                handle = ray.get_actor(replica_actor_name(self.app, self.spec.model,
                                                          self.spec.pool + 1, replica),
                                       namespace="serve")
            except ValueError:
                handle = None
            apply(remove=name)
            self._say(f"{self.ongoing:g} ongoing requests over {_engines(len(servers))} (target "
                      f"{a['target_ongoing_requests']:g} each): engine {name} out of the "
                      "routing, stopping once its requests are done")
            if handle is not None:
                self.draining = _Change(replica, handle, now, server=(name, host, port))

    def _check_start(self, servers: list[tuple[str, str, int, int]],
                     apply: Callable[..., None], now: float) -> None:
        import ray

        from hetflow.workloads.serve.llm import stop_actors

        change = self.starting
        assert change is not None
        name = f"p{self.spec.pool + 1}-r{change.replica}"
        done, _ = ray.wait([change.ready], timeout=0)
        if done:
            try:
                host, port = ray.get(change.ready)
            except Exception as exc:  # noqa: BLE001 - the engine failed to start
                stop_actors([change.handle])
                self.starting = None
                cause = str(getattr(exc, "cause", None) or exc).strip().splitlines()[-1][:300]
                self._say(f"engine {name} failed to start: {cause}")
                return
            apply(add=(name, host, int(port), self.spec.weight))
            self.starting = None
            self.clock.since = now  # the next step waits a whole delay from here
            self._say(f"engine {name} answers at {host}:{port} ({len(servers) + 1} running)")
        elif now - change.began > self.spec.startup_timeout_s + START_GRACE_S:
            stop_actors([change.handle])
            self.starting = None
            self._say(f"engine {name} not ready after {now - change.began:.0f} s (its devices "
                      "busy, or a slow start): given up; the next want starts it again")

    def state(self, running: int) -> dict[str, Any]:
        return {"engines": running, "wanted": self.wanted, "ongoing": self.ongoing,
                "starting": self.starting is not None, "draining": self.draining is not None,
                "min": self.spec.autoscaling["min_replicas"],
                "max": self.spec.autoscaling["max_replicas"], "events": list(self.events),
                "said": self.said}


__all__ = ["EVERY_S", "PoolScaler", "ScaleClock", "ScaledPool", "wanted_engines"]
