"""Throughput profiles for ``hetflow capacity serve``, measured on a running endpoint.

``hetflow bench serve URL --profile FILE --device LABEL ...`` finds, for each request-size
bucket (input and output tokens), the highest request rate one replica behind ``URL`` sustains
while meeting the latency SLO, and writes it into a profiles file (``throughput: {LABEL:
{BUCKET: req/s}}``, the shape :func:`hetflow.capacity.serve.load_profiles` reads) - the numbers
Melange's program needs, profiled per device the way Melange profiles them: fixed input/output
lengths, Poisson arrivals at a rate, the SLO on a percentile of TTFT and TPOT.

The load is vLLM's own benchmark client (``vllm.benchmarks.serve``: random prompts of exact
token lengths from the model's tokenizer, ``ignore_eos``, an OpenAI-compatible
``/v1/completions``), so the figures are the ones ``vllm bench serve`` prints. A probe at rate
``r`` passes when no request failed, the SLO's percentile of TTFT and of TPOT are within it,
and the replica kept up with the requests as they were sent (past the knee the queue grows and
the latency of a longer run would too). Keeping up is judged against the pace the client really
sent at, not the answered rate against the nominal one: a short probe's run lasts the send
schedule plus the last request's latency, so a few requests on a busy but keeping-up replica
answer well under ``r``. A probe kept up when the wait from the last send to the last answer
exceeds the median request latency by at most ``1 - KEEP_UP`` of the run (a queue that grows
makes the last requests wait longer than the typical one, more so the longer the run); results
without per-request times fall back to answered >= KEEP_UP x offered. The search doubles the rate
from ``start_rate`` until a probe fails (or ``max_rate``), then bisects ``steps`` times; the
profile is the answered rate of the best passing probe (0 when even the lowest rate fails).
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from hetflow.core.errors import InputError

KEEP_UP = 0.9  # a passing probe answers at least this share of the offered rate
MIN_RATE = 0.05  # the search's floor (requests/s)
_BUCKET = re.compile(r"^([A-Za-z0-9_.-]+)=(\d+):(\d+)$")
_SLO = re.compile(r"^(ttft|tpot)\s*<=\s*([0-9.]+)\s*(ms|s)$", re.IGNORECASE)


@dataclass(frozen=True)
class ProfileBucket:
    name: str
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class Slo:
    ttft_ms: float | None
    tpot_ms: float | None
    percentile: float

    def text(self) -> str:
        parts = [f"{k} <= {v:g} ms" for k, v in (("TTFT", self.ttft_ms), ("TPOT", self.tpot_ms)) if v is not None]
        return f"P{self.percentile:g} " + ", ".join(parts)


@dataclass
class Probe:
    rate: float  # offered requests/s
    answered: float  # requests/s answered (vLLM's request_throughput)
    ttft_ms: float
    tpot_ms: float
    failed: int
    passed: bool


def parse_buckets(text: str) -> list[ProfileBucket]:
    """``short=256:128,long=4096:512`` -> buckets (name=input:output tokens)."""
    out: list[ProfileBucket] = []
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        m = _BUCKET.match(part)
        if not m or int(m.group(2)) < 1 or int(m.group(3)) < 1:
            raise InputError(f"--buckets: {part!r} is not NAME=INPUT:OUTPUT with token counts >= 1 "
                             "(e.g. short=256:128,long=4096:512)")
        if any(b.name == m.group(1) for b in out):
            raise InputError(f"--buckets: {m.group(1)!r} is named twice")
        out.append(ProfileBucket(m.group(1), int(m.group(2)), int(m.group(3))))
    if not out:
        raise InputError("--buckets: give at least one NAME=INPUT:OUTPUT (e.g. short=256:128)")
    return out


def parse_slo(text: str, percentile: float) -> Slo:
    """``ttft<=1s,tpot<=100ms`` -> an SLO on the ``percentile`` of each."""
    if not 0 < percentile <= 100:
        raise InputError(f"--percentile {percentile:g}: give a percentile in (0, 100], e.g. 99")
    limits: dict[str, float] = {}
    for part in [p.strip() for p in text.split(",") if p.strip()]:
        m = _SLO.match(part)
        if not m or not float(m.group(2)) > 0:
            raise InputError(f"--slo: {part!r} is not ttft<=N(ms|s) or tpot<=N(ms|s) with N > 0 "
                             "(e.g. ttft<=1s,tpot<=100ms)")
        limits[m.group(1).lower()] = float(m.group(2)) * (1000.0 if m.group(3).lower() == "s" else 1.0)
    if not limits:
        raise InputError("--slo: give ttft<=N and/or tpot<=N (e.g. ttft<=1s,tpot<=100ms)")
    return Slo(limits.get("ttft"), limits.get("tpot"), percentile)


def judge(result: dict[str, Any], rate: float, slo: Slo) -> Probe:
    """One vLLM benchmark result at offered ``rate`` against the SLO."""
    p = str(int(slo.percentile)) if int(slo.percentile) == slo.percentile else str(slo.percentile)
    ttft = float(result.get(f"p{p}_ttft_ms") or 0.0)
    tpot = float(result.get(f"p{p}_tpot_ms") or 0.0)
    failed = int(result.get("failed") or 0)
    answered = float(result.get("request_throughput") or 0.0)
    ok = (failed == 0 and int(result.get("completed") or 0) > 0
          and (slo.ttft_ms is None or ttft <= slo.ttft_ms)
          and (slo.tpot_ms is None or tpot <= slo.tpot_ms)
          and kept_up(result, rate))
    return Probe(rate, answered, ttft, tpot, failed, ok)


def kept_up(result: dict[str, Any], rate: float) -> bool:
    """Whether the replica kept pace with the requests as sent (see the module's docstring)."""
    answered = [(float(start), float(latency)) for start, latency, error
                in zip(result.get("start_times") or [], result.get("latencies") or [], result.get("errors") or [])
                if not error]
    duration = float(result.get("duration") or 0.0)
    if len(answered) < 2 or duration <= 0:
        return float(result.get("request_throughput") or 0.0) >= KEEP_UP * rate
    drain = max(s + lat for s, lat in answered) - max(s for s, _ in answered)  # last send -> last answer
    return drain - statistics.median(lat for _, lat in answered) <= (1.0 - KEEP_UP) * duration

def search(measure: Callable[[float], Probe], start_rate: float, max_rate: float, steps: int) -> tuple[float, list[Probe]]:
    """The highest passing rate: double from ``start_rate`` until a probe fails or ``max_rate``,
    then bisect ``steps`` times (halving down to :data:`MIN_RATE` when the first probe fails).
    Returns the best passing probe's answered rate (0 if none passed) and every probe."""
    probes: list[Probe] = []
    good: Probe | None = None
    bad: float | None = None
    rate = min(start_rate, max_rate)
    while True:  # bracket
        probe = measure(rate)
        probes.append(probe)
        if probe.passed:
            good = probe
            if rate >= max_rate or bad is not None:  # the ceiling, or a rate above already failed
                break
            rate = min(rate * 2, max_rate)
        else:
            bad = rate
            if good is not None or rate / 2 < MIN_RATE:
                break
            rate /= 2
    if good is not None and bad is not None:
        lo, hi = good.rate, bad
        for _ in range(steps):
            mid = math.sqrt(lo * hi)  # geometric: rates span orders of magnitude
            probe = measure(mid)
            probes.append(probe)
            if probe.passed:
                lo = mid
                if probe.answered > good.answered:
                    good = probe
            else:
                hi = mid
    return (min(good.answered, good.rate) if good is not None else 0.0), probes


def write_profile(path: Path, device: str, values: dict[str, float], slo: Slo,
                  buckets: list[ProfileBucket], price: float | None) -> dict[str, Any]:
    """Merge ``device``'s measured throughputs into the profiles file at ``path`` (created when
    absent; other devices, their prices and the device's other buckets kept), atomically. Returns the document written."""
    import os

    import yaml

    doc: dict[str, Any] = {}
    if path.exists():
        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise InputError(f"{path}: not YAML ({str(exc).splitlines()[0]}); give a new file or fix it") from None
        if not isinstance(doc, dict):
            raise InputError(f"{path}: not a profiles document (a mapping with devices: and throughput:)")
    slo_text = slo.text()
    if doc.get("slo") not in (None, slo_text):
        raise InputError(f"{path} was profiled at SLO {doc['slo']!r}, not {slo_text!r}: profiles of one file "
                         "must share one SLO (give another --profile file)")
    doc["slo"] = slo_text
    devices = doc.setdefault("devices", {})
    entry = devices.setdefault(device, {})
    if price is not None:
        entry["price_per_hour"] = price
    row = doc.setdefault("throughput", {}).setdefault(device, {})  # other buckets of the device kept
    row.update({k: round(v, 4) for k, v in values.items()})
    shapes = doc.setdefault("buckets", {})
    for b in buckets:
        shapes[b.name] = {"input_tokens": b.input_tokens, "output_tokens": b.output_tokens}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
    os.replace(tmp, path)
    return doc


def vllm_probe(url: str, model: str, tokenizer: str, bucket: ProfileBucket, prompts: int, seed: int,
               slo: Slo) -> Callable[[float], Probe]:
    """A probe function: ``prompts`` requests of ``bucket``'s shape at a rate, by vLLM's client."""
    import argparse
    import contextlib
    import io
    import os

    import logging

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # before vLLM's import: its per-run warnings
    from vllm.benchmarks import serve as vbench

    for name in ("vllm", "vllm.benchmarks", "vllm.benchmarks.datasets.datasets"):
        logging.getLogger(name).setLevel(logging.ERROR)

    pct = f"{slo.percentile:g}"

    def measure(rate: float) -> Probe:
        parser = argparse.ArgumentParser()
        vbench.add_cli_args(parser)
        n = max(prompts, int(math.ceil(rate * 2)))  # at least ~2 s of arrivals at high rates
        args = parser.parse_args([
            "--backend", "openai", "--base-url", url.rstrip("/"), "--endpoint", "/v1/completions",
            "--model", model, "--tokenizer", tokenizer, "--dataset-name", "random",
            "--random-input-len", str(bucket.input_tokens), "--random-output-len", str(bucket.output_tokens),
            "--random-range-ratio", "0", "--num-prompts", str(n), "--request-rate", f"{rate:.6g}",
            "--ignore-eos", "--seed", str(seed), "--percentile-metrics", "ttft,tpot",
            "--metric-percentiles", pct, "--disable-tqdm",
            "--save-detailed"])  # keeps the per-request start times kept_up judges by (nothing is saved)
        with contextlib.redirect_stdout(io.StringIO()):
            result = vbench.main(args)
        return judge(result, rate, slo)

    return measure


__all__ = ["KEEP_UP", "MIN_RATE", "Probe", "ProfileBucket", "Slo", "judge", "kept_up", "parse_buckets", "parse_slo",
           "search", "vllm_probe", "write_profile"]
