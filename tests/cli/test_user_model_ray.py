"""A user's own model through hetflow's commands, as a user runs them: ``hetflow train``,
``hetflow tune``, ``hetflow serve`` (one real HTTP request answered) and ``hetflow run``.

The model is ``tests/fixtures/user_pkg`` - a package outside ``src/`` with its own model, TP
plan, loss and generated data - named in YAML by import path only. Each command is its own
process (the installed ``hetflow`` script) with its own local Ray (``ray_address: local``: never
a cluster someone else left running). Two ways of making the package importable, as
docs/training.md tells users:

* ``PYTHONPATH`` names its directory (train, serve, run): hetflow starts the local Ray, whose
  workers inherit the variable;
* the working directory holds it (tune): hetflow puts the current directory on its own import
  path, and Ray puts the driver's current directory on its workers' path.

And the control: from anywhere else, without either, the command stops at once with the one
line saying which module it could not import.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from tests.net import free_port

pytestmark = pytest.mark.ray

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SPEC = "user_pkg.blobs:SPEC"
SCRIPT = Path(sys.executable).with_name("hetflow")
HETFLOW = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "hetflow.cli.main"]


def env(with_package_on_path: bool) -> dict[str, str]:
    """This process's environment (hetflow importable as here), with the user's package
    directory on PYTHONPATH or not - less Ray's loopback mode, which this test process has
    for its own loopback clusters and a user has not: each command's embedded Ray gets the
    node IP Ray picks (on a machine with a default route its LAN address, not 127.0.0.1; a
    pinned loopback IP once hid a `hetflow serve` that never became ready)."""
    out = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    paths = [p for p in out.get("PYTHONPATH", "").split(os.pathsep)
             if p and Path(p).resolve() != FIXTURES]
    if with_package_on_path:
        paths.insert(0, str(FIXTURES))
    out["PYTHONPATH"] = os.pathsep.join(paths)
    return out


def hetflow(*args: str, cwd: Path, on_path: bool, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*HETFLOW, *args], cwd=cwd, env=env(on_path), capture_output=True,
                          text=True, timeout=timeout)


def write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def user_pkg():
    """The package in this process too (to score what the commands produced)."""
    sys.path.insert(0, str(FIXTURES))
    import user_pkg.blobs

    yield user_pkg.blobs
    sys.path.remove(str(FIXTURES))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """``hetflow train train.yaml --json``: the user's model, dp 2 on CPU."""
    root = tmp_path_factory.mktemp("user-train")
    config = write(root / "train.yaml", {
        "name": "blobs",
        "model": {"spec": SPEC, "hidden": 16, "spread": 2.0},
        "layout": {"dp": 2},
        "train": {"steps": 60, "batch_size": 32, "lr": 0.01, "log_every": 20},
        "checkpoint": {"dir": str(root / "checkpoints")},
        "resources": {"devices": "cpu", "ray_address": "local"},
    })
    done = hetflow("train", str(config), "--json", cwd=root, on_path=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return config, json.loads(done.stdout)


def test_hetflow_train_trains_the_user_model(trained, user_pkg) -> None:
    from hetflow.workloads.train.checkpoint import latest_checkpoint
    from hetflow.workloads.train.config import load_config
    from hetflow.workloads.train.job import evaluate_checkpoint

    path, result = trained
    assert result["steps"] == 60 and result["layout"] == {"dp": 2, "pp": 1, "tp": 1}
    assert len({r["pid"] for r in result["ranks"]}) == 2  # two rank processes (Ray workers)
    assert result["losses"]["60"] < result["losses"]["1"] / 2
    assert set(result["metrics"]) == {"val_loss", "val_accuracy"}  # what the spec reports
    assert result["metrics"]["val_accuracy"] > 0.9  # three blobs: chance is 1/3
    # The final checkpoint, read here into the user's single-device model, scores the same.
    config = load_config(path)
    here = evaluate_checkpoint(config, latest_checkpoint(config.checkpoint_dir))
    assert here == pytest.approx(result["metrics"])


def test_hetflow_tune_from_the_working_directory(tmp_path, user_pkg) -> None:
    config = write(tmp_path / "tune.yaml", {
        "name": "blobs-tune",
        "base": {"model": {"spec": SPEC, "hidden": 16, "spread": 2.0},
                 "train": {"batch_size": 32},
                 "resources": {"devices": "cpu", "ray_address": "local"}},
        "space": {"train": {"lr": {"loguniform": [1.0e-5, 0.1]}},
                  "model": {"hidden": {"choice": [8, 32]}}},
        "search": {"algorithm": "random", "scheduler": "fifo", "seed": 1},
        "budget": {"trials": 3, "epochs": 2, "concurrent": 2},
        "output": {"dir": str(tmp_path / "out"), "live": False},
    })
    # The control first: from a directory without the package, and not on PYTHONPATH, the
    # command stops before any Ray starts, naming the module it could not import.
    refused = hetflow("tune", str(config), cwd=tmp_path, on_path=False, timeout=120)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    assert f'base.model.spec: "{SPEC}": no module named user_pkg' in refused.stderr

    done = hetflow("tune", str(config), "--json", cwd=FIXTURES, on_path=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["metric"] == "val_accuracy" and len(result["trials"]) == 3
    assert all(t["status"] == "done" and t["epochs"] == 2 for t in result["trials"])
    assert {t["params"]["model.hidden"] for t in result["trials"]} <= {8, 32}
    best = yaml.safe_load(Path(result["best_config"]).read_text())
    assert best["model"]["spec"] == SPEC  # the best config names the user's spec again
    assert best["model"]["hidden"] == result["best"]["params"]["model.hidden"]


def test_hetflow_serve_answers_with_the_trained_model(trained, user_pkg, tmp_path) -> None:
    import torch

    from hetflow.workloads.train.checkpoint import latest_checkpoint, load_model_weights
    from hetflow.workloads.train.config import load_config
    from hetflow.workloads.train.data import load_split
    from hetflow.workloads.train.models import build_model

    train_path, _ = trained
    port = free_port()
    config = write(tmp_path / "serve.yaml", {
        "name": "blobs",
        "models": [{"name": "blobs", "train_config": str(train_path), "precision": "fp32",
                    "devices": "cpu", "replicas": 1, "cpus_per_replica": 0.5}],
    })
    out = tmp_path / "serve.out"
    with out.open("w") as stdout, (tmp_path / "serve.err").open("w") as stderr:
        proc = subprocess.Popen([*HETFLOW, "serve", str(config), "--address", "local",
                                 "--port", str(port), "--duration", "300"],
                                cwd=tmp_path, env=env(True), stdout=stdout, stderr=stderr)
    try:
        deadline = time.monotonic() + 180
        while "serving blobs at" not in out.read_text():
            assert proc.poll() is None, (tmp_path / "serve.err").read_text()[-3000:]
            assert time.monotonic() < deadline, "hetflow serve did not come up in 180 s"
            time.sleep(1)
        train = load_config(train_path)
        rows = load_split(train).val.inputs[:5]
        body = json.dumps({"inputs": rows.tolist()}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models/blobs/predict",
                                         data=body, headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310 - loopback
            served = json.loads(answer.read())
    finally:
        proc.send_signal(signal.SIGINT)  # as Ctrl-C: the command shuts Serve and Ray down
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, (tmp_path / "serve.err").read_text()[-3000:]
    # The served predictions are the trained checkpoint's, computed here by the user's model.
    model = build_model(train)
    load_model_weights(latest_checkpoint(train.checkpoint_dir), model)
    with torch.no_grad():
        expected = model.eval()(rows.float()).argmax(-1).tolist()
    assert served["predictions"] == expected and served["model"] == "blobs"
    assert "input 8 coordinates of a point" in out.read_text()  # the spec's serving row


def test_hetflow_run_takes_the_user_model_through_every_stage(tmp_path, user_pkg) -> None:
    spec = write(tmp_path / "workflow.yaml", {
        "name": "blobs-wf",
        "results_dir": str(tmp_path / "results"),
        "cache_dir": str(tmp_path / "runs"),
        "ray": {"num_cpus": 2},
        "train": {"model": {"spec": SPEC, "hidden": 16, "spread": 2.0},
                  "train": {"steps": 40, "batch_size": 32, "lr": 0.01, "log_every": 10},
                  "resources": {"devices": "cpu"}},
        "export": {"precision": "fp32", "min_accuracy": 0.8},
        "serve": {"http": {"port": free_port()}, "devices": "cpu", "cpus_per_replica": 0.5},
        "load_test": {"rate": 20, "max_requests": 20, "max_duration_s": 2, "timeout_s": 5},
    })
    done = hetflow("run", str(spec), cwd=tmp_path, on_path=True)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    lines = {line.split()[0]: line for line in done.stdout.splitlines() if line.strip()}
    for stage in ("prepare", "train", "export", "serve", "load_test"):
        assert lines[stage].split()[1] == "ran", done.stdout
    assert "480 train / 120 val" in lines["prepare"]  # the spec's 600 generated samples
    served = next(line for line in done.stdout.splitlines() if line.startswith("served model"))
    accuracy = float(served.split("accuracy ")[1].split()[0])
    assert accuracy >= 0.8, served
    assert done.stdout.rstrip().endswith("success")
