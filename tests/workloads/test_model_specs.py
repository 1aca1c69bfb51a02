"""Model specs: the registry of built-ins, a user's spec by import path, the one-line errors of
a path that does not resolve, and a user's model (``tests/fixtures/user_pkg``, a package outside
``src/``) trained in every layout its spec allows, against one process.

The user's package is imported as a user's would be: its directory goes on ``sys.path`` (the
spawned training processes inherit it), nothing else.
"""

from __future__ import annotations

import dataclasses
import pickle
import sys
from pathlib import Path

import pytest

from hetflow.core.errors import InputError
from hetflow.workloads.models.spec import (
    BUILTIN_SPECS,
    ModelSpec,
    builtin_spec,
    resolve_spec,
    spec_of,
)
from hetflow.workloads.train.checkpoint import latest_checkpoint
from hetflow.workloads.train.config import GPTConfig, MLPConfig, config_from_dict
from hetflow.workloads.train.job import evaluate_checkpoint
from tests.workloads.launch import run_worlds

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
BLOBS = "user_pkg.blobs:SPEC"


@pytest.fixture(scope="module", autouse=True)
def user_pkg_importable():
    sys.path.insert(0, str(FIXTURES))
    yield
    sys.path.remove(str(FIXTURES))


def blobs_job(ckpt: Path, layout: dict | None = None, **sections: dict):
    data = {"model": {"spec": BLOBS, "hidden": 16}, "layout": layout or {},
            "train": {"steps": 6, "batch_size": 16, "log_every": 1, "optimizer": "sgd",
                      "lr": 0.2},
            "checkpoint": {"dir": str(ckpt)}, "resources": {"devices": "cpu"}}
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    return config_from_dict(data, source="job.yaml")


def test_the_builtins_are_two_entries_of_one_registry() -> None:
    assert sorted(BUILTIN_SPECS) == ["gpt", "mlp"]
    for name, section in (("mlp", MLPConfig), ("gpt", GPTConfig)):
        spec = builtin_spec(name)
        assert isinstance(spec, ModelSpec) and spec.name == name and spec.config is section
        assert spec.parallelize is not None and spec.pipeline_blocks is not None
    assert builtin_spec("mlp").metrics == ("val_loss", "val_accuracy")
    assert builtin_spec("gpt").metrics == ("val_loss", "val_token_accuracy")
    # A built-in is written back as it was read: by kind, without a spec key.
    config = config_from_dict({"model": {"kind": "gpt", "layers": 3}})
    assert config.model_dump(mode="json")["model"] == {
        "kind": "gpt", "layers": 3, "heads": 4, "dim": 64, "ffn_mult": 4, "seq_len": 64}
    assert spec_of(config.model) is builtin_spec("gpt")


def test_a_user_spec_is_read_by_its_import_path_and_written_back_with_it(tmp_path) -> None:
    config = blobs_job(tmp_path)
    assert spec_of(config.model) is resolve_spec(BLOBS)
    assert config.model.hidden == 16 and config.dataset == "blobs"
    dumped = config.model_dump(mode="json")
    assert dumped["model"]["spec"] == BLOBS
    again = config_from_dict(dumped)
    assert again == config and spec_of(again.model) is spec_of(config.model)
    # Pickled to a Ray worker or a spawned process, it still knows its spec.
    assert spec_of(pickle.loads(pickle.dumps(config)).model) is resolve_spec(BLOBS)
    assert config.with_overrides(model={"hidden": 8}).model.hidden == 8


# (model or data section, the one line after "job.yaml: ")
BAD_PATHS = [
    ({"model": {"spec": "user_pkg.blobs:SPECS"}},
     'model.spec: "user_pkg.blobs:SPECS": module user_pkg.blobs has no attribute SPECS'),
    ({"model": {"spec": "user_pkg.blob:SPEC"}},
     'model.spec: "user_pkg.blob:SPEC": no module named user_pkg.blob (make its directory '
     "importable: run from the directory that holds it, or add that directory to PYTHONPATH)"),
    ({"model": {"spec": "nowhere_pkg.models:SPEC"}},
     'model.spec: "nowhere_pkg.models:SPEC": no module named nowhere_pkg'),
    ({"model": {"spec": "user_pkg.blobs.SPEC"}},
     'model.spec: "user_pkg.blobs.SPEC": expected "package.module:NAME"'),
    ({"model": {"spec": "user_pkg.blobs:SPEC.nope"}},
     'model.spec: "user_pkg.blobs:SPEC.nope": user_pkg.blobs:SPEC has no attribute nope'),
    ({"model": {"spec": "user_pkg.blobs:NOT_A_SPEC"}},
     'model.spec: "user_pkg.blobs:NOT_A_SPEC" is a dict, not a hetflow ModelSpec'),
    ({"model": {"spec": "user_pkg.broken:SPEC"}},
     'model.spec: "user_pkg.broken:SPEC": importing user_pkg.broken failed: RuntimeError: '
     "user_pkg.broken is broken on purpose"),
    ({"model": {"spec": BLOBS, "kind": "mlp"}}, "model.kind: give kind"),
    ({"model": {"kind": "rnn"}}, "model.kind: 'rnn' is not a built-in model; give kind mlp or "
                                 'gpt, or name your own model with spec: "package.module:SPEC"'),
    ({"model": {"spec": BLOBS, "hiden": 4}},
     "model.hiden: unknown key (did you mean 'hidden'?"),
    ({"model": {"spec": BLOBS}, "data": {"loader": "user_pkg.data:load_all"}},
     'data.loader: "user_pkg.data:load_all": module user_pkg.data has no attribute load_all'),
    ({"model": {"spec": BLOBS}, "data": {"loader": "user_pkg.blobs:CENTRE_SEED"}},
     'data.loader: "user_pkg.blobs:CENTRE_SEED" is a int, not a function'),
]


