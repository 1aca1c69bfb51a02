"""Metrics of a run: per-job rows, utilisation series, effective and best-type utilisation."""

from __future__ import annotations

import pytest

from hetflow.sim.metrics import job_rows, summarise, utilisation, utilisation_series

from tests.sim.world import cluster, job, node, simulate, table


def _run():
    # One fast and one slow GPU; job x is 2x faster on fast; fifo puts y (first) on fast.
    model = cluster(node("f", "fast", 1), node("s", "slow", 1))
    speeds = table({("x", 1, "fast"): 2.0, ("x", 1, "slow"): 1.0, ("y", 1, "fast"): 1.0, ("y", 1, "slow"): 1.0})
    return simulate(model, [job(0, "y", 0, 1, 100), job(1, "x", 0, 1, 200)], "fifo", speeds)


def test_rows_and_summary() -> None:
    r = _run()
    rows = {row["job_id"]: row for row in job_rows(r)}
    # y on fast 0..100; x on slow 0..200 (its best would be 100 s on fast: slowdown 2)
    assert rows["0"]["device_types"] == "fast" and rows["1"]["device_types"] == "slow"
    assert rows["1"]["jct_s"] == 200.0 and rows["1"]["slowdown"] == pytest.approx(2.0)
    assert rows["0"]["slowdown"] == pytest.approx(1.0) and rows["0"]["queue_s"] == 0.0
    s = summarise(r, 1.5)
    assert s["avg_jct_s"] == 150.0 and s["p95_jct_s"] == pytest.approx(195.0) and s["wall_s"] == 1.5
    assert s["avg_slowdown"] == pytest.approx(1.5) and s["max_slowdown"] == pytest.approx(2.0)


def test_utilisation_kinds() -> None:
    r = _run()
    u = utilisation(r)
    # Demand (2 GPUs) equals capacity on [0, 100): contended. Both GPUs busy: allocated 1.0.
    # Both run at their type's ideal rate: effective 1.0. Relative to the best type, x on slow
    # counts 1/2: best-type = (1 + 0.5) / 2 = 0.75.
    assert u["contended_share"] == pytest.approx(0.5)
    assert u["utilisation"] == pytest.approx(1.0)
    assert u["effective_utilisation"] == pytest.approx(1.0)
    assert u["best_type_utilisation"] == pytest.approx(0.75)
    assert u["unallocated_gpu_share"] == pytest.approx(0.0)


def test_utilisation_series_integrates_exactly() -> None:
    r = _run()
    series = utilisation_series(r, bins=4)
    # span [0, 200] in 4 bins of 50 s: both GPUs busy until 100, then one.
    assert series["allocated"] == pytest.approx([1.0, 1.0, 0.5, 0.5])
    assert series["t"] == pytest.approx([25, 75, 125, 175])
