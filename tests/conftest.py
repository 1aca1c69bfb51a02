"""Shared test fixtures. The real recorded tool outputs live in tests/fixtures/topology and the
cluster traces in data/traces, both part of the repository (data/README.md: where each file
comes from); a missing file fails the test that reads it, it never skips."""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Ray reads this once, on its first import: without it a multi-node test cluster on loopback is
# rewritten to the host address and can hang (Ray's loopback mode; runtime/session.py). Set
# before any test module imports ray. It is this process's, for the clusters the tests build on
# 127.0.0.1: the commands the tests run as a user does get a user's environment without it
# (tests/launch/common.py, tests/cli/test_user_model_ray.py, tests/control/test_submit_user_ray.py).
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import signal

import pytest

# A suite started in the background by a script (`cmd &` without job control) inherits SIGINT
# ignored, and so would every command a test starts: those that test Ctrl-C (`hetflow serve`,
# `hetflow launch` -> 130) would then never see it. A handler (unlike "ignored") is not passed
# on through exec, so the commands get the default again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# A Ray temp folder per test process, nothing left behind, a true `ray` marker (see there).
from tests.ray_hygiene import _ray_marker_is_true, pytest_sessionstart  # noqa: E402,F401
from tests.ray_hygiene import pytest_sessionfinish as _hygiene_sessionfinish  # noqa: E402

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


# --- one module's Ray Serve client is not the next module's ----------------------------------------
# Ray Serve caches its controller client in a module global that survives ray.shutdown(); it
# tells a stale one by the driver's job id, but every fresh cluster numbers its first driver job
# 01000000 again, so a module whose Ray is the second in this process would reach the first
# cluster's dead controller ("Can't find actor ..."). Each module starts without it.
@pytest.fixture(autouse=True, scope="module")
def _no_serve_client_of_an_earlier_cluster():
    context = sys.modules.get("ray.serve.context")
    if context is not None:
        context._set_global_client(None)
    yield


# --- order and grouping ---------------------------------------------------------------------------
# `make test` runs the modules on two processes (pytest-xdist, `--dist loadfile`, with the
# scheduler below): a module stays on one process, so its Ray cluster starts once, and the
# modules of tests/hosts stay together, so their one namespace cluster (a package fixture,
# tests/hosts/conftest.py) starts once and never twice at the same time. (xdist's own
# `loadgroup` marks do not group under pytest 9: the nodeid it rewrites is no longer read.)
# The modules that start Ray take most of the time, so they are handed out first and the quick
# unit modules fill the gaps at the end; within a module the order is the file's.
def group_of(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return "tests/hosts" if path.startswith("tests/hosts/") else path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    # hand the units out in collection order (below: Ray modules first), not xdist's default
    # of the units with the most tests first (which ran the few-test, long Ray modules last)
    config.option.loadscopereorder = False

    class ModuleGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return ModuleGroups(config, log)


def pytest_collection_modifyitems(session, config, items):
    def slow(item) -> bool:
        return any(m.name in ("ray", "hosts") for m in item.iter_markers())

    first = {}
    for item in items:
        first.setdefault(group_of(item.nodeid), slow(item))
    items.sort(key=lambda item: not first[group_of(item.nodeid)])


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
    _hygiene_sessionfinish(session, exitstatus)  # may fail the run (session.exitstatus)
    session.config._hetflow_exitstatus = int(session.exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    status = getattr(config, "_hetflow_exitstatus", None)
    if status is None or os.environ.get("HETFLOW_TESTS_NORMAL_EXIT") == "1":
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
