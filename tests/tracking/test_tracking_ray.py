"""Each verb with MLflow tracking on, as a user runs it, against a real SQLite tracking store
in tmp_path, read back with ``MlflowClient``: ``hetflow train`` (parameters, the loss at every
step, the placement, the final checkpoint), ``hetflow tune`` (the run and one nested run per
trial), ``hetflow launch`` (a script that logs itself joins the launch's run; a failing one ends
it FAILED) and ``hetflow run`` (stages nested under the workflow's run).

One local Ray for the module (2 CPUs, loopback); tiny jobs (a 16-unit MLP, a dozen steps).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import pytest
import yaml
from mlflow.tracking import MlflowClient

from hetflow.cli.main import main as hetflow
from hetflow.workloads.train.checkpoint import latest_checkpoint
from tests.ray_cluster import local_ray
from tests.net import free_port

pytestmark = pytest.mark.ray

SCRIPTS = Path(__file__).parent / "scripts"


@pytest.fixture(scope="module", autouse=True)
def cluster():
    with local_ray(num_cpus=2):
        yield


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.chdir(tmp_path)  # artifacts go to ./mlruns beside the SQLite file
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID"):
        monkeypatch.delenv(name, raising=False)
    return f"sqlite:///{tmp_path}/mlflow.db"


def runs(uri: str, experiment: str) -> list:
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no experiment {experiment}"
    return client.search_runs([found.experiment_id])


def artifact_paths(client: MlflowClient, run_id: str, path: str | None = None) -> set[str]:
    out = set()
    for item in client.list_artifacts(run_id, path):
        out |= artifact_paths(client, run_id, item.path) if item.is_dir else {item.path}
    return out


def read_json(client: MlflowClient, run_id: str, path: str, where: Path) -> dict:
    return json.loads(Path(client.download_artifacts(run_id, path, str(where))).read_text())


def test_train_logs_params_every_step_placement_and_checkpoint(store: str, tmp_path: Path) -> None:
    config = tmp_path / "train.yaml"
    config.write_text(yaml.safe_dump({
        "name": "tiny", "model": {"kind": "mlp", "hidden": [16]}, "layout": {"dp": 2},
        "train": {"steps": 12, "batch_size": 32, "log_every": 4},
        "checkpoint": {"dir": str(tmp_path / "ckpt"), "interval": 6},
        "resources": {"devices": "cpu", "cpus_per_rank": 1}}))
    assert hetflow(["train", str(config), "--mlflow", store, "--quiet"]) == 0

    [run] = runs(store, "tiny")  # experiment: the job's name by default
    client = MlflowClient(store)
    assert run.info.status == "FINISHED" and run.info.run_name == "tiny"
    params = run.data.params
    assert params["train.steps"] == "12" and params["layout.dp"] == "2" and params["model.hidden"] == "[16]"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "train_loss")]
    assert steps == list(range(1, 13))  # every step, in order, once
    assert 0 < run.data.metrics["val_accuracy"] <= 1
    assert client.get_metric_history(run.info.run_id, "val_accuracy")[0].step == 12
    placement = read_json(client, run.info.run_id, "placement.json", tmp_path)
    ranks = placement["attempts"][0]["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["node_id"] and r["pid"] for r in ranks)
    assert run.data.tags["hetflow.placement"] == placement["attempts"][0]["how"]
    final = read_json(client, run.info.run_id, "ranks.json", tmp_path)
    assert {r["rank"]: r["backend"] for r in final["ranks"]} == {0: "gloo", 1: "gloo"}
    files = artifact_paths(client, run.info.run_id)
    assert "config.yaml" in files
    final_dir = latest_checkpoint(tmp_path / "ckpt").path
    on_disk = {str(p.relative_to(final_dir)) for p in final_dir.rglob("*") if p.is_file()}
    assert on_disk and {f"checkpoint/{p}" for p in on_disk} <= files  # the final checkpoint, whole


def test_tune_logs_the_run_and_each_trial_nested(store: str, tmp_path: Path) -> None:
    config = tmp_path / "tune.yaml"
    config.write_text(yaml.safe_dump({
        "name": "tiny-tune",
        "base": {"model": {"kind": "mlp", "hidden": [16]}, "train": {"batch_size": 64},
                 "resources": {"devices": "cpu"}},
        "space": {"train": {"lr": {"loguniform": [1e-3, 1e-1]}}},
        "search": {"algorithm": "random", "scheduler": "fifo", "seed": 1},
        "budget": {"trials": 2, "epochs": 2, "concurrent": 2},
        "output": {"dir": str(tmp_path / "out"), "live": False, "plot": True},
        "tracking": {"mlflow": {"uri": store, "experiment": "tuning"}}}))
    assert hetflow(["tune", str(config), "--quiet"]) == 0

    found = runs(store, "tuning")
    [parent] = [r for r in found if r.data.tags.get("hetflow.kind") == "tune"]
    trials = [r for r in found if r.data.tags.get("hetflow.kind") == "trial"]
    client = MlflowClient(store)
    assert parent.info.status == "FINISHED" and len(trials) == 2
    assert parent.data.params["budget.trials"] == "2" and "space.train.lr.loguniform" in parent.data.params
    result = json.loads((tmp_path / "out" / "best" / "result.json").read_text())
    assert parent.data.metrics["best_val_accuracy"] == pytest.approx(result["value"])
    assert parent.data.tags["hetflow.best_trial"] == result["trial_id"]
    files = artifact_paths(client, parent.info.run_id)
    assert {"trials.json", "best/config.yaml", "best/result.json", "curves.png"} <= files
    assert any(f.startswith("best/checkpoint/") for f in files)
    for trial in trials:
        assert trial.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert trial.info.status == "FINISHED" and "train/lr" in trial.data.params
        assert trial.data.tags["hetflow.device"] == "cpu"
        history = client.get_metric_history(trial.info.run_id, "val_accuracy")
        assert [m.step for m in history] == [1, 2]  # one value per epoch

    # --resume continues the same runs (here nothing is left to run): no second tuning run
    assert hetflow(["tune", str(config), "--quiet", "--resume"]) == 0
    again = runs(store, "tuning")
    assert sorted(r.info.run_id for r in again) == sorted(r.info.run_id for r in found)
    assert client.get_run(parent.info.run_id).info.status == "FINISHED"


def test_launch_passes_its_run_to_a_script_that_logs_itself(store: str, tmp_path: Path) -> None:
    code = hetflow(["launch", "--nproc", "2", "--device", "cpu", "--quiet", "--log-dir", str(tmp_path / "logs"),
                    "--mlflow", store, "--mlflow-experiment", "launches", str(SCRIPTS / "logs_itself.py")])
    assert code == 0
    [run] = runs(store, "launches")  # one run: the script joined hetflow's, it made none of its own
    client = MlflowClient(store)
    assert run.info.status == "FINISHED"
    params = run.data.params
    assert params["hetflow.nproc"] == "2" and params["script.lr"] == "0.5"  # hetflow's and the script's
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "script_loss")] == \
        [(1, 1.0), (2, 0.5), (3, 1.0 / 3)]
    assert run.data.metrics["hetflow.exit_code"] == 0 and run.data.metrics["hetflow.restarts"] == 0
    placement = read_json(client, run.info.run_id, "placement.json", tmp_path)
    assert [r["rank"] for r in placement["attempts"][0]["ranks"]] == [0, 1]
    files = artifact_paths(client, run.info.run_id)
    assert {"logs/rank-0.log", "logs/rank-1.log"} <= files
    log = Path(client.download_artifacts(run.info.run_id, "logs/rank-0.log", str(tmp_path / "dl")))
    assert f"run {run.info.run_id}" in log.read_text()  # rank 0's script saw hetflow's run id

    # a script that does not use MLflow and fails: the run has what hetflow knows, ended FAILED
    code = hetflow(["launch", "--nproc", "1", "--device", "cpu", "--quiet", "--env", "EXIT_CODE=3",
                    "--env", "NO_MLFLOW=1",
                    "--log-dir", str(tmp_path / "logs2"), "--mlflow", store, "--mlflow-experiment", "launches",
                    str(SCRIPTS / "logs_itself.py")])
    assert code == 3
    failed = [r for r in runs(store, "launches") if r.info.run_id != run.info.run_id]
    assert len(failed) == 1 and failed[0].info.status == "FAILED"
    assert failed[0].data.metrics["hetflow.exit_code"] == 3
    assert failed[0].data.params["hetflow.nproc"] == "1" and "script.lr" not in failed[0].data.params
    assert "logs/rank-0.log" in artifact_paths(client, failed[0].info.run_id)


def test_workflow_logs_its_stages_as_nested_runs(store: str, tmp_path: Path) -> None:
    workflow = tmp_path / "wf.yaml"
    workflow.write_text(yaml.safe_dump({
        "name": "wf-tracked", "results_dir": str(tmp_path / "results"), "cache_dir": str(tmp_path / "runs"),
        "train": {"model": {"kind": "mlp", "hidden": [16]},
                  "train": {"steps": 10, "batch_size": 64, "lr": 0.01, "log_every": 5},
                  "resources": {"devices": "cpu"}},
        "export": {"precision": "fp32"},
        "serve": {"http": {"port": free_port()}, "devices": "cpu", "cpus_per_replica": 0.5},
        "load_test": {"rate": 20, "max_requests": 10, "max_duration_s": 1, "timeout_s": 5}}))
    assert hetflow(["run", str(workflow), "--no-progress", "--mlflow", store]) == 0

    found = runs(store, "wf-tracked")
    client = MlflowClient(store)
    [parent] = [r for r in found if r.data.tags.get("hetflow.kind") == "workflow"]
    [train] = [r for r in found if r.data.tags.get("hetflow.kind") == "train"]
    assert parent.info.status == "FINISHED" and parent.info.run_name.startswith("wf-tracked-")
    assert train.data.tags["mlflow.parentRunId"] == parent.info.run_id and train.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(train.info.run_id, "train_loss")] == list(range(1, 11))
    assert parent.data.tags["hetflow.stage.train"] == "ran" and parent.data.tags["hetflow.stage.tune"] == "off"
    assert 0 < parent.data.metrics["served_accuracy"] <= 1 and parent.data.params["train.train.steps"] == "10"
    assert {"report/report.md", "report/result.json"} <= artifact_paths(client, parent.info.run_id)
