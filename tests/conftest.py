"""Shared test fixtures. The real recorded tool outputs live in tests/fixtures/topology and the
cluster traces in data/traces, both part of the repository (data/README.md: where each file
comes from); a missing file fails the test that reads it, it never skips."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Ray reads this once, on its first import: without it a multi-node test cluster on loopback is
# rewritten to the host address and can hang (../shared/RAY-NOTES.md). Set before any test
# module imports ray.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "topology"  # recorded vendor-tool outputs (SOURCES.md there)
TRACES = REPO / "data" / "traces"  # cluster traces and reference results (data/README.md)


def fixture_path(name: str) -> Path:
    path = FIXTURES / name
    assert path.exists(), f"missing fixture {path}: every fixture is in the repository (tests/fixtures/topology)"
    return path


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    assert FIXTURES.is_dir(), f"missing {FIXTURES}: the recorded outputs are part of the repository"
    return FIXTURES


# --- ending the test process --------------------------------------------------------------------
# Once every test has run and pytest has printed its summary, the process ends with pytest's own
# exit status through os._exit, skipping the interpreter's teardown. Reason: tests leave native
# threads behind that their libraries never stop (Ray Serve's router event loop in the driver,
# tensorboardX writers of in-process Tune runs, gRPC and the Ray core worker's threads after
# ray.shutdown()), and tearing the interpreter down under them crashed CI once with SIGSEGV
# *after* "1299 passed". Skipping that teardown never turns a failure into a pass: the status is
# the one pytest computed, and a crash during a test still fails the run.
# HETFLOW_TESTS_NORMAL_EXIT=1 keeps Python's normal exit (e.g. for coverage, which writes its
# data at exit).
@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    session.config._hetflow_exitstatus = int(exitstatus)
    try:
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            ray.shutdown()
    except Exception:  # best effort: the tests' own results are already final
        pass


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    status = getattr(config, "_hetflow_exitstatus", None)
    if status is None or os.environ.get("HETFLOW_TESTS_NORMAL_EXIT") == "1":
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
