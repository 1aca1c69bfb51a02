"""A model spec or data loader named by a path that does not resolve stops every command that
reads a training config - train, tune, serve, run - with one line naming the key, the module
and the attribute it tried (exit 2, no traceback), before any Ray starts."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hetflow.cli.main import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def files(train: dict) -> dict[str, dict]:
    """The same training sections in each command's file."""
    return {
        "train": train,
        "tune": {"name": "t", "base": train, "space": {"train": {"lr": {"choice": [0.1]}}}},
        "serve": {"name": "s", "models": [{"name": "m", "train": train}]},
        "run": {"name": "w", "train": train},
    }


WHERE = {"train": "", "tune": "base.", "serve": "models[m].train: ", "run": "train."}

# (training sections, the error after the key, the key)
BAD = [
    ({"model": {"spec": "user_pkg.blobs:SPECS"}}, "model.spec",
     '"user_pkg.blobs:SPECS": module user_pkg.blobs has no attribute SPECS'),
    ({"model": {"spec": "user_pkg.blobz:SPEC"}}, "model.spec",
     '"user_pkg.blobz:SPEC": no module named user_pkg.blobz'),
    ({"model": {"spec": "user_pkg.blobs:SPEC"}, "data": {"loader": "user_pkg.data:load"}},
     "data.loader", '"user_pkg.data:load": module user_pkg.data has no attribute load'),
]


@pytest.mark.parametrize("command", ["train", "tune", "serve", "run"])
@pytest.mark.parametrize("train, key, why", BAD, ids=["attribute", "module", "loader"])
def test_a_bad_path_is_one_line_and_exit_2(command, train, key, why, tmp_path, capsys,
                                           monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(FIXTURES))
    path = tmp_path / f"{command}.yaml"
    path.write_text(yaml.safe_dump(files(train)[command]))
    code = main([command, str(path)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("hetflow: error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    assert f"{WHERE[command]}{key}: {why}" in err, err
