"""The serving counters, latency and batch-size histograms, exposed through prometheus_client.

Pure Python (no Ray). Every replica - each model replica and each gateway replica - counts
what it answered in one :class:`GatewayMetrics` and sends it, cumulative, to the front door
actor (:meth:`~hetflow.workloads.serve.front.FrontDoor.report`); ``GET /metrics`` on the
gateway renders the **sum over all replicas** the front door holds (a dead replica's last
report stays counted, so no counter goes down), whichever gateway replica answers. Ray Serve's
own metrics (``serve_*``, per replica, through Ray's metrics agent) are separate.

Exposed at ``GET /metrics`` (Prometheus text 0.0.4, or OpenMetrics when the scraper's
``Accept`` asks for it; both written by prometheus_client) and ``GET /metrics?format=json``:

* ``hetflow_serve_requests_total{model,code}`` - counter: answered requests by HTTP status;
  requests refused by the checks (4xx) before a model was known count under ``model="-"``.
* ``hetflow_serve_fallbacks_total{model,served_by}`` - counter: requests another model answered.
* ``hetflow_serve_retries_total{model}`` - counter: attempts repeated because a replica died.
* ``hetflow_serve_request_duration_seconds{model}`` - histogram: time to answer (successful
  requests, measured in the replica or the gateway that answered).
* ``hetflow_serve_request_batch_size{model}`` - histogram, per request, of how many requests
  shared its forward pass (1 = it ran alone): whether batches really form.
* ``hetflow_serve_replicas_running{model,deployment}`` - gauge, from Serve's status, last poll.
* ``hetflow_key_{requests,tokens,refused}_total{key}`` - counters per API key (its name).
* ``hetflow_upstream_requests_total{upstream}``, ``hetflow_upstream_errors_total{upstream}``
  (connection errors, bad answers and 5xx), ``hetflow_upstream_response_duration_seconds{upstream}`` (mean
  response time of its last 1,024 requests) and ``hetflow_upstream_up{upstream}`` (1 while
  its health checks pass) - from the front door's HAProxy counters.
* ``hetflow_llm_{replicas,replicas_wanted,replicas_answering,requests_running,requests_waiting,kv_cache_usage_ratio,
  routing_weight,capacity_tokens_per_second}{model,pool}`` (gauges), ``hetflow_llm_{generation,prompt}_tokens_total{model,pool}``,
  ``hetflow_llm_engine_restarts_total{model,pool}`` (counters) and
  ``hetflow_llm_{first_token,output_token}_duration_seconds{model,pool}`` (summaries:
  sum and count) - an ``engine: vllm`` model's pools, from their engines' own ``/metrics``.

The names before the naming fix: :data:`RENAMED`.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Any, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.utils import floatToGoString

LATENCY_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
METRIC_TYPES = {
    "hetflow_serve_requests_total": "counter",
    "hetflow_serve_fallbacks_total": "counter",
    "hetflow_serve_retries_total": "counter",
    "hetflow_serve_request_duration_seconds": "histogram",
    "hetflow_serve_request_batch_size": "histogram",
    "hetflow_serve_replicas_running": "gauge",
    "hetflow_key_requests_total": "counter",
    "hetflow_key_tokens_total": "counter",
    "hetflow_key_refused_total": "counter",
    "hetflow_upstream_requests_total": "counter",
    "hetflow_upstream_errors_total": "counter",
    "hetflow_upstream_response_duration_seconds": "gauge",
    "hetflow_upstream_up": "gauge",
    "hetflow_llm_replicas": "gauge",
    "hetflow_llm_replicas_wanted": "gauge",
    "hetflow_llm_replicas_answering": "gauge",
    "hetflow_llm_requests_running": "gauge",
    "hetflow_llm_requests_waiting": "gauge",
    "hetflow_llm_kv_cache_usage_ratio": "gauge",
    "hetflow_llm_routing_weight": "gauge",
    "hetflow_llm_capacity_tokens_per_second": "gauge",
    "hetflow_llm_generation_tokens_total": "counter",
    "hetflow_llm_prompt_tokens_total": "counter",
    "hetflow_llm_engine_restarts_total": "counter",
    "hetflow_llm_first_token_duration_seconds": "summary",
    "hetflow_llm_output_token_duration_seconds": "summary",
}
RENAMED = {
    "hetflow_serve_request_seconds": "hetflow_serve_request_duration_seconds",
    "hetflow_serve_request_batch_requests": "hetflow_serve_request_batch_size",
}


class Histogram:
    """Cumulative-bucket histogram (Prometheus semantics: bucket ``le`` counts values <= le)."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value
        self.count += 1

    def cumulative(self) -> list[tuple[str, int]]:
        out, running = [], 0
        for bound, n in zip([*map(_fmt, self.bounds), "+Inf"], self.counts):
            running += n
            out.append((bound, running))
        return out


