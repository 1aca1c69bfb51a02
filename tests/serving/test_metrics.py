"""The gateway's counters and histograms, in Prometheus text and JSON."""

from __future__ import annotations

from hetflow.workloads.serve.metrics import GatewayMetrics, Histogram


def test_histogram_is_cumulative() -> None:
    h = Histogram((1, 2, 4))
    for value in (1, 1, 3, 9):
        h.observe(value)
    assert h.cumulative() == [("1", 2), ("2", 2), ("4", 3), ("+Inf", 4)]
    assert h.count == 4 and h.total == 14


def test_render_counts_requests_fallbacks_and_batches() -> None:
    m = GatewayMetrics()
    m.served("digits", "digits", 0.004, batch_requests=8)
    m.served("digits", "digits-int8", 0.010, batch_requests=1)
    m.answered("-", 404)
    m.retried("digits")
    m.set_replicas({("digits", "app.digits"): 2})
    text = m.render()
    assert 'hetflow_serve_requests_total{model="digits",code="200"} 2' in text
    assert 'hetflow_serve_requests_total{model="-",code="404"} 1' in text
    assert 'hetflow_serve_fallbacks_total{model="digits",served_by="digits-int8"} 1' in text
    assert 'hetflow_serve_retries_total{model="digits"} 1' in text
    assert 'hetflow_serve_request_batch_requests_bucket{model="digits",le="4"} 0' in text
    assert 'hetflow_serve_request_batch_requests_bucket{model="digits",le="8"} 1' in text
    assert 'hetflow_serve_request_seconds_count{model="digits"} 2' in text
    assert 'hetflow_serve_replicas_running{model="digits",deployment="app.digits"} 2' in text
    data = m.to_dict()
    assert data["batch_requests"]["digits-int8"]["count"] == 1
    assert {"model": "digits", "code": 200, "count": 2} in data["requests"]
