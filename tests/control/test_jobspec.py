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
     "devices.memory: cannot read size '12 bogus'"),
    ({"name": "a", "kind": "python", "python": PY, "devices": {"count": -1}},
     "devices.count: Input should be greater than or equal to 0"),
    ({"name": "a", "kind": "python", "python": PY, "devices": {"count": 0, "model": "MI300X"}},
     "devices: count 0 asks for no device, so model cannot apply"),
    ({"name": "a", "kind": "python", "python": PY, "devices": {"type": "MI300X", "model": "MI300X"}},
     "devices.type and devices.model both given: keep devices.model"),
    ({"name": "a", "kind": "python", "python": PY, "devices": {"count": 0}, "cpus": 0},
     "a CPU job (devices.count 0) needs cpus > 0"),
    ({"name": "a", "kind": "python", "python": PY, "devices": {"count": 1}, "memory": "4GiB"},
     "memory (host memory) is for CPU jobs (devices.count 0)"),
    ({"name": "a", "kind": "python", "python": PY, "devices": {"count": 0}, "memory": "4 gigs"},
     "memory: cannot read size '4 gigs'"),
    ({"name": "a", "kind": "python", "python": PY, "work": {"steps": 3, "seconds": 4}},
     "give work.steps or work.seconds, not both"),
    ({"kind": "python", "python": PY}, "name: missing"),
    ({"name": "a b", "kind": "python", "python": PY}, "name: String should match pattern"),
    ({"name": "a", "kind": "serve", "python": PY}, "kind: Input should be 'train', 'tune', 'python' or 'launch'"),
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


# (file, devices, CPUs the policy schedules for a CPU job): what each example asks for
EXAMPLES = {"digits-train.yaml": (2, None), "sleep-python.yaml": (1, None), "digits-cpu.yaml": (0, 2.0),
            "digits-elastic.yaml": (2, None), "digits-adaptive.yaml": (2, None)}


def test_every_example_job_file_is_checked() -> None:
    assert sorted(p.name for p in (REPO / "examples" / "jobs").glob("*.yaml")) == sorted(EXAMPLES)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_job_files_load(name: str) -> None:
    spec = load_job(REPO / "examples" / "jobs" / name)
    devices, cpus = EXAMPLES[name]
    assert spec.num_devices == devices and spec.cpu_only == (devices == 0)
    if cpus is not None:
        assert spec.job_cpus == cpus


# -- CPU jobs ------------------------------------------------------------------------------------


def test_cpu_python_job_defaults_to_one_cpu_and_takes_host_memory() -> None:
    spec = job_from_dict({"name": "a", "kind": "python", "python": PY, "devices": {"count": 0}})
    assert spec.cpu_only and spec.job_cpus == 1.0 and spec.memory_bytes == 0 and spec.num_ranks == 1
    spec = job_from_dict({"name": "a", "kind": "python", "python": PY, "devices": {"count": 0},
                          "cpus": 3, "memory": "2GiB"})
    assert spec.job_cpus == 3.0 and spec.memory_bytes == 2 << 30


def test_cpu_training_config_makes_a_cpu_job_of_world_size_times_cpus_per_rank(tmp_path: Path) -> None:
    train = {"layout": {"dp": 3}, "train": {"batch_size": 48}, "resources": {"devices": "cpu", "cpus_per_rank": 2}}
    spec = resolve(job_from_dict({"name": "a", "kind": "train", "train": train}), tmp_path)
    assert spec.num_devices == 0 and spec.job_cpus == 6.0 and spec.num_ranks == 3
    # any devices section keeps it a device job (job files written before CPU jobs existed)
    typed = resolve(job_from_dict({"name": "a", "kind": "train", "train": train,
                                   "devices": {"model": "MI210"}}), tmp_path)
    assert typed.num_devices == 3 and not typed.cpu_only and typed.cpus_per_device == 2.0
    # a GPU training config stays a device job by default
    gpu = resolve(job_from_dict({"name": "a", "kind": "train", "train": {**train, "resources": {"devices": "gpu"}}}),
                  tmp_path)
    assert gpu.num_devices == 3


def test_devices_type_is_the_earlier_name_of_model_and_warns() -> None:
    with pytest.warns(FutureWarning, match="write devices.model: MI210"):
        old = job_from_dict({"name": "a", "kind": "python", "python": PY, "devices": {"type": "MI210"}})
    new = job_from_dict({"name": "a", "kind": "python", "python": PY, "devices": {"model": "MI210"}})
    assert old == new and old.devices.model == "MI210"


def test_cpu_training_job_needs_a_cpu_training_config(tmp_path: Path) -> None:
    spec = job_from_dict({"name": "a", "kind": "train", "train": {"resources": {"devices": "gpu"}},
                          "devices": {"count": 0}})
    with pytest.raises(InputError, match="devices.count 0 runs the training on CPUs; set resources.devices: cpu"):
        resolve(spec, tmp_path)


def test_launch_jobs_take_a_device_per_rank_or_a_cpu_per_rank(tmp_path: Path) -> None:
    base = {"name": "l", "kind": "launch", "launch": {"script": "train.py", "nproc": 4, "tp": 2}}
    spec = resolve(job_from_dict(base), tmp_path)
    assert spec.num_devices == 4 and spec.num_ranks == 4 and not spec.cpu_only
    assert spec.launch.script == str(tmp_path / "train.py") and spec.launch.workdir == str(tmp_path)
    cpu = resolve(job_from_dict({**base, "devices": {"count": 0}}), tmp_path)
    assert cpu.cpu_only and cpu.job_cpus == 4.0 and cpu.num_ranks == 4
    with pytest.raises(InputError, match="devices.count 2 must equal launch.nproc 4"):
        resolve(job_from_dict({**base, "devices": {"count": 2}}), tmp_path)


