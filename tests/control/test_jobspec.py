"""Job files: strict loading with key paths and "did you mean", and resolving at submit time."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetflow.control.jobspec import job_from_dict, load_job, resolve
from hetflow.core.errors import InputError

REPO = Path(__file__).resolve().parents[2]
PY = {"script": "run.py"}


@pytest.mark.parametrize("doc, message", [
    ({"name": "a", "kind": "python", "python": PY, "devics": {}},
     "devics: unknown key (did you mean 'devices'?"),
    ({"name": "a", "kind": "python", "python": PY, "devices": {"cont": 2}},
     "devices.cont: unknown key (did you mean 'count'?"),
    ({"name": "a", "kind": "python", "python": {"scrpt": "x.py"}},
     "python.scrpt: unknown key (did you mean 'script'?"),
    ({"name": "a", "kind": "train"}, "kind train needs the train key"),
    ({"name": "a", "kind": "python", "python": PY, "tune": "t.yaml"}, "kind python takes no tune key"),
    ({"name": "a", "kind": "python", "python": {"entrypoint": "nocolon"}},
     "python.entrypoint: write package.module:function"),
    ({"name": "a", "kind": "python", "python": {}}, "give exactly one of python.entrypoint"),
    ({"name": "a", "kind": "python", "python": PY, "devices": {"memory": "12 bogus"}},
     "devices: cannot read size '12 bogus'"),
    ({"name": "a", "kind": "python", "python": PY, "devices": {"count": 0}},
     "devices.count: Input should be greater than 0"),
    ({"name": "a", "kind": "python", "python": PY, "work": {"steps": 3, "seconds": 4}},
     "give work.steps or work.seconds, not both"),
    ({"kind": "python", "python": PY}, "name: missing"),
    ({"name": "a b", "kind": "python", "python": PY}, "name: String should match pattern"),
    ({"name": "a", "kind": "serve", "python": PY}, "kind: Input should be 'train', 'tune' or 'python'"),
])
def test_bad_job_files_say_which_key_and_what_to_write(doc: dict, message: str) -> None:
    with pytest.raises(InputError) as exc:
        job_from_dict(doc, source="job.yaml")
    assert str(exc.value).startswith("job.yaml: ")
    assert message in str(exc.value)


def test_train_job_reads_its_config_and_pins_the_checkpoint_directory(tmp_path: Path) -> None:
    (tmp_path / "t.yaml").write_text("name: tiny\nlayout: {dp: 2}\ntrain: {steps: 40}\n")
    (tmp_path / "job.yaml").write_text("name: tiny\nkind: train\ntrain: t.yaml\n")
    spec = load_job(tmp_path / "job.yaml")
    assert isinstance(spec.train, dict)  # inline now: the cluster never reads the submitter's files
    assert spec.num_devices == 2 and spec.total_work == 40.0 and spec.cpus_per_device == 1.0
    assert spec.train_config().checkpoint_dir == tmp_path / "runs" / "tiny" / "checkpoints"
    assert spec.is_preemptible and spec.effective_job_type == "train:tiny"


def test_train_job_device_count_must_match_its_layout(tmp_path: Path) -> None:
    spec = job_from_dict({"name": "a", "kind": "train", "train": {"layout": {"dp": 2}},
                          "devices": {"count": 4}})
    with pytest.raises(InputError, match="devices.count 4 must equal .* world size dp\\*pp\\*tp = 2"):
        resolve(spec, tmp_path)


def test_python_paths_are_taken_from_the_job_file(tmp_path: Path) -> None:
    spec = resolve(job_from_dict({"name": "a", "kind": "python", "python": {"script": "s/run.py"},
                                  "work": {"seconds": 5}}), tmp_path)
    assert spec.python is not None
    assert spec.python.script == str(tmp_path / "s" / "run.py")
    assert spec.python.workdir == str(tmp_path)
    assert spec.num_devices == 1 and spec.total_work == 5.0 and spec.effective_job_type == "fixed-duration"


def test_tune_jobs_are_never_preemptible(tmp_path: Path) -> None:
    spec = resolve(job_from_dict({"name": "t", "kind": "tune", "tune": "tune.yaml"}), tmp_path)
    assert spec.tune == str(tmp_path / "tune.yaml")
    assert spec.preemptible and not spec.is_preemptible
    assert spec.total_work == float("inf")  # open-ended without an estimate


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "examples" / "jobs").glob("*.yaml")))
def test_example_job_files_load(name: str) -> None:
    spec = load_job(REPO / "examples" / "jobs" / name)
    assert spec.num_devices >= 1
