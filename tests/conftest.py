"""Shared test fixtures. The real recorded tool outputs live in tests/fixtures/topology and the
cluster traces in data/traces, both part of the repository (data/README.md: where each file
comes from); a missing file fails the test that reads it, it never skips."""

from __future__ import annotations

import functools
import os
import re
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

# pytest's assertion rewriting of each test module (4-5 CPU-s a collection, in every xdist worker)
# is cached beside the module (__pycache__, ignored by git) unless bytecode writing is off, as
# PYTHONDONTWRITEBYTECODE sets it on this kind of machine: the test processes write it (the
# commands and Ray workers the tests start keep the user's setting)
sys.dont_write_bytecode = False

# A suite started in the background by a script (`cmd &` without job control) inherits SIGINT
# ignored, and so would every command a test starts: those that test Ctrl-C (`hetflow serve`,
# `hetflow launch` -> 130) would then never see it. A handler (unlike "ignored") is not passed
# on through exec, so the commands get the default again.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# A Ray temp folder per test process, nothing left behind, a true `ray` marker (see there).
from tests.ray_hygiene import _ray_marker_is_true, pytest_sessionstart  # noqa: E402,F401
from tests.ray_hygiene import pytest_sessionfinish as _hygiene_sessionfinish  # noqa: E402
from tests.ray_hygiene import remove_own_pymp_dir  # noqa: E402

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
# `make test` runs the modules on three processes (pytest-xdist, `--dist loadfile`, with the
# scheduler below): a module stays on one process, so its Ray cluster starts once, and the
# modules of tests/hosts stay together, so their one namespace cluster (a package fixture,
# tests/hosts/conftest.py) starts once and never twice at the same time. (xdist's own
# `loadgroup` marks do not group under pytest 9: the nodeid it rewrites is no longer read.)
# The modules that start Ray take most of the time, so they are handed out first, longest first,
# to the first two processes; the third takes the unit modules only (ModuleGroups below), and the
# first two take what units are left once their Ray modules are done; within a module the order
# is the file's.
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
        """With 3 or more processes the last one takes the unit modules only: their waits
        (timers, rate limits, subprocess start-ups) then fall where the Ray modules on the others
        keep the cores busy, instead of all together at the end of the run. (Letting it take the
        shortest Ray modules once its units were done - three Ray clusters at once on two cores -
        was slower in the one clean-clone run that tried it: 15 min 50 s against 14 min 6 s and
        14 min 49 s.)"""

        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

        def _third(self, node) -> bool:
            return self.numnodes >= 3 and node.gateway.id == f"gw{self.numnodes - 1}"

        def _pick(self) -> str | None:
            return next((s for s in self.workqueue if not starts_ray(s)), None)

        def _reschedule(self, node) -> None:
            if not node.shutting_down and self.workqueue and self._third(node):
                pending = self._pending_of(self.assigned_work[node])
                if self._pick() is None:
                    # no unit module left: done once at most one test is left - an xdist worker
                    # holds its last test until it hears of the next one or of its shutdown
                    if pending <= 1:
                        node.shutdown()
                    return
                if pending <= 2:
                    self._assign_work_unit(node)
                return
            super()._reschedule(node)

        def _assign_work_unit(self, node) -> None:
            if self._third(node):
                scope = self._pick()
                if scope is None:
                    return
                self.workqueue.move_to_end(scope, last=False)  # the parent pops the first
            super()._assign_work_unit(node)

    return ModuleGroups(config, log)


_SLOW_MARKS = re.compile(r"pytest\.mark\.(ray|hosts)\b")


@functools.lru_cache(maxsize=None)
def starts_ray(scope: str) -> bool:
    """Whether a module (or the tests/hosts group) is one of the Ray modules, read from its
    source in the scheduling process (which collects nothing): their marks are module-level."""
    path = Path(__file__).resolve().parent.parent / scope
    if path.is_dir():
        return True  # the tests/hosts group
    try:
        return bool(_SLOW_MARKS.search(path.read_text()))
    except OSError:
        return True


def pytest_collection_modifyitems(session, config, items):
    def slow(item) -> bool:
        return any(m.name in ("ray", "hosts") for m in item.iter_markers())

    first = {}
    for item in items:
        first.setdefault(group_of(item.nodeid), slow(item))
    # Ray modules longest first (so the run does not end on one long module while the other
    # process has nothing left); units after them in collection order
    items.sort(key=lambda item: (not first[group_of(item.nodeid)],
                                 -RAY_MODULE_WALL_S.get(group_of(item.nodeid), 30)
                                 if first[group_of(item.nodeid)] else 0))


# Each Ray module's wall time in seconds (`make test-cpu`, 2026-12-06, 3 processes): only the
# order of the Ray modules comes from it; a module not listed counts as 30 s. tests/hosts (278 s)
# is put fifth, not first: its hosts' health checks are 1 s, and at the start the units' process
# shares the cores too.
RAY_MODULE_WALL_S = {
    "tests/hosts": 110, "tests/control/test_controller_ray.py": 153,
    "tests/serving/test_serve_ray.py": 120, "tests/launch/test_launch_ray.py": 114,
    "tests/cli/test_user_model_ray.py": 113, "tests/train_api/test_train_func.py": 93,
    "tests/serving/test_serve_tooling_ray.py": 87, "tests/workflow/test_workflow_ray.py": 79,
    "tests/serving/test_llm_ray.py": 185, "tests/control/test_elastic_resize_ray.py": 65,
    "tests/serving/test_llm_nodes_ray.py": 145, "tests/serving/test_llm_autoscale_ray.py": 90,
    "tests/tracking/test_tracking_ray.py": 60, "tests/workloads/test_train_ray.py": 55,
    "tests/control/test_ray_jobs.py": 54, "tests/runtime/test_binding_ray.py": 47,
    "tests/workflow/test_workflow_cluster_ray.py": 41, "tests/serving/test_gateway_ray.py": 35,
    "tests/tuning/test_tune_ray.py": 34, "tests/control/test_submit_user_ray.py": 32,
    "tests/tuning/test_placement_ray.py": 19, "tests/observability/test_metrics_ray.py": 19,
    "tests/launch/test_launch_local.py": 18, "tests/tuning/test_user_trainable.py": 16,
    "tests/train_api/test_ray_examples.py": 14, "tests/runtime/test_ray_gpus_ray.py": 12,
}


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
    remove_own_pymp_dir()  # multiprocessing's own removal runs at a normal exit only
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
