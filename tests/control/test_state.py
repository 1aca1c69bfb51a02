"""The controller's durable state: atomic file-backed key-value store, records round-trip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hetflow.control.state import (
    AttemptReport, DirectoryKV, HeldDevices, JobRecord, JobStore, Slot, Status,
)
from hetflow.core.errors import InputError


def test_directory_kv_puts_atomically_and_lists_by_prefix(tmp_path: Path) -> None:
    kv = DirectoryKV(tmp_path / "kv")
    kv.put("control/job/a-1", b"one")
    kv.put("control/job/b-2", b"two")
    kv.put("control/seq", b"2")
    kv.put("control/job/a-1", b"uno")  # overwrite
    assert kv.get("control/job/a-1") == b"uno"
    assert kv.keys("control/job/") == ["control/job/a-1", "control/job/b-2"]
    assert not [p for p in (tmp_path / "kv").iterdir() if p.name.startswith(".tmp-")]  # no leftovers
    kv.delete("control/job/b-2")
    assert kv.get("control/job/b-2") is None and kv.keys("control/job/") == ["control/job/a-1"]


def test_job_records_survive_a_new_store_on_the_same_files(tmp_path: Path) -> None:
    store = JobStore(DirectoryKV(tmp_path))
    seqs = [store.next_seq(), store.next_seq()]
    running = JobRecord("train-2", seqs[1], {"name": "train", "kind": "train"}, 10.0,
                        status=Status.RUNNING, token=3,
                        held=HeldDevices("MI300X", [Slot("mi300x-0", 4), Slot("mi300x-0", 5)]))
    running.note(11.0, "started")
    queued = JobRecord("sleep-1", seqs[0], {"name": "sleep", "kind": "python"}, 9.0)
    store.save(running)
    store.save(queued)
    store.report(AttemptReport("train-2", 3, "running", step=40))

    again = JobStore(DirectoryKV(tmp_path))  # a restarted controller
    assert [r.job_id for r in again.all()] == ["sleep-1", "train-2"]  # submission order
    loaded = again.load("train-2")
    assert loaded == running
    assert loaded.held.text() == "2x MI300X on mi300x-0 [4 5]"
    assert again.attempt("train-2") == AttemptReport("train-2", 3, "running", step=40)
    assert again.next_seq() == 3
    assert Status.PREEMPTING.holds_devices and not Status.QUEUED.holds_devices
    assert Status.CANCELLED.finished and not Status.RUNNING.finished


def test_a_record_of_another_schema_is_refused(tmp_path: Path) -> None:
    kv = DirectoryKV(tmp_path)
    kv.put("control/job/x-1", json.dumps({"schema": "hetflow.job/v0", "job_id": "x-1"}).encode())
    with pytest.raises(InputError, match="schema 'hetflow.job/v0'; this hetflow reads hetflow.job/v1"):
        JobStore(kv).all()


def test_history_is_bounded() -> None:
    record = JobRecord("a-1", 1, {}, 0.0)
    for i in range(200):
        record.note(float(i), f"event {i}")
    assert len(record.history) == 50 and record.history[-1] == [199.0, "event 199"]
