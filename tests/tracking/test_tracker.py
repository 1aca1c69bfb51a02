"""The MLflow tracker against a real local tracking store (SQLite in tmp_path), read back with
``MlflowClient``; how URIs and MLflow's environment variables resolve; bad input. No Ray."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from hetflow.core.errors import InputError
from hetflow.runtime.tracking import (
    PARENT_TAG,
    MLflowSettings,
    Tracker,
    TrackingConfig,
    absolute_uri,
    resolve,
    with_cli,
)
from tests.cli.test_conventions import EXAMPLES, hetflow, one_line_error


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.chdir(tmp_path)  # the SQLite store's artifacts go to ./mlruns
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    return "sqlite:///mlflow.db"  # relative: made absolute by the tracker


@pytest.mark.parametrize("uri, expected", [
    ("sqlite:///runs/m.db", "sqlite:///{cwd}/runs/m.db"),
    ("sqlite:////abs/m.db", "sqlite:////abs/m.db"),
    ("file:mlruns", "file://{cwd}/mlruns"),
    ("file:///abs/mlruns", "file:///abs/mlruns"),
    ("mlruns", "file://{cwd}/mlruns"),
    ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
    ("databricks", "databricks"),
])
def test_relative_stores_become_absolute(uri: str, expected: str, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert absolute_uri(uri) == expected.format(cwd=tmp_path)


def test_flags_config_environment_and_defaults_in_that_order(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "from-env")
    target = resolve(MLflowSettings(), "job")
    assert (target.uri, target.experiment, target.run_name) == ("http://127.0.0.1:5000", "from-env", "job")
    config = TrackingConfig(mlflow=MLflowSettings(uri="sqlite:///a.db", experiment="from-file"))
    target = resolve(config.mlflow, "job")
    assert (target.uri, target.experiment) == (f"sqlite:///{tmp_path}/a.db", "from-file")
    flagged = with_cli(config, "sqlite:///b.db", None)
    assert resolve(flagged.mlflow, "job").uri == f"sqlite:///{tmp_path}/b.db"
    assert resolve(flagged.mlflow, "job").experiment == "from-file"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME")
    target = resolve(MLflowSettings(), "job")
    assert (target.uri, target.experiment) == (f"sqlite:///{tmp_path}/mlflow.db", "job")  # MLflow's default
    assert not with_cli(None, None, None).enabled and with_cli(None, None, "exp").enabled
    with pytest.raises(InputError, match="--mlflow: empty URI"):
        with_cli(None, " ", None)


def test_params_metrics_per_step_nested_runs_and_artifacts(store: str, tmp_path: Path) -> None:
    tracker = Tracker.start(MLflowSettings(uri=store, experiment="exp", tags={"team": "a"}), "job",
                            kind="train")
    tracker.log_params({"train": {"lr": 0.01, "steps": 7}, "model": {"hidden": [16, 8]}, "unset": None})
    tracker.log_metric_rows([(step, {"train_loss": 1.0 / step, "device": "cpu"}) for step in range(1, 8)])
    child = tracker.child("stage", "tune")
    child.log_metrics({"best": 0.5}, step=2)
    child.finish()
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "weights.bin").write_bytes(b"\0" * 64)
    tracker.log_artifacts(tmp_path / "ckpt", "checkpoint")
    tracker.log_dict({"ranks": [{"rank": 0, "node": "n1"}]}, "placement.json")
    tracker.finish("FINISHED")

    client = MlflowClient(tracker.target.uri)
    run = client.get_run(tracker.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "job"
    assert client.get_experiment(run.info.experiment_id).name == "exp"
    assert run.data.params == {"train.lr": "0.01", "train.steps": "7", "model.hidden": "[16, 8]"}
    assert run.data.tags["hetflow.kind"] == "train" and run.data.tags["team"] == "a"
    history = client.get_metric_history(tracker.run_id, "train_loss")
    assert [(m.step, m.value) for m in history] == [(s, 1.0 / s) for s in range(1, 8)]
    assert "device" not in run.data.metrics  # not a number
    assert [f.path for f in client.list_artifacts(tracker.run_id, "checkpoint")] == ["checkpoint/weights.bin"]
    placement = Path(client.download_artifacts(tracker.run_id, "placement.json", str(tmp_path)))
    assert '"node": "n1"' in placement.read_text()
    nested = client.get_run(child.run_id)
    assert nested.data.tags[PARENT_TAG] == tracker.run_id and nested.info.status == "FINISHED"
    assert nested.info.experiment_id == run.info.experiment_id


def test_a_store_that_fails_later_is_warned_once_and_the_run_goes_on(
        store: str, capsys: pytest.CaptureFixture[str]) -> None:
    tracker = Tracker.start(MLflowSettings(uri=store), "job", kind="train")
    tracker.log_params({"lr": 0.1})
    assert tracker._worker.drain(30)
    with sqlite3.connect(tracker.target.uri.removeprefix("sqlite:///")) as db:
        db.execute("DROP TABLE metrics")  # the store breaks under the run
    for step in range(5):
        tracker.log_metrics({"train_loss": 1.0}, step=step)  # never raises
    tracker.finish("FINISHED")
    err = capsys.readouterr().err
    assert err.count("MLflow logging failed") == 1, err
    assert tracker._worker.failed == 5
    run = MlflowClient(tracker.target.uri).get_run(tracker.run_id)
    assert run.data.params == {"lr": "0.1"} and run.info.status == "FINISHED"


def test_file_store_works_where_mlflow_allows_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps its file store behind this
    tracker = Tracker.start(MLflowSettings(uri="file:mlruns-files"), "job", kind="launch")
    tracker.log_metrics({"hetflow.exit_code": 0})
    tracker.finish("FAILED")
    run = MlflowClient((tmp_path / "mlruns-files").as_uri()).get_run(tracker.run_id)
    assert run.info.status == "FAILED" and run.data.metrics == {"hetflow.exit_code": 0.0}


def test_a_uri_mlflow_cannot_use_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    config = tmp_path / "t.yaml"
    config.write_text("model: {kind: mlp, hidden: [8]}\ntrain: {steps: 2}\nresources: {devices: cpu}\n")
    # MLflow's import alone takes seconds on a loaded machine: a longer limit than the CLI's
    # bad-input deadline (what is checked is the one line and that nothing started)
    done = hetflow("train", str(config), "--address", "local", "--mlflow", "bogus://nowhere", cwd=tmp_path,
                   timeout=60)
    one_line_error(done, 2, r"MLflow tracking URI bogus://nowhere: .*")
    assert not (tmp_path / "runs").exists()  # no training started


def test_a_missing_mlflow_is_one_line_with_the_install_command() -> None:
    done = hetflow("train", str(EXAMPLES / "train_digits.yaml"), "--mlflow", "sqlite:///x.db",
                   prelude="sys.modules['mlflow'] = None")
    one_line_error(done, 2, r"MLflow is not installed .*pip install 'mlflow-skinny>=3\.1'")
    # without tracking the same verb does not need it
    done = hetflow("train", str(EXAMPLES / "train_digits.yaml"), "--dry-run", "--json",
                   prelude="sys.modules['mlflow'] = None")
    assert done.returncode == 0, done.stderr
