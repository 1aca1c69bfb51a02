"""Stage keys and the stage cache (no Ray)."""

from __future__ import annotations

from pathlib import Path

from hetflow.workflow.cache import StageCache, hash_tree, stage_key


def test_key_changes_with_settings_and_inputs_only() -> None:
    base = stage_key("train", {"steps": 10, "lr": 0.1}, ["abc"])
    assert stage_key("train", {"lr": 0.1, "steps": 10}, ["abc"]) == base  # key order is irrelevant
    assert stage_key("train", {"steps": 11, "lr": 0.1}, ["abc"]) != base
    assert stage_key("train", {"steps": 10, "lr": 0.1}, ["abd"]) != base
    assert stage_key("export", {"steps": 10, "lr": 0.1}, ["abc"]) != base
    assert len(base) == 16


def test_record_marks_a_stage_done(tmp_path: Path) -> None:
    cache = StageCache(tmp_path)
    assert cache.load("train", "k1") is None
    cache.save("train", "k1", {"metrics": {"val_accuracy": 0.9}})
    assert cache.load("train", "k1") == {"metrics": {"val_accuracy": 0.9}}
    assert cache.load("train", "k2") is None
    assert [p.name for p in cache.dir("train", "k1").iterdir()] == ["record.json"]


def test_tree_hash_follows_content_and_names(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "w.bin").write_bytes(b"\x00\x01")
    first = hash_tree(tmp_path)
    assert hash_tree(tmp_path) == first
    (tmp_path / "a" / "w.bin").write_bytes(b"\x00\x02")
    second = hash_tree(tmp_path)
    assert second != first
    (tmp_path / "a" / "w.bin").rename(tmp_path / "a" / "v.bin")
    assert hash_tree(tmp_path) != second
