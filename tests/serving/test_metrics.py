"""The serving metrics: counters and histograms as prometheus_client writes them, read back with
prometheus_client's own parser; several replicas' reports summed as the front door sums them."""

from __future__ import annotations

import pickle

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from hetflow.workloads.serve.metrics import (
    METRIC_TYPES,
    RENAMED,
    GatewayMetrics,
    Histogram,
    ReplicaReports,
)


def _page(metrics: GatewayMetrics, accept: str | None = None) -> dict:
    """family name -> (type, {(sample name, sorted labels): value}), from the parser."""
    body, content_type = metrics.render(accept)
    parse = openmetrics_families if "openmetrics" in content_type else text_string_to_metric_families
    out = {}
    for family in parse(body.decode()):
        out[family.name] = (family.type, {(s.name, tuple(sorted(s.labels.items()))): s.value
                                          for s in family.samples})
    return out


def _value(page: dict, sample: str, **labels: str) -> float | None:
    for _, samples in page.values():
        for (name, got), value in samples.items():
            if name == sample and dict(got) == labels:
                return value
    return None


def _exposed_names(page: dict) -> dict[str, str]:
    """Exposed metric name -> type (a counter family ``x`` is exposed as ``x_total``)."""
    return {name + ("_total" if kind == "counter" else ""): kind for name, (kind, _) in page.items()}


def test_histogram_is_cumulative() -> None:
    h = Histogram((1, 2, 4))
    for value in (1, 1, 3, 9):
        h.observe(value)
    assert h.cumulative() == [("1", 2), ("2", 2), ("4", 3), ("+Inf", 4)]
    assert h.count == 4 and h.total == 14


def _one_replica() -> GatewayMetrics:
    m = GatewayMetrics()
    m.served("digits", "digits", 0.004, batch_requests=8)
    m.served("digits", "digits-int8", 0.010, batch_requests=1)
    m.answered("-", 404)
    m.retried("digits")
    m.set_replicas({("digits", "app.digits"): 2})
    return m


@pytest.mark.parametrize("accept", [None, "application/openmetrics-text; version=1.0.0"],
                         ids=["text-0.0.4", "openmetrics"])
def test_page_parses_with_the_names_types_and_values(accept) -> None:
    page = _page(_one_replica(), accept)
    assert _exposed_names(page) == METRIC_TYPES  # every family, each with its type
    assert _value(page, "hetflow_serve_requests_total", model="digits", code="200") == 2
    assert _value(page, "hetflow_serve_requests_total", model="-", code="404") == 1
    assert _value(page, "hetflow_serve_fallbacks_total", model="digits", served_by="digits-int8") == 1
    assert _value(page, "hetflow_serve_retries_total", model="digits") == 1
    duration = "hetflow_serve_request_duration_seconds"
    assert _value(page, duration + "_count", model="digits") == 2
    assert _value(page, duration + "_sum", model="digits") == pytest.approx(0.014)
    assert _value(page, duration + "_bucket", model="digits", le="0.005") == 1
    assert _value(page, duration + "_bucket", model="digits", le="0.01") == 2
    assert _value(page, duration + "_bucket", model="digits", le="+Inf") == 2
    # batch sizes are counted under the model that ran the forward pass
    batch = "hetflow_serve_request_batch_size"
    assert _value(page, batch + "_bucket", model="digits", le="4.0") == 0
    assert _value(page, batch + "_bucket", model="digits", le="8.0") == 1
    assert _value(page, batch + "_count", model="digits-int8") == 1
    assert _value(page, "hetflow_serve_replicas_running", model="digits", deployment="app.digits") == 2


def test_content_type_follows_the_scrapers_accept_header() -> None:
    m = _one_replica()
    assert m.render()[1].startswith("text/plain; version=0.0.4")
    assert m.render("application/openmetrics-text; version=1.0.0")[1].startswith("application/openmetrics-text")
    assert m.render("application/openmetrics-text")[0].rstrip().endswith(b"# EOF")


def test_label_values_are_escaped() -> None:
    m = GatewayMetrics()
    m.answered('we"ird\\mo\ndel', 422)
    page = _page(m)
    assert _value(page, "hetflow_serve_requests_total", model='we"ird\\mo\ndel', code="422") == 1


def test_replica_reports_sum_over_replicas_and_never_go_down() -> None:
    reports = ReplicaReports()
    a, b, gateway = _one_replica(), GatewayMetrics(), GatewayMetrics()
    for _ in range(3):
        b.served("digits", "digits", 0.5, batch_requests=2)
    gateway.served("digits", "digits-int8", 0.02, batch_requests=1)  # a fallback answer
    older_b = pickle.loads(pickle.dumps(b))  # what b sent before its latest request
    b.answered("digits", 422)
    # as the replicas' reports reach the front door (pickled, through Ray); b's older report
    # overtakes its newer one on the way and must not replace it
    for source, m in (("a", a), ("b", b), ("gw", gateway), ("b", older_b)):
        reports.report(source, pickle.loads(pickle.dumps(m)))
    page = _page(reports.total())
    assert _value(page, "hetflow_serve_requests_total", model="digits", code="200") == 2 + 3 + 1
    assert _value(page, "hetflow_serve_requests_total", model="digits", code="422") == 1
    assert _value(page, "hetflow_serve_fallbacks_total", model="digits", served_by="digits-int8") == 2
    duration = "hetflow_serve_request_duration_seconds"
    assert _value(page, duration + "_count", model="digits") == 6
    assert _value(page, duration + "_sum", model="digits") == pytest.approx(0.014 + 1.5 + 0.02)
    assert _value(page, duration + "_bucket", model="digits", le="0.64") == 6
    assert _value(page, duration + "_bucket", model="digits", le="0.32") == 3
    assert _value(page, "hetflow_serve_request_batch_size_bucket", model="digits", le="2.0") == 3
    # a replica that died keeps its last counts in the sum
    reports.report("b2", GatewayMetrics())
    assert _value(_page(reports.total()), "hetflow_serve_requests_total", model="digits", code="200") == 6


def test_json_form_keeps_its_shape() -> None:
    data = _one_replica().to_dict()
    assert data["batch_requests"]["digits-int8"]["count"] == 1
    assert data["batch_requests"]["digits"]["buckets"]["8"] == 1
    assert {"model": "digits", "code": 200, "count": 2} in data["requests"]


def test_renamed_names_are_gone_and_new_ones_follow_the_rules() -> None:
    page = _page(_one_replica())
    exposed = _exposed_names(page)
    assert not set(RENAMED) & set(exposed)
    assert set(RENAMED.values()) <= set(exposed)
