"""Tuning runs on a real local Ray (2 CPUs): ASHA stopping trials early, the outputs, resume.

One Ray instance for the module. Trials are tiny (digits MLP, a few epochs, one thread), so a
run takes seconds; every run writes under pytest's tmp dirs.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import pytest
import ray
from ray.tune import Callback

from hetflow.cli import tune as tune_cli
from hetflow.core.errors import InputError
from hetflow.workloads.train.checkpoint import latest_checkpoint
from hetflow.workloads.train.config import load_config
from hetflow.workloads.train.job import evaluate_checkpoint
from hetflow.workloads.tune.config import tuning_config_from_dict
from hetflow.workloads.tune.runner import run_tuning

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False)
    yield
    ray.shutdown()


def tuning(out: Path, **sections: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "t",
        "base": {"model": {"kind": "mlp", "hidden": [32]},
                 "train": {"batch_size": 64, "optimizer": "adamw"},
                 "resources": {"devices": "cpu"}},
        # lr over five decades: some trials learn in one epoch, some barely move
        "space": {"train": {"lr": {"loguniform": [1e-5, 1.0]}}},
        "search": {"algorithm": "random", "scheduler": "fifo", "seed": 3},
        "budget": {"trials": 5, "epochs": 3, "concurrent": 2},
        "output": {"dir": str(out), "live": False},
    }
    for name, values in sections.items():
        data[name] = {**data[name], **values}
    return data


def write(path: Path, data: dict[str, Any]) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(data))
    return path


class ResultOrder(Callback):
    """Every result in the order Tune's driver processed it - the order its scheduler saw them
    (the trials' own ``reported_at`` clocks can disagree when two trials report together)."""

    seen: list[tuple[str, int, float]] = []

    def on_trial_result(self, iteration, trials, trial, result, **info):
        ResultOrder.seen.append((trial.trial_id, int(result["training_iteration"]),
                                 float(result["val_accuracy"])))


def test_asha_stops_weak_trials_at_its_rungs(tmp_path: Path, capsys, monkeypatch) -> None:
    from hetflow.workloads.tune import runner

    ResultOrder.seen = []
    real_run_tuning = runner.run_tuning
    monkeypatch.setattr(runner, "run_tuning", lambda config, **kw: real_run_tuning(
        config, **{**kw, "callbacks": [*kw.get("callbacks", ()), ResultOrder()]}))
    out = tmp_path / "asha"
    config = write(tmp_path / "tune.yaml", tuning(
        out, search={"scheduler": "asha", "grace_epochs": 1, "reduction_factor": 2,
                     "first_rung_quorum": 2},
        budget={"trials": 6, "epochs": 4}))
    assert tune_cli.main([str(config), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    trials = json.loads((out / "trials.json").read_text())
    assert len(trials) == 6 and len(summary["trials"]) == 6
    # where each trial ran, in the JSON too: here CPU processes that see no GPU
    assert {(t["device"], t["visible_devices"]) for t in summary["trials"]} == {("cpu", "")}
    assert all(t["device_units"] == 0 for t in summary["trials"])
    stopped = [t for t in trials if t["status"] == "stopped"]
    finished = [t for t in trials if t["status"] == "done"]
    assert stopped and finished, [(t["status"], t["epochs"]) for t in trials]
    assert all(t["epochs"] == 4 for t in finished)
    assert summary["trial_epochs"] == sum(t["epochs"] for t in trials) < 6 * 4
    assert len(ResultOrder.seen) == summary["trial_epochs"]  # one result per trial-epoch
    epochs = {t["trial_id"]: t["epochs"] for t in trials}
    first_at_rung_1 = [tid for tid, epoch, _ in ResultOrder.seen if epoch == 1][:2]
    assert all(epochs[tid] == 1 for tid in first_at_rung_1)  # the quorum: no promotion before 2
    for trial in stopped:
        # ASHA (reduction factor 2, grace 1, 4 epochs) stops only at its rungs, epochs 1 and 2,
        # and - past the first rung's quorum - only a trial below the median of those that
        # reached the rung before it
        rung = trial["epochs"]
        assert rung in (1, 2)
        if trial["trial_id"] in first_at_rung_1:
            continue
        at_rung = [(tid, acc) for tid, epoch, acc in ResultOrder.seen if epoch == rung]
        mine_index = next(i for i, (tid, _) in enumerate(at_rung) if tid == trial["trial_id"])
        mine = at_rung[mine_index][1]
        assert mine == trial["curve"][-1]["val_accuracy"]
        earlier_better = [tid for tid, acc in at_rung[:mine_index] if acc > mine]
        assert earlier_better, f"trial {trial['trial_id']} stopped at {rung} with nobody ahead"

    # the best trial is the highest accuracy any trial reached, written out whole
    best_value = max(p["val_accuracy"] for t in trials for p in t["curve"])
    assert summary["best"]["value"] == best_value
    best_config = load_config(summary["best_config"])
    assert best_config.train.lr == summary["best"]["params"]["train.lr"]
    info = latest_checkpoint(summary["best_checkpoint"])
    assert info is not None and info.meta["epoch"] == summary["best"]["epoch"]
    assert best_config.train.steps == info.step  # the config trains exactly the best epochs
    assert evaluate_checkpoint(best_config, info)["val_accuracy"] == pytest.approx(best_value)
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class InterruptOnce(Callback):
    """Ctrl-C (SIGINT to this process) once 2 trials finished and a running one reports its
    second epoch (so its first epoch's checkpoint is registered: Tune saves a result's
    checkpoint before the trial trains on). The marker file keeps the copy of this callback
    that Tune restores with the run from firing again."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker
        self.completed: set[str] = set()

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        # a trial that trained all its epochs, counted once
        if (trial.last_result or {}).get("epoch") == 3:
            self.completed.add(trial.trial_id)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict,
                        **info: Any) -> None:
        if len(self.completed) >= 2 and result["epoch"] == 2 and not self.marker.exists():
            self.marker.write_text(f"{trial.trial_id} {result['epoch']} "
                                   f"{','.join(sorted(self.completed))} {time.time()}")
            os.kill(os.getpid(), signal.SIGINT)


def test_an_interrupted_run_resumes_without_losing_finished_trials(tmp_path: Path) -> None:
    config = tuning_config_from_dict(tuning(tmp_path / "run"))
    marker = tmp_path / "interrupted"
    first = run_tuning(config, callbacks=[InterruptOnce(marker)], quiet=True)
    assert marker.exists() and first.interrupted
    interrupted_id, interrupted_epoch, completed, interrupted_at = marker.read_text().split()
    before = {t.trial_id: t for t in first.trials}
    # Tune's own results at the interruption (a trial that finished an instant before may not
    # be in them yet: the callback's view, `completed`, is checked after the resume below)
    finished = {i: t for i, t in before.items() if t.status == "done"}
    assert finished, [(i, t.status, t.epochs) for i, t in before.items()]
    assert set(finished) <= set(completed.split(","))
    assert before[interrupted_id].epochs >= int(interrupted_epoch) >= 1

    with pytest.raises(InputError, match="--resume"):
        run_tuning(config, quiet=True)  # a second start over the same run is refused

    second = run_tuning(config, resume=True, quiet=True)
    assert second.resumed and not second.interrupted
    after = {t.trial_id: t for t in second.trials}
    assert len(after) == 5 and set(before) <= set(after)
    assert all(t.status == "done" and t.epochs == 3 for t in after.values())
    for trial_id, trial in finished.items():
        assert after[trial_id].curve == trial.curve  # kept, not trained again
    for trial_id in completed.split(","):  # every trial done before the interruption: kept
        curve = after[trial_id].curve
        assert [p["epoch"] for p in curve] == [1, 2, 3]
        assert all(p["resumed_from"] == 0 and p["reported_at"] < float(interrupted_at)
                   for p in curve), curve
    resumed = after[interrupted_id]
    assert [p["epoch"] for p in resumed.curve] == [1, 2, 3]
    # it went on from a checkpoint (not from scratch) in a new process after the interruption
    restored = resumed.curve[-1]["resumed_from"]
    assert 1 <= restored <= int(interrupted_epoch)
    assert resumed.curve[0] == before[interrupted_id].curve[0]
    assert all(p["resumed_from"] == restored for p in resumed.curve[restored:])
    assert resumed.curve[restored]["started_at"] > max(
        p["reported_at"] for t in first.trials for p in t.curve)


def test_nothing_to_resume_is_a_clear_error(tmp_path: Path) -> None:
    config = write(tmp_path / "tune.yaml", tuning(tmp_path / "empty"))
    with pytest.raises(InputError, match="nothing to resume"):
        run_tuning(tuning_config_from_dict(tuning(tmp_path / "empty")), resume=True)
    assert tune_cli.main([str(config), "--resume"]) == 2


def test_trials_train_on_arrays_handed_over_through_the_object_store(tmp_path: Path) -> None:
    """``run_tuning(data=ref)``: every trial trains and is scored on the handed-over split. It
    labels every sample 3, which the bundled digits never do; only trials that used these
    arrays reach a validation accuracy of 1.0."""
    import numpy as np

    from hetflow.workloads.train.data import load_dataset, split_arrays

    arrays = split_arrays(load_dataset("digits", val_fraction=0.2, seed=0))
    arrays["train_targets"] = np.full_like(arrays["train_targets"], 3)
    arrays["val_targets"] = np.full_like(arrays["val_targets"], 3)
    config = tuning_config_from_dict(tuning(
        tmp_path / "handed", space={"train": {"lr": {"loguniform": [1e-2, 3e-2]}}},
        budget={"trials": 2, "epochs": 1, "concurrent": 2}))
    result = run_tuning(config, quiet=True, data=ray.put(arrays))
    assert len(result.trials) == 2
    assert all(t.curve[-1]["val_accuracy"] == 1.0 for t in result.trials)
