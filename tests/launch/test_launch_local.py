"""``hetflow launch`` on a laptop or CI: no cluster, no address - an embedded local Ray is started
for the run and stopped after it, and the script ends as under ``torchrun --standalone``."""

from __future__ import annotations

import pytest

from tests.launch.common import EXAMPLES, final_loss, hetflow_launch, processes_of_run, torchrun

pytestmark = pytest.mark.ray


def test_without_a_cluster_the_ranks_run_on_an_embedded_local_ray(tmp_path) -> None:
    args = ["--steps", "40"]
    reference = torchrun(EXAMPLES / "ddp_snapshot.py", *args)
    assert reference.returncode == 0, reference.stderr
    run = hetflow_launch("--nproc", "2", "--run-id", "embedded", str(EXAMPLES / "ddp_snapshot.py"),
                         *args, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert final_loss(run.stdout) == pytest.approx(final_loss(reference.stdout), rel=1e-5, abs=1e-6)
    assert "no hetflow-managed nodes" in run.stderr  # CPU ranks, as on a laptop
    logs = tmp_path / "results" / "launch" / "embedded"
    assert "final loss" in (logs / "rank-0.log").read_text()
    assert processes_of_run("embedded") == {}
