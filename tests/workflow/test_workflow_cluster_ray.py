"""The demo workflow joined to an existing multi-node cluster with ``--address``: the same
file, with only the training stage's device changed from ``cpu`` to ``auto``.

The cluster (``ray.cluster_utils.Cluster``, loopback) has a CPU head and a hetflow node that
declares two L40S GPUs it does not have. With ``devices: auto`` the train stage's ranks are
placed by the planner on that node's devices, each seeing exactly its own (with a CPU build of
torch they still compute on the CPU); everything else runs as on one machine. The load test is
shortened to keep the test short.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import pytest
import ray
import yaml

from hetflow.accelerators.synthetic import synthetic_node
from hetflow.workflow.runner import run_workflow
from hetflow.workflow.spec import workflow_from_dict
from tests.conftest import REPO
from tests.ray_cluster import hetflow_cluster
from tests.net import free_port as _free_port

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def cluster():
    from hetflow.workloads.serve.front import FAST_ENV

    # A cluster started by its user needs Serve's direct ingress in Ray's environment for
    # hetflow's serving fast path (docs/serving.md), as `hetflow run` sets for its own Ray.
    saved = {k: os.environ.get(k) for k in FAST_ENV}
    os.environ.update(FAST_ENV)
    try:
        with hetflow_cluster([synthetic_node("2x L40S", "gpu-node")], head_cpus=3, node_cpus=2) as c:
            ray.shutdown()  # the workflow joins the cluster itself, as `hetflow run --address` does
            yield c
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def test_the_demo_file_runs_on_a_cluster_with_only_its_device_changed(cluster, tmp_path: Path) -> None:
    data = yaml.safe_load((REPO / "examples" / "digits.yaml").read_text())
    assert data["train"]["resources"]["devices"] == "cpu"
    data["train"]["resources"]["devices"] = "auto"  # the one resource that differs
    data["serve"]["http"]["port"] = _free_port()
    data["load_test"].update(max_requests=100, max_duration_s=4)
    data.update(results_dir=str(tmp_path / "results"), cache_dir=str(tmp_path / "runs"))

    result = run_workflow(workflow_from_dict(data, source="digits.yaml"), address=cluster.address,
                          progress=False)

    assert result.ok, result.failures
    assert not ray.is_initialized()  # it joined and left; the cluster is still there
    placement = result.trained["placement"]
    # one rank on each of the node's two devices, placed by the planner
    assert re.search(r"rank 0\s+gpu-node \[0\]", placement), placement
    assert re.search(r"rank 1\s+gpu-node \[1\]", placement), placement
    assert result.trained["metrics"]["val_accuracy"] > 0.9
    assert result.served_accuracy == pytest.approx(result.exported["accuracy"], abs=1e-9)
    assert result.load.ok == result.load.sent == 100
