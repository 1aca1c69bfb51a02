"""The HTTP request and response format, and the checks that turn bad input into a 4xx.

Pure (numpy only): the gateway calls :func:`parse_predict` on the raw body before anything
reaches a model replica, so a replica never sees malformed input.

Requests (JSON)::

    POST /v1/models/<name>/predict   {"inputs": [[...], ...], "probabilities": false}
    POST /v1/predict                 {"model": "<name>", "inputs": [[...], ...]}

``inputs`` is a list of rows; each row has exactly the model's width (64 pixel values in 0..1
for the digits MLP; ``seq_len`` byte tokens for the text model). ``model`` may be left out of
``/v1/predict`` (the default model answers). Responses::

    200 {"model": "digits", "served_by": "digits", "fallback": false,
         "predictions": [3, 7], "batch": {"requests": 4, "rows": 5}, "replica": "..."}

Errors are ``{"error": "<what was wrong and how to fix it>"}`` with, in order of the checks:
405 wrong method, 404 unknown path or model, 413 body over ``limits.max_body_bytes`` or more
rows than ``limits.max_rows``, 415 not JSON, 400 malformed JSON or wrong keys, 422 wrong shape
or dtype or a value out of range.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

PREDICT_KEYS = {"model", "inputs", "probabilities"}


@dataclass(frozen=True)
class InputSpec:
    """What one row of a model's input looks like."""

    kind: Literal["float", "int"]  # JSON numbers (not booleans), or whole numbers only
    width: int  # values per row
    low: float | None = None  # inclusive bounds of each value, when the model has them
    high: float | None = None
    outputs: int = 10  # classes (or vocabulary) the model predicts over
    description: str = ""

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.float32 if self.kind == "float" else np.int64)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "width": self.width, "low": self.low, "high": self.high,
                "outputs": self.outputs, "description": self.description}


