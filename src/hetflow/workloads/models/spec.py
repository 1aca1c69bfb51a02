"""``ModelSpec``: everything hetflow needs to know about a model to train, tune and serve it.

A spec names a model (torchtitan's ``TrainSpec``, smaller): how to build it for one device, its
tensor-parallel plan, how a pipeline splits it, its loss, the data it trains on, the config
section its ``model:`` block is read into, the validation metric it reports and what serving
needs (one request row, what the output is). Training, tuning, serving and the workflow ask the
spec; none of them switches on the model's name.

Two doors lead to a spec, and both end in :func:`resolve_spec`:

* a built-in, by name: ``model: {kind: mlp, ...}`` / ``{kind: gpt, ...}`` -
  :data:`BUILTIN_SPECS` maps each name to the import path of its ``SPEC``;
* your own, by import path: ``model: {spec: "my_pkg.models:SPEC", ...its own keys...}``.
  Optionally ``data: {loader: "my_pkg.data:load"}`` replaces the spec's dataset.

An import path is ``package.module:NAME`` (``NAME`` may be dotted). It is imported as Python
would, with the current directory on the path as well (appended, so installed packages win).
A path that does not resolve is one line naming the module and the attribute it tried, e.g.
``model.spec: "pkg.mod:SPEC": module pkg.mod has no attribute SPEC`` (exit 2).

The section a spec reads (``ModelSpec.config``) subclasses :class:`ModelSection`: frozen,
unknown keys refused, each field documented by its docstring. hetflow remembers which spec read
it, so a config written back out (``model_dump``) or sent to a Ray worker names it again
(``spec: ...``) and is read the same way there - the package must therefore be importable on
every worker too (see docs/training.md, "Models: built-in and your own").

Pure at import time (pydantic only): torch is imported by the model packages, not here.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping

from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError, model_serializer
from pydantic_core import InitErrorDetails, PydanticCustomError

from hetflow.core.errors import InputError

if TYPE_CHECKING:  # torch stays out of this module's import
    import torch
    from torch import nn
    from torch.distributed.device_mesh import DeviceMesh

    from hetflow.workloads.serve.protocol import InputSpec

# The built-in models: name (``model.kind``) -> import path of its spec.
BUILTIN_SPECS: dict[str, str] = {
    "mlp": "hetflow.workloads.models.mlp:SPEC",
    "gpt": "hetflow.workloads.models.gpt:SPEC",
}


class ModelSection(BaseModel):
    """Base of every ``model:`` section: frozen, unknown keys refused, fields documented by
    their docstrings. Subclass it for your own spec's config (``ModelSpec.config``); do not
    declare ``spec`` or ``kind`` fields (hetflow reads those keys itself)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    # The import path this section was read through (``spec: ...``); None for a built-in,
    # whose ``kind`` field names it. Pickled with the section, written back by model_dump.
    _spec_path: str | None = PrivateAttr(None)

    @model_serializer(mode="wrap")
    def _name_the_spec(self, handler: Any) -> Any:
        out = handler(self)
        return {"spec": self._spec_path, **out} if self._spec_path else out


@dataclass(frozen=True)
class ServingInfo:
    """What serving a model needs: one request row, and what the output is.

    ``input(section) -> InputSpec`` describes one row (kind float/int, width, bounds, the number
    of outputs, a description for error messages). ``output``: ``logits`` - the model maps
    ``(rows, width)`` to ``(rows, classes)`` and a prediction is the argmax;
    ``sequence_logits`` - it maps ``(rows, seq)`` tokens to ``(rows, seq, vocab)`` and a
    prediction is the argmax at the last position (the next token).
    """

    input: Callable[[Any], "InputSpec"]
    output: Literal["logits", "sequence_logits"] = "logits"


