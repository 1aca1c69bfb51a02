"""Open-loop load generator for a served model: Poisson arrivals at a target rate, loopback only.

    from hetflow.workloads.serve.loadgen import run_load, sweep, digits_bodies
    bodies = digits_bodies(rows=1)
    result = run_load("http://127.0.0.1:8000/v1/models/digits/predict", bodies, rate=100,
                      max_requests=2000, max_duration_s=20)
    print(result.line())
    best = sweep(url, bodies, p99_target_ms=80)     # highest rate whose P99 <= 80 ms

**Open loop.** Send times are drawn in advance (exponential gaps, mean ``1/rate``, seeded),
and each request is sent at its time whether or not earlier ones have answered - the way
independent clients arrive. Latency is measured from the *scheduled* send time, so time a
request spent waiting for the generator itself (a slow event loop, no free connection) counts
against the server instead of silently lowering the offered load (no coordinated omission).

**Bounded.** A run stops sending after ``max_requests`` or ``max_duration_s``, whichever
comes first, then waits at most ``timeout_s`` for the answers still due; those that do not
come count as errors (``timeout``). Only loopback addresses are accepted (127.0.0.0/8, ::1,
localhost): this is a test tool, not a way to load someone else's server.

**Percentiles** are nearest-rank over the answered (2xx) requests; ``achieved_qps`` is 2xx
answers per second from the first scheduled send to the last answer.

**Sweep.** Rates grow geometrically from ``start_rate`` until a step fails (P99 above the
target, or any error), then the bracket between the last passing and the first failing rate is
bisected ``refine`` times. Each run sends at least ``min_requests`` (its duration is stretched,
up to ``max_duration_s``), and a failing rate is run once more and judged on the two runs'
samples together (``confirm``), so one stall of a shared host does not end the sweep. The
answer is the highest passing rate tried (None if none passed).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import math
import random
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence
from urllib.parse import urlsplit

from hetflow.core.errors import InputError


@dataclass(frozen=True)
class LoadResult:
    """One bounded run at one offered rate."""

    rate: float  # offered, requests/s
    sent: int
    ok: int
    errors: dict[str, int]  # "503", "timeout", "ConnectionError", ... -> count
    duration_s: float  # first scheduled send -> last answer
    achieved_qps: float
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    latencies_ms: tuple[float, ...] = field(default=(), repr=False)

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    def passes(self, p99_target_ms: float) -> bool:
        return self.error_count == 0 and self.p99_ms is not None and self.p99_ms <= p99_target_ms

    def line(self) -> str:
        def ms(x: float | None) -> str:
            return "-" if x is None else f"{x:.1f}"

        errs = (", ".join(f"{k}:{v}" for k, v in sorted(self.errors.items()))
                if self.errors else "0")
        return (f"rate {self.rate:7.1f}/s  sent {self.sent:5d}  ok {self.ok:5d}  "
                f"achieved {self.achieved_qps:7.1f}/s  p50 {ms(self.p50_ms)}  p95 "
                f"{ms(self.p95_ms)}  p99 {ms(self.p99_ms)} ms  errors {errs}")

    def pooled(self, other: "LoadResult") -> "LoadResult":
        """Both runs at one rate taken together (more samples for the percentiles)."""
        latencies = sorted(self.latencies_ms + other.latencies_ms)
        errors = dict(self.errors)
        for key, count in other.errors.items():
            errors[key] = errors.get(key, 0) + count
        duration = self.duration_s + other.duration_s
        return LoadResult(
            rate=self.rate, sent=self.sent + other.sent, ok=len(latencies), errors=errors,
            duration_s=duration, achieved_qps=len(latencies) / duration,
            p50_ms=percentile(latencies, 50), p95_ms=percentile(latencies, 95),
            p99_ms=percentile(latencies, 99), max_ms=latencies[-1] if latencies else None,
            latencies_ms=tuple(latencies))

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "latencies_ms"}


@dataclass(frozen=True)
class SweepResult:
    steps: list[LoadResult]
    p99_target_ms: float
    best: LoadResult | None  # the highest passing rate

    @property
    def best_rate(self) -> float | None:
        return self.best.rate if self.best else None


def check_loopback(url: str) -> None:
    """InputError unless ``url`` is http(s) to a loopback host."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InputError(f"{url!r} is not an http:// URL")
    host = parts.hostname
    if host == "localhost":
        return
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        pass
    raise InputError(f"the load generator only targets loopback addresses (127.0.0.1, ::1, "
                     f"localhost), not {host}; run it on the serving host")


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) of already sorted values."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def arrival_times(rate: float, max_requests: int, max_duration_s: float,
                  seed: int = 0) -> list[float]:
    """Poisson arrival offsets (seconds from the start), bounded in count and time."""
    if rate <= 0:
        raise InputError(f"rate must be > 0 requests/s, got {rate:g}")
    rng = random.Random(seed)
    times, t = [], 0.0
    while len(times) < max_requests:
        t += rng.expovariate(rate)
        if t > max_duration_s:
            break
        times.append(t)
    return times


def run_load(url: str, bodies: Sequence[bytes], rate: float, *, max_requests: int = 1000,
             max_duration_s: float = 10.0, timeout_s: float = 10.0, seed: int = 0,
             connections: int = 256) -> LoadResult:
    """One open-loop run (see the module docstring). Blocks; runs its own event loop."""
    check_loopback(url)
    if not bodies:
        raise InputError("the load generator needs at least one request body")
    times = arrival_times(rate, max_requests, max_duration_s, seed)
    return asyncio.run(_run(url, list(bodies), rate, times, timeout_s, connections))


