"""Which devices: one spelling, one stored type, for every config schema.

Every place a user says what a job, a replica or a pool runs on takes the same ``devices``
section (:class:`DeviceSpec`), and every schema stores it as its ``devices`` field::

    devices: cpu                                   # or gpu, auto
    devices: {model: H100}                         # a catalog model (a GPU, so kind gpu)
    devices: {vendor: amd, memory: 40GiB}          # any AMD device with 40 GiB
    devices: {count: 2, min: 1, max: 4, model: MI300X}   # a controller job's gang and range

Each schema takes the keys that mean something for it (a :class:`DeviceKeys`; the error for
another key names them) and fills its defaults: a serving model ``kind model vendor memory
share strategy`` (one replica's devices; kind ``auto``, share ``true``, strategy ``pack``), an
LLM pool ``kind model vendor memory share`` (kind ``cpu`` or ``gpu``, default ``cpu``; share
``false``), a training config's ``resources`` ``kind model vendor memory`` (each rank's; kind
``auto``), a workflow's serve stage ``kind memory``, a tuning trial ``memory``, a controller
job ``count model vendor memory min max scaling`` (its gang; ``DeviceRequest``). A ``model`` or
a ``vendor`` without a ``kind`` is a GPU's. Readers read ``config.devices.<key>``, and
everything hetflow writes back (``model_dump``: only the keys that are set; the controller's
stored specs; ``with_overrides``) is in this spelling; ``--set SECTION.devices.KEY=VALUE``
sets one key of a section's ``devices`` (:func:`override`).

The schemas' earlier flat keys (``device``, ``vendor``, ``accelerator``, ``memory``,
``share_devices``, ``strategy`` beside the section's other fields) are read until the next
release, into ``devices``, with one ``FutureWarning`` per section naming what to write instead,
e.g. ``resources.device: write resources.devices: {kind: cpu} (device is read until the next
release)`` (``hetflow`` prints it as one ``hetflow: deprecated: ...`` line); a ``--set`` of a
flat key is read and warned about the same way. A flat ``accelerator`` or ``vendor`` without
``device`` kept the schema's default kind, so the suggested spelling writes that kind out and
the meaning stays; a flat key whose value is null (an earlier dump's "not set") is dropped
without a word. A controller job's ``devices.type`` (now ``devices.model``) is read with a
``FutureWarning`` too. The same thing given both ways is an error.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

from hetflow.core.topology import AcceleratorVendor

KINDS = ("auto", "cpu", "gpu")
FLAT = {"device": "kind", "accelerator": "model", "vendor": "vendor", "memory": "memory",
        "share_devices": "share", "strategy": "strategy"}
"""The earlier flat keys (read until the next release) -> the :class:`DeviceSpec` key each is."""


class DeviceSpec(BaseModel):
    """The devices something runs on (each key optional; what a schema leaves out is its
    default)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    kind: Literal["auto", "cpu", "gpu"] | None = None
    """``cpu``, ``gpu``, or ``auto`` (GPUs where the cluster has them, else CPUs). A ``model``
    or ``vendor`` asks for a GPU."""
    count: int | None = Field(None, ge=0)
    """How many devices (a controller job's gang; 0: a CPU job)."""
    model: str | None = None
    """Only devices of this catalog model (``H100``, ``MI300X``, ``L40S``; the planner's rule,
    ``hetflow plan --model``)."""
    vendor: AcceleratorVendor | None = None
    """Only devices of this vendor."""
    memory: int | str | None = None
    """Device memory each needs, e.g. ``20GiB``."""
    share: bool | None = None
    """Whether replicas may share a device by memory (serving)."""
    strategy: Literal["pack", "spread"] | None = None
    """``pack``: fill partly used devices and nodes first; ``spread``: emptiest first (serving)."""
    min: int | None = Field(None, ge=1)
    """An elastic job's fewest devices."""
    max: int | None = Field(None, ge=1)
    """An elastic job's most devices."""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        return shorthand(value)

    @field_validator("memory")
    @classmethod
    def _memory_reads(cls, value: int | str | None) -> int | str | None:
        if value is not None:
            from hetflow.core.errors import InputError
            from hetflow.core.units import parse_bytes

            try:
                parse_bytes(value)
            except InputError as exc:
                raise ValueError(str(exc)) from None
        return value

    @model_serializer(mode="wrap")
    def _given_only(self, handler: Any) -> Any:
        """Written back with the keys that are set only (what a schema does not take is never
        written, so it reads back without a word)."""
        out = handler(self)
        return {k: v for k, v in out.items() if v is not None} if isinstance(out, dict) else out

    def given(self) -> dict[str, Any]:
        """The keys that were set, and their values."""
        return {k: v for k in type(self).model_fields if (v := getattr(self, k)) is not None}

    @property
    def memory_bytes(self) -> int | None:
        """``memory`` in bytes (None when not given)."""
        from hetflow.core.units import parse_bytes

        return None if self.memory is None else parse_bytes(self.memory)


