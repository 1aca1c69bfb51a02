"""A search space written in YAML -> Ray Tune's search space, checked against the training config.

The ``space`` section names fields of the training config (section, then field) and gives each
one distribution::

    space:
      train:
        lr: {loguniform: [1.0e-4, 0.3]}        # log-uniform float in [low, high]
        weight_decay: {uniform: [0.0, 0.1]}    # uniform float in [low, high]
        batch_size: {choice: [32, 64, 128]}    # one of the listed values
      model:
        hidden: {choice: [[64], [128, 128]]}   # values may be lists (layer widths)

Integer ranges are inclusive at both ends: ``{randint: [16, 256]}`` is any whole number from 16
to 256, ``{qrandint: [16, 256, 16]}`` any multiple of 16 from 16 to 256 (both ends multiples of
the step, so Ray's own sampler and Optuna's agree on the values).

Only the ``model``, ``data`` and ``train`` sections may be searched: a trial is one process,
so ``layout``, ``resources`` and ``checkpoint`` belong to the tuning run, not to the space.

Every distribution is checked against the base training config when the space is parsed: the
field must exist and its extreme values (each choice, both ends of a range) must be accepted by
the training config's own validation, so a bad space fails before any trial starts, with the
key path (``space.train.lr``) and what to write instead.

Optuna's categorical distribution takes only None, bool, int, float and str; a choice among
lists (``model.hidden``) is therefore handed to Tune as the values' JSON text and decoded
before the trial builds its config (:meth:`SearchSpace.overrides`).
"""

from __future__ import annotations

import difflib
import json
import math
from dataclasses import dataclass
from typing import Any, Iterable

from hetflow.core.errors import InputError

DISTRIBUTIONS = ("uniform", "loguniform", "choice", "randint", "qrandint")
SEARCHABLE_SECTIONS = ("model", "data", "train")
EXAMPLES = {
    "uniform": "{uniform: [0.0, 0.1]}",
    "loguniform": "{loguniform: [1.0e-4, 0.3]}",
    "choice": "{choice: [32, 64, 128]}",
    "randint": "{randint: [16, 256]}",
    "qrandint": "{qrandint: [16, 256, 16]}",
}
_SCALARS = (type(None), bool, int, float, str)


@dataclass(frozen=True)
class Param:
    """One searched field: ``section.field`` and its distribution.

    ``args`` are the parsed arguments: (low, high) for uniform/loguniform/randint (inclusive),
    (low, high, step) for qrandint, the values for choice. ``encoded`` means the choice values
    are passed to Tune as JSON text (see the module docstring).
    """

    section: str
    field: str
    kind: str
    args: tuple[Any, ...]
    encoded: bool = False

    @property
    def name(self) -> str:
        return f"{self.section}.{self.field}"

    def domain(self) -> Any:
        """The Ray Tune domain (``tune.loguniform(...)`` etc.) for this parameter."""
        from ray import tune

        if self.kind == "uniform":
            return tune.uniform(*self.args)
        if self.kind == "loguniform":
            return tune.loguniform(*self.args)
        if self.kind == "randint":
            low, high = self.args
            return tune.randint(low, high + 1)  # Ray's randint excludes its upper end
        if self.kind == "qrandint":
            return tune.qrandint(*self.args)  # Ray's qrandint includes its upper end
        values = [json.dumps(v) for v in self.args] if self.encoded else list(self.args)
        return tune.choice(values)

    def decode(self, value: Any) -> Any:
        """A value Tune sampled -> the value the training config takes."""
        if self.encoded:
            return json.loads(value)
        if self.kind in ("randint", "qrandint"):
            return int(value)  # numpy integers from Ray's samplers
        if self.kind in ("uniform", "loguniform"):
            return float(value)
        return value

    def extremes(self) -> tuple[Any, ...]:
        """Values that stand for the whole distribution when checking it against the config."""
        if self.kind == "choice":
            return self.args
        return self.args[:2]


