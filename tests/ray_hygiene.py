"""Ray hygiene of a test run (imported by tests/conftest.py, before any test module imports Ray).

* **A Ray temp folder per test process.** ``RAY_TMPDIR`` points every test process (each
  pytest-xdist worker, and every ``hetflow``/``ray`` process a test starts, which inherit it)
  at a folder of its own under one short base folder of the run. Ray keeps there what it
  keeps in /tmp/ray otherwise: session folders, sockets, and ``ray_current_cluster`` - the
  file every later ``ray.init()`` with no address joins. Two workers must not join each other's
  clusters, and a user's /tmp/ray is not the tests' business.
* **Direct-ingress ports of its own.** Every Ray Serve controller hands its replicas HTTP ports
  from 30000 and gRPC ports from 40000, per node; two test processes serving side by side on
  one machine would be handed the same numbers, and a front door whose replica died could
  health-check - and route to - the other run's replica that took its port. Each test process
  (and what it starts) gets a range of its own.
* **Nothing left behind.** Before the first test the run notes which Ray processes (raylet,
  gcs_server), HAProxy processes and recorded clusters exist; at the end it waits a little for
  the ones its tests started to end, then fails the run (exit 1, one line per leak) if any is
  still alive, if a ``ray_current_cluster`` was left in a worker's folder, or if the user's own
  Ray temp folder changed.
* **Job logs of their own.** ``HETFLOW_JOBS_DIR`` (where hetflow's controller writes its jobs'
  logs) points under the run's base folder; the run fails if the default ``/tmp/hetflow/jobs``
  gained an entry.
* **Temporary files of their own.** ``TMPDIR`` points the test processes' children (and the
  xdist workers themselves) at a folder under the run's base: what Python's ``tempfile`` makes
  there - multiprocessing's ``pymp-*`` folders of processes that end through ``os._exit`` or
  ``kill -9``, torchrun's ``torchelastic_*`` log folders, vLLM's IPC sockets and file stores -
  goes with the run's folder. The run fails if the user's temporary folder gained one of those.
  The first process keeps the user's folder for itself, so pytest's ``tmp_path`` folders stay
  where pytest keeps them.
* **The ``ray`` marker is true.** A test not marked ``ray`` or ``hosts`` that starts a Ray
  instance (in-process or through a command it runs) fails, naming it: `make test-quick` runs
  only unmarked tests and must start no Ray.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from hetflow.runtime.session import ray_address_file

BASE_ENV = "HETFLOW_TESTS_RAY_BASE"  # the run's base folder (set by the first process)
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")
OWNS_BASE = BASE_ENV not in os.environ  # the controller (or a lone pytest) made it
if OWNS_BASE:
    # short: Ray's Unix sockets live below it, and a socket path has at most 107 bytes
    os.environ[BASE_ENV] = tempfile.mkdtemp(prefix="hft-", dir="/tmp")
BASE = Path(os.environ[BASE_ENV])
# where the user's own Ray records its cluster (Ray's rule, before RAY_TMPDIR is changed below)
USER_ADDRESS_FILE = ray_address_file()
RAY_DIR = BASE / WORKER
RAY_DIR.mkdir(exist_ok=True)
os.environ["RAY_TMPDIR"] = str(RAY_DIR)
# hetflow's controller writes its jobs' logs there (ControllerSettings.log_dir); every test
# process, and the Ray instances and commands it starts, inherit it: not the user's /tmp/hetflow/jobs
os.environ["HETFLOW_JOBS_DIR"] = str(BASE / "jobs")
USER_JOBS_DIR = Path("/tmp/hetflow/jobs")  # the controller's default (DEFAULT_JOBS_DIR)
# the user's temporary folder, kept by the first process (pytest's basetemp is made there)
USER_TMP = Path(tempfile.gettempdir()) if OWNS_BASE else Path(os.environ.get("HETFLOW_TESTS_USER_TMP", "/tmp"))
os.environ.setdefault("HETFLOW_TESTS_USER_TMP", str(USER_TMP))
TMP_DIR = BASE / "tmp"
TMP_DIR.mkdir(exist_ok=True)
os.environ["TMPDIR"] = str(TMP_DIR)
if not OWNS_BASE:
    tempfile.tempdir = None  # recomputed from TMPDIR: this worker's own files go there too
# what Python's tempfile makes for the programs the tests run, and must not be left in USER_TMP
LEFT_IN_TMP = ("pymp-", "torchelastic_", "vllm_dist_")
_SLOT = int(WORKER[2:]) if WORKER.startswith("gw") and WORKER[2:].isdigit() else 0
_SPAN = 200  # ports per test process: Ray's own ranges (1,000 each) hold five processes
for _kind, _first in (("HTTP", 30000), ("GRPC", 40000)):
    _low = _first + _SPAN * (_SLOT % 5)
    os.environ[f"RAY_SERVE_DIRECT_INGRESS_MIN_{_kind}_PORT"] = str(_low)
    os.environ[f"RAY_SERVE_DIRECT_INGRESS_MAX_{_kind}_PORT"] = str(_low + _SPAN - 1)

WATCHED = ("raylet", "gcs_server", "haproxy")  # programs a test must not leave running
GRACE_S = 20.0  # processes get this long to end after the last test (raylets stop in ~1 s)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def command_lines() -> dict[int, list[str]]:
    """PID -> argv of every process on this machine that can be read (not this one)."""
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                out[int(entry.name)] = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
    return out


def watched_processes() -> dict[int, str]:
    """PID -> command line of every raylet, gcs_server and haproxy process on this machine."""
    return {pid: " ".join(argv)[:200] for pid, argv in command_lines().items()
            if argv[0] and os.path.basename(argv[0]) in WATCHED}


def ray_sessions() -> set[str]:
    """Ray session folders of this process's Ray temp folder (one per Ray instance started)."""
    try:
        return {p.name for p in (RAY_DIR / "ray").iterdir() if p.name.startswith("session_2")}
    except OSError:
        return set()