def shorthand(value: Any) -> Any:
    """``cpu`` / ``gpu`` / ``auto`` -> ``{kind: ...}``; any other string is an error (one line)."""
    if isinstance(value, str):
        if value in KINDS:
            return {"kind": value}
        raise ValueError(f"devices {value!r}: write cpu, gpu or auto, or a mapping such as {{model: H100}} "
                         "or {vendor: amd, memory: 40GiB}")
    return value


@dataclass(frozen=True)
class DeviceKeys:
    """What one schema's ``devices`` takes: its keys, its defaults, the kinds it runs on."""

    where: str
    """The schema in an error (``a served model``)."""
    keys: tuple[str, ...]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    kinds: tuple[str, ...] = KINDS

    def default(self) -> DeviceSpec:
        """The section when nothing is given (a field's ``default_factory``)."""
        return DeviceSpec(**self.defaults)

    def read(self, data: Any, section: str) -> Any:
        """A schema's ``mode="before"`` step: its ``devices`` section (a mapping, a shorthand or
        a :class:`DeviceSpec`) with the earlier flat keys folded in (each section that has them
        warns once, ``section`` its key path such as ``resources``) and the defaults filled.
        A key the schema does not take, the same thing given both ways or a kind it does not
        run on is a ``ValueError`` (one line)."""
        if not isinstance(data, Mapping):
            return data
        out = dict(data)
        raw = shorthand(out.pop("devices", None))
        if isinstance(raw, DeviceSpec):
            raw = raw.given()
        if raw is not None and not isinstance(raw, Mapping):
            raise ValueError(f"devices: expected cpu, gpu, auto or a mapping such as {{model: H100}}, "
                             f"got {type(raw).__name__}")
        given = {k: v for k, v in (raw or {}).items() if v is not None}
        unknown = [k for k in given if k not in self.keys]
        if unknown:
            raise ValueError(f"devices: {', '.join(map(str, unknown))} does not apply to {self.where}; "
                             f"it takes {', '.join(self.keys)}")
        flat: dict[str, Any] = {}  # flat key -> value, in the order written
        for name in [k for k in out if k in FLAT and FLAT[k] in self.keys]:
            value = out.pop(name)
            if value is None:
                continue  # an earlier dump's "not set"
            if FLAT[name] in given:
                raise ValueError(f"devices.{FLAT[name]} and {name} both given: keep devices.{FLAT[name]}")
            flat[name] = value
        if flat:
            written = {**given, **{FLAT[n]: v for n, v in flat.items()}}
            if ("kind" in self.keys and "kind" not in written and {"model", "vendor"} & set(written)
                    and self.defaults.get("kind") not in (None, "gpu")):
                # flat, a model or vendor left the kind as it was: said so, the meaning is kept
                written = {"kind": self.defaults["kind"], **written}
            names = ", ".join(flat)
            keys = ", ".join(f"{section}.{n}" for n in flat)
            warnings.warn(f"{keys}: write {section}.devices: {_inline(written)} ({names} "
                          f"{'is' if len(flat) == 1 else 'are'} read until the next release)",
                          FutureWarning, stacklevel=2)
            given = written
        if "kind" in self.keys and "kind" not in given and ({"model", "vendor"} & set(given)):
            given["kind"] = "gpu"  # a model or a vendor is a GPU's
        kind = given.get("kind", self.defaults.get("kind"))
        if kind is not None and kind in KINDS and kind not in self.kinds:
            raise ValueError(f"devices.kind {kind} is not for {self.where}: write "
                             f"{' or '.join(self.kinds)}")
        out["devices"] = {**self.defaults, **given}
        return out


def _inline(values: Mapping[str, Any]) -> str:
    """``{kind: gpu, share: false}``: a mapping as it is written in YAML, on one line."""
    def text(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        return str(getattr(v, "value", v))
    return "{" + ", ".join(f"{k}: {text(v)}" for k, v in values.items()) + "}"


def override(section: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """A dumped section with ``values`` over it (``with_overrides``, ``--set``): a ``devices``
    mapping merges into the section's, key by key; an earlier flat key replaces the same key of
    the section's ``devices`` and is read (and warned about) as a file's would be."""
    out = {**section}
    devices = dict(out.get("devices") or {})
    for key, value in values.items():
        if key == "devices" and isinstance(value, Mapping):
            devices = {**(devices or {}), **value}
        elif key == "devices":
            devices = shorthand(value)
        else:
            if key in FLAT and isinstance(devices, dict):
                devices.pop(FLAT[key], None)
            out[key] = value
    if "devices" in out or devices:
        out["devices"] = devices
    return out


__all__ = ["DeviceKeys", "DeviceSpec", "FLAT", "KINDS", "override", "shorthand"]
