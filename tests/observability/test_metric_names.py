"""Every metric hetflow exposes is named by Prometheus' naming rules, the renamed ones are listed
for users in docs/observability.md, and the link counter is fed as the vendor counts.

Rules (https://prometheus.io/docs/practices/naming/): snake case under ``hetflow_``; ``_total``
exactly on counters (and nowhere in other names); times taken as ``_duration_seconds``; a base-unit suffix (``_bytes``, ``_seconds``, ``_watts``, FLOP/s as
``_flops``, fractions as ``_ratio``) unless the value is a plain count; "utilization" as Ray and
DCGM spell it, and only as a ratio; no scaled units (``_tflops``, ``_milliseconds``, ...).
"""

from __future__ import annotations

import re

import pytest

from hetflow.runtime import metrics as runtime
from hetflow.runtime.metrics import CounterFeed
from hetflow.workloads.serve import metrics as serving
from tests.conftest import REPO

ALL = {**runtime.METRIC_TYPES, **serving.METRIC_TYPES}
UNIT_SUFFIXES = ("_ratio", "_bytes", "_seconds", "_watts", "_flops")
# Plain counts (no unit to name), and one rate a job reports itself (documented).
COUNTS = {
    "hetflow_cluster_accelerators", "hetflow_cluster_devices_held", "hetflow_cluster_free_devices",
    "hetflow_cluster_queue_length", "hetflow_job_devices_held", "hetflow_serve_replicas_running",
    "hetflow_serve_request_batch_size", "hetflow_job_samples_per_second",
    "hetflow_upstream_up",  # a 0/1 state, as Prometheus's own `up`
    "hetflow_llm_replicas", "hetflow_llm_replicas_wanted",
    "hetflow_llm_replicas_answering", "hetflow_llm_requests_running", "hetflow_llm_requests_waiting",
    "hetflow_llm_routing_weight",  # HAProxy's server weight, 1..256
    "hetflow_llm_capacity_tokens_per_second",  # a rate in tokens, as samples_per_second
}
SCALED = re.compile(r"_(?:k|m|g|t|p|kilo|mega|giga|tera|milli|micro|nano)(?:flops|bytes|seconds|watts)\b"
                    r"|_(?:kib|mib|gib|kb|mb|gb|ms|us|ns|percent)\b")


@pytest.mark.parametrize("name", sorted(ALL))
def test_name_follows_the_rules(name: str) -> None:
    kind = ALL[name]
    assert re.fullmatch(r"hetflow_[a-z][a-z0-9]*(?:_[a-z0-9]+)+", name), name
    assert name.endswith("_total") == (kind == "counter"), f"{name} is a {kind}"
    if kind != "counter":
        assert "_total_" not in name, f"{name}: _total reads as a counter"
    if name.endswith("_seconds"):
        assert name.endswith("_duration_seconds"), f"{name}: a time taken is a _duration_seconds"
    assert not SCALED.search(name), f"{name}: use the base unit"
    assert "utilisation" not in name, name
    if "utilization" in name:
        assert name.endswith("_utilization_ratio"), name
    base = name.removesuffix("_total")
    assert base.endswith(UNIT_SUFFIXES) or name in COUNTS or kind == "counter", (
        f"{name}: name its unit ({', '.join(UNIT_SUFFIXES)}) or list it as a plain count")


def test_counts_list_names_only_exported_ones() -> None:
    assert COUNTS <= set(ALL)


def test_renamed_names_are_gone_and_their_successors_exported() -> None:
    for renamed in (runtime.RENAMED, serving.RENAMED):
        assert not set(renamed) & set(ALL), "an old name is still exported"
        assert set(renamed.values()) <= set(ALL)


def _doc_rows(heading: str) -> list[list[str]]:
    """The table rows under ``heading`` in docs/observability.md, cells stripped of backticks."""
    text = (REPO / "docs" / "observability.md").read_text()
    section = text.split(heading, 1)[1].split("\n#", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0].startswith("hetflow_"):
            rows.append(cells)
    return rows


def test_docs_table_of_renamed_metrics_is_the_code_s() -> None:
    rows = _doc_rows("### Renamed metrics")
    assert {r[0]: r[1] for r in rows} == {**runtime.RENAMED, **serving.RENAMED}
    assert len(rows) == len(runtime.RENAMED) + len(serving.RENAMED)


def test_docs_reference_lists_every_metric_with_its_type() -> None:
    rows = _doc_rows("## Metrics reference")
    assert {r[0]: r[1] for r in rows} == ALL


# ---- the link counter, fed from the vendor's cumulative counter --------------------------------


def test_counter_feed_adds_what_the_vendor_counted() -> None:
    feed, exported = CounterFeed(), 0
    # first reading: the whole count (the driver's traffic so far), then the increases
    for reading in (5_000, 5_000, 7_500, 10_000):
        exported += feed.increment("nvlink-tx", reading)
    assert exported == 10_000


def test_counter_feed_after_a_reset_or_wrap_never_goes_down() -> None:
    feed = CounterFeed()
    readings = [1_000, 4_000, 300, 900]  # the driver reloaded (or the counter wrapped) after 4000
    increments = [feed.increment(("gpu0", "pcie", "rx"), r) for r in readings]
    assert increments == [1_000, 3_000, 300, 600]
    assert all(i >= 0 for i in increments)
    assert sum(increments) == 4_000 + 900  # the count before the reset, plus the one since


def test_counter_feed_keeps_keys_apart() -> None:
    feed = CounterFeed()
    assert feed.increment(("gpu0", "tx"), 10) == 10
    assert feed.increment(("gpu1", "tx"), 50) == 50
    assert feed.increment(("gpu0", "tx"), 15) == 5