@pytest.mark.parametrize("sections, line", BAD_PATHS, ids=[line[:40] for _, line in BAD_PATHS])
def test_a_bad_import_path_is_one_line_naming_module_and_attribute(sections, line) -> None:
    with pytest.raises(InputError) as err:
        config_from_dict(sections, source="job.yaml")
    message = str(err.value)
    assert message.startswith(f"job.yaml: {line}"), message
    assert "\n" not in message


def test_what_a_spec_lacks_is_refused_with_a_fix(tmp_path) -> None:
    no_plan = dataclasses.replace(resolve_spec(BLOBS), name="blobs-no-tp", parallelize=None)
    sys.modules["user_pkg.blobs"].NO_TP = no_plan  # a second spec, as a user would add one
    try:
        with pytest.raises(InputError, match=r'layout.tp 2: model.spec "user_pkg.blobs:NO_TP" '
                                             r"has no tensor-parallel plan .*use layout.tp 1"):
            config_from_dict({"model": {"spec": "user_pkg.blobs:NO_TP"}, "layout": {"tp": 2}})
    finally:
        del sys.modules["user_pkg.blobs"].NO_TP
    with pytest.raises(InputError, match="has no pipeline split"):
        blobs_job(tmp_path, {"pp": 2})
    with pytest.raises(InputError, match="layout.tp 2 must divide model.hidden 15"):
        config_from_dict({"model": {"spec": BLOBS, "hidden": 15}, "layout": {"tp": 2}})
    with pytest.raises(InputError, match="trains on data.dataset blobs, not digits"):
        config_from_dict({"model": {"spec": BLOBS}, "data": {"dataset": "digits"}})


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The user's model in one world of processes: one process, its TP plan (tp 2), DDP and
    FSDP (dp 2), and one process on the loader's split."""
    root = tmp_path_factory.mktemp("blobs")
    configs = {
        "single": blobs_job(root / "single"),
        "tp2": blobs_job(root / "tp2", {"tp": 2}),
        "dp2": blobs_job(root / "dp2", {"dp": 2}),
        "fsdp2": blobs_job(root / "fsdp2", {"dp": 2, "data_parallel": "fsdp"}),
        "loader": blobs_job(root / "loader", data={"loader": "user_pkg.data:load_one_class"},
                            train={"steps": 30}),
    }
    outcomes = run_worlds(list(configs.values()))
    return configs, dict(zip(configs, outcomes))


@pytest.mark.parametrize("layout", ["tp2", "dp2", "fsdp2"])
def test_the_user_model_trains_the_same_in_every_layout(trained, layout) -> None:
    configs, outcomes = trained
    got, ref = outcomes[layout], outcomes["single"]
    assert got.error is None and ref.error is None, (got.error, ref.error)
    assert sorted(got.losses) == list(range(1, 7))
    assert abs(ref.losses[6] - ref.losses[1]) > 0.01  # the steps moved the weights
    for step in range(1, 7):
        assert got.losses[step] == pytest.approx(ref.losses[step], abs=1e-4), step
    # tp 2 sharded the layers its plan names (two shards each, along the plan's dim); DDP holds
    # whole tensors; FSDP shards every parameter over dp along dim 0.
    chunks = _chunks(configs[layout])
    if layout == "tp2":
        assert chunks["model.fc1.weight"] == [(0, 0), (8, 0)]  # column-wise: output rows
        assert chunks["model.fc2.weight"] == [(0, 0), (0, 8)]  # row-wise: input columns
    elif layout == "fsdp2":
        assert chunks["model.fc1.weight"] == [(0, 0), (8, 0)]
        assert chunks["model.fc2.weight"] == [(0, 0), (2, 0)]  # 3 classes: rows 0-1 and 2
    else:
        assert chunks["model.fc1.weight"] == [(0, 0)] and chunks["model.fc2.weight"] == [(0, 0)]
    # The sharded checkpoint loads into the plain single-device model and scores the same.
    got_eval = evaluate_checkpoint(configs[layout], latest_checkpoint(configs[layout].checkpoint_dir))
    ref_eval = evaluate_checkpoint(configs["single"], latest_checkpoint(configs["single"].checkpoint_dir))
    assert set(got_eval) == {"val_loss", "val_accuracy"}
    assert got_eval["val_loss"] == pytest.approx(ref_eval["val_loss"], abs=1e-4)


def _chunks(config) -> dict[str, list[tuple[int, ...]]]:
    """Offsets of the chunks DCP wrote for each model tensor of the final checkpoint."""
    from torch.distributed.checkpoint import FileSystemReader

    meta = FileSystemReader(str(latest_checkpoint(config.checkpoint_dir).path)).read_metadata()
    return {key: sorted(tuple(c.offsets) for c in item.chunks)
            for key, item in meta.state_dict_metadata.items()
            if key.startswith("model.") and hasattr(item, "chunks")}


def test_data_loader_replaces_the_spec_dataset(trained) -> None:
    """Every sample of the loader's split is class 1; the spec's own blobs are balanced over 3
    classes, so only a model trained and scored on the loader's split reaches 1.0."""
    configs, outcomes = trained
    assert outcomes["loader"].error is None, outcomes["loader"].error
    config = configs["loader"]
    metrics = evaluate_checkpoint(config, latest_checkpoint(config.checkpoint_dir))
    assert metrics["val_accuracy"] == 1.0
    balanced = evaluate_checkpoint(configs["single"], latest_checkpoint(config.checkpoint_dir))
    assert balanced["val_accuracy"] < 0.5