@dataclass(frozen=True)
class ModelSpec:
    """One model, as hetflow trains, tunes and serves it.

    Contract of each field (hetflow calls them; a spec never sees Ray or the process group):

    * ``name``: shown in messages and results.
    * ``config``: the :class:`ModelSection` subclass the ``model:`` keys are read into (without
      ``spec``/``kind``).
    * ``build(section) -> nn.Module``: the whole model on the CPU, in fp32, written for one
      device. hetflow seeds torch (``train.seed``) just before, on every rank, so every layout
      starts from the same weights. No random ops in ``forward`` (the layouts must compute the
      same function).
    * ``loss(output, target) -> scalar tensor``: the mean loss of a batch.
    * ``dataset(section, data) -> Dataset | mapping``: the fixed train/validation split, given
      the model section and the ``data:`` section (``val_fraction``, ``seed``). Either a
      :class:`~hetflow.workloads.train.data.Dataset` or a mapping with the arrays (numpy or
      torch) ``train_inputs``, ``train_targets``, ``val_inputs``, ``val_targets``. Called once
      per process; deterministic (every rank calls it).
    * ``dataset_name``: what ``data.dataset`` may say (the default name of that split).
    * ``parallelize(model, tp_mesh)``: the tensor-parallel plan, applied in place to the model
      (after the pipeline split, on its device), e.g. with ``parallelize_module``. None: the
      model has none, and ``layout.tp > 1`` is refused.
    * ``pipeline_blocks(section) -> int``: how many blocks a pipeline can split; the model then
      follows the split convention of :mod:`~hetflow.workloads.train.parallelize`
      (``layers`` ModuleDict, ``FIRST_STAGE``/``LAST_STAGE``). None: ``layout.pp > 1`` is
      refused.
    * ``check(section, layout) -> list[str]``: errors of this section with this layout (e.g.
      tp not dividing the widths it shards), each saying how to fix the file.
    * ``accuracy``: the name of the argmax accuracy it reports on the validation split
      (``val_accuracy`` for a classifier, ``val_token_accuracy`` for a language model), or
      None (a regression: ``val_loss`` only). ``val_loss`` is always reported.
    * ``serving``: :class:`ServingInfo`, or None when the model cannot be served.
    """

    name: str
    config: type[ModelSection]
    build: Callable[[Any], "nn.Module"]
    loss: Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"]
    dataset: Callable[[Any, Any], Any]
    dataset_name: str
    parallelize: Callable[["nn.Module", "DeviceMesh"], None] | None = None
    pipeline_blocks: Callable[[Any], int] | None = None
    check: Callable[[Any, Any], list[str]] | None = None
    accuracy: str | None = None
    serving: ServingInfo | None = None

    @property
    def metrics(self) -> tuple[str, ...]:
        """The validation metrics it reports."""
        return ("val_loss",) + ((self.accuracy,) if self.accuracy else ())

    def evaluate(self, model: "nn.Module", inputs: "torch.Tensor", targets: "torch.Tensor",
                 batch: int, device: Any = None) -> dict[str, float]:
        """:attr:`metrics` of ``model`` (in eval mode) over ``inputs``/``targets``, ``batch``
        rows at a time: the loss averaged over every target element, and the share of argmax
        predictions equal to their target."""
        import torch

        total_loss, correct, count = 0.0, 0, 0
        with torch.no_grad():
            for start in range(0, len(inputs), batch):
                x, y = inputs[start:start + batch], targets[start:start + batch]
                if device is not None:
                    x, y = x.to(device), y.to(device)
                output = model(x)
                total_loss += float(self.loss(output, y)) * y.numel()
                if self.accuracy:
                    correct += int((output.argmax(-1) == y).sum())
                count += y.numel()
        metrics = {"val_loss": total_loss / count}
        if self.accuracy:
            metrics[self.accuracy] = correct / count
        return metrics


# --- import paths ----------------------------------------------------------------------------


