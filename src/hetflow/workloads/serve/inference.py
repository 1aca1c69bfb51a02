"""A trained model ready to answer requests: weights, precision, device, one ``predict`` call.

No Ray here: a Serve replica builds a :class:`ModelRunner` in its constructor, and the tests
and the benchmark build the same object in-process (to measure precision and the HTTP path's
overhead against calling the model directly).

Precision (``apply_precision``):

* ``fp32``: as trained.
* ``bf16`` / ``fp16``: weights cast, inputs cast on the way in, logits back to fp32 for the
  softmax. Meant for GPUs (the serving config refuses them with ``devices: cpu``); the cast
  itself works on CPU too, which is how the accuracy tests measure them on a CPU-only host.
* ``int8``: dynamic quantisation of every ``nn.Linear`` (int8 weights, activations quantised
  per batch at run time) with ``torch.ao.quantization.quantize_dynamic`` - still the eager,
  CPU-kernel form in torch 2.13 (x86/fbgemm and qnnpack engines), deprecated in favour of
  torchao's ``quantize_``, which is not a dependency here. The deprecation warnings are
  silenced at the call. Embeddings (the text model's) stay fp32.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from hetflow.core.errors import InputError
from hetflow.workloads.serve.protocol import InputSpec
from hetflow.workloads.models.spec import ServingInfo, spec_label, spec_of
from hetflow.workloads.train.config import TrainConfig, config_from_dict, load_config

PRECISION_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
BYTES_PER_PARAM = {"fp32": 4, "bf16": 2, "fp16": 2, "int8": 1}
RUNTIME_OVERHEAD_BYTES = 512 * 1024 * 1024  # CUDA/HIP context and allocator slack per replica


@dataclass(frozen=True)
class ReplicaSpec:
    """Everything a replica needs to build its model (plain data: it travels to Ray workers)."""

    model: str  # the served name
    train: dict[str, Any] | None  # the training config, as JSON (None: a model file)
    checkpoint: str | None  # checkpoint directory; None: the untrained initial weights
    precision: str  # fp32 | bf16 | fp16 | int8
    device: str  # cpu | gpu | auto
    threads: int = 1
    # Where else the model comes from: {"torchscript" | "exported" | "safetensors": path,
    # "input": InputSection as a dict, "preprocess"/"postprocess": "pkg.mod:fn"}
    source: dict[str, Any] | None = None

    @property
    def train_config(self) -> TrainConfig | None:
        if self.train is None:
            return None
        return config_from_dict(self.train, source=f"model {self.model}")


def source_of(entry: Any) -> dict[str, Any]:
    """The ``ReplicaSpec.source`` of a serving model entry."""
    out = {k: getattr(entry, k) for k in ("torchscript", "exported", "safetensors",
                                          "preprocess", "postprocess") if getattr(entry, k)}
    if entry.input is not None:
        out["input"] = entry.input.model_dump()
    return out


def import_hook(path: str) -> Any:
    """``pkg.mod:fn`` -> the function; InputError naming what is missing."""
    import importlib

    module, _, name = path.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise InputError(f"cannot import {path} ({exc}); is its package on PYTHONPATH (for "
                         "Ray's workers too)?") from None
    if not callable(fn):
        raise InputError(f"{path} is not a function")
    return fn


def check_model_source(entry: Any) -> None:
    """Files exist and hooks import (when the serving config is read, before any Ray)."""
    from pathlib import Path

    for key in ("torchscript", "exported", "safetensors"):
        path = getattr(entry, key)
        if path is not None and not Path(path).is_file():
            raise InputError(f"{key} file {path} does not exist")
    for key in ("preprocess", "postprocess"):
        if getattr(entry, key) is not None:
            import_hook(getattr(entry, key))


def entry_input_spec(entry: Any, train: TrainConfig | None) -> InputSpec:
    """The request row of a serving entry: its ``input`` section, else its spec's."""
    if entry.input is not None:
        return InputSpec(**entry.input.model_dump())
    assert train is not None
    return input_spec(train)


def entry_output(train: TrainConfig | None) -> str:
    return serving_info(train).output if train is not None else "logits"


