"""``hetflow bench serve --profile``'s parts that need no server: the bucket and SLO syntax, the
verdict on one vLLM benchmark result, the rate search, and the profiles file it writes (read
back by ``hetflow capacity serve``'s own reader). The measurement against a real vLLM engine is
in tests/serving/test_llm_ray.py."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from hetflow.capacity.profile import (KEEP_UP, MIN_RATE, Probe, ProfileBucket, judge, parse_buckets, parse_slo,
                                      search, write_profile)
from hetflow.capacity.serve import plan_serve, read_profiles, read_workload
from hetflow.core.errors import InputError


def test_buckets_and_slo_parse_and_bad_ones_say_what_to_write() -> None:
    assert parse_buckets("short=256:128, long=4096:512") == [ProfileBucket("short", 256, 128),
                                                             ProfileBucket("long", 4096, 512)]
    slo = parse_slo("ttft<=1s,tpot<=100ms", 90)
    assert (slo.ttft_ms, slo.tpot_ms, slo.percentile) == (1000.0, 100.0, 90)
    assert parse_slo("TPOT <= 50 ms", 99).ttft_ms is None
    for bad in ("short", "short=0:8", "a=1:1,a=2:2", "", "x=1:y"):
        with pytest.raises(InputError, match="--buckets"):
            parse_buckets(bad)
    for bad in ("ttft<1s", "latency<=1s", "ttft<=0ms", ""):
        with pytest.raises(InputError, match="--slo"):
            parse_slo(bad, 99)
    with pytest.raises(InputError, match="--percentile"):
        parse_slo("ttft<=1s", 0)


def result(ttft: float, tpot: float, answered: float, failed: int = 0, completed: int = 10) -> dict:
    return {"p99_ttft_ms": ttft, "p99_tpot_ms": tpot, "request_throughput": answered, "failed": failed,
            "completed": completed}


def test_a_probe_passes_only_within_the_slo_without_failures_and_keeping_up() -> None:
    slo = parse_slo("ttft<=1s,tpot<=100ms", 99)
    assert judge(result(900, 90, 4.0), 4.0, slo).passed
    assert not judge(result(1100, 90, 4.0), 4.0, slo).passed  # TTFT over
    assert not judge(result(900, 110, 4.0), 4.0, slo).passed  # TPOT over
    assert not judge(result(900, 90, 4.0, failed=1), 4.0, slo).passed
    assert not judge(result(900, 90, 4.0 * KEEP_UP * 0.99), 4.0, slo).passed  # the queue grows
    assert not judge(result(900, 90, 4.0, completed=0), 4.0, slo).passed
    p90 = parse_slo("ttft<=1s", 90)
    assert judge({"p90_ttft_ms": 500, "request_throughput": 2, "completed": 3}, 2.0, p90).passed



def timed(sends: list[float], latencies: list[float]) -> dict:
    """A probe's result as vLLM's client reports it: each request's send time (on its own clock)
    and latency, the run's duration from the benchmark's start (sends offset from it)."""
    end = max(s + l for s, l in zip(sends, latencies))
    return {**result(900, 90, len(sends) / end), "start_times": [1000.0 + s for s in sends],
            "latencies": latencies, "errors": [""] * len(sends), "duration": end, "completed": len(sends)}


def test_keeping_up_is_judged_by_the_wait_after_the_last_send() -> None:
    slo = parse_slo("ttft<=1s,tpot<=100ms", 99)
    # 4 requests at 2/s, the schedule ending at 2 s: a busy replica answering each in 0.5 s
    # answers 4 / 2.5 s, under KEEP_UP x 2/s, yet it kept up - every request took the same
    busy = timed([0.4, 0.9, 1.5, 2.0], [0.5, 0.5, 0.5, 0.5])
    assert busy["request_throughput"] < KEEP_UP * 2.0
    assert judge(busy, 2.0, slo).passed
    # the same sends on a replica that serves one request a second: the queue grows
    saturated = timed([0.5, 1.0, 1.5, 2.0], [1.0, 1.5, 2.0, 2.5])
    assert not judge(saturated, 2.0, slo).passed
    # without per-request times the answered rate is the measure
    bare = {k: v for k, v in busy.items() if k not in ("start_times", "latencies")}
    assert not judge(bare, 2.0, slo).passed


def knee(capacity: float):
    """A server that keeps up to ``capacity`` req/s and then falls behind; the rates asked, kept."""
    asked: list[float] = []

    def measure(rate: float) -> Probe:
        asked.append(rate)
        ok = rate <= capacity
        return Probe(rate, min(rate, capacity), 100.0 if ok else 5000.0, 10.0, 0, ok)

    return measure, asked


def test_the_search_brackets_the_knee_then_bisects() -> None:
    measure, asked = knee(11.0)
    best, probes = search(measure, 1.0, 256.0, steps=4)
    assert asked[:5] == [1.0, 2.0, 4.0, 8.0, 16.0] and len(asked) == 9  # doubled to the first failure, 4 bisections
    assert 8.0 <= best <= 11.0 and best == max(p.answered for p in probes if p.passed)
    measure, asked = knee(1000.0)
    best, _ = search(measure, 1.0, 20.0, steps=3)
    assert best == 20.0 and asked[-1] == 20.0 and len(asked) == 6  # stops at the ceiling, nothing to bisect
    measure, asked = knee(0.3)
    best, _ = search(measure, 2.0, 256.0, steps=1)
    assert asked[:4] == [2.0, 1.0, 0.5, 0.25] and 0.25 <= best <= 0.3  # halved down to a passing rate
    assert len(asked) == 5 and 0.25 < asked[4] < 0.5  # then one bisection: no rate is probed twice


def test_a_slo_no_rate_meets_profiles_zero_and_the_search_ends() -> None:
    measure, asked = knee(0.0)
    best, _ = search(measure, 1.0, 256.0, steps=3)
    assert best == 0.0 and min(asked) >= MIN_RATE and len(asked) <= 6


def test_the_profile_merges_into_the_file_capacity_serve_reads(tmp_path) -> None:
    path = tmp_path / "profiles.yaml"
    slo = parse_slo("ttft<=1s,tpot<=100ms", 99)
    buckets = [ProfileBucket("short", 256, 128), ProfileBucket("long", 4096, 512)]
    write_profile(path, "MI300X", {"short": 26.0, "long": 5.5}, slo, buckets, price=4.0)
    write_profile(path, "L40S", {"short": 14.0, "long": 0.0}, slo, buckets, price=1.9)
    write_profile(path, "MI300X", {"long": 5.0}, slo, buckets[1:], price=None)  # one bucket re-measured
    throughput, prices, text = read_profiles(yaml.safe_load(path.read_text()), str(path))
    assert throughput == {"MI300X": {"short": 26.0, "long": 5.0}, "L40S": {"short": 14.0, "long": 0.0}}
    assert prices == {"MI300X": 4.0, "L40S": 1.9} and text == slo.text()
    workload = read_workload({"buckets": {"short": 30.0, "long": 4.0}}, "w", {"short", "long"})
    fleet = plan_serve(workload, throughput, prices)
    assert fleet.counts.get("MI300X", 0) >= 1  # only MI300X serves long
    with pytest.raises(InputError, match="SLO"):
        write_profile(path, "H100", {"short": 30.0}, parse_slo("ttft<=2s", 99), buckets, price=4.5)
    assert "H100" not in path.read_text()  # refused before anything was written


def test_the_cli_refuses_bad_input_in_one_line(tmp_path) -> None:
    base = [sys.executable, "-m", "hetflow.cli.main", "bench", "serve", "--url", "http://127.0.0.1:9"]
    cases = [
        (["--profile", str(tmp_path / "p.yaml"), "--model", "m"], "--device"),
        (["--profile", str(tmp_path / "p.yaml"), "--device", "d"], "--model"),
        (["--profile", str(tmp_path / "p.yaml"), "--device", "d", "--model", "m", "--buckets", "x"], "--buckets"),
        (["--profile", str(tmp_path / "p.yaml"), "--device", "d", "--model", "m"], "nothing answers"),
        (["--device", "d"], "only with --profile"),
        (["--profile", str(tmp_path / "p.yaml"), "--device", "d", "--model", "m", "--prompts", "10000000"],
         "--prompts 10,000,000 is more than one run can schedule"),
    ]
    for extra, words in cases:
        done = subprocess.run(base + extra, capture_output=True, text=True, timeout=120)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and words in lines[0], (extra, done.stderr)
        assert "Traceback" not in done.stderr
    assert not (tmp_path / "p.yaml").exists()
