"""The Open Inference Protocol (KServe v2 REST), for the models hetflow serves. Pure (numpy).

    GET  /v2/health/live | /v2/health/ready        200 when live / ready
    GET  /v2/models/<name>                         metadata: inputs and outputs, typed
    GET  /v2/models/<name>/ready                   200 when the model (or its fallback) answers
    POST /v2/models/<name>/infer                   typed tensors in, typed tensors out

One input tensor, ``input``: shape ``[rows, width]`` (``[width]`` is one row), datatype
``FP32``/``FP64``/``FP16`` for a float model (``INT64``/``INT32``/``UINT8`` tokens for the text
model); ``data`` as a flat or nested JSON list, or raw little-endian bytes with the binary
extension (``Inference-Header-Content-Length``; what ``tritonclient`` sends by default). Two
output tensors: ``predictions`` (``INT64 [rows]``) and ``probabilities`` (``FP32 [rows,
classes]``); both unless ``outputs`` names some; each as JSON ``data`` or, when its
``parameters.binary_data`` is true, as raw bytes after the JSON header.

The values go through the same checks as the JSON API (:func:`protocol.check_array`): a wrong
datatype, shape, size or value is a 400 with a message, never an error inside the model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from hetflow.workloads.serve.protocol import (
    InputSpec,
    PredictRequest,
    RequestError,
    as_array,
    check_array,
    parse_json,
)

HEADER_LENGTH = "inference-header-content-length"
INPUT_NAME = "input"
OUTPUTS = ("predictions", "probabilities")
# datatypes (KServe v2 names) -> numpy, accepted per input kind
DTYPES = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64, "INT8": np.int8,
          "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "UINT8": np.uint8,
          "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64, "BOOL": np.bool_}
ACCEPTED = {"float": ("FP32", "FP64", "FP16"), "int": ("INT64", "INT32", "UINT8")}
REQUEST_KEYS = {"id", "parameters", "inputs", "outputs"}
TENSOR_KEYS = {"name", "shape", "datatype", "parameters", "data"}


@dataclass(frozen=True)
class InferRequest:
    request: PredictRequest
    id: str | None
    outputs: tuple[str, ...]  # which outputs to return
    binary: frozenset[str]  # outputs to return as raw bytes


def metadata(model: str, spec: InputSpec, platform: str = "hetflow-pytorch") -> dict[str, Any]:
    """``GET /v2/models/<name>``."""
    kind = ACCEPTED[spec.kind][0]
    return {"name": model, "versions": ["1"], "platform": platform,
            "inputs": [{"name": INPUT_NAME, "datatype": kind, "shape": [-1, spec.width]}],
            "outputs": [{"name": "predictions", "datatype": "INT64", "shape": [-1]},
                        {"name": "probabilities", "datatype": "FP32",
                         "shape": [-1, spec.outputs]}]}


def parse_infer(body: bytes, header_length: str | None, spec: InputSpec, *, model: str,
                max_rows: int) -> InferRequest:
    """A checked infer request, or RequestError (400 for what the client sent wrong, 413 for
    too many rows)."""
    if header_length is not None:
        # (ASCII digits only: str.isdigit() also takes '²', which int() refuses)
        if not (header_length.isascii() and header_length.isdigit()) or int(header_length) > len(body):
            raise RequestError(400, f"Inference-Header-Content-Length {header_length} does not "
                                    f"fit the {len(body)}-byte body")
        head, tail = body[:int(header_length)], body[int(header_length):]
    else:
        head, tail = body, b""
    doc = parse_json(head)
    if not isinstance(doc, dict):
        raise RequestError(400, "an infer request is a JSON object with 'inputs'")
    unknown = sorted(set(doc) - REQUEST_KEYS)
    if unknown:
        raise RequestError(400, f"unknown key(s) {', '.join(map(repr, unknown))}; an infer "
                                f"request takes {', '.join(sorted(REQUEST_KEYS))}")
    inputs = doc.get("inputs")
    if not isinstance(inputs, list) or len(inputs) != 1 or not isinstance(inputs[0], dict):
        raise RequestError(400, f"'inputs' must be a list of one tensor named {INPUT_NAME!r} "
                                f"(model {model} takes one input)")
    tensor = inputs[0]
    unknown = sorted(set(tensor) - TENSOR_KEYS)
    if unknown:
        raise RequestError(400, f"unknown key(s) {', '.join(map(repr, unknown))} in the input "
                                f"tensor; it takes {', '.join(sorted(TENSOR_KEYS))}")
    if tensor.get("name") != INPUT_NAME:
        raise RequestError(400, f"the input tensor must be named {INPUT_NAME!r}, not "
                                f"{tensor.get('name')!r}")
    array = _tensor(tensor, tail, spec, model)
    rows = check_array(array, spec, max_rows=max_rows, model=model)
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise RequestError(400, "the request's 'parameters' must be an object")
    wanted, binary = _outputs(doc.get("outputs"))
    if doc.get("outputs") is None and params.get("binary_data_output") is True:
        binary = frozenset(wanted)  # tritonclient asks so when it names no outputs
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise RequestError(400, "'id' must be a string")
    return InferRequest(PredictRequest(model, rows, "probabilities" in wanted), request_id,
                        wanted, binary)


def _tensor(tensor: dict[str, Any], tail: bytes, spec: InputSpec, model: str) -> np.ndarray:
    datatype = tensor.get("datatype")
    accepted = ACCEPTED[spec.kind]
    if datatype not in accepted:
        raise RequestError(400, f"input datatype {datatype!r} is not accepted by model {model}; "
                                f"send {' or '.join(accepted)} ({spec.description})")
    shape = tensor.get("shape")
    if (not isinstance(shape, list) or not 1 <= len(shape) <= 2
            or not all(type(d) is int and d > 0 for d in shape)):
        raise RequestError(400, f"input shape must be [rows, {spec.width}] with positive "
                                f"whole numbers, got {shape!r}")
    if len(shape) == 1:
        shape = [1, shape[0]]
    if shape[1] != spec.width:
        raise RequestError(400, f"input shape {shape} has {shape[1]} values per row; model "
                                f"{model} takes [rows, {spec.width}] ({spec.description})")
    count = shape[0] * shape[1]
    dtype = np.dtype(DTYPES[datatype]).newbyteorder("<")
    params = tensor.get("parameters") or {}
    if not isinstance(params, dict):
        raise RequestError(400, "the input tensor's 'parameters' must be an object")
    size = params.get("binary_data_size")
    if size is not None:
        if "data" in tensor:
            raise RequestError(400, "the input has both 'data' and binary_data_size; send one")
        if type(size) is not int or size != count * dtype.itemsize or size > len(tail):
            raise RequestError(400, f"binary input of {size!r} bytes does not match shape "
                                    f"{shape} of {datatype} ({count * dtype.itemsize} bytes)")
        return np.frombuffer(tail[:size], dtype=dtype).reshape(shape)
    data = tensor.get("data")
    if not isinstance(data, list):
        raise RequestError(400, "the input tensor needs 'data' (a list of numbers) or binary "
                                "data (parameters.binary_data_size)")
    flat = _flatten(data)
    if len(flat) != count:
        raise RequestError(400, f"input data has {len(flat)} values; shape {shape} needs {count}")
    kinds = (int, float) if spec.kind == "float" else (int,)
    for i, value in enumerate(flat):
        if type(value) not in kinds:
            raise RequestError(400, f"input data[{i}] is {type(value).__name__ if value is not None else 'null'}; "
                                    f"{datatype} takes {'numbers' if spec.kind == 'float' else 'whole numbers'}")
    with np.errstate(over="ignore", invalid="ignore"):
        return as_array(flat, np.float64 if spec.kind == "float" else np.int64).reshape(shape)


def _flatten(data: list[Any]) -> list[Any]:
    if all(not isinstance(v, list) for v in data):
        return data
    out: list[Any] = []
    for v in data:
        if isinstance(v, list):
            if any(isinstance(x, list) for x in v):
                raise RequestError(400, "input data nests deeper than [rows][values]")
            out.extend(v)
        else:
            out.append(v)
    return out


def _outputs(requested: Any) -> tuple[tuple[str, ...], frozenset[str]]:
    if requested is None:
        return OUTPUTS, frozenset()
    if not isinstance(requested, list) or not requested:
        raise RequestError(400, "'outputs' must be a non-empty list of {\"name\": ...}")
    names, binary = [], set()
    for item in requested:
        name = item.get("name") if isinstance(item, dict) else None
        if name not in OUTPUTS:
            raise RequestError(400, f"unknown output {name!r}; this model has "
                                    f"{', '.join(OUTPUTS)}")
        names.append(name)
        params = item.get("parameters") or {}
        if isinstance(params, dict) and params.get("binary_data") is True:
            binary.add(name)
    return tuple(names), frozenset(binary)


def infer_response(model: str, req: InferRequest, result: dict[str, Any],
                   served_by: str) -> tuple[bytes, dict[str, str]]:
    """The response body and its extra headers for one answered request."""
    arrays = {"predictions": np.asarray(result["predictions"], dtype="<i8")}
    if "probabilities" in req.outputs:
        arrays["probabilities"] = np.asarray(result["probabilities"], dtype="<f4")
    outputs, blobs = [], []
    for name in req.outputs:
        array = arrays[name]
        out: dict[str, Any] = {"name": name, "datatype": "INT64" if name == "predictions"
                               else "FP32", "shape": list(array.shape)}
        if name in req.binary:
            blob = array.tobytes()
            out["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            out["data"] = array.ravel().tolist()
        outputs.append(out)
    doc: dict[str, Any] = {"model_name": model, "model_version": "1", "outputs": outputs,
                           "parameters": {"served_by": served_by,
                                          "batch_requests": result["batch"]["requests"]}}
    if req.id is not None:
        doc["id"] = req.id
    head = json.dumps(doc).encode()
    if not blobs:
        return head, {}
    return head + b"".join(blobs), {"Inference-Header-Content-Length": str(len(head))}


__all__ = ["HEADER_LENGTH", "InferRequest", "infer_response", "metadata", "parse_infer"]
