"""The tuning YAML: search-space parsing into Ray Tune domains, and strict config loading.

Every bad space must fail before any trial starts, naming the key path and what to write.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
from ray.tune.search.optuna import OptunaSearch
from ray.tune.search.sample import Categorical, Float, Integer

from hetflow.core.errors import InputError
from hetflow.workloads.train.config import config_from_dict
from hetflow.workloads.tune.config import (
    load_tuning_config,
    parse_duration,
    tuning_config_from_dict,
)
from hetflow.workloads.tune.space import parse_space

REPO = Path(__file__).resolve().parents[2]
BASE = config_from_dict({"model": {"kind": "mlp", "hidden": [32]},
                         "resources": {"devices": "cpu"}})

GOOD = {
    "train": {
        "lr": {"loguniform": ["1e-4", 0.3]},  # PyYAML reads 1e-4 (no dot) as text
        "weight_decay": {"uniform": [0.0, 0.1]},
        "batch_size": {"qrandint": [16, 128, 16]},
        "seed": {"randint": [0, 3]},
        "optimizer": {"choice": ["adamw", "sgd"]},
    },
    "model": {"hidden": {"choice": [[32], [64, 64]]}},
}


def test_each_distribution_becomes_the_tune_domain_with_the_written_bounds() -> None:
    space = parse_space(GOOD, BASE)
    tune_space = space.to_tune()
    lr = tune_space["train"]["lr"]
    assert isinstance(lr, Float) and (lr.lower, lr.upper) == (1e-4, 0.3)
    assert isinstance(lr.get_sampler(), Float._LogUniform)
    wd = tune_space["train"]["weight_decay"]
    assert isinstance(wd.get_sampler(), Float._Uniform) and (wd.lower, wd.upper) == (0.0, 0.1)
    assert isinstance(tune_space["train"]["batch_size"], Integer)
    assert isinstance(tune_space["model"]["hidden"], Categorical)
    assert space.names == ("train.lr", "train.weight_decay", "train.batch_size", "train.seed",
                           "train.optimizer", "model.hidden")


def test_int_ranges_are_inclusive_and_qrandint_stays_on_its_step() -> None:
    space = parse_space(GOOD, BASE).to_tune()
    rng = np.random.default_rng(0)
    seeds = {int(v) for v in space["train"]["seed"].sample(size=400, random_state=rng)}
    assert seeds == {0, 1, 2, 3}  # Ray's randint excludes its upper end; ours includes it
    batches = {int(v) for v in space["train"]["batch_size"].sample(size=400, random_state=rng)}
    assert batches == {16, 32, 48, 64, 80, 96, 112, 128}


def test_choice_of_lists_reaches_optuna_as_text_and_decodes_back() -> None:
    space = parse_space(GOOD, BASE)
    # Optuna's categorical distribution refuses lists; the encoded space converts.
    converted = OptunaSearch.convert_search_space(space.to_tune())
    assert converted["model/hidden"].choices == ("[32]", "[64, 64]")
    sampled = {"train": {"lr": 0.01, "weight_decay": 0.0, "batch_size": np.int64(32),
                         "seed": 1, "optimizer": "sgd"}, "model": {"hidden": "[64, 64]"}}
    overrides = space.overrides(sampled)
    assert overrides["model"] == {"hidden": [64, 64]}
    assert type(overrides["train"]["batch_size"]) is int
    trial_config = BASE.with_overrides(**overrides)
    assert trial_config.model.hidden == (64, 64) and trial_config.train.optimizer == "sgd"
    assert space.describe(sampled).startswith("lr=0.01 weight_decay=0 batch_size=32")


BAD_SPACES = [
    # (space, the key path and the words the message must hold)
    ({"train": {"lrr": {"loguniform": [1e-4, 0.1]}}},
     ["space.train.lrr", "not a field", "did you mean 'lr'"]),
    ({"train": {"lr": {"log_uniform": [1e-4, 0.1]}}},
     ["space.train.lr", "unknown distribution", "did you mean 'loguniform'"]),
    ({"train": {"lr": {"loguniform": [0, 0.1]}}}, ["space.train.lr", "0 < low"]),
    ({"train": {"lr": {"uniform": [0.3, 0.1]}}}, ["space.train.lr", "low < high"]),
    ({"train": {"lr": {"uniform": [0.1]}}}, ["space.train.lr", "[low, high]"]),
    ({"train": {"lr": {"uniform": ["a", 0.1]}}}, ["space.train.lr", "numbers"]),
    ({"train": {"lr": 0.01}}, ["space.train.lr", "fixed value belongs in the base"]),
    ({"train": {"lr": {"uniform": [0.1, 0.2], "choice": [1]}}},
     ["space.train.lr", "one distribution"]),
    ({"train": {"batch_size": {"uniform": [16, 64]}}},
     ["space.train.batch_size", "whole number", "randint"]),
    ({"train": {"batch_size": {"randint": [16.5, 64]}}},
     ["space.train.batch_size", "whole numbers"]),
    ({"train": {"batch_size": {"qrandint": [10, 64, 16]}}},
     ["space.train.batch_size", "multiples of the step", "[16, 64, 16]"]),
    ({"train": {"batch_size": {"choice": [0, 16]}}},
     ["space.train.batch_size", "value 0 is not accepted", "greater than 0"]),
    ({"train": {"optimizer": {"choice": ["adam"]}}},
     ["space.train.optimizer", "'adamw' or 'sgd'"]),
    ({"train": {"batch_size": {"choice": []}}}, ["space.train.batch_size", "non-empty list"]),
    ({"train": {"batch_size": {"choice": [16, 16]}}}, ["space.train.batch_size", "more than once"]),
    ({"model": {"hidden": {"choice": [[32], [0]]}}}, ["space.model.hidden", "value [0]"]),
    ({"layout": {"dp": {"choice": [1, 2]}}}, ["space.layout", "cannot be searched"]),
    ({"trian": {"lr": {"uniform": [0.1, 0.2]}}}, ["space.trian", "did you mean 'train'"]),
    ({"train": []}, ["space.train", "mapping of field"]),
    ({}, ["space", "expected a mapping"]),
]


@pytest.mark.parametrize("space, expected", BAD_SPACES, ids=[e[0] for _, e in BAD_SPACES])
def test_a_bad_space_names_its_key_path_and_the_fix(space: dict, expected: list[str]) -> None:
    with pytest.raises(InputError) as info:
        parse_space(space, BASE)
    for words in expected:
        assert words in str(info.value)


def test_every_mistake_of_a_space_is_reported_at_once() -> None:
    with pytest.raises(InputError) as info:
        parse_space({"train": {"lrr": {"uniform": [0.1, 0.2]}, "lr": {"uniform": [1, 0]}}}, BASE)
    assert "space.train.lrr" in str(info.value) and "space.train.lr:" in str(info.value)


def _config(**sections: object) -> dict:
    data = {"base": {"model": {"kind": "mlp", "hidden": [32]}, "resources": {"devices": "cpu"}},
            "space": {"train": {"lr": {"loguniform": [1e-4, 0.1]}}}}
    data.update(sections)
    return data


BAD_CONFIGS = [
    ({"serch": {}}, ["serch: unknown key", "did you mean 'search'"]),
    ({"search": {"schedular": "asha"}}, ["search.schedular", "did you mean 'scheduler'"]),
    ({"search": {"algorithm": "bayes"}}, ["search.algorithm", "'tpe' or 'random'"]),
    ({"budget": {"time": "10 min"}}, ["budget.time", "not a duration"]),
    ({"budget": {"trials": 0}}, ["budget.trials", "greater than 0"]),
    ({"budget": {"epochs": 1}}, ["grace_epochs 1 must be below budget.epochs 1"]),
    ({"trial": {"devices": {"memory": "lots"}}}, ["trial.devices.memory"]),
    ({"base": {"model": {"kind": "mlp", "hiden": [3]}}},
     ["base.model.hiden: unknown key", "did you mean 'hidden'"]),
    ({"base": {"layout": {"dp": 2}}}, ["base.layout", "one process"]),
    ({"base": {"model": {"kind": "gpt"}}}, ["val_accuracy needs the mlp model"]),
    ({"space": {"train": {"lr": {"loguniform": [-1, 0.1]}}}}, ["space.train.lr", "0 < low"]),
]


@pytest.mark.parametrize("sections, expected", BAD_CONFIGS, ids=[e[0] for _, e in BAD_CONFIGS])
def test_a_bad_tuning_config_names_its_key_path(sections: dict, expected: list[str]) -> None:
    with pytest.raises(InputError) as info:
        tuning_config_from_dict(_config(**sections), source="tune.yaml")
    message = str(info.value)
    assert message.startswith("tune.yaml: ")
    for words in expected:
        assert words in message


def test_a_config_without_space_says_it_is_required() -> None:
    data = _config()
    del data["space"]
    with pytest.raises(InputError, match="space: required"):
        tuning_config_from_dict(data)


def test_durations() -> None:
    assert [parse_duration(v) for v in (90, "90", "90s", "10m", "1.5h")] == \
        [90.0, 90.0, 90.0, 600.0, 5400.0]
    for bad in ("10 min", "-5", 0, "h"):
        with pytest.raises(InputError):
            parse_duration(bad)


def test_the_example_loads_and_a_base_path_is_read_relative_to_the_file(tmp_path: Path) -> None:
    example = load_tuning_config(REPO / "examples" / "tune_digits.yaml")
    assert example.search.algorithm == "tpe" and example.search.scheduler == "asha"
    assert set(example.search_space.names) >= {"train.lr", "model.hidden"}
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "train.yaml").write_text(
        "model: {kind: mlp, hidden: [16]}\ntrain: {batch_size: 32}\n")
    (tmp_path / "jobs" / "tune.yaml").write_text(textwrap.dedent("""\
        base: train.yaml
        space:
          train:
            lr: {loguniform: [1e-4, 1e-1]}
        """))
    config = load_tuning_config(tmp_path / "jobs" / "tune.yaml")
    assert config.base.model.hidden == (16,) and config.base.train.batch_size == 32
    assert config.search_space.params[0].args == (1e-4, 1e-1)
    (tmp_path / "jobs" / "broken.yaml").write_text("base: missing.yaml\nspace: {}\n")
    with pytest.raises(InputError, match="cannot read training config"):
        load_tuning_config(tmp_path / "jobs" / "broken.yaml")


def test_hetflow_tune_reports_a_bad_config_with_exit_code_2(tmp_path: Path, capsys,
                                                           monkeypatch) -> None:
    from hetflow.cli import main as cli_main

    if "tune" not in cli_main.COMMAND_MODULES:  # until the lead registers the verb
        monkeypatch.setattr(cli_main, "COMMAND_MODULES", [*cli_main.COMMAND_MODULES, "tune"])
    config = tmp_path / "tune.yaml"
    config.write_text("space:\n  train:\n    lr: {loguniform: [0, 0.1]}\n")
    assert cli_main.main(["tune", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hetflow: error: ") and "space.train.lr: loguniform needs 0 < low" in err
    assert len(err.strip().splitlines()) == 1  # one line, no traceback
