"""Shared test fixtures. The real recorded tool outputs live in ../shared/fixtures/topology
(beside the repository, in development and in CI); tests fail loudly if it is missing."""

from __future__ import annotations

from pathlib import Path

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