@dataclass(frozen=True)
class SearchSpace:
    """The parsed ``space`` section: the searched parameters, in file order."""

    params: tuple[Param, ...]

    def to_tune(self) -> dict[str, dict[str, Any]]:
        """Ray Tune's ``param_space``: ``{section: {field: domain}}``."""
        space: dict[str, dict[str, Any]] = {}
        for p in self.params:
            space.setdefault(p.section, {})[p.field] = p.domain()
        return space

    def overrides(self, sampled: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """A trial's sampled config (``{section: {field: value}}``, as Tune passes it) ->
        the section overrides for ``TrainConfig.with_overrides``, values decoded."""
        out: dict[str, dict[str, Any]] = {}
        for p in self.params:
            try:
                value = sampled[p.section][p.field]
            except (KeyError, TypeError):
                raise KeyError(f"trial config has no value for {p.name}: {sampled!r}") from None
            out.setdefault(p.section, {})[p.field] = p.decode(value)
        return out

    def flat(self, sampled: dict[str, Any]) -> dict[str, Any]:
        """``{"train.lr": 0.01, ...}`` for tables and files."""
        return {f"{s}.{f}": v for s, fields in self.overrides(sampled).items()
                for f, v in fields.items()}

    def describe(self, sampled: dict[str, Any]) -> str:
        """One line for people: ``lr=0.0123 hidden=[64, 64]``."""
        return " ".join(f"{name.split('.', 1)[1]}={_short(v)}"
                        for name, v in self.flat(sampled).items())

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return json.dumps(value) if isinstance(value, (list, tuple)) else str(value)


def parse_space(data: Any, base: Any | None = None, where: str = "space") -> SearchSpace:
    """Parse the ``space`` mapping; raise InputError naming the key path of every mistake.

    ``base`` is the base ``TrainConfig``: fields are checked to exist in it and the extreme
    values of each distribution to pass its validation. Without it only the form is checked.
    """
    if not isinstance(data, dict) or not data:
        raise InputError(f"{where}: expected a mapping of training-config sections to fields, "
                         f"e.g. {{train: {{lr: {EXAMPLES['loguniform']}}}}}; got {data!r}")
    errors: list[str] = []
    params: list[Param] = []
    for section, fields in data.items():
        path = f"{where}.{section}"
        if section not in SEARCHABLE_SECTIONS:
            hint = _did_you_mean(str(section), SEARCHABLE_SECTIONS)
            errors.append(f"{path}: cannot be searched ({hint}searchable sections: "
                          f"{', '.join(SEARCHABLE_SECTIONS)}; a trial runs in one process, so "
                          "layout, resources and checkpoint are set for the whole run)")
            continue
        if not isinstance(fields, dict) or not fields:
            errors.append(f"{path}: expected a mapping of field -> distribution, "
                          f"e.g. {{lr: {EXAMPLES['loguniform']}}}; got {fields!r}")
            continue
        known = _fields_of(base, section) if base is not None else None
        for field, spec in fields.items():
            field_path = f"{path}.{field}"
            if known is not None and field not in known:
                hint = _did_you_mean(str(field), known)
                errors.append(f"{field_path}: not a field of the training config's {section} "
                              f"section ({hint}fields: {', '.join(sorted(known))})")
                continue
            try:
                param = _parse_param(str(section), str(field), spec, field_path)
            except InputError as exc:
                errors.append(str(exc))
                continue
            if base is not None:
                errors.extend(_check_against(base, param, field_path))
            params.append(param)
    if errors:
        raise InputError("; ".join(errors))
    return SearchSpace(tuple(params))


TRAINABLE_SECTION = "config"  # the section a trainable's flat parameters are kept under


def parse_flat_space(data: Any, where: str = "space") -> SearchSpace:
    """A trainable's space, ``{name: distribution}``: the names are its dict's keys (only the
    form of each distribution is checked: the trainable is the judge of its values)."""
    if not isinstance(data, dict) or not data:
        raise InputError(f"{where}: expected a mapping of names to distributions, e.g. "
                         f"{{lr: {EXAMPLES['loguniform']}}}; got {data!r}")
    errors: list[str] = []
    params: list[Param] = []
    for name, spec in data.items():
        try:
            params.append(_parse_param(TRAINABLE_SECTION, str(name), spec, f"{where}.{name}"))
        except InputError as exc:
            errors.append(str(exc))
    if errors:
        raise InputError("; ".join(errors))
    return SearchSpace(tuple(params))


def _did_you_mean(word: str, known: Iterable[str]) -> str:
    hint = difflib.get_close_matches(word, list(known), n=1)
    return f"did you mean {hint[0]!r}? " if hint else ""


def _fields_of(base: Any, section: str) -> list[str]:
    part = getattr(base, section)
    return [name for name in type(part).model_fields if name != "kind"]


def _parse_param(section: str, field: str, spec: Any, path: str) -> Param:
    if not isinstance(spec, dict) or len(spec) != 1:
        raise InputError(
            f"{path}: expected one distribution, e.g. {EXAMPLES['loguniform']} or "
            f"{EXAMPLES['choice']}; got {spec!r} (a fixed value belongs in the base training "
            "config, not in the space)")
    ((kind, args),) = spec.items()
    if kind not in DISTRIBUTIONS:
        hint = _did_you_mean(str(kind), DISTRIBUTIONS)
        raise InputError(f"{path}: unknown distribution {kind!r} ({hint}known: "
                         f"{', '.join(DISTRIBUTIONS)})")
    if kind == "choice":
        return _parse_choice(section, field, args, path)
    if kind in ("uniform", "loguniform"):
        return Param(section, field, kind, _parse_float_range(kind, args, path))
    return Param(section, field, kind, _parse_int_range(kind, args, path))


def _parse_choice(section: str, field: str, args: Any, path: str) -> Param:
    if not isinstance(args, list) or not args:
        raise InputError(f"{path}: choice needs a non-empty list of values, e.g. "
                         f"{EXAMPLES['choice']}; got {args!r}")
    encoded = not all(isinstance(v, _SCALARS) for v in args)
    keys = [json.dumps(v, sort_keys=True) for v in args]
    if len(set(keys)) != len(keys):
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        raise InputError(f"{path}: choice lists {', '.join(dupes)} more than once")
    return Param(section, field, "choice", tuple(args), encoded=encoded)


def _number(value: Any, path: str, kind: str) -> float:
    # PyYAML reads 1e-4 (no dot) as a string; accept numeric text rather than fail on it.
    if isinstance(value, bool):
        raise InputError(f"{path}: {kind} bounds must be numbers, got {value!r}")
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise InputError(f"{path}: {kind} bounds must be numbers, got {value!r}") from None
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(f"{path}: {kind} bounds must be finite numbers, got {value!r}")
    return float(value)


def _parse_float_range(kind: str, args: Any, path: str) -> tuple[float, float]:
    if not isinstance(args, list) or len(args) != 2:
        raise InputError(f"{path}: {kind} needs [low, high], e.g. {EXAMPLES[kind]}; got {args!r}")
    low, high = (_number(v, path, kind) for v in args)
    if not low < high:
        raise InputError(f"{path}: {kind} needs low < high; got [{low:g}, {high:g}]")
    if kind == "loguniform" and low <= 0:
        raise InputError(f"{path}: loguniform needs 0 < low (a log scale has no zero); got low "
                         f"{low:g} - use uniform, or a small positive low such as 1.0e-6")
    return low, high


def _parse_int_range(kind: str, args: Any, path: str) -> tuple[int, ...]:
    size = 3 if kind == "qrandint" else 2
    form = "[low, high, step]" if kind == "qrandint" else "[low, high]"
    if not isinstance(args, list) or len(args) != size:
        raise InputError(f"{path}: {kind} needs {form}, e.g. {EXAMPLES[kind]}; got {args!r}")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in args):
        raise InputError(f"{path}: {kind} takes whole numbers {form}; got {args!r}")
    low, high = args[0], args[1]
    if not low < high:
        raise InputError(f"{path}: {kind} needs low < high; got [{low}, {high}]")
    if kind == "qrandint":
        step = args[2]
        if step < 1:
            raise InputError(f"{path}: qrandint needs a step >= 1; got {step}")
        if low % step or high % step:
            raise InputError(f"{path}: qrandint needs low and high to be multiples of the step "
                             f"{step} (Ray rounds samples to multiples of it); got [{low}, {high}]"
                             f" - e.g. [{_round_up(low, step)}, {high - high % step}, {step}]")
    return tuple(args)


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step


def _check_against(base: Any, param: Param, path: str) -> list[str]:
    """Each extreme value of ``param`` must be accepted by the training config."""
    errors = []
    annotation = type(getattr(base, param.section)).model_fields[param.field].annotation
    if annotation is int and param.kind in ("uniform", "loguniform"):
        return [f"{path}: {param.section}.{param.field} is a whole number but {param.kind} "
                f"draws fractions; use {{randint: [low, high]}}, {{qrandint: [low, high, step]}} "
                "or a choice"]
    for value in param.extremes():
        try:
            base.with_overrides(**{param.section: {param.field: value}})
        except InputError as exc:
            reason = str(exc).removeprefix("overrides: ")
            errors.append(f"{path}: the value {json.dumps(value)} is not accepted by the "
                          f"training config ({reason})")
    return errors


__all__ = ["DISTRIBUTIONS", "SEARCHABLE_SECTIONS", "Param", "SearchSpace", "parse_space"]