@pytest.mark.parametrize("launch, message", [
    ({"nproc": 2}, "give exactly one of launch.script or launch.module"),
    ({"script": "a.py", "module": "m"}, "give exactly one of launch.script or launch.module"),
    ({"script": "a.py", "nproc": 6, "tp": 4}, "must divide launch.nproc 6"),
    ({"script": "a.py", "nprocs": 2}, "launch.nprocs: unknown key (did you mean 'nproc'?"),
])
def test_bad_launch_sections_say_what_to_write(launch: dict, message: str) -> None:
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        job_from_dict({"name": "l", "kind": "launch", "launch": launch})


# --- fuzzed job files, as `hetflow submit --dry-run` reads them -------------------------------

TRAIN = {"name": "digits-dp2", "model": {"kind": "mlp", "hidden": [32]},
         "data": {"dataset": "digits", "val_fraction": 0.2}, "layout": {"dp": 2},
         "train": {"steps": 30, "batch_size": 64, "lr": 0.003},
         "checkpoint": {"dir": "ckpt", "interval": 10}, "resources": {"devices": "cpu"}}
GOOD_JOBS = [
    {"name": "digits", "kind": "train", "train": TRAIN, "devices": {"count": 0}, "cpus": 2,
     "memory": "2GiB", "work": {"steps": 30}},
    {"name": "py", "kind": "python", "python": {"script": "run.py", "args": ["30"], "env": {"A": "1"}},
     "devices": {"count": 1, "vendor": "nvidia", "memory": "16GiB"}, "cpus": 1,
     "preemptible": False, "weight": 1.0, "work": {"seconds": 30}, "max_attempts": 2},
    {"name": "l", "kind": "launch", "launch": {"script": "train.py", "nproc": 4, "tp": 2,
                                               "max_restarts": 1}},
    {"name": "t", "kind": "tune", "tune": "tune.yaml", "job_type": "tune"},
    {"name": "e", "kind": "train", "train": TRAIN, "devices": {"count": 2, "min": 1, "max": 4, "scaling": "eff:0.85"}},
]
# YAML a parser must not choke on: nesting deeper than Python's stack, an alias bomb (each
# level nine references to the one above), tabs, a document stream, a binary tag
NASTY_YAML = [b"[" * 600 + b"]" * 600, b"{a: " * 600 + b"1" + b"}" * 600,
              b"a: &a [x, x, x, x, x, x, x, x, x]\n" + b"".join(
                  b"%c: &%c [*%c, *%c, *%c, *%c, *%c, *%c, *%c, *%c, *%c]\n" % (
                      (98 + i, 98 + i) + (97 + i,) * 9) for i in range(8))
              + b"name: i\nkind: python\npython: {script: r.py, args: *i}\n",
              b"name:\tx\n", b"name: a\n---\nname: b\n", b"name: !!binary aGk=\nkind: tune\n",
              b"\xef\xbb\xbfname: bom\nkind: tune\ntune: t.yaml\n", b"\x00\x01", b"- 1\n- 2\n"]


def test_fuzzed_job_files_exit_0_or_2_with_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    """`hetflow submit JOB --dry-run` on job files with broken values, keys and bytes: exit 0
    (a valid job: its description) or 2 with one line; never a traceback or a hang."""
    import yaml
    from hypothesis import strategies as st

    from hetflow.cli.main import main
    from tests.fuzzing import (fuzz, leaf_edits, mutated, one_line_message, raw_bodies, report,
                               reuse_cli_parser)

    monkeypatch.setenv("RAY_ADDRESS", "local")  # the dry run looks for no cluster
    reuse_cli_parser(monkeypatch)
    path = tmp_path / "job.yaml"
    as_yaml = lambda doc: yaml.safe_dump(doc, allow_unicode=True).encode()  # noqa: E731
    outcomes = {0: 0, 2: 0}

    def check(text: bytes) -> None:
        path.write_bytes(text)
        code = main(["submit", str(path), "--dry-run"])  # an exception fails the test
        out, err = capsys.readouterr()
        assert code in (0, 2), (code, text[:200], out, err)
        outcomes[code] += 1
        if code == 0:
            assert out.startswith("dry run: nothing was started") and err == ""
        else:
            assert out == "" and err.startswith("hetflow: error: ") and one_line_message(err), err

    bodies = st.one_of(*(mutated(job).map(as_yaml) for job in GOOD_JOBS),
                       *(raw_bodies(as_yaml(job)) for job in GOOD_JOBS))
    sweep = [as_yaml(job) for job in GOOD_JOBS] + NASTY_YAML
    sweep += [as_yaml(doc) for doc in leaf_edits(GOOD_JOBS[1])]
    tried = fuzz(check, bodies, 150, sweep)
    report(capsys, f"fuzz: {tried} job files to `hetflow submit --dry-run` ({outcomes[0]} valid: "
                   f"exit 0; {outcomes[2]} exit 2 with one line), never a traceback")
    assert outcomes[0] >= len(GOOD_JOBS)  # the good ones (and some fuzzed) are accepted
