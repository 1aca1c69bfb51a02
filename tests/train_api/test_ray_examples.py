"""Ray Train's own example scripts, ported by their imports alone, run on hetflow.

The scripts come from the Ray wheel this project installs (``ray/train/examples/...``), read
at test time: every line but the ``ray.train`` import lines is kept byte for byte, and the
script is run as its README says (``python script.py --smoke-test``: the script's own
``ray.init(num_cpus=3)``, an embedded Ray whose node IP is not pinned) with ``HOME`` in a
temporary folder, so that Ray Train's default storage (``~/ray_results``) lands there.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray
IMPORT = re.compile(r"^(\s*)(import|from)(\s+)ray\.train\b")


def ported(module: str) -> tuple[str, list[str]]:
    """The source of Ray's example ``module`` with ``ray.train`` imports made ``hetflow.train``
    imports, and the lines that changed."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, f"{module} is not in the installed Ray"
    source = Path(spec.origin).read_text()
    lines = source.splitlines(keepends=True)
    changed = []
    for i, line in enumerate(lines):
        new = IMPORT.sub(r"\1\2\3hetflow.train", line)
        if new != line:
            lines[i] = new
            changed.append(new.strip())
    out = "".join(lines)
    # every other line byte for byte
    assert [a for a, b in zip(source.splitlines(), out.splitlines()) if a != b] == [
        line for line in source.splitlines() if IMPORT.match(line)]
    return out, changed


def test_ray_trains_linear_example_runs_with_its_imports_changed(tmp_path) -> None:
    source, changed = ported("ray.train.examples.pytorch.torch_linear_example")
    assert changed == ["import hetflow.train as train",
                       "from hetflow.train import Checkpoint, RunConfig, ScalingConfig",
                       "from hetflow.train.torch import TorchTrainer"]
    script = tmp_path / "torch_linear_example.py"
    script.write_text(source)
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")}
    env["HOME"] = str(tmp_path / "home")
    out = subprocess.run([sys.executable, str(script), "--smoke-test"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    runs = list((tmp_path / "home" / "ray_results").glob("ray_train_run-*"))
    assert len(runs) == 1, runs
    checkpoints = sorted(runs[0].glob("checkpoint_*"))
    assert [p.name for p in checkpoints] == ["checkpoint_000001", "checkpoint_000002",
                                             "checkpoint_000003"]  # one report per epoch, 3 epochs
    losses = [json.loads((p / ".hetflow_checkpoint.json").read_text())["metrics"]["loss"]
              for p in checkpoints]
    assert losses[-1] < losses[0]  # it learned y = 2x + 5
    import torch

    state = torch.load(checkpoints[-1] / "model.pt")
    weight = next(v for k, v in state.items() if k.endswith("weight"))
    bias = next(v for k, v in state.items() if k.endswith("bias"))
    assert float(weight) == pytest.approx(2.0, abs=0.5) and float(bias) == pytest.approx(5.0, abs=2.5)
