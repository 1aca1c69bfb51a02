"""Stage keys and the stage cache: what lets a re-run skip unchanged stages.

A stage's **key** is a hash of its name, its settings (as JSON) and the content hashes of its
inputs (the previous stages' outputs). Its artifacts live in ``<cache_dir>/<workflow>/<stage>/
<key>/``; a ``record.json`` written there (atomically, last) marks the stage as done and holds
what later stages and the report need, including the content hash of its output. A re-run
computes the same key for a stage whose inputs and settings are unchanged, finds the record and
skips the stage; a stage interrupted before its record was written runs again in the same
directory, so a training job resumes from its newest checkpoint there.

No Ray, no torch: plain files.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

RECORD = "record.json"


def stage_key(stage: str, settings: Any, inputs: list[str]) -> str:
    """16 hex digits of sha256 over the stage name, its settings and its inputs' hashes."""
    blob = json.dumps({"stage": stage, "settings": settings, "inputs": inputs},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def hash_bytes(*chunks: bytes) -> str:
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
    return digest.hexdigest()[:16]


def hash_tree(root: Path) -> str:
    """Content hash of a directory: relative paths and file bytes, in sorted order."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(root)).encode())
        with path.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


class StageCache:
    """``<cache_dir>/<workflow>/``: one directory per (stage, key)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def dir(self, stage: str, key: str) -> Path:
        return self.root / stage / key

    def load(self, stage: str, key: str) -> dict[str, Any] | None:
        """The stage's record, or None when it has not completed with this key."""
        path = self.dir(stage, key) / RECORD
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return None

    def save(self, stage: str, key: str, record: dict[str, Any]) -> None:
        """Mark the stage done (write to a temporary file, then rename: never half a record)."""
        directory = self.dir(stage, key)
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f".{RECORD}.tmp"
        tmp.write_text(json.dumps(record, indent=1, sort_keys=True, default=str))
        os.replace(tmp, directory / RECORD)


__all__ = ["RECORD", "StageCache", "hash_bytes", "hash_tree", "stage_key"]
