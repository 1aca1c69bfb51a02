"""One namespace cluster for every test of tests/hosts (started once: a start costs ~20 s on two
cores). Each test leaves every host alive again (a lost host rejoins, a killed head restarts),
so the tests do not depend on their order. The head keeps its GCS in Redis when redis-server is
installed (the head-restart test needs it and fails, not skips, without it) and every host runs
with Serve's direct ingress (the serving test)."""

from __future__ import annotations

import shutil

import pytest

from tests.hosts.netns import HostCluster, available


@pytest.fixture(scope="package")
def hosts():
    if available() is not None:
        pytest.skip(f"no namespace hosts here: {available()}")
    from hetflow.workloads.serve.front import FAST_ENV

    with HostCluster(workers=2, worker_cpus=2, env=dict(FAST_ENV),
                     gcs_redis=shutil.which("redis-server") is not None) as cluster:
        yield cluster
