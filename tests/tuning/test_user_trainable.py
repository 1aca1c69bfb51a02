"""``hetflow tune`` with the user's own trial function (``trainable: "pkg.mod:fn"``), run as a
user runs it: the installed ``hetflow`` script from the directory that holds the package
(``tests/fixtures/user_pkg``), on its own local Ray. The function reports per epoch through
``hetflow.train.report``; ASHA + TPE judge its own metric; the best trial's dict is written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hetflow.core.errors import InputError
from hetflow.workloads.tune.config import tuning_config_from_dict

pytestmark = pytest.mark.ray

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TRAINABLE = "user_pkg.trainable:train_blobs"
HETFLOW = [str(Path(sys.executable).with_name("hetflow"))]


def _config(tmp_path: Path, **over) -> dict:
    data = {
        "name": "blobs-fn",
        "trainable": TRAINABLE,
        "config": {"spread": 2.0},
        "base": {"resources": {"devices": "cpu", "ray_address": "local"}},
        "space": {"lr": {"loguniform": [1.0e-4, 0.5]}, "hidden": {"choice": [4, 32]}},
        "search": {"algorithm": "tpe", "scheduler": "asha", "metric": "accuracy", "mode": "max",
                   "seed": 0, "startup_trials": 3, "first_rung_quorum": 2},
        "budget": {"trials": 6, "epochs": 4, "concurrent": 2},
        "output": {"dir": str(tmp_path / "out"), "live": False},
    }
    data.update(over)
    return data


def test_the_users_function_is_tuned_by_its_own_metric(tmp_path: Path) -> None:
    config = tmp_path / "tune.yaml"
    config.write_text(yaml.safe_dump(_config(tmp_path)))
    done = subprocess.run([*HETFLOW, "tune", str(config), "--json"], cwd=FIXTURES,
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["metric"] == "accuracy" and len(result["trials"]) == 6
    epochs = [t["epochs"] for t in result["trials"]]
    assert max(epochs) == 4 and min(epochs) >= 1
    assert any(t["status"] == "stopped" for t in result["trials"])  # ASHA stopped some early
    for t in json.loads((tmp_path / "out" / "trials.json").read_text()):
        assert set(t["params"]) == {"config.lr", "config.hidden"}
        assert [p["epoch"] for p in t["curve"]] == list(range(1, t["epochs"] + 1))
        assert all(0.0 <= p["accuracy"] <= 1.0 for p in t["curve"])
    best = yaml.safe_load(Path(result["best_config"]).read_text())
    assert best["trainable"] == TRAINABLE
    assert best["config"]["hidden"] == result["best"]["params"]["config.hidden"]
    assert best["config"]["spread"] == 2.0  # the fixed values are kept
    assert Path(result["best_checkpoint"], "state.pt").is_file()  # reported through hetflow.train


@pytest.mark.parametrize("over, words", [
    ({"trainable": "user_pkg.trainable:nothing"}, "module user_pkg.trainable has no attribute nothing"),
    ({"trainable": "no_such_pkg.mod:fn"}, "no module named no_such_pkg"),
    ({"search": {"metric": "accuracy"}}, "give search.mode (max or min) for the metric 'accuracy'"),
    ({"space": {"lr": 0.1}}, "space.lr: expected one distribution"),
])
def test_bad_trainable_configs_say_what_is_wrong(tmp_path: Path, over: dict, words: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(FIXTURES))
    with pytest.raises(InputError) as err:
        tuning_config_from_dict(_config(tmp_path, **over))
    assert words in str(err.value)
