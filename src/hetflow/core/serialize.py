"""Stable, versioned JSON form of the topology types.

``snapshot_to_dict`` / ``snapshot_from_dict`` (and the node variants) round-trip exactly.
Reading is strict: an unknown key, a wrong type or a missing field raises InputError naming
its path (``nodes[2].devices[0].memory_bytes``) and what was expected.

Schema versions: ``hetflow.node/v1`` and ``hetflow.snapshot/v1``. A reader accepts only the
versions it knows; a new field means a new version.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import types
import typing
from typing import Any

from hetflow.core.errors import InputError
from hetflow.core.topology import (
    Allocation,
    ClusterSnapshot,
    Device,
    Link,
    LinkKind,
    NodeTopology,
    PcieLevel,
    Vendor,
)

NODE_SCHEMA = "hetflow.node/v1"
SNAPSHOT_SCHEMA = "hetflow.snapshot/v1"


def _encode(value: Any) -> Any:
    if isinstance(value, PcieLevel):
        return value.name
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value):
        return {
            f.name: _encode(getattr(value, f.name))
            for f in dataclasses.fields(value)
        }
    if isinstance(value, (tuple, list)):
        return [_encode(v) for v in value]
    return value


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _decode(tp: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        assert len(inner) == 1, tp
        return _decode(inner[0], value, path)
    if origin is tuple:
        (item_tp, _ellipsis) = typing.get_args(tp)
        if not isinstance(value, list):
            raise InputError(f"{path}: expected a list, got {type(value).__name__}")
        return tuple(_decode(item_tp, v, f"{path}[{i}]") for i, v in enumerate(value))
    if tp is PcieLevel:
        if not isinstance(value, str) or value not in PcieLevel.__members__:
            raise InputError(f"{path}: expected one of {list(PcieLevel.__members__)}, got {value!r}")
        return PcieLevel[value]
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except (ValueError, TypeError):  # (TypeError: an unhashable value, a list)
            raise InputError(
                f"{path}: expected one of {[m.value for m in tp]}, got {value!r}"
            ) from None
    if dataclasses.is_dataclass(tp):
        return _decode_dataclass(tp, value, path)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InputError(f"{path}: expected a number, got {value!r}")
        try:
            return float(value)
        except OverflowError:  # a whole number past float's range
            raise InputError(f"{path}: a {len(str(abs(value)))}-digit number is too large") from None
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputError(f"{path}: expected an integer, got {value!r}")
        return value
    if tp in (str, bool):
        if not isinstance(value, tp):
            raise InputError(f"{path}: expected {_type_name(tp)}, got {value!r}")
        return value
    raise AssertionError(f"no decoder for {tp}")


def _decode_dataclass(cls: Any, value: Any, path: str) -> Any:
    if not isinstance(value, dict):
        raise InputError(f"{path or 'top level'}: expected an object, got {type(value).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise InputError(
            f"{path or 'top level'}: unknown key {unknown[0]!r}; known keys: {sorted(fields)}"
        )
    kwargs = {}
    for name, f in fields.items():
        sub = f"{path}.{name}" if path else name
        if name not in value:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise InputError(f"{sub}: missing required field")
            continue
        kwargs[name] = _decode(hints[name], value[name], sub)
    try:
        return cls(**kwargs)
    except AssertionError as e:  # invariants of the types (ordered links, unique names)
        raise InputError(f"{path or 'top level'}: {e}") from None


def node_to_dict(node: NodeTopology) -> dict[str, Any]:
    return {"schema": NODE_SCHEMA, **_encode(node)}


def snapshot_to_dict(snap: ClusterSnapshot) -> dict[str, Any]:
    d = _encode(snap)
    d["nodes"] = [_encode(n) for n in snap.nodes]
    return {"schema": SNAPSHOT_SCHEMA, **d}


def _check_schema(data: Any, expected: str, path: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise InputError(f"{path}: expected a JSON object with \"schema\": \"{expected}\"")
    schema = data.get("schema")
    if schema != expected:
        raise InputError(
            f"{path}: schema is {schema!r}, this hetflow reads {expected!r}"
            " (write it with `hetflow inventory --json`)"
        )
    rest = dict(data)
    rest.pop("schema")
    return rest


def node_from_dict(data: Any, path: str = "") -> NodeTopology:
    return _decode_dataclass(NodeTopology, _check_schema(data, NODE_SCHEMA, path or "node"), path)


def snapshot_from_dict(data: Any) -> ClusterSnapshot:
    return _decode_dataclass(ClusterSnapshot, _check_schema(data, SNAPSHOT_SCHEMA, "snapshot"), "")


def dumps(obj: ClusterSnapshot | NodeTopology) -> str:
    d = snapshot_to_dict(obj) if isinstance(obj, ClusterSnapshot) else node_to_dict(obj)
    return json.dumps(d, indent=2, sort_keys=False)


def _not_a_number(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def loads_snapshot(text: str, source: str = "<json>") -> ClusterSnapshot:
    try:
        data = json.loads(text, parse_constant=_not_a_number)
    except json.JSONDecodeError as e:
        raise InputError(f"{source}:{e.lineno}: not valid JSON ({e.msg})") from None
    except (ValueError, RecursionError) as e:  # NaN, over 4300 digits, nested too deeply
        raise InputError(f"{source}: not valid JSON ({e})") from None
    if isinstance(data, dict) and data.get("schema") == NODE_SCHEMA:
        return ClusterSnapshot(nodes=(node_from_dict(data),))
    try:
        return snapshot_from_dict(data)
    except InputError as e:
        raise InputError(f"{source}: {e}") from None


__all__ = [
    "NODE_SCHEMA", "SNAPSHOT_SCHEMA", "node_to_dict", "node_from_dict", "snapshot_to_dict",
    "snapshot_from_dict", "dumps", "loads_snapshot", "Allocation", "Device", "Link", "LinkKind",
    "Vendor",
]
