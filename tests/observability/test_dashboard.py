"""The Grafana dashboard asks only for series hetflow exports, by the tags they carry, and
queries each by its type (counters and histograms through ``rate()``, gauges as they are).

A renamed metric or tag would leave a panel silently empty; this test ties the dashboard JSON to
the names and types in ``hetflow.runtime.metrics`` (with the ``ray_`` prefix Ray's Prometheus
endpoint adds, checked against a live endpoint in test_metrics_ray.py) and in
``hetflow.workloads.serve.metrics`` (the serving front door's ``/metrics``, no prefix).
"""

from __future__ import annotations

import json
import re

from hetflow.runtime.metrics import (
    DEVICE_TAGS,
    JOB_TAGS,
    LINK_TAGS,
    METRIC_TYPES,
    PROMETHEUS_PREFIX,
)
from hetflow.workloads.serve.metrics import METRIC_TYPES as SERVE_METRIC_TYPES
from tests.conftest import REPO

DASHBOARD = REPO / "deploy" / "grafana" / "hetflow-dashboard.json"
SERIES = re.compile(r"\b(?:ray_)?hetflow_[a-z_]+")
TAG_USE = re.compile(r"(?:by \(([^)]*)\))|(?:\{([^}]*)\})")
SERVE_TAGS = {"model", "code", "served_by", "deployment", "le", "key", "upstream", "pool"}
RATE_OF = re.compile(r"\b(?:rate|irate|increase)\(\s*$")


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _exprs(dashboard: dict) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def _families() -> dict[str, str]:
    """Every metric family a panel may query: exposed name -> type."""
    return {**{PROMETHEUS_PREFIX + n: t for n, t in METRIC_TYPES.items()}, **SERVE_METRIC_TYPES}


def _samples() -> dict[str, tuple[str, str]]:
    """Every sample name Prometheus stores -> (its family, the family's type)."""
    out = {}
    for family, kind in _families().items():
        names = ([family + s for s in ("_bucket", "_sum", "_count")] if kind == "histogram" else
                 [family + s for s in ("_sum", "_count")] if kind == "summary" else [family])
        out.update({name: (family, kind) for name in names})
    return out


def test_every_queried_series_is_exported_and_every_export_is_shown() -> None:
    samples = _samples()
    queried = {m for e in _exprs(_dashboard()) for m in SERIES.findall(e)}
    assert queried <= set(samples), f"panels query series hetflow does not export: {queried - set(samples)}"
    shown = {samples[m][0] for m in queried}
    assert shown == set(_families()), f"exported series with no panel: {set(_families()) - shown}"


def test_counters_and_histograms_are_queried_through_rate_and_gauges_never() -> None:
    samples = _samples()
    checked = 0
    for expr in _exprs(_dashboard()):
        for match in SERIES.finditer(expr):
            _, kind = samples[match.group(0)]
            through_rate = bool(RATE_OF.search(expr[:match.start()]))
            assert through_rate == (kind in ("counter", "histogram", "summary")), (
                f"{match.group(0)} ({kind}) {'inside' if through_rate else 'outside'} rate() in {expr!r}")
            checked += 1
    assert checked >= len(_families())


def test_panels_group_and_filter_only_by_tags_the_series_carry() -> None:
    tags = set(DEVICE_TAGS) | set(LINK_TAGS) | set(JOB_TAGS) | SERVE_TAGS
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
    for name, series in (("node", "ray_hetflow_"), ("job", "ray_hetflow_"), ("served_model", "hetflow_serve_")):
        found = SERIES.findall(variables[name]["definition"])
        assert found and all(f.startswith(series) for f in found)
        assert set(found) <= set(_samples()), variables[name]["definition"]
    for expr in _exprs(d):  # every $variable used is defined
        assert set(re.findall(r"\$(\w+)", expr)) - {"__rate_interval"} <= set(variables), expr
