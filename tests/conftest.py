"""Shared test fixtures. The real recorded tool outputs live in ../shared/fixtures/topology
(beside the repository, in development and in CI); tests fail loudly if it is missing."""

from __future__ import annotations

import os
from pathlib import Path

# Ray reads this once, on its first import: without it a multi-node test cluster on loopback is
# rewritten to the host address and can hang (../shared/RAY-NOTES.md). Set before any test
# module imports ray.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
FIXTURES = SHARED / "fixtures" / "topology"
TRACES = SHARED / "traces"


def fixture_path(name: str) -> Path:
    path = FIXTURES / name
    assert path.exists(), f"missing fixture {path}: the repository expects ../shared beside it"
    return path


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    assert FIXTURES.is_dir(), f"missing {FIXTURES}: the repository expects ../shared beside it"
    return FIXTURES