async def _run(url: str, bodies: list[bytes], rate: float, times: list[float],
               timeout_s: float, connections: int) -> LoadResult:
    import aiohttp

    latencies: list[float] = []
    errors: dict[str, int] = {}
    last_done = [0.0]
    connector = aiohttp.TCPConnector(limit=connections, force_close=False)
    timeout = aiohttp.ClientTimeout(total=None)
    headers = {"content-type": "application/json"}
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start = time.perf_counter() + 0.05  # room to create the first tasks on time

        async def one(i: int, at: float) -> None:
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            try:
                async with session.post(url, data=bodies[i % len(bodies)],
                                        headers=headers) as resp:
                    await resp.read()
                    status = resp.status
            except Exception as exc:  # noqa: BLE001 - every failure is a counted error
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                return
            now = time.perf_counter()
            last_done[0] = max(last_done[0], now)
            if 200 <= status < 300:
                latencies.append((now - (start + at)) * 1000.0)
            else:
                errors[str(status)] = errors.get(str(status), 0) + 1

        tasks = [asyncio.ensure_future(one(i, at)) for i, at in enumerate(times)]
        horizon = (times[-1] if times else 0.0) + timeout_s
        done, pending = await asyncio.wait(tasks, timeout=max(0.0, start + horizon
                                                              - time.perf_counter()))
        for task in pending:
            task.cancel()
        if pending:
            errors["timeout"] = errors.get("timeout", 0) + len(pending)
            await asyncio.gather(*pending, return_exceptions=True)
    latencies.sort()
    span = max(1e-9, (last_done[0] or time.perf_counter()) - start)
    return LoadResult(
        rate=rate, sent=len(times), ok=len(latencies), errors=errors, duration_s=span,
        achieved_qps=len(latencies) / span, p50_ms=percentile(latencies, 50),
        p95_ms=percentile(latencies, 95), p99_ms=percentile(latencies, 99),
        max_ms=latencies[-1] if latencies else None, latencies_ms=tuple(latencies))


def sweep(url: str, bodies: Sequence[bytes], *, p99_target_ms: float = 80.0,
          start_rate: float = 20.0, factor: float = 1.5, max_rate: float = 2000.0,
          refine: int = 2, duration_s: float = 4.0, max_requests: int = 2000,
          timeout_s: float = 5.0, seed: int = 0, min_requests: int = 100,
          max_duration_s: float = 30.0, confirm: bool = True,
          on_step: Callable[[LoadResult], None] | None = None) -> SweepResult:
    """The highest offered rate whose P99 stays at or under the target, with no errors."""
    steps: list[LoadResult] = []

    def run(rate: float) -> LoadResult:
        # At least min_requests per run: a P99 over a few dozen samples is just the maximum.
        duration = min(max(duration_s, min_requests / rate), max_duration_s)
        result = run_load(url, bodies, rate, max_requests=max_requests,
                          max_duration_s=duration, timeout_s=timeout_s, seed=seed + len(steps))
        steps.append(result)
        if on_step is not None:
            on_step(result)
        return result

    def step(rate: float) -> LoadResult:
        result = run(rate)
        if result.passes(p99_target_ms) or not confirm:
            return result
        # A miss is run once more and judged on both runs' samples together: one stall of a
        # shared host should not end the sweep, a real overload fails the pooled P99 too.
        pooled = result.pooled(run(rate))
        if on_step is not None:
            on_step(pooled)
        return pooled

    good: LoadResult | None = None
    bad: float | None = None
    rate = start_rate
    while rate <= max_rate:
        result = step(rate)
        if not result.passes(p99_target_ms):
            bad = rate
            break
        good = result
        rate *= factor
    if bad is not None:
        low = good.rate if good else 0.0
        high = bad
        for _ in range(refine):
            mid = (low + high) / 2
            if mid <= 0 or high - low < 1.0:
                break
            result = step(mid)
            if result.passes(p99_target_ms):
                low, good = mid, result
            else:
                high = mid
    return SweepResult(steps, p99_target_ms, good)


def digits_bodies(rows: int = 1, count: int = 64, seed: int = 0) -> list[bytes]:
    """Request bodies of held-out digits images (``rows`` per request), as JSON bytes."""
    from hetflow.workloads.train.data import load_dataset

    val = load_dataset("digits", val_fraction=0.2, seed=0).val.inputs.numpy()
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        picks = [val[rng.randrange(len(val))].round(4).tolist() for _ in range(rows)]
        out.append(json.dumps({"inputs": picks}).encode())
    return out


def bodies_for(spec: dict, rows: int = 1, count: int = 64, seed: int = 0) -> list[bytes]:
    """Valid random bodies for a model's input description (``GET /v1/models/<name>``)."""
    rng = random.Random(seed)
    low = spec.get("low") if spec.get("low") is not None else 0.0
    high = spec.get("high") if spec.get("high") is not None else 1.0
    out = []
    for _ in range(count):
        if spec["kind"] == "int":
            data = [[rng.randint(int(low), int(high)) for _ in range(spec["width"])]
                    for _ in range(rows)]
        else:
            data = [[round(rng.uniform(low, high), 4) for _ in range(spec["width"])]
                    for _ in range(rows)]
        out.append(json.dumps({"inputs": data}).encode())
    return out


__all__ = ["LoadResult", "SweepResult", "arrival_times", "bodies_for", "check_loopback",
           "digits_bodies", "percentile", "run_load", "sweep"]