def train_config_of(entry: Any) -> TrainConfig | None:
    """The training config a serving model entry names (file or inline); None for a model
    file (``torchscript`` / ``exported``)."""
    if entry.train_config is not None:
        return load_config(entry.train_config)
    if entry.train is None:
        return None
    return config_from_dict(entry.train, source=f"models[{entry.name}].train")


def serving_info(config: TrainConfig) -> ServingInfo:
    """What the model's spec says serving needs; InputError when it cannot be served."""
    info = spec_of(config.model).serving
    if info is None:
        raise InputError(f"{spec_label(config.model)} cannot be served: its ModelSpec gives no "
                         "serving (ServingInfo: the request row and the output)")
    return info


def input_spec(config: TrainConfig) -> InputSpec:
    """What one request row is for this model (its spec's ``serving.input``)."""
    return serving_info(config).input(config.model)


def apply_precision(model: nn.Module, precision: str, device: torch.device) -> nn.Module:
    """``model`` (fp32, on CPU) converted to ``precision`` and moved to ``device``."""
    try:
        model = model.eval()
    except NotImplementedError:  # a torch.export program's module: already inference-only
        pass
    if precision == "int8":
        if device.type != "cpu":
            raise InputError("int8 dynamic quantisation runs on CPU; use bf16 or fp16 on GPUs")
        with warnings.catch_warnings():
            # torch.ao.quantization is deprecated (torchao replaces it) but still ships and
            # runs in torch 2.13; the warnings would repeat in every replica's log.
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", UserWarning)
            from torch.ao.quantization import quantize_dynamic

            return quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    if precision not in PRECISION_DTYPES:
        raise InputError(f"unknown precision {precision!r}; use fp32, bf16, fp16 or int8")
    if precision == "fp32" and device.type == "cpu":
        return model  # as loaded (a torch.export module may not take .to())
    return model.to(device=device, dtype=PRECISION_DTYPES[precision])


def resolve_device(choice: str) -> torch.device:
    """The device a replica computes on. It sees only its planned device (visibility is set
    before the process starts), so that device is ``cuda:0`` when torch has CUDA or HIP."""
    has_gpu = torch.cuda.is_available()
    if choice == "gpu" and not has_gpu:
        raise InputError(
            "devices: gpu, but torch sees no GPU in this replica (CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r}, torch {torch.__version__}); install "
            "a CUDA or ROCm build of torch, or use devices: auto or cpu")
    return torch.device("cuda:0" if choice in ("gpu", "auto") and has_gpu else "cpu")


class ModelRunner:
    """One model on one device at one precision; ``predict`` is safe for any valid batch."""

    def __init__(self, model: nn.Module, spec: InputSpec, precision: str,
                 device: torch.device, output: str = "logits", preprocess: Any = None,
                 postprocess: Any = None) -> None:
        self.model = model
        self.preprocess = preprocess
        self.postprocess = postprocess
        self.spec = spec
        self.precision = precision
        self.device = device
        self.output = output  # ServingInfo.output: "logits" | "sequence_logits"
        self.input_dtype = (PRECISION_DTYPES.get(precision, torch.float32)
                            if spec.kind == "float" else torch.long)

    @torch.inference_mode()
    def logits(self, rows: np.ndarray) -> torch.Tensor:
        """fp32 logits on CPU, one row per input row (the last position's - the next token's -
        for a model whose output is ``sequence_logits``)."""
        if not rows.flags.writeable:  # Ray hands arrays over read-only (zero-copy)
            rows = rows.copy()
        if self.preprocess is None:
            x = torch.from_numpy(np.ascontiguousarray(rows)).to(self.device, self.input_dtype)
        else:  # the user's hook shapes the input; floats still take the serving precision
            x = self.preprocess(rows)
            if not isinstance(x, torch.Tensor):
                x = torch.from_numpy(np.ascontiguousarray(x))
            dtype = PRECISION_DTYPES.get(self.precision) if x.is_floating_point() else None
            x = x.to(self.device, dtype) if dtype is not None else x.to(self.device)
        out = self.model(x)
        if self.postprocess is not None:
            out = self.postprocess(out)
        if self.output == "sequence_logits":
            out = out[:, -1, :]
        return out.float().cpu()

    def predict(self, rows: np.ndarray, probabilities: bool = False) -> dict[str, Any]:
        """``{"predictions": [...]}`` (and ``"probabilities"`` when asked) for ``rows``."""
        logits = self.logits(rows)
        result: dict[str, Any] = {"predictions": logits.argmax(-1).tolist()}
        if probabilities:
            result["probabilities"] = torch.softmax(logits, -1).tolist()
        return result

    def split_predict(self, batches: list[np.ndarray],
                      probabilities: list[bool]) -> list[dict[str, Any]]:
        """One forward pass over several requests' rows; one result per request."""
        logits = self.logits(np.concatenate(batches) if len(batches) > 1 else batches[0])
        labels = logits.argmax(-1).tolist()
        probs = torch.softmax(logits, -1).tolist() if any(probabilities) else None
        out, start = [], 0
        for rows, want in zip(batches, probabilities):
            end = start + len(rows)
            result: dict[str, Any] = {"predictions": labels[start:end]}
            if want and probs is not None:
                result["probabilities"] = probs[start:end]
            out.append(result)
            start = end
        return out


