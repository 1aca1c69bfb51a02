"""Prices and power of catalog models: ``data/prices.yaml`` (public, cited, dated figures).

Usage::

    from hetflow.accelerators.prices import default_prices
    info = default_prices()["MI300X"]      # PriceInfo; fields are None where no source was found
    info.cloud_usd_per_hour, info.cloud_source, info.tdp_w

Every figure in the file names its source (a URL, or a repository file at a commit) and, where
the source states one, its date; a model with no public figure has none (never a guess). Prices
move: the file records what its sources said, and a user's own prices (``--price``/``--prices``
of ``hetflow capacity train``) override it. Read strictly: an unknown model or key, or a
figure without its source, is an :class:`InputError`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from importlib import resources
from typing import Any

import yaml

from hetflow.core.errors import InputError

SCHEMA = "hetflow.prices/v1"


@dataclass(frozen=True)
class PriceInfo:
    model: str
    cloud_usd_per_hour: float | None = None  # on-demand, per device-hour
    cloud_offering: str | None = None  # provider, instance, region, instance price
    cloud_source: str | None = None
    cloud_date: str | None = None
    list_usd: float | None = None  # purchase price per device
    list_kind: str | None = None  # msrp | estimate
    list_source: str | None = None
    list_date: str | None = None
    tdp_w: float | None = None  # board power per physical package
    tdp_source: str | None = None
    tdp_kind: str | None = None  # vendor | third_party
    notes: str = ""


_KEYS = {f.name for f in fields(PriceInfo)} - {"model"}
_NEEDS_SOURCE = {"cloud_usd_per_hour": "cloud_source", "list_usd": "list_source", "tdp_w": "tdp_source"}


def parse_prices_doc(doc: Any, source: str = "prices.yaml") -> dict[str, PriceInfo]:
    """The file's mapping -> {catalog model: PriceInfo}; model names must be catalog rows."""
    from hetflow.accelerators.catalog import default_catalog

    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or not isinstance(doc.get("prices"), dict):
        raise InputError(f"{source}: expected schema: {SCHEMA} and a prices: mapping")
    catalog = default_catalog()
    out: dict[str, PriceInfo] = {}
    for model, row in doc["prices"].items():
        spec = catalog.find(str(model))
        if spec is None or spec.name != model:
            raise InputError(f"{source}: {model!r} is not a catalog model name")
        row = row or {}
        unknown = set(row) - _KEYS
        if unknown:
            raise InputError(f"{source}: {model}: unknown key(s) {', '.join(sorted(unknown))}")
        for key, src in _NEEDS_SOURCE.items():
            if row.get(key) is not None:
                value = row[key]
                if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                    raise InputError(f"{source}: {model}: {key} must be a positive number, not {value!r}")
                if not row.get(src):
                    raise InputError(f"{source}: {model}: {key} without {src}: every figure names its source")
        out[model] = PriceInfo(model, **{k: row.get(k) for k in _KEYS if k != "notes"}, notes=row.get("notes") or "")
    return out


@functools.cache
def default_prices() -> dict[str, PriceInfo]:
    """The shipped figures (``hetflow/accelerators/data/prices.yaml``)."""
    resource = resources.files("hetflow.accelerators").joinpath("data/prices.yaml")
    return parse_prices_doc(yaml.safe_load(resource.read_text()), "hetflow/accelerators/data/prices.yaml")


def device_watts(model: str) -> float | None:
    """Board power per device (a package's TDP over the devices it holds), None when unknown."""
    from hetflow.accelerators.catalog import default_catalog

    info = default_prices().get(model)
    if info is None or info.tdp_w is None:
        return None
    spec = default_catalog().lookup(model)
    return float(info.tdp_w) / max(spec.devices_per_package, 1)


__all__ = ["PriceInfo", "default_prices", "device_watts", "parse_prices_doc"]
