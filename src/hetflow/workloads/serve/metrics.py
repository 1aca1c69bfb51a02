"""The gateway's request counters, latency and batch-size histograms, in Prometheus text.

Pure Python. Each gateway replica keeps its own (``gateway.replicas`` is 1 by default); Ray
Serve's own metrics (``serve_*``, per replica, through Ray's metrics agent) are separate.

Exposed at ``GET /metrics`` (Prometheus text format 0.0.4) and ``GET /metrics?format=json``:

* ``hetflow_serve_requests_total{model,code}`` - answered requests by HTTP status; requests
  refused by the gateway's checks (4xx) count under ``model="-"``.
* ``hetflow_serve_fallbacks_total{model,served_by}`` - requests another model answered.
* ``hetflow_serve_retries_total{model}`` - attempts repeated because a replica died under them.
* ``hetflow_serve_request_seconds{model}`` - gateway latency histogram (successful requests).
* ``hetflow_serve_request_batch_requests{model}`` - histogram, per request, of how many
  requests shared its forward pass (1 = it ran alone): whether batches really form.
* ``hetflow_serve_replicas_running{model,deployment}`` - from Serve's status, last poll.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Any

LATENCY_BUCKETS_S = (0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


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
    """Counters and histograms of one gateway replica."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, int], int] = defaultdict(int)
        self.fallbacks: dict[tuple[str, str], int] = defaultdict(int)
        self.retries: dict[str, int] = defaultdict(int)
        self.latency: dict[str, Histogram] = {}
        self.batch: dict[str, Histogram] = {}
        self.replicas: dict[tuple[str, str], int] = {}

    def answered(self, model: str, code: int) -> None:
        self.requests[(model, code)] += 1

    def served(self, model: str, served_by: str, seconds: float, batch_requests: int) -> None:
        self.answered(model, 200)
        if served_by != model:
            self.fallbacks[(model, served_by)] += 1
        self.latency.setdefault(model, Histogram(LATENCY_BUCKETS_S)).observe(seconds)
        self.batch.setdefault(served_by, Histogram(BATCH_BUCKETS)).observe(batch_requests)

    def retried(self, model: str) -> None:
        self.retries[model] += 1

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

    def render(self) -> str:
        """Prometheus text exposition."""
        lines: list[str] = []
        _family(lines, "hetflow_serve_requests_total", "counter", "Answered requests by status.",
                [({"model": m, "code": str(c)}, v) for (m, c), v in sorted(self.requests.items())])
        _family(lines, "hetflow_serve_fallbacks_total", "counter",
                "Requests answered by a fallback model.",
                [({"model": m, "served_by": s}, v) for (m, s), v in sorted(self.fallbacks.items())])
        _family(lines, "hetflow_serve_retries_total", "counter",
                "Attempts repeated after a replica died.",
                [({"model": m}, v) for m, v in sorted(self.retries.items())])
        _histograms(lines, "hetflow_serve_request_seconds", "Gateway latency of answered requests.",
                    self.latency)
        _histograms(lines, "hetflow_serve_request_batch_requests",
                    "Requests sharing each request's forward pass.", self.batch)
        _family(lines, "hetflow_serve_replicas_running", "gauge",
                "Running replicas per deployment (last status poll).",
                [({"model": m, "deployment": d}, v) for (m, d), v in sorted(self.replicas.items())])
        return "\n".join(lines) + "\n"

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
        }


def _fmt(x: float) -> str:
    return f"{x:g}"


def _labels(labels: dict[str, str]) -> str:
    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in labels.items()) + "}"


def _family(lines: list[str], name: str, kind: str, help_text: str,
            samples: list[tuple[dict[str, str], float]]) -> None:
    lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    lines += [f"{name}{_labels(labels)} {_fmt(value)}" for labels, value in samples]


def _histograms(lines: list[str], name: str, help_text: str, hists: dict[str, Histogram]) -> None:
    lines += [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
    for model, hist in sorted(hists.items()):
        for bound, count in hist.cumulative():
            lines.append(f"{name}_bucket{_labels({'model': model, 'le': bound})} {count}")
        lines.append(f"{name}_sum{_labels({'model': model})} {_fmt(hist.total)}")
        lines.append(f"{name}_count{_labels({'model': model})} {hist.count}")


def _hist_dict(h: Histogram) -> dict[str, Any]:
    return {"count": h.count, "sum": h.total, "buckets": dict(h.cumulative())}


__all__ = ["BATCH_BUCKETS", "GatewayMetrics", "Histogram", "LATENCY_BUCKETS_S"]
