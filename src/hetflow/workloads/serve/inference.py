"""A trained model ready to answer requests: weights, precision, device, one ``predict`` call.

No Ray here: a Serve replica builds a :class:`ModelRunner` in its constructor, and the tests
and the benchmark build the same object in-process (to measure precision and the HTTP path's
overhead against calling the model directly).

Precision (``apply_precision``):

* ``fp32``: as trained.
* ``bf16`` / ``fp16``: weights cast, inputs cast on the way in, logits back to fp32 for the
  softmax. Meant for GPUs (the serving config refuses them with ``device: cpu``); the cast
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
    train: dict[str, Any]  # the training config, as JSON
    checkpoint: str | None  # checkpoint directory; None: the untrained initial weights
    precision: str  # fp32 | bf16 | fp16 | int8
    device: str  # cpu | gpu | auto
    threads: int = 1

    @property
    def train_config(self) -> TrainConfig:
        return config_from_dict(self.train, source=f"model {self.model}")


def train_config_of(entry: Any) -> TrainConfig:
    """The training config a serving model entry names (file or inline)."""
    if entry.train_config is not None:
        return load_config(entry.train_config)
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
    model = model.eval()
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
    return model.to(device=device, dtype=PRECISION_DTYPES[precision])


def resolve_device(choice: str) -> torch.device:
    """The device a replica computes on. It sees only its planned device (visibility is set
    before the process starts), so that device is ``cuda:0`` when torch has CUDA or HIP."""
    has_gpu = torch.cuda.is_available()
    if choice == "gpu" and not has_gpu:
        raise InputError(
            "device: gpu, but torch sees no GPU in this replica (CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES')!r}, torch {torch.__version__}); install "
            "a CUDA or ROCm build of torch, or use device: auto or cpu")
    return torch.device("cuda:0" if choice in ("gpu", "auto") and has_gpu else "cpu")


class ModelRunner:
    """One model on one device at one precision; ``predict`` is safe for any valid batch."""

    def __init__(self, model: nn.Module, spec: InputSpec, precision: str,
                 device: torch.device, output: str = "logits") -> None:
        self.model = model
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
        x = torch.from_numpy(np.ascontiguousarray(rows)).to(self.device, self.input_dtype)
        out = self.model(x)
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
    """Load the weights, apply the precision, move to the device (in a replica or in-process)."""
    from hetflow.workloads.train.checkpoint import latest_checkpoint, load_model_weights
    from hetflow.workloads.train.models import build_model

    torch.set_num_threads(spec.threads)
    config = spec.train_config
    model = build_model(config)
    if spec.checkpoint is not None:
        info = latest_checkpoint(spec.checkpoint)
        if info is None:
            raise InputError(f"model {spec.model}: no complete checkpoint in {spec.checkpoint}; "
                             "train it first (hetflow train) or set train_if_missing: true")
        load_model_weights(info, model)
    device = torch.device("cpu") if spec.precision == "int8" else resolve_device(spec.device)
    prepared = apply_precision(model, spec.precision, device)
    return ModelRunner(prepared, input_spec(config), spec.precision, device,
                       serving_info(config).output)


def estimate_memory_bytes(config: TrainConfig, precision: str) -> int:
    """Device memory one replica needs: runtime overhead plus twice the weights (the weights
    and room for activations and the allocator's rounding of small batches)."""
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
           "estimate_memory_bytes", "input_spec", "resolve_device", "serving_info",
           "train_config_of"]