class GatewayMetrics:
    """Counters and histograms of one replica (or, merged, of several). ``version`` grows with
    every change, so the front door keeps a replica's newest report."""

    def __init__(self) -> None:
        self.version = 0
        self.requests: dict[tuple[str, int], int] = defaultdict(int)
        self.fallbacks: dict[tuple[str, str], int] = defaultdict(int)
        self.retries: dict[str, int] = defaultdict(int)
        self.latency: dict[str, Histogram] = {}
        self.batch: dict[str, Histogram] = {}
        self.replicas: dict[tuple[str, str], int] = {}
        # API key name -> requests, tokens, refused since the front door started (set by it)
        self.keys: dict[str, dict[str, int]] = {}
        # upstream name -> requests, errors, response_ms, up (set by the front door)
        self.upstreams: dict[str, dict[str, Any]] = {}
        # engine: vllm model -> pool -> its engines' stats (llm.pool_stats; set by the front door)
        self.llm_pools: dict[str, dict[int, dict[str, float]]] = {}

    def answered(self, model: str, code: int) -> None:
        self.requests[(model, code)] += 1
        self.version += 1

    def served(self, model: str, served_by: str, seconds: float, batch_requests: int) -> None:
        self.answered(model, 200)
        if served_by != model:
            self.fallbacks[(model, served_by)] += 1
        self.latency.setdefault(model, Histogram(LATENCY_BUCKETS_S)).observe(seconds)
        self.batch.setdefault(served_by, Histogram(BATCH_BUCKETS)).observe(batch_requests)

    def retried(self, model: str) -> None:
        self.retries[model] += 1
        self.version += 1

    def set_replicas(self, running: dict[tuple[str, str], int]) -> None:
        self.replicas = dict(running)

    def merge(self, other: "GatewayMetrics") -> None:
        """Add ``other``'s counts to these (metrics of several replicas shown as one)."""
        for key, value in other.requests.items():
            self.requests[key] += value
        for key, value in other.fallbacks.items():
            self.fallbacks[key] += value
        for key, value in other.retries.items():
            self.retries[key] += value
        for mine, theirs, bounds in ((self.latency, other.latency, LATENCY_BUCKETS_S),
                                     (self.batch, other.batch, BATCH_BUCKETS)):
            for model, hist in theirs.items():
                into = mine.setdefault(model, Histogram(bounds))
                into.counts = [a + b for a, b in zip(into.counts, hist.counts)]
                into.total += hist.total
                into.count += hist.count

    def families(self) -> Iterator[Metric]:
        """The metric families (prometheus_client's), for a collector."""
        simple = (
            (CounterMetricFamily, "hetflow_serve_requests", "Answered requests by status.",
             ["model", "code"], self.requests),
            (CounterMetricFamily, "hetflow_serve_fallbacks", "Requests answered by a fallback model.",
             ["model", "served_by"], self.fallbacks),
            (CounterMetricFamily, "hetflow_serve_retries", "Attempts repeated after a replica died.",
             ["model"], {(m,): v for m, v in self.retries.items()}),
        )
        for kind, name, help_text, labels, values in simple:
            yield _filled(kind(name, help_text, labels=labels), values)
        for name, help_text, hists in (
                ("hetflow_serve_request_duration_seconds",
                 "Time to answer a request (successful requests), seconds.", self.latency),
                ("hetflow_serve_request_batch_size",
                 "Requests sharing each request's forward pass.", self.batch)):
            family = HistogramMetricFamily(name, help_text, labels=["model"])
            for model, hist in sorted(hists.items()):
                buckets = [(floatToGoString(float(le)), n) for le, n in hist.cumulative()]
                family.add_metric([model], buckets, hist.total)
            yield family
        for field, help_text in (("requests", "Requests admitted per API key (by its name)."),
                                 ("tokens", "Tokens counted per API key (by its name)."),
                                 ("refused", "Requests refused per API key over its rate limits.")):
            yield _filled(CounterMetricFamily(f"hetflow_key_{field}", help_text, labels=["key"]),
                          {(k,): v.get(field, 0) for k, v in self.keys.items()})
        for field, family_type, help_text in (
                ("requests", CounterMetricFamily, "Requests sent to each upstream provider."),
                ("errors", CounterMetricFamily, "Upstream connection errors, bad answers and 5xx."),
                ("response_duration_seconds", GaugeMetricFamily, "Mean upstream response time of its last 1,024 requests."),
                ("up", GaugeMetricFamily, "1 while the upstream's health checks pass.")):
            yield _filled(family_type(f"hetflow_upstream_{field}", help_text, labels=["upstream"]),
                          {(k,): (v.get("response_ms", 0) / 1000.0 if field == "response_duration_seconds"
                                  else float(v.get(field, 0))) for k, v in self.upstreams.items()})
        pools = {(m, str(p)): st for m, by_pool in self.llm_pools.items() for p, st in by_pool.items()}
        for name, field, help_text in (
                ("replicas", "replicas", "LLM replicas (engines) in the pool's routing."),
                ("replicas_wanted", "wanted", "Engines the pool wants: its fixed count, or (autoscaled) "
                 "its ongoing requests over target_ongoing_requests, within min and max_replicas."),
                ("replicas_answering", "answering", "LLM replicas whose engine answered the last look."),
                ("requests_running", "running", "Requests the pool's engines are generating for."),
                ("requests_waiting", "waiting", "Requests waiting in the pool's engines."),
                ("kv_cache_usage_ratio", "kv_cache", "KV-cache use of the pool's fullest engine, 0..1."),
                ("routing_weight", "weight", "The front door's weight for the pool's engines "
                 "(mean; 256 = the engine worth most), from what each sustains."),
                ("capacity_tokens_per_second", "capacity_tokens_per_s",
                 "Generation tokens/s the pool's engines sustained while requests waited (0: "
                 "not measured yet).")):
            yield _filled(GaugeMetricFamily(f"hetflow_llm_{name}", help_text, labels=["model", "pool"]),
                          {k: float(st.get(field, 0)) for k, st in pools.items()})
        for name, field, help_text in (
                ("generation_tokens", "generation_tokens", "Tokens the pool's engines generated."),
                ("prompt_tokens", "prompt_tokens", "Prompt tokens the pool's engines read."),
                ("engine_restarts", "restarts", "The pool's engines that died, were started again "
                 "and were followed by the front door to their new address.")):
            yield _filled(CounterMetricFamily(f"hetflow_llm_{name}", help_text, labels=["model", "pool"]),
                          {k: float(st.get(field, 0)) for k, st in pools.items()})
        for name, prefix, help_text in (
                ("first_token_duration_seconds", "ttft", "Time to first token in the pool's engines."),
                ("output_token_duration_seconds", "tpot", "Time per output token in the pool's engines.")):
            family = SummaryMetricFamily(f"hetflow_llm_{name}", help_text, labels=["model", "pool"])
            for key, st in sorted(pools.items()):
                family.add_metric(list(key), count_value=st.get(f"{prefix}_count", 0),
                                  sum_value=st.get(f"{prefix}_sum", 0.0))
            yield family
        yield _filled(GaugeMetricFamily("hetflow_serve_replicas_running",
                                        "Running replicas per deployment (last status poll).",
                                        labels=["model", "deployment"]), self.replicas)

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """The exposition prometheus_client writes for a scraper sending ``accept`` (text 0.0.4
        by default, OpenMetrics when asked): (body, content type)."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(self))
        try:
            encoder, content_type = choose_encoder(accept or "")
            return encoder(registry), content_type
        except (TypeError, ValueError):  # prometheus_client on e.g. "...; version=abc"
            encoder, content_type = choose_encoder("")  # the default: text 0.0.4
            return encoder(registry), content_type

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": [{"model": m, "code": c, "count": v}
                         for (m, c), v in sorted(self.requests.items())],
            "fallbacks": [{"model": m, "served_by": s, "count": v}
                          for (m, s), v in sorted(self.fallbacks.items())],
            "retries": dict(self.retries),
            "latency_s": {m: _hist_dict(h) for m, h in self.latency.items()},
            "batch_requests": {m: _hist_dict(h) for m, h in self.batch.items()},
            "replicas_running": [{"model": m, "deployment": d, "running": v}
                                 for (m, d), v in sorted(self.replicas.items())],
            "keys": {k: dict(v) for k, v in sorted(self.keys.items())},
            "upstreams": {k: dict(v) for k, v in sorted(self.upstreams.items())},
            "llm_pools": {m: {str(p): dict(st) for p, st in sorted(by_pool.items())}
                          for m, by_pool in sorted(self.llm_pools.items())},
        }


def _filled(family: Any, values: dict[tuple, float]) -> Any:
    """``family`` with one sample per (label values...) -> value, in label order."""
    for key, value in sorted(values.items()):
        family.add_metric([str(k) for k in key], value)
    return family


def _fmt(x: float) -> str:
    return f"{x:g}"


class ReplicaReports:
    """Every replica's latest cumulative metrics, by replica (what the front door holds and
    ``/metrics`` sums). A report older than the one held - a lower ``version``, since calls
    may overtake each other - is dropped, and a dead replica's last report stays, so no sum
    ever goes down."""

    def __init__(self) -> None:
        self.latest: dict[str, GatewayMetrics] = {}

    def report(self, source: str, metrics: GatewayMetrics) -> None:
        held = self.latest.get(source)
        if held is None or getattr(metrics, "version", 0) >= getattr(held, "version", 0):
            self.latest[source] = metrics

    def reports(self) -> list[GatewayMetrics]:
        return list(self.latest.values())

    def total(self) -> GatewayMetrics:
        merged = GatewayMetrics()
        for metrics in self.latest.values():
            merged.merge(metrics)
        return merged


class _Collector:
    """A prometheus_client collector over one (merged) :class:`GatewayMetrics`."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self.metrics = metrics

    def describe(self) -> list[Metric]:
        return []  # names are fixed; nothing to check against other collectors

    def collect(self) -> Iterator[Metric]:
        return self.metrics.families()


def _hist_dict(h: Histogram) -> dict[str, Any]:
    return {"count": h.count, "sum": h.total, "buckets": dict(h.cumulative())}


__all__ = ["BATCH_BUCKETS", "GatewayMetrics", "Histogram", "LATENCY_BUCKETS_S", "METRIC_TYPES",
           "RENAMED", "ReplicaReports"]
