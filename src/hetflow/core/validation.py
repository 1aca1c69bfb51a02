"""Readable errors for the files hetflow reads: pydantic's validation errors as key paths.

Every configuration hetflow reads (training, tuning, serving, workflow and job files) is a
pydantic model with ``extra="forbid"``. A :class:`pydantic.ValidationError` names the place of
each error by pydantic's location, which has levels the file does not have: the tag of a
discriminated union (``model.mlp.hidden`` for the file's ``model.hidden``) or the member of a
plain union it tried (``train.dict[str,any]``). :func:`field_errors` walks the location along
the model's own fields, keeps only the keys the file has, and words each error for a person:

- an unknown key: ``train.lrr: unknown key (did you mean 'lr'? known keys here: ...)``;
- a missing key: ``name: missing; this field is required``;
- a bad union tag: ``model.kind: must be mlp or gpt``;
- anything else: pydantic's message (without its ``Value error,`` prefix), optionally with the
  value given.

Pure: imports only pydantic.
"""

from __future__ import annotations

import difflib
import typing
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from pydantic import BaseModel, ValidationError


@dataclass(frozen=True)
class FieldError:
    """One error: the key path as the file spells it (list indices as digits) and why."""

    path: tuple[str, ...]
    message: str

    def text(self) -> str:
        return f"{'.'.join(self.path) or '(top level)'}: {self.message}"


def field_errors(exc: ValidationError, root: type[BaseModel], *, show_input: bool = False,
                 hints: Mapping[str, str] | None = None) -> list[FieldError]:
    """The errors of ``exc`` (raised validating ``root``) as key paths and messages.

    ``hints`` replace the message of an error type (``"missing"``), or of an error type at a key
    (``"string_pattern_mismatch:entrypoint"``, which wins). ``show_input`` adds the value given
    (shortened) to messages that do not already say it.
    """
    out = []
    for error in exc.errors():
        kind = error["type"]
        loc = tuple(error["loc"])
        if kind == "extra_forbidden" and loc:  # the last level is the unknown key itself
            path, models = _walk(root, loc[:-1])
            path += (str(loc[-1]),)
        else:
            path, models = _walk(root, loc)
        key = path[-1] if path else ""
        hint = (hints or {}).get(f"{kind}:{key}") or (hints or {}).get(kind)
        if hint is not None:
            message = hint
        elif kind == "extra_forbidden":
            message = _unknown_key(key, sorted(models[0].model_fields) if models else [])
        elif kind == "missing":
            message = "missing; this field is required"
        elif kind == "union_tag_invalid":
            ctx = error.get("ctx", {})
            tags = [t.strip().strip("'\"") for t in str(ctx.get("expected_tags", "")).split(",")]
            message = "must be " + _either([t for t in tags if t])
            tag_key = str(ctx.get("discriminator", "")).strip("'\"")
            path += (tag_key,) if tag_key.isidentifier() else ()  # the key that holds the tag
        else:
            message = error["msg"].removeprefix("Value error, ")
            given = error.get("input")
            if show_input and not kind.startswith("value_error") and not isinstance(given, dict):
                message += f" (got {_short(given)})"
        out.append(FieldError(path, message))
    return out


def describe(exc: ValidationError, root: type[BaseModel], source: str, **options: Any) -> str:
    """``"<source>: <path>: <why>; <path>: <why>"`` - one line for an InputError."""
    return f"{source}: " + "; ".join(e.text() for e in field_errors(exc, root, **options))


def known_keys(root: type[BaseModel], path: Iterable[str]) -> list[str]:
    """The keys allowed in the section at key ``path`` of ``root`` (list indices skipped)."""
    _, models = _walk(root, tuple(path))
    return sorted(models[0].model_fields) if models else []


def _walk(root: type[BaseModel], loc: Iterable[Any]) -> tuple[tuple[str, ...], list[type[BaseModel]]]:
    """Follow ``loc`` through the models' fields: the file's key path, and the section models
    that can be at its end (several while a plain union is undecided)."""
    models: list[type[BaseModel]] = [root]
    path: list[str] = []
    for part in loc:
        if isinstance(part, int) or (isinstance(part, str) and part.isdigit()):
            path.append(str(part))  # a list index: the section stays the list's item type
            continue
        part = str(part)
        owner = next((m for m in models if part in m.model_fields), None)
        if owner is not None:
            path.append(part)
            models = _models_in(owner.model_fields[part].annotation)
        elif models:
            # Not a key of the section: a union member pydantic tried, named by its tag or its
            # type (``mlp``, ``dict[str,any]``). The file has no such level; narrow to it.
            models = [m for m in models if _names(m, part)]
        else:
            path.append(part)  # inside a value that is not a section (a mapping): keep it
    return tuple(path), models


def _names(model: type[BaseModel], label: str) -> bool:
    """Whether ``label`` names ``model`` as a union member: its class name or a tag value."""
    if model.__name__ == label:
        return True
    for field in model.model_fields.values():
        if typing.get_origin(field.annotation) is typing.Literal and label in typing.get_args(field.annotation):
            return True
    return False


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The section models inside ``X``, ``X | None``, ``list[X]``, ``Annotated[A | B, ...]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        out += [m for m in _models_in(arg) if m not in out]
    return out


def _unknown_key(key: str, known: list[str]) -> str:
    hint = difflib.get_close_matches(key, known, n=1)
    did_you_mean = f"did you mean {hint[0]!r}? " if hint else ""
    return f"unknown key ({did_you_mean}known keys here: {', '.join(known)})"


def _either(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


__all__ = ["FieldError", "describe", "field_errors", "known_keys"]
