"""The Grafana dashboard asks only for series hetflow exports, by the tags they carry.

A renamed gauge or tag would leave a panel silently empty; this test ties the dashboard JSON to
the names in ``hetflow.runtime.metrics`` (with the ``ray_`` prefix Ray's Prometheus endpoint
adds, checked against a live endpoint in test_metrics_ray.py).
"""

from __future__ import annotations

import json
import re

from hetflow.runtime.metrics import (
    DEVICE_TAGS,
    JOB_TAGS,
    LINK_TAGS,
    METRIC_NAMES,
    PROMETHEUS_PREFIX,
)
from tests.conftest import REPO

DASHBOARD = REPO / "deploy" / "grafana" / "hetflow-dashboard.json"
SERIES = re.compile(r"\bray_hetflow_[a-z_]+")
TAG_USE = re.compile(r"(?:by \(([^)]*)\))|(?:\{([^}]*)\})")


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _exprs(dashboard: dict) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def test_every_queried_series_is_exported_and_every_export_is_shown() -> None:
    exported = {PROMETHEUS_PREFIX + name for name in METRIC_NAMES}
    queried = {m for e in _exprs(_dashboard()) for m in SERIES.findall(e)}
    assert queried <= exported, f"panels query series hetflow does not export: {queried - exported}"
    assert exported <= queried, f"exported series with no panel: {exported - queried}"


def test_panels_group_and_filter_only_by_tags_the_series_carry() -> None:
    tags = set(DEVICE_TAGS) | set(LINK_TAGS) | set(JOB_TAGS)
    for expr in _exprs(_dashboard()):
        for by, selector in TAG_USE.findall(expr):
            used = {t.strip() for t in by.split(",") if t.strip()}
            used |= {m.split("=")[0].strip() for m in selector.split(",") if "=" in m}
            assert used <= tags, f"{expr!r} uses tags {used - tags}"


def test_dashboard_is_importable_grafana_json() -> None:
    d = _dashboard()
    assert d["title"] and d["uid"] == "hetflow-overview"
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for p in d["panels"]:
        assert {"x", "y", "w", "h"} <= set(p["gridPos"])
        assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}" and p["targets"]
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    assert "ray_hetflow_" in variables["node"]["definition"]
