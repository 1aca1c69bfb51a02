"""``hetflow bench serve --profile``: what one served LLM replica delivers, for capacity planning.

    hetflow bench serve --url http://127.0.0.1:PORT --model NAME [--tokenizer PATH]
                        --buckets short=256:128,long=4096:512 --slo "ttft<=1s,tpot<=100ms"
                        [--percentile 99] --profile FILE --device LABEL [--price USD]

Per bucket (input:output tokens), the highest request rate
the endpoint at URL sustains within the SLO (a percentile of TTFT and TPOT), found by doubling
the rate and then bisecting; written into FILE as ``throughput: {LABEL: {BUCKET: req/s}}``
(merged: other devices kept), the profiles file ``hetflow capacity serve`` reads. Point URL at
one replica (e.g. an ``engine: vllm`` pool of one replica, or the engine's own port that
``hetflow serve`` prints) on the device to profile; repeat per device model with the same
file. (Without ``--profile``, ``hetflow bench serve`` is the open-loop load test of a
predict URL: cli/serve.py.)

The load is vLLM's own benchmark client (``vllm bench serve``: random prompts of exact lengths
from the model's tokenizer, Poisson arrivals, ``ignore_eos``) against ``/v1/completions``;
the key, when the endpoint wants one, comes from ``OPENAI_API_KEY``. Needs the ``llm`` extra
(``make llm``). docs/capacity.md.
"""

from __future__ import annotations

import argparse
import json


# What one load run can hold: every arrival is scheduled up front (a list of times, then one
# task each), so a count or rate past these would exhaust memory before the first request.
BENCH_BOUNDS = {"rate": 1_000_000, "requests": 1_000_000, "duration": 86_400, "timeout": 3_600,
                "rows": 100_000, "p99_ms": 3_600_000, "start_rate": 1_000_000, "max_rate": 1_000_000,
                "prompts": 100_000}


def check_bench_bounds(args: argparse.Namespace, names: tuple[str, ...]) -> None:
    """Each ``--NAME`` above 0 and at most its :data:`BENCH_BOUNDS` (NaN and infinity refused),
    in one line naming the flag; before anything is sent."""
    from hetflow.core.errors import InputError

    for name in names:
        value = getattr(args, name)
        if value is None:
            continue
        flag = "--" + name.replace("_", "-")
        if not value > 0:
            raise InputError(f"{flag} must be > 0, got {value}")
        if not value <= BENCH_BOUNDS[name]:
            shown = f"{value:,}" if isinstance(value, int) else f"{value:g}"
            raise InputError(f"{flag} {shown} is more than one run can schedule (at most "
                             f"{BENCH_BOUNDS[name]:,}); split the load into runs")


def run_profile(args: argparse.Namespace) -> int:
    import importlib.util

    from hetflow.capacity.profile import parse_buckets, parse_slo, search, vllm_probe, write_profile
    from hetflow.core.errors import InputError

    buckets = parse_buckets(args.buckets)
    slo = parse_slo(args.slo, args.percentile)
    if not args.model:
        raise InputError("--profile needs --model NAME: the model name the endpoint serves")
    if not args.device:
        raise InputError("--profile needs --device LABEL: the device model the figures are for (e.g. MI300X)")
    if args.price is not None and not args.price > 0:
        raise InputError(f"--price {args.price:g}: a positive number of dollars per hour")
    for name, value, low in (("--prompts", args.prompts, 1), ("--steps", args.steps, 0)):
        if value < low:
            raise InputError(f"{name} {value}: give a number >= {low}")
    start = 1.0 if args.start_rate is None else args.start_rate
    ceiling = 256.0 if args.max_rate is None else args.max_rate
    check_bench_bounds(argparse.Namespace(prompts=args.prompts, start_rate=start, max_rate=ceiling),
                       ("prompts", "start_rate", "max_rate"))
    url = args.url.split("/v1/", 1)[0].rstrip("/")  # the base URL, also when a /v1/... path was given
    if importlib.util.find_spec("vllm") is None:
        raise InputError("hetflow bench serve uses vLLM's benchmark client: install the llm extra (make llm, "
                         "or pip install 'hetflow[llm]')")
    _check_endpoint(url, args.model)
    tokenizer = args.tokenizer or args.model
    figures: dict[str, dict] = {}
    for b in buckets:
        measure = vllm_probe(url, args.model, tokenizer, b, args.prompts, args.seed, slo)
        best, probes = search(measure, start, ceiling, args.steps)
        figures[b.name] = {"rps": best, "probes": [vars(p) for p in probes]}
        if not args.json:
            tried = ", ".join(f"{p.rate:.3g}{'+' if p.passed else '-'}" for p in probes)
            print(f"{b.name} ({b.input_tokens}:{b.output_tokens} tokens): {best:.3g} req/s at {slo.text()} "
                  f"(rates tried, + passed: {tried})", flush=True)
    write_profile(args.profile, args.device, {k: v["rps"] for k, v in figures.items()}, slo, buckets, args.price)
    if args.json:
        print(json.dumps({"device": args.device, "slo": slo.text(), "buckets": figures}, indent=2))
    else:
        print(f"wrote {args.device}'s throughput to {args.profile}" +
              ("" if args.price is not None else " (add its price_per_hour before `hetflow capacity serve`)"))
    return 0


def _check_endpoint(url: str, model: str) -> None:
    """One line at once when nothing answers at ``url`` or it does not serve ``model``."""
    import os

    import requests

    from hetflow.core.errors import InputError

    headers = {"Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}"} if os.environ.get("OPENAI_API_KEY") else {}
    try:
        r = requests.get(url.rstrip("/") + "/v1/models", headers=headers, timeout=10)
    except requests.RequestException as exc:
        raise InputError(f"nothing answers at {url} ({type(exc).__name__}); start the server or fix the URL") from None
    if r.status_code in (401, 403):
        raise InputError(f"{url} refused the key ({r.status_code}): set OPENAI_API_KEY to a key for {model!r}")
    if r.status_code != 200:
        raise InputError(f"{url}/v1/models answered {r.status_code}: is it an OpenAI-compatible endpoint?")
    names = [m.get("id") for m in (r.json().get("data") or []) if isinstance(m, dict)]
    if model not in names:
        raise InputError(f"{url} does not serve {model!r} (it serves: {', '.join(map(str, names)) or 'nothing'})")
