"""Checkpoints are atomic: only a whole checkpoint is ever taken as the latest.

A real saver process is killed (SIGKILL) in the middle of writing; the directory it leaves is
read back. Hand-made damage covers the other ways a directory can be incomplete.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from hetflow.workloads.train.checkpoint import (
    COMPLETE,
    META,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    partial_dir_name,
    remove_partials,
    save_checkpoint,
    step_dir_name,
)

# Writes checkpoint 1, 2, 3, ... of one large tensor filled with the step number, forever,
# announcing each step on stdout before it starts writing it.
SAVER = textwrap.dedent("""
    import sys, torch
    from hetflow.workloads.train.checkpoint import save_checkpoint
    root = sys.argv[1]
    weights = torch.empty(8 * 1024 * 1024)  # 32 MiB: a save takes a while
    step = 0
    while True:
        step += 1
        weights.fill_(step)
        print(step, flush=True)
        save_checkpoint(root, step, {"model": {"w": weights}}, {"losses": {}})
""")


def _state(value: float) -> dict:
    return {"model": {"w": torch.full((16,), value)}}


def _saved(root: Path, step: int) -> Path:
    return save_checkpoint(root, step, _state(float(step)), {"losses": {str(step): 1.0}})



def test_killed_saver_leaves_only_whole_checkpoints(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    proc = subprocess.Popen([sys.executable, "-c", SAVER, str(root)], stdout=subprocess.PIPE,
                            text=True)
    try:
        for line in proc.stdout:  # kill while step 3 is being written
            if int(line) == 3:
                time.sleep(0.05)
                proc.send_signal(signal.SIGKILL)
                break
    finally:
        proc.kill()
        proc.wait()
    latest = latest_checkpoint(root)
    assert latest is not None and latest.step in (2, 3)
    if latest.step == 2:  # the usual case: the kill hit the write of step 3
        assert (root / partial_dir_name(3)).is_dir()
        assert not (root / step_dir_name(3)).exists()
    # The latest loads whole, with the values of its own step.
    state = {"model": {"w": torch.zeros(8 * 1024 * 1024)}}
    load_checkpoint(latest, state)
    assert torch.all(state["model"]["w"] == latest.step)
    assert [c.step for c in list_checkpoints(root)] == list(range(1, latest.step + 1))


@pytest.mark.parametrize("damage", [
    "no-marker", "no-dcp-metadata", "bad-meta", "meta-of-other-step", "partial-dir", "stray-name",
])
def test_incomplete_directory_is_never_latest(tmp_path: Path, damage: str) -> None:
    _saved(tmp_path, 10)
    good = _saved(tmp_path, 20)
    broken = tmp_path / step_dir_name(30)
    shutil.copytree(good, broken)  # a "step 30" that differs from a whole one in one way
    (broken / META).write_text(json.dumps({"step": 30, "losses": {}}))
    if damage == "no-marker":
        (broken / COMPLETE).unlink()
    elif damage == "no-dcp-metadata":
        (broken / ".metadata").unlink()
    elif damage == "bad-meta":
        (broken / META).write_text("{not json")
    elif damage == "meta-of-other-step":
        (broken / META).write_text(json.dumps({"step": 20}))
    elif damage == "partial-dir":
        broken.rename(tmp_path / partial_dir_name(30))
    elif damage == "stray-name":
        broken.rename(tmp_path / "step-30-copy")
    latest = latest_checkpoint(tmp_path)
    assert latest is not None and latest.step == 20
    assert [c.step for c in list_checkpoints(tmp_path)] == [10, 20]


def test_whole_copy_is_taken(tmp_path: Path) -> None:
    # The negative control of the test above: the same copy, undamaged, is the latest.
    _saved(tmp_path, 10)
    good = _saved(tmp_path, 20)
    shutil.copytree(good, tmp_path / step_dir_name(30))
    (tmp_path / step_dir_name(30) / META).write_text(json.dumps({"step": 30}))
    assert latest_checkpoint(tmp_path).step == 30


def test_save_publishes_and_keeps_last(tmp_path: Path) -> None:
    for step in (5, 10, 15):
        save_checkpoint(tmp_path, step, _state(float(step)), {"losses": {}}, keep_last=2)
    assert [c.step for c in list_checkpoints(tmp_path)] == [10, 15]
    assert not any(p.name.startswith(".partial-") for p in tmp_path.iterdir())
    info = latest_checkpoint(tmp_path)
    assert info.meta["step"] == 15 and info.meta["saved_at"] <= time.time()
    state = _state(0.0)
    load_checkpoint(info, state)
    assert torch.all(state["model"]["w"] == 15.0)


def test_remove_partials_keeps_complete(tmp_path: Path) -> None:
    _saved(tmp_path, 10)
    (tmp_path / partial_dir_name(20)).mkdir()
    assert remove_partials(tmp_path) == 1
    assert [p.name for p in tmp_path.iterdir()] == [step_dir_name(10)]


def test_missing_directory_has_no_checkpoint(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path / "nowhere") is None
    assert os.listdir(tmp_path) == []