_before: dict[str, object] = {}


def pytest_sessionstart(session: pytest.Session) -> None:
    _before["processes"] = set(watched_processes())
    _before["user_cluster"] = _read(USER_ADDRESS_FILE)
    _before["user_jobs"] = _listing(USER_JOBS_DIR)
    _before["user_tmp"] = _listing(USER_TMP)


def _listing(folder: Path) -> set[str]:
    try:
        return {p.name for p in folder.iterdir()}
    except OSError:
        return set()


@pytest.fixture(autouse=True)
def _ray_marker_is_true(request: pytest.FixtureRequest):
    """Fail a test that is not marked ``ray``/``hosts`` yet started Ray (see the docstring)."""
    marked = any(True for m in request.node.iter_markers() if m.name in ("ray", "hosts"))
    before = ray_sessions() if not marked else set()
    yield
    if not marked:
        started = ray_sessions() - before
        if started:
            pytest.fail(f"this test started Ray ({len(started)} instance(s)) but is not marked "
                        "`ray`: mark it (pytestmark = pytest.mark.ray) so `make test-quick` "
                        "leaves it out", pytrace=False)


def leaks() -> list[str]:
    """This process's leaks: a recorded cluster left in its Ray temp folder."""
    recorded = _read(RAY_DIR / "ray" / "ray_current_cluster")
    return [f"worker {WORKER}: a test left Ray's recorded cluster ({recorded}) in "
            f"{RAY_DIR / 'ray' / 'ray_current_cluster'}: a `ray start` or Cluster() was not "
            "stopped"] if recorded else []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Workers write their leaks for the controller; the controller (or a lone pytest) checks
    every process on the machine and the user's Ray folder, reports, and fails the run."""
    ray = __import__("sys").modules.get("ray")
    try:
        if ray is not None and ray.is_initialized():
            ray.shutdown()
    except Exception:  # noqa: BLE001 - best effort; what stays alive is reported below
        pass
    found = leaks()
    if not OWNS_BASE:
        (BASE / f"{WORKER}.leaks").write_text("\n".join(found))
        return
    for path in BASE.glob("*.leaks"):
        found += [line for line in path.read_text().splitlines() if line]
    deadline = time.monotonic() + GRACE_S
    while True:
        new = {pid: cmd for pid, cmd in watched_processes().items()
               if pid not in _before["processes"]}
        if not new or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    found += [f"a test left {cmd.split()[0].rsplit('/', 1)[-1]} running (pid {pid}): {cmd}"
              for pid, cmd in sorted(new.items())]
    user = _read(USER_ADDRESS_FILE)
    if user != _before["user_cluster"]:
        found.append(f"Ray's recorded cluster in {USER_ADDRESS_FILE} changed during the run "
                     f"({_before['user_cluster']} -> {user}): a test ignored RAY_TMPDIR")
    added = _listing(USER_JOBS_DIR) - _before["user_jobs"]
    if added:
        found.append(f"job logs written to {USER_JOBS_DIR} during the run ({', '.join(sorted(added))}): "
                     "a controller started without the tests' HETFLOW_JOBS_DIR")
    own = own_pymp_dir()
    added = {name for name in _listing(USER_TMP) - _before["user_tmp"]
             if name.startswith(LEFT_IN_TMP) and str(USER_TMP / name) != own}
    if added:
        found.append(f"temporary files left in {USER_TMP} during the run ({', '.join(sorted(added))}): "
                     "a program the tests ran ignored TMPDIR")
    if found:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        for line in found:
            if reporter is not None:
                reporter.write_line(f"RAY HYGIENE: {line}", red=True)
            else:
                print(f"RAY HYGIENE: {line}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if not new:
        shutil.rmtree(BASE, ignore_errors=True)


def own_pymp_dir() -> str | None:
    """This process's multiprocessing folder (``pymp-*``), if it made one: the first process
    makes it in the user's folder, and its exit through ``os._exit`` (tests/conftest.py) would
    skip multiprocessing's own removal of it."""
    import multiprocessing

    return multiprocessing.current_process()._config.get("tempdir")


def remove_own_pymp_dir() -> None:
    folder = own_pymp_dir()
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


__all__ = ["_ray_marker_is_true", "pytest_sessionfinish", "pytest_sessionstart"]