def import_object(path: str) -> Any:
    """The object ``path`` (``package.module:NAME``) names; InputError in one line otherwise:
    ``"<path>": <why>`` (the caller prefixes the key that gave it)."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name.strip() or not attr.strip():
        raise InputError(f'"{path}": expected "package.module:NAME" (a module path, a colon, '
                         "then the attribute)")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())  # as Ray puts the driver's directory on its workers' path
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or module_name
        if module_name == missing or module_name.startswith(missing + "."):
            raise InputError(f'"{path}": no module named {missing} (make its directory '
                             "importable: run from the directory that holds it, or add that "
                             "directory to PYTHONPATH)") from None
        raise InputError(f'"{path}": importing {module_name} failed: {_one_line(exc)}') from None
    except Exception as exc:  # noqa: BLE001 - the user's module raised while importing
        raise InputError(f'"{path}": importing {module_name} failed: {_one_line(exc)}') from None
    found: Any = module
    parts = attr.split(".")
    for i, part in enumerate(parts):
        if not hasattr(found, part):
            owner = f"module {module_name}" if i == 0 else f"{module_name}:{'.'.join(parts[:i])}"
            raise InputError(f'"{path}": {owner} has no attribute {part}')
        found = getattr(found, part)
    return found


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


@functools.lru_cache(maxsize=None)
def resolve_spec(path: str) -> ModelSpec:
    """The :class:`ModelSpec` at ``path``; InputError (one line, ``"<path>": <why>``) when it
    does not resolve or is not a usable spec."""
    spec = import_object(path)
    if not isinstance(spec, ModelSpec):
        raise InputError(f'"{path}" is a {type(spec).__name__}, not a hetflow ModelSpec '
                         "(hetflow.workloads.models.spec.ModelSpec)")
    if not (isinstance(spec.config, type) and issubclass(spec.config, ModelSection)):
        raise InputError(f'"{path}": its config must subclass '
                         "hetflow.workloads.models.spec.ModelSection (frozen, unknown keys "
                         f"refused), got {spec.config!r}")
    if spec.config.model_config.get("extra") != "forbid":
        raise InputError(f'"{path}": its config {spec.config.__name__} must refuse unknown '
                         'keys (keep ModelSection\'s extra="forbid")')
    clash = sorted({"spec", "kind"} & set(spec.config.model_fields)) if path not in \
        BUILTIN_SPECS.values() else []
    if clash:
        raise InputError(f'"{path}": its config {spec.config.__name__} may not declare '
                         f"{' or '.join(clash)} (hetflow reads that key itself)")
    return spec


def resolve_callable(path: str) -> Callable[..., Any]:
    """A function named by import path (``data.loader``); InputError when it is not one."""
    found = import_object(path)
    if not callable(found):
        raise InputError(f'"{path}" is a {type(found).__name__}, not a function')
    return found


def builtin_spec(name: str) -> ModelSpec:
    return resolve_spec(BUILTIN_SPECS[name])


def spec_of(section: ModelSection) -> ModelSpec:
    """The spec that reads ``section`` (the model section of a config)."""
    if section._spec_path is not None:
        return resolve_spec(section._spec_path)
    kind = getattr(section, "kind", None)
    assert kind in BUILTIN_SPECS, f"a model section read outside read_model_section: {section!r}"
    return builtin_spec(kind)


def spec_label(section: ModelSection) -> str:
    """How messages name the model: ``model.kind mlp`` or ``model.spec "pkg.mod:SPEC"``."""
    if section._spec_path is not None:
        return f'model.spec "{section._spec_path}"'
    return f"model.kind {getattr(section, 'kind', '?')}"


# --- reading a model: section ----------------------------------------------------------------


def read_model_section(value: Any) -> ModelSection:
    """A ``model:`` mapping -> the section of its spec (``kind`` a built-in, ``spec`` an import
    path). Used as a pydantic ``before`` validator: errors are pydantic errors at the keys of
    the section, so the file's error names ``model.<key>``."""
    if isinstance(value, ModelSection):
        return value
    if not isinstance(value, Mapping):
        raise PydanticCustomError(
            "model_section", "expected a mapping with kind (mlp or gpt) or spec "
            '("package.module:SPEC"), got {given}', {"given": type(value).__name__})
    data = dict(value)
    if "spec" in data:
        if "kind" in data:
            _fail(("kind",), "give kind (a built-in model) or spec (your own), not both")
        path = data.pop("spec")
        if not isinstance(path, str):
            _fail(("spec",), 'expected an import path "package.module:SPEC", got '
                  f"{type(path).__name__}")
        try:
            spec = resolve_spec(path)
        except InputError as exc:
            _fail(("spec",), str(exc))
        section = _validate(spec.config, data)
        section._spec_path = path
        return section
    kind = data.get("kind")
    if kind not in BUILTIN_SPECS:
        told = "missing" if kind is None else f"{kind!r} is not a built-in model"
        _fail(("kind",), f"{told}; give kind {' or '.join(BUILTIN_SPECS)}, or name your own "
              'model with spec: "package.module:SPEC"')
    return _validate(builtin_spec(kind).config, data)


def _validate(config: type[ModelSection], data: dict[str, Any]) -> ModelSection:
    """``config`` from ``data``; its errors re-raised at their key paths, already worded (the
    outer model cannot see which section class a free-form field holds)."""
    from hetflow.core.validation import field_errors

    try:
        return config.model_validate(data)
    except ValidationError as exc:
        errors = field_errors(exc, config)
    raise ValidationError.from_exception_data(config.__name__, [
        InitErrorDetails(type=PydanticCustomError("model_section", "{message}",
                                                  {"message": e.message}),
                         loc=e.path, input={}) for e in errors])


def _fail(loc: tuple[str, ...], message: str) -> None:
    raise ValidationError.from_exception_data("model", [InitErrorDetails(
        type=PydanticCustomError("model_section", "{message}", {"message": message}),
        loc=loc, input={})])


__all__ = ["BUILTIN_SPECS", "ModelSection", "ModelSpec", "ServingInfo", "builtin_spec",
           "import_object", "read_model_section", "resolve_callable", "resolve_spec", "spec_of",
           "spec_label"]