def build_runner(spec: ReplicaSpec) -> ModelRunner:
    """Load the model (a spec's with a hetflow checkpoint, safetensors or its initial weights;
    or a TorchScript / torch.export file), apply the precision, move to the device."""
    from hetflow.workloads.train.checkpoint import latest_checkpoint, load_model_weights
    from hetflow.workloads.train.models import build_model

    torch.set_num_threads(spec.threads)
    source = spec.source or {}
    config = spec.train_config
    if source.get("torchscript"):
        model = torch.jit.load(source["torchscript"], map_location="cpu")
    elif source.get("exported"):
        model = torch.export.load(source["exported"]).module()
    else:
        assert config is not None
        model = build_model(config)
        if source.get("safetensors"):
            from safetensors.torch import load_file

            try:
                model.load_state_dict(load_file(source["safetensors"]))
            except RuntimeError as exc:
                raise InputError(f"model {spec.model}: {source['safetensors']} does not fit the "
                                 f"spec's model: {str(exc).splitlines()[0]}") from None
        elif spec.checkpoint is not None:
            info = latest_checkpoint(spec.checkpoint)
            if info is None:
                raise InputError(f"model {spec.model}: no complete checkpoint in "
                                 f"{spec.checkpoint}; train it first (hetflow train) or set "
                                 "train_if_missing: true")
            load_model_weights(info, model)
    device = torch.device("cpu") if spec.precision == "int8" else resolve_device(spec.device)
    prepared = apply_precision(model, spec.precision, device)
    if "input" in source:
        row = InputSpec(**source["input"])
    else:
        assert config is not None
        row = input_spec(config)
    hooks = [import_hook(source[k]) if source.get(k) else None
             for k in ("preprocess", "postprocess")]
    return ModelRunner(prepared, row, spec.precision, device, entry_output(config), *hooks)


def estimate_memory_bytes(config: TrainConfig | None, precision: str,
                          model_file: str | None = None) -> int:
    """Device memory one replica needs: runtime overhead plus twice the weights (the weights
    and room for activations and the allocator's rounding of small batches). A model file
    counts by its size (fp32 weights, scaled to the precision)."""
    if config is None:
        assert model_file is not None
        weights = os.path.getsize(model_file) * BYTES_PER_PARAM[precision] // 4
        return RUNTIME_OVERHEAD_BYTES + 2 * weights
    from hetflow.workloads.train.models import build_model

    params = sum(p.numel() for p in build_model(config).parameters())
    return RUNTIME_OVERHEAD_BYTES + 2 * params * BYTES_PER_PARAM[precision]


def accuracy(runner: ModelRunner, inputs: np.ndarray, targets: np.ndarray,
             batch: int = 256) -> float:
    """Share of rows whose prediction equals the target (the classifier's accuracy)."""
    correct = 0
    for start in range(0, len(inputs), batch):
        logits = runner.logits(inputs[start:start + batch])
        correct += int((logits.argmax(-1).numpy() == targets[start:start + batch]).sum())
    return correct / len(inputs)


__all__ = ["ModelRunner", "ReplicaSpec", "accuracy", "apply_precision", "build_runner",
           "check_model_source", "entry_input_spec", "entry_output", "import_hook", "source_of",
           "estimate_memory_bytes", "input_spec", "resolve_device", "serving_info",
           "train_config_of"]
