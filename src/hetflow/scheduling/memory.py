"""Estimate the device memory one rank of a job needs, from the model's parameter count.

Formula (per device)::

    bytes = params * bytes_per_param(mode, dtype, optimizer) * activation_factor / (tp * pp)
            + runtime_overhead_bytes

* ``bytes_per_param`` for **training** with mixed precision (weights and gradients in a 16-bit
  dtype, an fp32 master copy, optimizer state in fp32):

  - ``adam`` / ``adamw``: 2 (weights) + 2 (grads) + 4 (master) + 4 + 4 (two moments) = 16
  - ``sgd`` (with momentum): 2 + 2 + 4 + 4 = 12

  In fp32 training the 16-bit copies become 4 bytes and there is no master copy
  (adam: 4 + 4 + 8 = 16 as well; sgd: 12).
* ``bytes_per_param`` for **inference**: the dtype's size (fp32 4, bf16/fp16 2, fp8/int8 1,
  int4 0.5).
* ``activation_factor``: room for activations, KV cache and allocator slack, as a multiple of
  the state above. Defaults: training 1.125 (so Adam mixed precision is 18 bytes/param before
  the split, the usual 16-18 bytes/param rule), inference 1.2. Activations grow with batch
  size and sequence length; pass a larger factor (or a measured ``--mem``) for long sequences
  or big batches.
* The split: tensor and pipeline parallelism divide the model over ``tp * pp`` devices; data
  parallelism replicates it (no ZeRO/FSDP sharding assumed: pass ``shard`` > 1 for the
  data-parallel degree the optimizer state is sharded over).
* ``runtime_overhead_bytes``: the CUDA/HIP context, communicator buffers and the framework's
  own allocations per device, default 1 GiB.

These are estimates for choosing devices, not guarantees; a measured peak is better.
"""

from __future__ import annotations

import math

from hetflow.core.errors import InputError

GIB = 1024**3
DEFAULT_RUNTIME_OVERHEAD_BYTES = 1 * GIB

DTYPE_BYTES: dict[str, float] = {
    "fp32": 4, "float32": 4, "tf32": 4,
    "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "half": 2,
    "fp8": 1, "float8": 1, "int8": 1,
    "int4": 0.5, "fp4": 0.5,
}
OPTIMIZER_STATE_BYTES_FP32: dict[str, float] = {  # fp32 optimizer state per parameter
    "adam": 8, "adamw": 8, "sgd": 4, "none": 0,
}
MODES = ("train", "inference")
DEFAULT_ACTIVATION_FACTOR = {"train": 1.125, "inference": 1.2}


def bytes_per_param(mode: str = "train", dtype: str = "bf16", optimizer: str = "adam") -> float:
    """State bytes per parameter before activations (see the module docstring)."""
    size = _dtype_size(dtype)
    if mode == "inference":
        return size
    if mode != "train":
        raise InputError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    opt = optimizer.lower()
    if opt not in OPTIMIZER_STATE_BYTES_FP32:
        raise InputError(
            f"unknown optimizer {optimizer!r}; expected one of {', '.join(OPTIMIZER_STATE_BYTES_FP32)}"
        )
    master = 4 if size < 4 else 0  # mixed precision keeps an fp32 copy of the weights
    return size + size + master + OPTIMIZER_STATE_BYTES_FP32[opt]


def estimate_memory_per_device(
    num_params: float,
    *,
    mode: str = "train",
    dtype: str = "bf16",
    optimizer: str = "adam",
    tp: int = 1,
    pp: int = 1,
    shard: int = 1,
    activation_factor: float | None = None,
    runtime_overhead_bytes: int = DEFAULT_RUNTIME_OVERHEAD_BYTES,
) -> int:
    """Bytes one device needs for a model of ``num_params`` parameters (formula above).

    ``shard`` divides only the optimizer state, gradients and master weights (ZeRO-style
    sharding over that many data-parallel ranks); 1 means plain data parallelism.
    """
    if not (isinstance(num_params, (int, float)) and num_params > 0 and math.isfinite(num_params)):
        raise InputError(f"parameter count must be a positive number, got {num_params!r}")
    for name, value in (("tp", tp), ("pp", pp), ("shard", shard)):
        if not isinstance(value, int) or value < 1:
            raise InputError(f"{name} must be a whole number >= 1, got {value!r}")
    factor = DEFAULT_ACTIVATION_FACTOR.get(mode, 1.0) if activation_factor is None else activation_factor
    if factor < 1:
        raise InputError(f"activation factor must be >= 1, got {factor}")
    per_param = bytes_per_param(mode, dtype, optimizer)
    if mode == "train" and shard > 1:
        weights = _dtype_size(dtype)
        per_param = weights + (per_param - weights) / shard
    model_bytes = num_params * per_param * factor / (tp * pp)
    return int(math.ceil(model_bytes)) + int(runtime_overhead_bytes)


def describe_estimate(num_params: float, *, mode: str = "train", dtype: str = "bf16",
                      optimizer: str = "adam", tp: int = 1, pp: int = 1) -> str:
    """One line saying how an estimate was made, for a request's ``memory_note``."""
    per_param = bytes_per_param(mode, dtype, optimizer)
    factor = DEFAULT_ACTIVATION_FACTOR[mode]
    opt = f" {optimizer}" if mode == "train" else ""
    return (
        f"estimated: {num_params:.3g} params x {per_param:g} B/param ({mode}{opt}, {dtype}) "
        f"x {factor:g} (activations) / (tp {tp} x pp {pp}) + 1 GiB runtime"
    )


def parse_param_count(text: str | int | float) -> float:
    """``"7B"``, ``"70b"``, ``"1.3e9"``, ``"350M"`` -> number of parameters."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        s = str(text).strip().lower().replace("_", "")
        scale = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}.get(s[-1:], 1.0)
        if scale != 1.0:
            s = s[:-1]
        try:
            value = float(s) * scale
        except ValueError:
            raise InputError(
                f"cannot read parameter count {text!r}: write e.g. '7B', '350M' or '1.3e9'"
            ) from None
    if not value > 0 or not math.isfinite(value):
        raise InputError(f"parameter count must be positive, got {text!r}")
    return value


def _dtype_size(dtype: str) -> float:
    size = DTYPE_BYTES.get(dtype.lower())
    if size is None:
        raise InputError(f"unknown dtype {dtype!r}; expected one of {', '.join(DTYPE_BYTES)}")
    return size


__all__ = [
    "DTYPE_BYTES", "bytes_per_param", "estimate_memory_per_device", "describe_estimate",
    "parse_param_count",
]
