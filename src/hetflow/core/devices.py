"""Which devices: one spelling for every config schema.

Every place a user says what a job, a replica or a pool runs on takes the same ``devices``
section (:class:`DeviceSpec`)::

    devices: cpu                                   # or gpu, auto
    devices: {model: H100}                         # a catalog model (a GPU, so kind gpu)
    devices: {vendor: amd, memory: 40GiB}          # any AMD device with 40 GiB
    devices: {count: 2, min: 1, max: 4, model: MI300X}   # a controller job's gang and range

Each schema takes the keys that mean something for it (:func:`fold_devices` names the others
in its error): a serving model or LLM pool ``kind model vendor memory share strategy`` (one
replica's devices), a training config's ``resources`` ``kind model vendor memory`` (each
rank's), a controller job ``count model vendor memory min max`` (its gang).

The schemas' earlier flat keys (``device``, ``vendor``, ``accelerator``, ``memory``,
``share_devices``, ``strategy``) are still read, silently: they are what the schemas store, and
every config hetflow writes back (``model_dump``, the controller's stored specs, ``--set``
overrides) is in them, so a warning could not tell a user's file from hetflow's own copy. A
controller job's ``devices.type`` (now ``devices.model``) is read with a ``FutureWarning``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hetflow.core.topology import AcceleratorVendor

KINDS = ("auto", "cpu", "gpu")


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
        if isinstance(value, str):
            if value in KINDS:
                return {"kind": value}
            raise ValueError(f"devices {value!r}: write cpu, gpu or auto, or a mapping such as {{model: H100}} "
                             "or {vendor: amd, memory: 40GiB}")
        return value

    def given(self) -> dict[str, Any]:
        """The keys that were set, and their values."""
        return {k: v for k in type(self).model_fields if (v := getattr(self, k)) is not None}


def fold_devices(data: Any, storage: Mapping[str, str], where: str) -> Any:
    """A schema's ``mode="before"`` step: its ``devices`` section (:class:`DeviceSpec`) moved
    into the fields it stores (``storage``: DeviceSpec key -> the schema's field; the flat
    keys, written directly, are read as they are). A key the schema does not take, or the same
    thing given both ways, is a ``ValueError`` (one line, ``where`` the section's name)."""
    if not isinstance(data, Mapping) or "devices" not in data:
        return data
    out = dict(data)
    spec = DeviceSpec.model_validate(out.pop("devices"))
    given = spec.given()
    unknown = sorted(set(given) - set(storage))
    if unknown:
        raise ValueError(f"devices: {', '.join(unknown)} does not apply to {where}; it takes "
                         f"{', '.join(storage)}")
    both = sorted(key for key in given if out.get(storage[key]) is not None)
    if both:
        raise ValueError(f"devices.{both[0]} and {storage[both[0]]} both given: keep devices.{both[0]}")
    for key, value in given.items():
        out[storage[key]] = value
    if "kind" in storage and "kind" not in given and ({"model", "vendor"} & set(given)):
        out[storage["kind"]] = "gpu"  # a model or a vendor is a GPU's
    return out


__all__ = ["DeviceSpec", "KINDS", "fold_devices"]
