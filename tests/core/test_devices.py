"""One ``devices`` section (hetflow.core.devices), stored by every config schema: each stores a
``DeviceSpec`` with its defaults; the earlier flat keys are read into it with exactly one
``FutureWarning`` naming the new spelling (one ``hetflow: deprecated: ...`` line from the CLI);
keys a schema does not take, both spellings at once and unknown shorthands are one line each;
what hetflow writes back (``model_dump``) reads back equal and without a word.
"""

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
    with pytest.warns(FutureWarning, match="read until the next release"):
        flat = served(**old)
    assert served(**new) == flat


@pytest.mark.parametrize("new, old", [
    ({"devices": "cpu"}, {"device": "cpu"}),
    ({"devices": {"model": "MI300X", "memory": "20GiB"}},
     {"device": "gpu", "accelerator": "MI300X", "memory": "20GiB"}),
    ({"devices": {"vendor": "nvidia"}}, {"device": "gpu", "vendor": "nvidia"}),
])
def test_a_training_configs_ranks_say_it_either_way(new, old) -> None:
    with pytest.warns(FutureWarning, match="read until the next release"):
        flat = config_from_dict({"resources": old})
    assert config_from_dict({"resources": new}) == flat


def test_the_issues_three_pools_are_planned_onto_their_devices() -> None:
    entry = pool_entry([{"devices": {"model": "H100"}, "replicas": 2},
                        {"devices": {"vendor": "amd"}, "replicas": 1},
                        {"devices": "cpu", "replicas": 1}])
    assert [(p.devices.kind, p.devices.model, p.devices.vendor) for p in entry.pools] == [
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
    stage = {k: v for k, v in doc["serve"].items() if k != "devices"}
    with pytest.warns(FutureWarning, match=r"serve.device, serve.memory: write serve.devices: "):
        flat = workflow_from_dict({**doc, "serve": {**stage, "device": "cpu", "memory": "1GiB"}})
    new = workflow_from_dict({**doc, "serve": {**stage, "devices": {"kind": "cpu", "memory": "1GiB"}}})
    assert new == flat and new.serve.devices == DeviceSpec(kind="cpu", memory="1GiB")
    with pytest.raises(InputError, match="devices: model does not apply to the serve stage"):
        workflow_from_dict({**doc, "serve": {**stage, "devices": {"model": "L40S"}}})
    base = {"base": {"model": {"kind": "mlp", "hidden": [32]}, "resources": {"devices": "cpu"}},
            "space": {"train": {"lr": {"loguniform": [1e-4, 0.1]}}}}
    with pytest.warns(FutureWarning, match=r"trial.memory: write trial.devices: \{memory: 2GiB\}"):
        flat = tuning_config_from_dict({**base, "trial": {"memory": "2GiB"}})
    assert tuning_config_from_dict({**base, "trial": {"devices": {"memory": "2GiB"}}}) == flat
    with pytest.raises(InputError, match="devices: kind does not apply to a trial"):
        tuning_config_from_dict({**base, "trial": {"devices": "gpu"}})


# --- every schema stores ``devices``: defaults, the earlier flat keys, both at once, round trips --

def _job(devices=None):
    doc = {"name": "t", "kind": "python", "python": {"script": "/x.py"}}
    return job_from_dict({**doc, "devices": devices} if devices is not None else doc)


def _stage(**fields):
    from hetflow.workflow.spec import ServeStage

    return ServeStage.model_validate(fields)


def _trial(**fields):
    from hetflow.workloads.tune.config import TrialConfig

    return TrialConfig.model_validate(fields)


def _pool(**fields):
    from hetflow.workloads.serve.llm import LLMPool

    return LLMPool.model_validate(fields)


def test_every_schema_stores_one_devicespec_with_its_defaults() -> None:
    from hetflow.control.jobspec import DeviceRequest

    assert served().devices == DeviceSpec(kind="auto", share=True, strategy="pack")
    assert served(devices={"model": "L40S"}).devices == DeviceSpec(kind="gpu", model="L40S", share=True,
                                                                   strategy="pack")
    assert _pool().devices == DeviceSpec(kind="cpu", share=False)
    assert pool_entry([{"devices": {"vendor": "amd"}}]).pools[0].devices == DeviceSpec(
        kind="gpu", vendor="amd", share=False)
    assert config_from_dict({}).resources.devices == DeviceSpec(kind="auto")
    assert _trial().devices == DeviceSpec()
    assert _stage().devices == DeviceSpec(kind="auto")
    job = _job({"count": 2, "model": "MI300X", "memory": "40GiB"})
    assert isinstance(job.devices, DeviceRequest) and isinstance(job.devices, DeviceSpec)
    assert job.devices.given() == {"count": 2, "model": "MI300X", "memory": "40GiB"}
    elastic = {"count": 2, "model": "MI300X", "min": 1, "max": 4, "scaling": "eff:0.9"}
    assert DeviceRequest.model_validate(elastic).given() == elastic
    # an engine entry without pools: one pool from the entry's devices
    entry = serve_config_from_dict({"models": [{"name": "c", "engine": "vllm", "vllm": {"model": "org/x"},
                                                "devices": {"model": "H100", "memory": "30GiB"}}]}).models[0]
    assert entry.effective_pools[0].devices == DeviceSpec(kind="gpu", model="H100", memory="30GiB", share=False)


FLAT_CASES = [  # (load, the earlier flat keys, the devices they make, the one warning line)
    (lambda **kw: served(**kw), {"device": "cpu"}, {"kind": "cpu"},
     "models[m].device: write models[m].devices: {kind: cpu} (device is read until the next release)"),
    (lambda **kw: served(**kw), {"accelerator": "L40S"}, {"kind": "auto", "model": "L40S"},
     "models[m].accelerator: write models[m].devices: {kind: auto, model: L40S} (accelerator is read until "
     "the next release)"),
    (lambda **kw: served(**kw), {"vendor": "amd"}, {"kind": "auto", "vendor": "amd"},
     "models[m].vendor: write models[m].devices: {kind: auto, vendor: amd} (vendor is read until the next "
     "release)"),
    (lambda **kw: served(**kw), {"memory": "2GiB"}, {"memory": "2GiB"},
     "models[m].memory: write models[m].devices: {memory: 2GiB} (memory is read until the next release)"),
    (lambda **kw: served(**kw), {"share_devices": False}, {"share": False},
     "models[m].share_devices: write models[m].devices: {share: false} (share_devices is read until the "
     "next release)"),
    (lambda **kw: served(**kw), {"strategy": "spread"}, {"strategy": "spread"},
     "models[m].strategy: write models[m].devices: {strategy: spread} (strategy is read until the next "
     "release)"),
    (lambda **kw: served(**kw), {"device": "gpu", "accelerator": "L40S"}, {"kind": "gpu", "model": "L40S"},
     "models[m].device, models[m].accelerator: write models[m].devices: {kind: gpu, model: L40S} (device, "
     "accelerator are read until the next release)"),
    (lambda **kw: pool_entry([kw]).pools[0], {"device": "gpu", "vendor": "nvidia"},
     {"kind": "gpu", "vendor": "nvidia"},
     "models[chat].pools[0].device, models[chat].pools[0].vendor: write models[chat].pools[0].devices: "
     "{kind: gpu, vendor: nvidia} (device, vendor are read until the next release)"),
    (lambda **kw: pool_entry([kw]).pools[0], {"share_devices": True, "memory": "8GiB"},
     {"share": True, "memory": "8GiB"},
     "models[chat].pools[0].share_devices, models[chat].pools[0].memory: write models[chat].pools[0].devices: "
     "{share: true, memory: 8GiB} (share_devices, memory are read until the next release)"),
    (lambda **kw: _pool(**kw), {"accelerator": "H100", "device": "gpu"}, {"kind": "gpu", "model": "H100"},
     "pools[].accelerator, pools[].device: write pools[].devices: {model: H100, kind: gpu} (accelerator, "
     "device are read until the next release)"),
    (lambda **kw: config_from_dict({"resources": kw}).resources, {"vendor": "amd"}, {"kind": "auto", "vendor": "amd"},
     "resources.vendor: write resources.devices: {kind: auto, vendor: amd} (vendor is read until the next "
     "release)"),
    (lambda **kw: config_from_dict({"resources": kw}).resources, {"device": "cpu"}, {"kind": "cpu"},
     "resources.device: write resources.devices: {kind: cpu} (device is read until the next release)"),
    (lambda **kw: config_from_dict({"resources": kw}).resources, {"accelerator": "MI300X", "memory": "20GiB"},
     {"kind": "auto", "model": "MI300X", "memory": "20GiB"},
     "resources.accelerator, resources.memory: write resources.devices: {kind: auto, model: MI300X, memory: "
     "20GiB} (accelerator, memory are read until the next release)"),
    (lambda **kw: _trial(**kw), {"memory": "2GiB"}, {"memory": "2GiB"},
     "trial.memory: write trial.devices: {memory: 2GiB} (memory is read until the next release)"),
    (lambda **kw: _stage(**kw), {"device": "cpu", "memory": "1GiB"}, {"kind": "cpu", "memory": "1GiB"},
     "serve.device, serve.memory: write serve.devices: {kind: cpu, memory: 1GiB} (device, memory are read "
     "until the next release)"),
]


@pytest.mark.parametrize("load, flat, devices, line", FLAT_CASES)
def test_the_earlier_flat_keys_are_read_with_one_warning_naming_the_new_spelling(load, flat, devices, line) -> None:
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        old = load(**flat)
    assert [(w.category, str(w.message)) for w in seen] == [(FutureWarning, line)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = load(devices=devices)
    assert new == old
    assert all(getattr(new.devices, k) == v for k, v in devices.items())


@pytest.mark.parametrize("load", [
    lambda: served(devices={"kind": "cpu"}, device="cpu"),
    lambda: served(devices={"share": True}, share_devices=False),
    lambda: pool_entry([{"devices": {"vendor": "amd"}, "vendor": "nvidia"}]),
    lambda: config_from_dict({"resources": {"devices": {"memory": "1GiB"}, "memory": "2GiB"}}),
    lambda: tuning_trial_both(),
    lambda: _job({"model": "H100", "type": "H100"}),
])
def test_both_spellings_at_once_is_one_line(load) -> None:
    with pytest.raises((InputError, ValueError)) as err:
        load()
    text = str(err.value)
    assert "both given: keep devices." in text and "\n" not in text.strip(), text


def tuning_trial_both():
    from hetflow.workloads.tune.config import tuning_config_from_dict

    return tuning_config_from_dict({"base": {"resources": {"devices": "cpu"}},
                                    "space": {"train": {"lr": {"loguniform": [1e-4, 0.1]}}},
                                    "trial": {"devices": {"memory": "1GiB"}, "memory": "1GiB"}})


@pytest.mark.parametrize("load, words", [
    (lambda: served(devices={"count": 2}), "devices: count does not apply to a served model; it takes kind, "
                                           "model, vendor, memory, share, strategy"),
    (lambda: pool_entry([{"devices": {"min": 1}}]), "devices: min does not apply to an LLM pool; it takes kind, "
                                                   "model, vendor, memory, share"),
    (lambda: config_from_dict({"resources": {"devices": {"strategy": "pack"}}}),
     "it takes kind, model, vendor, memory"),
    (lambda: _stage(devices={"vendor": "amd"}), "devices: vendor does not apply to the serve stage; it takes kind, memory"),
    (lambda: _trial(devices={"model": "H100"}), "it takes memory"),
    (lambda: _job({"count": 1, "share": True}), "devices: share does not apply to a job; it takes count, model, "
                                               "vendor, memory, min, max, scaling"),
    (lambda: _job("gpu"), "devices: kind does not apply to a job"),
    (lambda: pool_entry([{"devices": "auto"}]), "devices.kind auto is not for an LLM pool: write cpu or gpu"),
    (lambda: served(devices={"memory": "lots"}), "models.0.devices.memory: cannot read size 'lots'"),
    (lambda: served(devices={"vendor": "intel"}), "models.0.devices.vendor"),
])
def test_what_a_schema_does_not_take_names_what_it_takes(load, words) -> None:
    from pydantic import ValidationError

    with pytest.raises((InputError, ValidationError)) as err:
        load()
    text = err.value.errors()[0]["msg"] if isinstance(err.value, ValidationError) else str(err.value)
    assert words in text and "\n" not in text.strip(), text


@pytest.mark.parametrize("config", [
    lambda: serve_config_from_dict({"name": "app", "models": [
        {"name": "m", "train": MLP, "devices": {"vendor": "amd", "memory": "2GiB", "share": False}},
        {"name": "chat", "engine": "vllm", "vllm": {"model": "org/x"},
         "pools": [{"devices": {"model": "H100"}, "replicas": 2}, {"devices": "cpu"}]}]}),
    lambda: config_from_dict({"resources": {"devices": {"model": "MI300X", "memory": "20GiB"}}}),
    lambda: config_from_dict({}),
    lambda: _job({"count": 2, "model": "MI300X", "memory": "40GiB"}),
    lambda: _job(),
])
def test_what_hetflow_writes_back_reads_back_equal_and_without_a_word(config) -> None:
    import warnings

    made = config()
    dumped = made.model_dump(mode="json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = type(made).model_validate(dumped)
        assert again == made
        assert type(made).model_validate(made.model_dump()) == made
    text = yaml.safe_dump(dumped)
    for flat in ("share_devices", "accelerator", "device:"):
        assert flat not in text, text


def test_a_workflow_and_a_tuning_config_write_back_the_new_spelling() -> None:
    import warnings

    from hetflow.workflow.spec import workflow_from_dict
    from hetflow.workloads.tune.config import tuning_config_from_dict

    doc = yaml.safe_load((Path(__file__).parents[2] / "examples" / "digits_gpu.yaml").read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spec = workflow_from_dict(doc)
        assert type(spec.serve).model_validate(spec.serve.model_dump(mode="json")) == spec.serve
        assert spec.serve.devices == DeviceSpec(kind="gpu", memory="1GiB")
        served_model = spec.serve_config("export").models[0]
        assert served_model.devices == DeviceSpec(kind="gpu", memory="1GiB", share=True, strategy="pack")
        tune = tuning_config_from_dict({"base": {"resources": {"devices": "cpu"}},
                                        "space": {"train": {"lr": {"loguniform": [1e-4, 0.1]}}},
                                        "trial": {"devices": {"memory": "1GiB"}}})
        assert tuning_config_from_dict(tune.model_dump(mode="json")) == tune
        assert tune.trial_memory == "1GiB"


def test_set_overrides_take_the_devices_keys_and_warn_for_a_flat_one_like_a_file() -> None:
    import warnings

    from hetflow.cli.train import parse_overrides

    base = config_from_dict({"resources": {"devices": {"kind": "gpu", "model": "MI300X"}}})
    sets = parse_overrides(["resources.devices.memory=20GiB", "resources.cpus_per_rank=2"])
    assert sets == {"resources": {"devices": {"memory": "20GiB"}, "cpus_per_rank": 2}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = base.with_overrides(**sets).resources
    assert got.devices == DeviceSpec(kind="gpu", model="MI300X", memory="20GiB") and got.cpus_per_rank == 2
    assert base.with_overrides(**parse_overrides(["resources.devices=cpu"])).resources.devices == \
        DeviceSpec(kind="cpu")
    with pytest.warns(FutureWarning, match=r"resources.vendor: write resources.devices: \{kind: gpu, model: "
                                           r"MI300X, vendor: amd\}"):
        flat = base.with_overrides(**parse_overrides(["resources.vendor=amd"])).resources
    assert flat.devices == DeviceSpec(kind="gpu", model="MI300X", vendor="amd")
    with pytest.raises(InputError, match="SECTION.devices.KEY=VALUE"):
        parse_overrides(["resources.layout.dp=2"])


def test_a_cli_verb_reads_a_flat_key_with_one_deprecation_line_and_runs(tmp_path: Path) -> None:
    path = tmp_path / "train.yaml"
    path.write_text("model: {kind: mlp, hidden: [8]}\ntrain: {steps: 2}\nresources: {device: cpu, cpus_per_rank: 1}\n")
    out = subprocess.run([sys.executable, "-m", "hetflow.cli.main", "train", str(path), "--dry-run"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stderr.strip() == ("hetflow: deprecated: resources.device: write resources.devices: {kind: cpu} "
                                  "(device is read until the next release)")
    assert out.stdout.startswith("dry run: nothing was started") and "1 CPU each" in out.stdout
    path.write_text(path.read_text().replace("device: cpu", "devices: cpu"))
    new = subprocess.run([sys.executable, "-m", "hetflow.cli.main", "train", str(path), "--dry-run"],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert new.returncode == 0 and new.stderr == "", new.stderr
