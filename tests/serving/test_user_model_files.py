"""Serving the user's own model: a spec by import path with safetensors weights, a TorchScript
file, a torch.export program, and pre/post hooks - all from tests/fixtures/user_pkg (outside
src/). In-process (the replica's loading code, no Ray): cheap; the HTTP path is the same
``build_runner`` inside a ModelServer replica."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from hetflow.core.errors import InputError
from hetflow.workloads.serve.config import serve_config_from_dict
from hetflow.workloads.serve.inference import (
    ReplicaSpec,
    build_runner,
    entry_input_spec,
    source_of,
    train_config_of,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
BLOBS = {"model": {"spec": "user_pkg.blobs:SPEC", "features": 8, "classes": 3, "hidden": 16}}
INPUT = {"kind": "float", "width": 8, "outputs": 3, "description": "8 coordinates"}


@pytest.fixture(scope="module")
def user_model(tmp_path_factory):
    """The user's TwoLayer with fixed weights, saved three ways."""
    sys.path.insert(0, str(FIXTURES))
    from user_pkg.model import TwoLayer

    torch.manual_seed(3)
    model = TwoLayer(8, 16, 3).eval()
    root = tmp_path_factory.mktemp("user-model")
    from safetensors.torch import save_file

    save_file(model.state_dict(), str(root / "weights.safetensors"))
    torch.jit.save(torch.jit.script(model), str(root / "model.ts"))
    program = torch.export.export(model, (torch.zeros(2, 8),),
                                  dynamic_shapes=({0: torch.export.Dim("rows", max=1024)},))
    torch.export.save(program, str(root / "model.pt2"))
    yield model, root
    sys.path.remove(str(FIXTURES))


def _runner(root: Path, entry: dict):
    config = serve_config_from_dict({"models": [{"name": "mine", **entry}]}, base_dir=root)
    m = config.models[0]
    train = train_config_of(m)
    spec = ReplicaSpec("mine", train.model_dump(mode="json") if train else None, None,
                       m.precision, "cpu", source=source_of(m))
    return build_runner(spec), entry_input_spec(m, train)


@pytest.mark.parametrize("entry", [
    {"train": BLOBS, "safetensors": "weights.safetensors"},
    {"torchscript": "model.ts", "input": INPUT},
    {"exported": "model.pt2", "input": INPUT},
], ids=["spec+safetensors", "torchscript", "torch.export"])
def test_each_format_serves_the_users_weights(user_model, entry) -> None:
    model, root = user_model
    runner, row = _runner(root, entry)
    assert row.width == 8 and row.outputs == 3
    x = np.random.default_rng(0).normal(size=(5, 8)).astype(np.float32)
    with torch.no_grad():
        want = model(torch.from_numpy(x)).argmax(-1).tolist()
    assert runner.predict(x)["predictions"] == want


def test_pre_and_post_hooks_by_import_path(user_model) -> None:
    model, root = user_model
    runner, _ = _runner(root, {"torchscript": "model.ts", "input": {**INPUT, "low": 0,
                                                                     "high": 10},
                               "preprocess": "user_pkg.hooks:centre",
                               "postprocess": "user_pkg.hooks:reverse_classes"})
    x = np.random.default_rng(1).uniform(0, 10, size=(4, 8)).astype(np.float32)
    with torch.no_grad():
        logits = model(torch.from_numpy(x - 5.0)).flip(-1)
    assert runner.predict(x)["predictions"] == logits.argmax(-1).tolist()


@pytest.mark.parametrize("entry, words", [
    ({"torchscript": "model.ts"}, "needs input"),
    ({"torchscript": "missing.ts", "input": INPUT}, "does not exist"),
    ({"torchscript": "model.ts", "input": INPUT, "train": BLOBS}, "exactly one of"),
    ({"torchscript": "model.ts", "input": INPUT, "preprocess": "user_pkg.hooks:nope"},
     "cannot import user_pkg.hooks:nope"),
    ({"torchscript": "model.ts", "input": INPUT, "precision": "int8"}, "int8"),
])
def test_bad_model_entries_are_one_clear_line(user_model, entry, words) -> None:
    _, root = user_model
    with pytest.raises(InputError, match=words):
        serve_config_from_dict({"models": [{"name": "mine", **entry}]}, base_dir=root)


def test_safetensors_that_do_not_fit_the_spec(user_model, tmp_path) -> None:
    from safetensors.torch import save_file

    _, root = user_model
    save_file({"fc1.weight": torch.zeros(2, 2)}, str(tmp_path / "bad.safetensors"))
    with pytest.raises(InputError, match="does not fit the spec's model"):
        _runner(root, {"train": BLOBS, "safetensors": str(tmp_path / "bad.safetensors")})
