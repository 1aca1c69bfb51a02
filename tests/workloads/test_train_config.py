"""The training config: one YAML -> frozen object; unknown keys and bad combinations are refused
with the key path and a fix."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest

from hetflow.cli.train import parse_overrides
from hetflow.core.errors import InputError
from hetflow.workloads.train.config import (
    CheckpointConfig,
    DataConfig,
    GPTConfig,
    LayoutConfig,
    MLPConfig,
    OptimConfig,
    ResourcesConfig,
    TrainConfig,
    config_from_dict,
    load_config,
)
from hetflow.workloads.train.job import smaller_layouts

REPO = Path(__file__).resolve().parents[2]


def test_example_loads() -> None:
    config = load_config(REPO / "examples" / "train_digits.yaml")
    assert (config.layout.dp, config.layout.pp, config.layout.tp) == (2, 1, 1)
    assert config.resources.devices.kind == "cpu"
    assert config.dataset == "digits"


def test_defaults_and_frozen() -> None:
    config = config_from_dict({"model": {"kind": "gpt"}})
    assert isinstance(config.model, GPTConfig) and config.dataset == "python-source"
    with pytest.raises(pydantic.ValidationError):
        config.train.steps = 5  # type: ignore[misc]


@pytest.mark.parametrize("section", [MLPConfig, GPTConfig, DataConfig, LayoutConfig, OptimConfig,
                                     CheckpointConfig, ResourcesConfig, TrainConfig])
def test_every_field_is_documented(section: type[pydantic.BaseModel]) -> None:
    undocumented = [n for n, f in section.model_fields.items() if not f.description]
    assert undocumented == []


@pytest.mark.parametrize("data, path", [
    ({"layout": {"tpp": 2}}, "layout.tpp"),
    ({"model": {"kind": "gpt", "layer": 3}}, "model.layer"),
    ({"checkpoint": {"every": 5}}, "checkpoint.every"),
    ({"optimiser": {}}, "optimiser"),
])
def test_unknown_key_is_refused_with_its_path(data: dict, path: str) -> None:
    with pytest.raises(InputError) as err:
        config_from_dict(data, source="job.yaml")
    assert f"job.yaml: {path}: unknown key" in str(err.value)


@pytest.mark.parametrize("data, fragment", [
    ({"layout": {"dp": 3}, "train": {"batch_size": 64}}, "split evenly over layout.dp"),
    ({"layout": {"dp": 2, "tp": 2}}, "data_parallel: fsdp"),
    ({"layout": {"tp": 3}, "model": {"kind": "gpt"}}, "must divide model.heads"),
    ({"layout": {"tp": 2}, "model": {"kind": "mlp", "hidden": [64]}}, "in pairs"),
    ({"layout": {"pp": 4}, "model": {"kind": "gpt", "layers": 2}}, "more stages"),
    ({"layout": {"pp": 2, "microbatches": 1}, "model": {"kind": "gpt"}}, "microbatches >= pp"),
    ({"layout": {"pp": 2}, "model": {"kind": "gpt"}, "train": {"precision": "fp16"}}, "fp16"),
    ({"model": {"kind": "mlp"}, "data": {"dataset": "python-source"}}, "trains on"),
    ({"model": {"kind": "gpt", "dim": 30, "heads": 4}}, "must divide by model.heads"),
    ({"train": {"precision": "fp8"}}, "train.precision"),
    ({"layout": {"dp": 0}}, "layout.dp"),
])
def test_bad_combinations_say_how_to_fix(data: dict, fragment: str) -> None:
    with pytest.raises(InputError) as err:
        config_from_dict(data)
    assert fragment in str(err.value)


def test_bad_yaml_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\nlayout:\n  dp: [1\n")
    with pytest.raises(InputError, match=r"bad.yaml:\d+: not valid YAML"):
        load_config(path)
    with pytest.raises(InputError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")


def test_overrides_are_validated() -> None:
    config = config_from_dict({})
    assert config.with_overrides(layout={"dp": 2}).layout.dp == 2
    with pytest.raises(InputError, match="layout.dq: unknown key"):
        config.with_overrides(layout={"dq": 2})
    assert parse_overrides(["train.steps=50", "layout.data_parallel=fsdp"]) == {
        "train": {"steps": 50}, "layout": {"data_parallel": "fsdp"}}
    with pytest.raises(InputError, match="SECTION.KEY=VALUE"):
        parse_overrides(["steps=5"])


def test_smaller_layouts_keep_the_global_batch() -> None:
    config = config_from_dict({"layout": {"dp": 4, "data_parallel": "fsdp"},
                               "train": {"batch_size": 12}})
    shrunk = smaller_layouts(config)
    assert [c.layout.dp for c in shrunk] == [3, 2, 1]
    assert all(c.train.batch_size == 12 for c in shrunk)
    assert shrunk[-1].layout.data_parallel == "ddp"
    odd = config_from_dict({"layout": {"dp": 4}, "train": {"batch_size": 8}})
    assert [c.layout.dp for c in smaller_layouts(odd)] == [2, 1]  # 3 does not divide 8
