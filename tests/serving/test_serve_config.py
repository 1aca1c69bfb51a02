"""The serving YAML: the example loads, and each bad file names the key and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetflow.core.errors import InputError
from hetflow.workloads.serve.config import (
    fallback_chain,
    load_serve_config,
    serve_config_from_dict,
)

REPO = Path(__file__).resolve().parents[2]
TRAIN = {"model": {"kind": "mlp", "hidden": [16]}}


def model(name: str = "m", **fields) -> dict:
    return {"name": name, "train": TRAIN, **fields}


def test_example_loads_with_paths_from_its_directory() -> None:
    config = load_serve_config(REPO / "examples" / "serve_digits.yaml")
    assert [m.name for m in config.models] == ["digits", "digits-int8"]
    assert config.models[0].train_config == str(REPO / "examples" / "train_digits.yaml")
    assert config.http.host == "127.0.0.1" and config.http.port == 8000
    assert config.limits.body_bytes == 256 * 1024
    assert config.default == "digits"
    assert fallback_chain(config, "digits") == ["digits", "digits-int8"]
    assert config.models[1].precision == "int8" and config.models[0].fixed_replicas == 2


def test_defaults() -> None:
    config = serve_config_from_dict({"models": [model()]})
    m = config.models[0]
    assert m.fixed_replicas == 1 and m.planned_replicas == 1
    assert m.batching.enabled and m.batching.max_batch_size == 32
    assert m.ongoing_limit == 64  # twice the batch, so a batch fills while another runs
    assert m.batches_in_flight == 2  # one batch running on the replica, the next on its way
    assert config.http.host == "127.0.0.1"


def test_autoscaling_plans_its_maximum() -> None:
    m = serve_config_from_dict({"models": [model(autoscaling={
        "min_replicas": 1, "max_replicas": 3})]}).models[0]
    assert m.fixed_replicas is None and m.planned_replicas == 3
    assert m.batches_in_flight == 6  # every replica autoscaling may add gets batches
    one_at_a_time = serve_config_from_dict({"models": [model(replicas=2, batching={
        "concurrent_batches": 1})]}).models[0]
    assert one_at_a_time.batches_in_flight == 1
    serve = m.autoscaling.to_serve()
    assert serve["initial_replicas"] == 1 and serve["max_replicas"] == 3


@pytest.mark.parametrize("doc, message", [
    ({"models": [model(batching={"max_batch": 8})]},
     "models.0.batching.max_batch: unknown key (did you mean 'max_batch_size'?"),
    ({"models": [model(precison="int8")]}, "did you mean 'precision'?"),
    ({"modles": []}, "did you mean 'models'?"),
    ({"models": []}, "models: List should have at least 1 item"),
    ({"models": [{"name": "m"}]}, "give exactly one of train_config"),
    ({"models": [model(train_config="x.yaml")]}, "give exactly one of train_config"),
    ({"models": [model(replicas=2, autoscaling={})]}, "replicas (a fixed count) or autoscaling"),
    ({"models": [model(precision="bf16", devices="cpu")]}, "bf16 serves on GPUs"),
    ({"models": [model(precision="int8", devices="gpu")]}, "int8 dynamic quantisation runs on CPUs"),
    ({"models": [model(precision="int4")]}, "models.0.precision"),
    ({"models": [model(fallback="other")]}, "fallback 'other' is not a model"),
    ({"models": [model(fallback="m")]}, "cannot be its own fallback"),
    ({"models": [model("a", fallback="b"), model("b", fallback="a")]},
     "fallbacks form a cycle: a -> b -> a"),
    ({"models": [model("a"), model("a")]}, "repeated: a"),
    ({"models": [model()], "default_model": "z"}, "default_model 'z' is not a model"),
    ({"models": [model(devices={"memory": "lots"})]}, "models.0.devices.memory"),
    ({"models": [model()], "limits": {"max_body_bytes": "1 bucket"}}, "limits.max_body_bytes"),
    ({"models": [model(autoscaling={"min_replicas": 3, "max_replicas": 2})]},
     "min_replicas <= initial_replicas <= max_replicas"),
    ({"models": [model(name="bad name")]}, "models.0.name"),
    ({"models": [model(batching={"concurrent_batches": 0})]},
     "models.0.batching.concurrent_batches"),
    ({"models": [model()], "http": {"port": 0}}, "http.port"),
    # huge numbers: one line naming the key and its bound (they would overflow HAProxy's timers and
    # counters, or wait for replicas forever)
    ({"models": [model(replicas=10**12)]}, "models.0.replicas: Input should be less than or equal to 100000"),
    ({"models": [model(queue_limit=10**15)]}, "models.0.queue_limit: Input should be less than or equal to 1000000"),
    ({"models": [model(batching={"max_batch_size": 10**9})]}, "models.0.batching.max_batch_size"),
    ({"models": [model(autoscaling={"max_replicas": 10**9})]}, "models.0.autoscaling.max_replicas"),
    ({"models": [model()], "limits": {"request_timeout_s": 1e15}}, "limits.request_timeout_s: Input should be less"),
    ({"models": [model()], "gateway": {"replicas": 10**9}}, "gateway.replicas"),
    ([1, 2], "expected a mapping"),
])
def test_bad_configs_name_the_key(doc, message) -> None:
    with pytest.raises(InputError) as err:
        serve_config_from_dict(doc)
    assert message in str(err.value)


def test_unreadable_and_invalid_files(tmp_path) -> None:
    with pytest.raises(InputError, match="cannot read serving config"):
        load_serve_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [\n  name: x\n")
    with pytest.raises(InputError, match=r"bad.yaml:\d+: not valid YAML"):
        load_serve_config(bad)


def test_overrides_are_validated() -> None:
    config = serve_config_from_dict({"models": [model()]})
    assert config.with_overrides(http={"port": 8123}).http.port == 8123
    with pytest.raises(InputError, match="http.port"):
        config.with_overrides(http={"port": -1})


def test_cli_rejects_a_bad_config_with_exit_code_2(tmp_path, capsys) -> None:
    from hetflow.cli.serve import main

    bad = tmp_path / "serve.yaml"
    bad.write_text("models:\n  - name: m\n    train: {model: {kind: mlp}}\n    precison: int8\n")
    assert main([str(bad)]) == 2
    assert "did you mean 'precision'?" in capsys.readouterr().err


@pytest.mark.parametrize("flags, words", [
    (["--rate", "1e15"], "--rate 1e+15 is more than one run can schedule (at most 1,000,000)"),
    (["--requests", "1000000000"], "--requests 1,000,000,000 is more than one run can schedule"),
    (["--duration", "inf"], "--duration inf is more than one run can schedule (at most 86,400)"),
    (["--timeout", "nan"], "--timeout must be > 0, got nan"),
    (["--rows", "0"], "--rows must be > 0, got 0"),
    (["--sweep", "--max-rate", "1e9"], "--max-rate 1e+09 is more than one run can schedule"),
    (["--sweep", "--p99-ms", "-1"], "--p99-ms must be > 0"),
])
def test_cli_bench_refuses_loads_it_cannot_schedule_before_sending(flags, words, capsys) -> None:
    from hetflow.cli.serve import main

    # nothing listens at port 9: a check after connecting would say so instead
    assert main(["bench", "serve", "--url", "http://127.0.0.1:9/v1/models/m/predict", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err, err


def test_cli_bench_refuses_remote_targets(capsys) -> None:
    from hetflow.cli.serve import main

    assert main(["bench", "serve", "--url", "http://192.0.2.1:8000/v1/predict"]) == 2
    assert "only targets loopback" in capsys.readouterr().err
