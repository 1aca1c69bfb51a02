"""One ``devices`` spelling (hetflow.core.devices) in every config schema: the same thing said
the new way and the earlier flat way validates to the same config; keys a schema does not
take, both ways at once and unknown shorthands are one line each; a job's ``devices.type``
warns once as ``hetflow: deprecated: ...``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hetflow.accelerators.synthetic import synthetic_node
from hetflow.control.jobspec import job_from_dict
from hetflow.core.devices import DeviceSpec
from hetflow.core.errors import InputError
from hetflow.core.topology import ClusterSnapshot
from hetflow.workloads.serve.config import serve_config_from_dict
from hetflow.workloads.serve.plan import plan_pools
from hetflow.workloads.train.config import config_from_dict

MLP = {"model": {"kind": "mlp", "hidden": [8]}}


def served(**fields):
    return serve_config_from_dict({"name": "app", "models": [{"name": "m", "train": MLP, **fields}]}).models[0]


def pool_entry(pools):
    doc = {"name": "chat", "engine": "vllm", "vllm": {"model": "org/some-model"}, "pools": pools}
    return serve_config_from_dict({"name": "app", "models": [doc]}).models[0]


@pytest.mark.parametrize("new, old", [
    ({"devices": "cpu"}, {"device": "cpu"}),
    ({"devices": {"model": "L40S"}}, {"device": "gpu", "accelerator": "L40S"}),
    ({"devices": {"kind": "gpu", "vendor": "amd", "memory": "2GiB", "share": False, "strategy": "spread"}},
     {"device": "gpu", "vendor": "amd", "memory": "2GiB", "share_devices": False, "strategy": "spread"}),
])
def test_a_served_model_says_it_either_way(new, old) -> None:
    assert served(**new) == served(**old)


@pytest.mark.parametrize("new, old", [
    ({"devices": "cpu"}, {"device": "cpu"}),
    ({"devices": {"model": "MI300X", "memory": "20GiB"}},
     {"device": "gpu", "accelerator": "MI300X", "memory": "20GiB"}),
    ({"devices": {"vendor": "nvidia"}}, {"device": "gpu", "vendor": "nvidia"}),
])
def test_a_training_configs_ranks_say_it_either_way(new, old) -> None:
    assert config_from_dict({"resources": new}) == config_from_dict({"resources": old})


def test_the_issues_three_pools_are_planned_onto_their_devices() -> None:
    entry = pool_entry([{"devices": {"model": "H100"}, "replicas": 2},
                        {"devices": {"vendor": "amd"}, "replicas": 1},
                        {"devices": "cpu", "replicas": 1}])
    assert [(p.device, p.accelerator, p.vendor) for p in entry.pools] == [
        ("gpu", "H100", None), ("gpu", None, "amd"), ("cpu", None, None)]
    snapshot = ClusterSnapshot(nodes=(synthetic_node("2x H100-SXM", "nv"), synthetic_node("2x MI300X", "amd")))
    nodes = {pool: group.device.node if group.device else "cpu"
             for pool, group in plan_pools("app", entry, snapshot, 0)}
    assert nodes == {0: "nv", 1: "amd", 2: "cpu"}


@pytest.mark.parametrize("load, words", [
    (lambda: served(devices={"min": 2}), "devices: min does not apply to a served model"),
    (lambda: served(devices={"model": "L40S"}, accelerator="A100"), "devices.model and accelerator both given"),
    (lambda: served(devices="tpu"), "devices 'tpu': write cpu, gpu or auto"),
    (lambda: pool_entry([{"devices": {"strategy": "pack"}}]), "devices: strategy does not apply to an LLM pool"),
    (lambda: config_from_dict({"resources": {"devices": {"share": True}}}),
     "devices: share does not apply to resources"),
    (lambda: config_from_dict({"resources": {"devices": {"modle": "X"}}}), "modle"),
])
def test_what_a_schema_does_not_take_is_one_line(load, words) -> None:
    with pytest.raises(InputError) as err:
        load()
    text = str(err.value)
    assert words in text and "\n" not in text.strip(), text


def test_the_spec_itself() -> None:
    assert DeviceSpec.model_validate("gpu") == DeviceSpec(kind="gpu")
    assert DeviceSpec(model="H100", count=2).given() == {"model": "H100", "count": 2}
    with pytest.raises(ValueError):
        DeviceSpec.model_validate({"count": -1})


def test_a_jobs_devices_type_is_model_with_one_deprecation_line(tmp_path: Path) -> None:
    job = {"name": "t", "kind": "python", "python": {"script": "run.py"}, "devices": {"count": 1, "type": "MI300X"}}
    with pytest.warns(FutureWarning):
        assert job_from_dict(job).devices.model == "MI300X"
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    out = subprocess.run([sys.executable, "-m", "hetflow.cli.main", "submit", str(path), "--dry-run"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stderr.strip() == ("hetflow: deprecated: devices.type: write devices.model: MI300X "
                                  "(type is read until the next release)")


def test_the_workflows_serve_stage_and_a_tuning_trial_take_it_too() -> None:
    import yaml as _yaml

    from hetflow.workflow.spec import workflow_from_dict
    from hetflow.workloads.tune.config import tuning_config_from_dict

    doc = _yaml.safe_load((Path(__file__).parents[2] / "examples" / "digits.yaml").read_text())
    flat = workflow_from_dict({**doc, "serve": {**doc["serve"], "device": "cpu", "memory": "1GiB"}})
    stage = {k: v for k, v in doc["serve"].items() if k not in ("device", "memory")}
    new = workflow_from_dict({**doc, "serve": {**stage, "devices": {"kind": "cpu", "memory": "1GiB"}}})
    assert new == flat and new.serve.device == "cpu" and new.serve.memory == "1GiB"
    with pytest.raises(InputError, match="devices: model does not apply to the serve stage"):
        workflow_from_dict({**doc, "serve": {**stage, "devices": {"model": "L40S"}}})
    base = {"base": {"model": {"kind": "mlp", "hidden": [32]}, "resources": {"devices": "cpu"}},
            "space": {"train": {"lr": {"loguniform": [1e-4, 0.1]}}}}
    assert tuning_config_from_dict({**base, "trial": {"devices": {"memory": "2GiB"}}}) == \
        tuning_config_from_dict({**base, "trial": {"memory": "2GiB"}})
    with pytest.raises(InputError, match="devices: kind does not apply to a trial"):
        tuning_config_from_dict({**base, "trial": {"devices": "gpu"}})
