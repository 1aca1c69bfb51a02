"""The workflow end to end on one local Ray (started once for the module): a tiny digits run,
an interrupted training stage that resumes from its checkpoint while a changed export setting
re-runs only the export, and (with the tune stage) a re-run that skips the unchanged stages.

Small on purpose: 40 steps of a one-process MLP, a 40-request load test on loopback.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import pytest
import ray

from hetflow.workflow.runner import run_workflow
from hetflow.workflow.spec import workflow_from_dict
from hetflow.workloads.train.checkpoint import list_checkpoints
from tests.net import free_port

pytestmark = pytest.mark.ray

STEPS = 40


@pytest.fixture(scope="module")
def cluster() -> None:
    ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False)
    yield
    ray.shutdown()


def spec_dict(root: Path, port: int, precision: str = "fp32") -> dict:
    return {
        "name": "wf-test",
        "results_dir": str(root / "results"),
        "cache_dir": str(root / "runs"),
        "train": {
            "model": {"kind": "mlp", "hidden": [64]},
            "train": {"steps": STEPS, "batch_size": 64, "lr": 0.01, "log_every": 5},
            "checkpoint": {"interval": 20},
            "resources": {"devices": "cpu"},
        },
        "export": {"precision": precision, "min_accuracy": 0.6},
        "serve": {"http": {"port": port}, "devices": "cpu", "cpus_per_replica": 0.5},
        "load_test": {"rate": 20, "max_requests": 40, "max_duration_s": 3, "timeout_s": 5},
    }


def statuses(result) -> dict[str, str]:
    return {s.name: s.status for s in result.stages}


def test_run_then_resume_an_interrupted_training(cluster: None, tmp_path: Path) -> None:
    from hetflow.workloads.serve.front import FAST_ENV

    environ = {key: os.environ.get(key) for key in FAST_ENV}
    port = free_port()
    first = run_workflow(workflow_from_dict(spec_dict(tmp_path, port)), progress=False)
    # joining this module's Ray, the runner leaves the process's environment as it was (Serve's
    # fast-path settings would reach the next Ray this process starts)
    assert {key: os.environ.get(key) for key in FAST_ENV} == environ

    assert statuses(first) == {"prepare": "ran", "train": "ran", "tune": "off", "export": "ran",
                               "serve": "ran", "load_test": "ran"}
    assert first.ok, first.failures
    assert first.prepared["train_samples"] + first.prepared["val_samples"] == 1797
    assert len(first.trained["losses"]) == STEPS
    # the served fp32 model answers over HTTP like the exported model scored in Ray
    assert first.served_accuracy == pytest.approx(first.exported["accuracy"], abs=1e-9)
    assert first.served_accuracy > 0.6
    assert first.load.sent == 40 and first.load.ok == 40
    assert first.load.p99_ms is not None and first.load.p99_ms >= first.load.p50_ms
    for name in ("report.md", "report.html", "result.json", "loss.png", "latency.png",
                 "utilisation.png"):
        assert (first.results_dir / name).stat().st_size > 0, name
    assert "Training loss" in first.report_md.read_text()
    # the host's CPU was sampled during the run, and the training stage kept it busy
    cpu = [s for s in first.utilisation if s["device"] == "cpu:0"]
    assert {s["stage"] for s in cpu} >= {"train", "serve"}
    assert all(0.0 <= s["utilisation"] <= 1.0 for s in cpu)
    assert max(s["utilisation"] for s in cpu if s["stage"] == "train") > 0.1

    # Interrupt the training stage after its step-20 checkpoint (drop its record and the final
    # checkpoint), and change the serving precision: training resumes at step 20, export re-runs.
    train_dir = tmp_path / "runs" / "wf-test" / "train" / first.stage("train").key
    (train_dir / "record.json").unlink()
    checkpoints = list_checkpoints(train_dir / "checkpoints")
    assert [c.step for c in checkpoints] == [20, 40]
    shutil.rmtree(checkpoints[-1].path)
    third = run_workflow(workflow_from_dict(spec_dict(tmp_path, port, precision="int8")),
                         progress=False)
    assert statuses(third)["prepare"] == "skipped"
    assert statuses(third)["train"] == "ran"
    assert third.stage("train").key == first.stage("train").key
    assert third.trained["resumed_from_step"] == 20
    assert statuses(third)["export"] == "ran"
    assert third.exported["precision"] == "int8"
    assert third.stage("export").key != first.stage("export").key
    assert third.ok, third.failures


def test_tune_stage_runs_and_export_serves_the_better_model(cluster: None, tmp_path: Path) -> None:
    """Tune enabled: two short trials around the train stage; export (source: tune) serves the
    best trial's checkpoint, the report has the tuning plot, and a re-run skips the tune stage."""
    port = free_port()
    spec = spec_dict(tmp_path, port)
    spec["tune"] = {
        "enabled": True,
        "space": {"train": {"lr": {"loguniform": [1.0e-3, 3.0e-2]}}},
        "search": {"algorithm": "random", "scheduler": "fifo", "metric": "val_accuracy"},
        "budget": {"trials": 2, "epochs": 2, "time": "3m", "concurrent": 2},
        "trial": {"cpus": 0.5, "threads": 1},
    }
    spec["export"]["source"] = "tune"
    first = run_workflow(workflow_from_dict(spec), progress=False)
    assert statuses(first)["tune"] == "ran", first.stages
    assert first.ok, first.failures
    tuned = first.tuned
    assert tuned["trials"] == 2 and len(tuned["curves"]) == 2
    assert all(len(curve) == 2 for curve in tuned["curves"].values())  # 2 epochs each
    assert tuned["best_value"] == max(max(c) for c in tuned["curves"].values())
    # the served model is the best trial's: export scored it, HTTP answers agree
    assert first.exported["source"] == "tune"
    assert Path(first.exported["checkpoint_dir"]).resolve().is_relative_to(
        (tmp_path / "runs").resolve())
    assert first.served_accuracy == pytest.approx(first.exported["accuracy"], abs=1e-9)
    assert (first.results_dir / "tuning.png").stat().st_size > 0
    # Same file again: every stage up to export is skipped, serve and load test run again.
    second = run_workflow(workflow_from_dict(spec), progress=False)
    assert statuses(second) == {"prepare": "skipped", "train": "skipped", "tune": "skipped",
                                "export": "skipped", "serve": "ran", "load_test": "ran"}
    assert second.tuned["best_value"] == tuned["best_value"]
    assert second.exported["checkpoint_dir"] == first.exported["checkpoint_dir"]
    assert second.served_accuracy == first.served_accuracy
    assert second.results_dir != first.results_dir
    assert second.ok, second.failures
