"""Serve config files and RayServices for hetflow serving configs, checked with Ray Serve's own
schema (``ServeDeploySchema``), and the application builder's arguments. No Ray cluster here:
tests/serving/test_serve_tooling_ray.py deploys them with Serve's CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ray.serve.schema import ServeDeploySchema

from hetflow.cli import k8s
from hetflow.core.errors import InputError
from hetflow.workloads.serve.builder import config_from_args, serve_config_document
from hetflow.workloads.serve.config import load_serve_config, serve_config_from_dict
from hetflow.workloads.serve.inference import train_config_of
from tests.conftest import REPO

SERVING = REPO / "examples" / "serve_digits.yaml"
CLUSTER = REPO / "examples" / "cluster-mixed.yaml"
HETFLOW = str(Path(sys.executable).with_name("hetflow"))
RAYSERVICE_SPEC_FIELDS = {"serveConfigV2", "rayClusterConfig", "serveService",
                          "upgradeStrategy", "excludeHeadPodFromServeSvc",
                          "serviceUnhealthySecondThreshold", "deploymentUnhealthySecondThreshold",
                          "rayClusterDeletionDelaySeconds"}


def _same_models(a, b) -> None:
    assert [m.name for m in a.models] == [m.name for m in b.models]
    for x, y in zip(a.models, b.models):
        assert train_config_of(x) == train_config_of(y)
        assert (x.precision, x.replicas, x.fallback, x.batching) == \
            (y.precision, y.replicas, y.fallback, y.batching)


def test_the_written_serve_config_is_serves_own_schema_and_self_contained(tmp_path,
                                                                          monkeypatch) -> None:
    out = subprocess.run([HETFLOW, "serve", str(SERVING), "--serve-config", "--port", "8123"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    document = yaml.safe_load(out.stdout)
    schema = ServeDeploySchema.model_validate(document)  # what `serve deploy` accepts
    assert schema.http_options.port == 8123 and schema.http_options.host == "127.0.0.1"
    (app,) = schema.applications
    assert app.import_path == "hetflow.serve:app" and app.name == "digits"
    serving = app.args["serving"]
    # no file paths to resolve: the training configs are inline, checkpoints absolute
    assert all("train_config" not in m and Path(m["checkpoint_dir"]).is_absolute()
               for m in serving["models"])
    original = load_serve_config(SERVING)
    rebuilt = config_from_args({"serving": serving})
    _same_models(original, rebuilt)
    monkeypatch.chdir(tmp_path)  # where the command ran: relative checkpoint dirs start there
    expected = train_config_of(original.models[0]).checkpoint_dir
    assert Path(serving["models"][0]["checkpoint_dir"]) == expected


def test_builder_arguments_are_checked_in_one_line(tmp_path) -> None:
    with pytest.raises(InputError, match="unknown argument"):
        config_from_args({"cfg": "x.yaml"})
    with pytest.raises(InputError, match="exactly one of"):
        config_from_args({})
    with pytest.raises(InputError, match="exactly one of"):
        config_from_args({"config": str(SERVING), "serving": {}})
    with pytest.raises(InputError, match="no such file|cannot read"):
        config_from_args({"config": str(tmp_path / "missing.yaml")})
    with pytest.raises(InputError, match="models"):
        config_from_args({"serving": {"name": "x", "models": []}})
    assert config_from_args({"config": str(SERVING)}).name == "digits"


def test_serve_config_refuses_flags_it_ignores(capsys) -> None:
    from hetflow.cli import main as cli_main

    assert cli_main.main(["serve", str(SERVING), "--serve-config", "--detach"]) == 2
    err = capsys.readouterr().err
    assert "--serve-config" in err and "--detach" in err and len(err.strip().splitlines()) == 1


def test_k8s_render_serve_writes_a_rayservice(tmp_path, capsys) -> None:
    assert k8s._main(["render", "--cluster", str(CLUSTER), "--serve", str(SERVING),
                      "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert not (tmp_path / "raycluster.yaml").exists()
    (service,) = yaml.safe_load_all((tmp_path / "rayservice.yaml").read_text())
    assert service["apiVersion"] == "ray.io/v1" and service["kind"] == "RayService"
    assert set(service["spec"]) <= RAYSERVICE_SPEC_FIELDS
    # the RayCluster inside is the one `render` writes without --serve, plus the serve port
    assert k8s._main(["render", "--cluster", str(CLUSTER), "--out", str(tmp_path / "rc")]) == 0
    (cluster,) = yaml.safe_load_all((tmp_path / "rc" / "raycluster.yaml").read_text())
    inner = service["spec"]["rayClusterConfig"]
    assert inner["workerGroupSpecs"] == cluster["spec"]["workerGroupSpecs"]
    ports = inner["headGroupSpec"]["template"]["spec"]["containers"][0]["ports"]
    assert {"containerPort": 8000, "name": "serve"} in ports
    document = yaml.safe_load(service["spec"]["serveConfigV2"])
    schema = ServeDeploySchema.model_validate(document)
    assert schema.http_options.host == "0.0.0.0"  # reachable from the pod's Service
    _same_models(load_serve_config(SERVING),
                 serve_config_from_dict(schema.applications[0].args["serving"]))
    assert "must exist in the pods" in err


def test_k8s_render_serve_with_a_bad_config_is_one_line(tmp_path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodels: [{name: m}]\n")
    assert k8s._main(["render", "--cluster", str(CLUSTER), "--serve", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bad.yaml" in err


def test_tooling_path_refuses_keys_it_cannot_check(tmp_path) -> None:
    """serve run / a RayService have no front door: auth.mode keys there is one clear line."""
    from hetflow.core.errors import InputError
    from hetflow.workloads.serve.builder import check_tooling_auth
    from hetflow.workloads.serve.config import serve_config_from_dict

    model = {"name": "m", "weights": "random", "devices": "cpu", "train": {"model": {"kind": "mlp", "hidden": [8]}}}
    keyed = serve_config_from_dict({"auth": {"mode": "keys"}, "models": [model]})
    with pytest.raises(InputError, match="front door"):
        check_tooling_auth(keyed)
    check_tooling_auth(serve_config_from_dict({"http": {"host": "0.0.0.0"}, "models": [model]}))  # auto: none here
    with pytest.raises(InputError, match="upstreams"):  # no front door to route them either
        check_tooling_auth(serve_config_from_dict(
            {"models": [model], "upstreams": [{"name": "cloud", "url": "http://127.0.0.1:9/v1"}]}))
    # the RayService render says it too, as one line, exit 2
    from hetflow.cli.main import main

    path = tmp_path / "keyed.yaml"
    path.write_text(yaml.safe_dump({"auth": {"mode": "keys"}, "models": [model]}))
    root = Path(__file__).resolve().parents[2]
    code = main(["k8s", "render", "--cluster", str(root / "examples" / "cluster-mixed.yaml"),
                 "--serve", str(path), "--out", str(tmp_path / "out")])
    assert code == 2 and not (tmp_path / "out").exists()