class RequestError(Exception):
    """A request refused with an HTTP status (always 4xx) and a message for the client."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        assert 400 <= status < 500, status
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param  # the request field at fault, where a protocol's errors name it


@dataclass(frozen=True)
class PredictRequest:
    model: str
    rows: np.ndarray  # (n, width), the model's dtype
    probabilities: bool


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(body: bytes) -> Any:
    """Strict JSON (no NaN/Infinity); RequestError 400 with the parser's position otherwise."""
    try:
        return json.loads(body.decode("utf-8"), parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise RequestError(400, "the body is not UTF-8 text; send JSON") from None
    except json.JSONDecodeError as exc:
        raise RequestError(400, f"malformed JSON at line {exc.lineno} column {exc.colno}: "
                                f"{exc.msg}") from None
    except (ValueError, RecursionError) as exc:
        raise RequestError(400, f"malformed JSON: {exc}") from None


def parse_predict(body: bytes, specs: dict[str, InputSpec], *, path_model: str | None,
                  default_model: str, max_rows: int) -> PredictRequest:
    """Check a predict body against the named model's input; raise RequestError when it
    does not fit. ``path_model`` is the model named in the URL (None for ``/v1/predict``)."""
    doc = parse_json(body)
    if not isinstance(doc, dict):
        raise RequestError(400, f"expected a JSON object with 'inputs', got a JSON "
                                f"{_json_kind(doc)}")
    unknown = sorted(set(doc) - PREDICT_KEYS)
    if unknown:
        raise RequestError(400, f"unknown key(s) {', '.join(map(repr, unknown))}; a predict "
                                f"request takes {', '.join(sorted(PREDICT_KEYS))}")
    model = _model_name(doc, path_model, default_model)
    spec = specs.get(model)
    if spec is None:
        raise RequestError(404, f"unknown model {model!r}; served models: "
                                f"{', '.join(sorted(specs))}")
    probabilities = doc.get("probabilities", False)
    if not isinstance(probabilities, bool):
        raise RequestError(400, "'probabilities' must be true or false")
    if "inputs" not in doc:
        raise RequestError(400, f"missing 'inputs': a list of rows of {spec.width} values")
    rows = parse_rows(doc["inputs"], spec, max_rows=max_rows, model=model)
    return PredictRequest(model, rows, probabilities)


def _model_name(doc: dict[str, Any], path_model: str | None, default_model: str) -> str:
    named = doc.get("model")
    if named is not None and not isinstance(named, str):
        raise RequestError(400, "'model' must be a string (a model name)")
    if path_model is not None:
        if named is not None and named != path_model:
            raise RequestError(400, f"the body names model {named!r} but the URL names "
                                    f"{path_model!r}; leave 'model' out of the body")
        return path_model
    return named if named is not None else default_model


def parse_rows(inputs: Any, spec: InputSpec, *, max_rows: int, model: str) -> np.ndarray:
    """``inputs`` (parsed JSON) -> an (n, width) array of the model's dtype, or RequestError."""
    if not isinstance(inputs, list) or not inputs:
        raise RequestError(422, f"'inputs' must be a non-empty list of rows (each a list of "
                                f"{spec.width} numbers), got {_json_kind(inputs)}")
    if len(inputs) > max_rows:
        raise RequestError(413, f"{len(inputs)} rows is more than the limit of {max_rows} per "
                                "request; split the request")
    for i, row in enumerate(inputs):
        if not isinstance(row, list):
            raise RequestError(422, f"inputs[{i}] must be a list of {spec.width} numbers, got "
                                    f"a JSON {_json_kind(row)} (wrap a single row in a list)")
        if len(row) != spec.width:
            raise RequestError(422, f"inputs[{i}] has {len(row)} values; model {model} takes "
                                    f"{spec.width} per row ({spec.description})")
        _check_values(row, i, spec)
    return check_array(as_array(inputs, np.float64), spec, max_rows=max_rows, model=model)


def as_array(values: list[Any], dtype: Any) -> np.ndarray:
    """Checked JSON numbers -> a numpy array, or RequestError 422 for a whole number too large
    for ``dtype`` (JSON has no size limit: ``1e999`` is refused by the parser, ``10**400``
    written out in digits is not)."""
    try:
        return np.asarray(values, dtype=dtype)
    except OverflowError:
        raise RequestError(422, f"inputs hold a whole number too large for "
                                f"{np.dtype(dtype).name}") from None


def check_array(array: np.ndarray, spec: InputSpec, *, max_rows: int, model: str) -> np.ndarray:
    """An (n, width) array of any numeric dtype -> the model's dtype, or RequestError: too many
    rows (413), a value out of the model's range, not finite or too large (422)."""
    if len(array) > max_rows:
        raise RequestError(413, f"{len(array)} rows is more than the limit of {max_rows} per "
                                "request; split the request")
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        raise RequestError(422, "inputs hold a value that is not finite")
    if spec.low is not None and (array < spec.low).any():
        raise RequestError(422, f"inputs hold a value below {spec.low:g}: {model} takes "
                                f"{spec.description}")
    if spec.high is not None and (array > spec.high).any():
        raise RequestError(422, f"inputs hold a value above {spec.high:g}: {model} takes "
                                f"{spec.description}")
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow becomes inf, refused below
        rows = array.astype(spec.dtype)
    if spec.kind == "float" and not np.isfinite(rows).all():
        raise RequestError(422, "inputs hold a number too large for float32")
    return rows


def _check_values(row: list[Any], i: int, spec: InputSpec) -> None:
    # bool is an int subclass in Python: a JSON true/false must not pass as 1/0.
    allowed = (int, float) if spec.kind == "float" else (int,)
    for j, value in enumerate(row):
        if type(value) not in allowed:
            want = "a number" if spec.kind == "float" else "a whole number"
            raise RequestError(422, f"inputs[{i}][{j}] is a JSON {_json_kind(value)}; "
                                    f"expected {want} ({spec.description})")
        if isinstance(value, float) and not math.isfinite(value):
            raise RequestError(422, f"inputs[{i}][{j}] is not finite")


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list" if value else "empty list"
    return "object"


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}).encode()


__all__ = ["InputSpec", "PredictRequest", "RequestError", "as_array", "check_array", "error_body",
           "parse_json",
           "parse_predict", "parse_rows"]
