"""The workflow file: strict loading with key paths, lines and what was expected (no Ray)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from hetflow.core.errors import InputError
from hetflow.workflow.spec import key_lines, load_workflow, workflow_from_dict

EXAMPLE = Path(__file__).parents[2] / "examples" / "digits.yaml"

GOOD = """\
name: wf
prepare:
  val_fraction: 0.25
train:
  model: {kind: mlp, hidden: [32]}
  train:
    steps: 10
    batch_size: 32
export:
  precision: int8
serve:
  devices: cpu
load_test:
  rate: 10
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "wf.yaml"
    path.write_text(text)
    return path


def error_of(tmp_path: Path, text: str) -> str:
    with pytest.raises(InputError) as info:
        load_workflow(write(tmp_path, text))
    return str(info.value)


def test_example_loads_with_its_stages() -> None:
    spec = load_workflow(EXAMPLE)
    assert spec.name == "digits"
    assert spec.train.layout.dp == 2
    assert spec.export.precision == "int8"
    assert spec.tune.enabled is False
    assert spec.load_test.max_requests == 400


def test_good_file_fills_defaults_and_wires_the_data(tmp_path: Path) -> None:
    spec = load_workflow(write(tmp_path, GOOD))
    train = spec.train_config(str(tmp_path / "ck"))
    assert train.data.val_fraction == 0.25  # prepare's split reaches the training job
    assert train.checkpoint_dir == tmp_path / "ck"
    serve = spec.serve_config(str(tmp_path / "export"))
    assert serve.models[0].precision == "int8"
    assert serve.http.host == "127.0.0.1"


@pytest.mark.parametrize("text, expected", [
    # unknown key: its path, its line, a suggestion and the known keys
    (GOOD.replace("  val_fraction: 0.25", "  val_fracton: 0.25"),
     ["wf.yaml:3", "prepare.val_fracton: unknown key", "did you mean 'val_fraction'"]),
    # unknown key deep inside the reused training section
    (GOOD.replace("    batch_size: 32", "    batch_sise: 32"),
     ["wf.yaml:8", "train.train.batch_sise: unknown key", "did you mean 'batch_size'"]),
    # wrong type: the path, the line and what was expected
    (GOOD.replace("    steps: 10", "    steps: ten"),
     ["wf.yaml:7", "train.train.steps", "valid integer", "'ten'"]),
    (GOOD.replace("  rate: 10", "  rate: [1]"), ["wf.yaml:14", "load_test.rate", "valid number"]),
    # a choice outside the allowed ones
    (GOOD.replace("  precision: int8", "  precision: int4"),
     ["wf.yaml:10", "export.precision", "'fp32', 'bf16', 'fp16' or 'int8'"]),
    # missing required section
    ("name: wf\n", ["train: missing; this field is required"]),
    # missing required field inside a section (tune space for an enabled tune stage)
    (GOOD + "tune:\n  enabled: true\n", ["tune.space: empty"]),
    # rules across stages, checked by building the stage's own config at load time
    (GOOD.replace("  devices: cpu", "  devices: gpu").replace("precision: int8", "precision: int8"),
     ["wf.yaml:11", "serve:", "int8"]),
    (GOOD + "  max_p99_ms: -3\n", ["load_test.max_p99_ms", "greater than 0"]),
    (GOOD.replace("train:\n  model", "train:\n  data: {seed: 1}\n  model"),
     ["train.data: set by the workflow", "under prepare"]),
    (GOOD.replace("export:\n", "export:\n  source: tune\n"),
     ["export.source: tune needs tune.enabled"]),
])
def test_bad_files_are_refused_with_path_line_and_expectation(
        tmp_path: Path, text: str, expected: list[str]) -> None:
    message = error_of(tmp_path, text)
    for part in expected:
        assert part in message, (part, message)


def test_several_errors_are_all_reported(tmp_path: Path) -> None:
    text = GOOD.replace("  rate: 10", "  rat: 10").replace("    steps: 10", "    steps: -1")
    message = error_of(tmp_path, text)
    assert "load_test.rat: unknown key" in message
    assert "train.train.steps" in message and "greater than 0" in message


def test_malformed_yaml_names_its_line(tmp_path: Path) -> None:
    message = error_of(tmp_path, "name: wf\ntrain: {model: [\n")
    assert "wf.yaml:3" in message and "not valid YAML" in message


def test_not_a_mapping_is_refused() -> None:
    with pytest.raises(InputError, match="expected a mapping"):
        workflow_from_dict(["name", "wf"])


def test_key_lines_maps_nested_keys_and_list_items() -> None:
    lines = key_lines(GOOD)
    assert lines[("prepare", "val_fraction")] == 3
    assert lines[("train", "model", "hidden")] == 5
    assert lines[("train", "model", "hidden", "0")] == 5
    assert lines[("load_test", "rate")] == 14


def test_spec_is_frozen(tmp_path: Path) -> None:
    spec = load_workflow(write(tmp_path, GOOD))
    with pytest.raises(Exception):
        spec.export.precision = "fp32"  # type: ignore[misc]


def _leaves(data, prefix=()):
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _leaves(value, (*prefix, key))
    else:
        yield ".".join(prefix), data


def test_gpu_example_is_the_cpu_example_with_only_resources_changed() -> None:
    import yaml

    cpu = dict(_leaves(yaml.safe_load(EXAMPLE.read_text())))
    gpu_path = EXAMPLE.with_name("digits_gpu.yaml")
    gpu = dict(_leaves(yaml.safe_load(gpu_path.read_text())))
    changed = {k for k in cpu.keys() & gpu.keys() if cpu[k] != gpu[k]}
    assert changed == {"name", "train.layout.dp", "train.resources.devices", "export.precision",
                       "serve.devices.kind", "serve.replicas"}
    assert set(gpu) - set(cpu) == {"train.train.precision", "serve.devices.memory"}
    assert all(k.startswith("tune.") for k in set(cpu) - set(gpu))  # tuning off in both
    spec = load_workflow(gpu_path)  # and it loads: bf16 is accepted on GPUs
    assert (spec.train.resources.devices.kind, spec.serve.devices.kind) == ("gpu", "gpu")
    assert spec.serve_config("export").models[0].precision == "bf16"


def test_the_served_model_must_be_a_classifier_by_its_spec(tmp_path: Path) -> None:
    """The workflow scores and serves accuracy: it asks the model's spec, not its name. The
    gpt (token accuracy, next-token output) is refused; a user's classifier spec loads, and
    its split depends on the spec (the stage keys hash its model section)."""
    gpt = GOOD.replace("{kind: mlp, hidden: [32]}", "{kind: gpt}")
    message = error_of(tmp_path, gpt)
    assert "train.model: the workflow serves a classifier" in message
    assert "model.kind gpt is not one (it reports val_loss, val_token_accuracy and serves " \
           "sequence_logits" in message
    fixtures = str(Path(__file__).parents[1] / "fixtures")
    sys.path.insert(0, fixtures)
    try:
        user = GOOD.replace("{kind: mlp, hidden: [32]}",
                            '{spec: "user_pkg.blobs:SPEC", hidden: 16}')
        spec = load_workflow(write(tmp_path, user))
        settings = spec.prepare_settings()
        assert settings["dataset"] == "blobs" and settings["model"]["hidden"] == 16
        assert spec.train_config().model.hidden == 16
    finally:
        sys.path.remove(fixtures)
    mlp = load_workflow(write(tmp_path, GOOD)).prepare_settings()
    assert mlp == {"dataset": "digits", "val_fraction": 0.25, "seed": 0}  # keys as before
