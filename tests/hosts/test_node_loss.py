"""A worker host lost mid-run, on a real multi-host Ray cluster in network namespaces.

`hetflow launch --max-restarts 2` runs an unchanged torchrun script (examples/launch/
ddp_snapshot.py: DDP with a snapshot file) on the namespace hosts. Its two ranks run on one
worker host; that host then disappears - every process of it SIGKILLed at once, or (the second
test) its link cut while its processes keep running. The launcher must restart the group on the
other host, the script resume from its snapshot, and the run end exactly as an uninterrupted run
does (same final loss: the script's batches depend on the step alone), with no placement group
left. See tests/hosts/netns.py for the hosts.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

from tests.hosts.netns import REPO, HostCluster, available

WHY_NOT = available()
pytestmark = [pytest.mark.ray, pytest.mark.hosts,
              pytest.mark.skipif(WHY_NOT is not None, reason=f"no namespace hosts here: {WHY_NOT}")]

SCRIPT = str(REPO / "examples" / "launch" / "ddp_snapshot.py")
STEPS = 400  # x 0.05 s: a rank left running on a cut-off host would need 16 s more


def _launch(hosts: HostCluster, tmp: Path, name: str, sleep: float) -> list[str]:
    snap = tmp / f"{name}.pt"
    return ["hetflow", "launch", "--address", hosts.address, "--nproc", "2", "--max-restarts", "2",
            "--cpus-per-rank", "1", "--run-id", f"hosts-{name}", "--log-dir", str(tmp / name), SCRIPT,
            "--steps", str(STEPS), "--snapshot", str(snap), "--save-every", "20",
            "--log-every", "10", "--step-sleep", str(sleep)]


def _final_loss(text: str) -> str:
    found = re.findall(r"final loss (\S+)", text)
    assert found, text[-3000:]
    return found[-1]


def _ranks_on(hosts: HostCluster, host) -> int:
    count = 0
    for pid in hosts.pids(host):
        try:
            count += "ddp_snapshot.py" in Path(f"/proc/{pid}/cmdline").read_text()
        except OSError:
            continue
    return count


def _rank_host(hosts: HostCluster) -> object:
    """The worker host whose processes run the script's ranks."""
    for host in hosts.worker_hosts:
        if _ranks_on(hosts, host):
            return host
    raise AssertionError("no host runs the ranks")


def _live_groups(hosts: HostCluster) -> int:
    out = hosts.python(hosts.head, "import ray\nray.init(address=ADDRESS)\n"
                                   "from ray.util import placement_group_table\n"
                                   "live = sum(g['state'] != 'REMOVED' for g in placement_group_table().values())\n"
                                   "print(f'LIVE_GROUPS={live}')\n")
    found = re.findall(r"LIVE_GROUPS=(\d+)", out.stdout)
    assert found, out.stdout + out.stderr
    return int(found[-1])


def _run_with_fault(hosts: HostCluster, tmp: Path, name: str, fault) -> tuple[int, str, object]:
    proc = hosts.popen(hosts.head, _launch(hosts, tmp, name, sleep=0.05), cwd=str(tmp))
    lines: list[str] = []
    victim = None
    deadline = time.monotonic() + 400
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if victim is None and re.search(r"step (8|9)0 loss", line):
            victim = _rank_host(hosts)
            fault(victim)
        assert time.monotonic() < deadline, "".join(lines[-50:])
    code = proc.wait(timeout=60)
    return code, "".join(lines), victim


@pytest.fixture(scope="module")
def reference(hosts, tmp_path_factory) -> str:
    """The final loss of the same run with nothing lost (world size 2, same steps)."""
    tmp = tmp_path_factory.mktemp("reference")
    out = hosts.run(hosts.head, _launch(hosts, tmp, "reference", sleep=0.0), cwd=str(tmp), timeout=300)
    return _final_loss(out.stdout + out.stderr)


def test_a_host_killed_whole_mid_run_resumes_on_the_other_host(hosts, reference, tmp_path) -> None:
    code, text, victim = _run_with_fault(hosts, tmp_path, "killed", hosts.kill_host)
    assert code == 0, text[-3000:]
    assert victim is not None and re.search(r"resumed from step [1-9]\d*", text), text[-3000:]
    assert _final_loss(text) == reference  # every step after the resume is the same step again
    assert _live_groups(hosts) == 0
    hosts.rejoin(victim)  # the machine comes back (for the next test)


def test_a_host_whose_link_is_cut_mid_run_is_replaced(hosts, reference, tmp_path) -> None:
    import threading

    from hetflow.workloads.launch.rank import DEFAULT_LEASE_S

    cut = []
    fenced_after: list[float] = []

    def watch(host, at: float) -> None:  # the cut-off ranks must stop themselves (their lease)
        while time.monotonic() - at < 60:
            if not _ranks_on(hosts, host):
                fenced_after.append(time.monotonic() - at)
                return
            time.sleep(0.2)

    def fault(host) -> None:
        hosts.cut_link(host)
        cut.append(host)
        threading.Thread(target=watch, args=(host, time.monotonic()), daemon=True).start()

    try:
        code, text, victim = _run_with_fault(hosts, tmp_path, "partitioned", fault)
    finally:
        for host in cut:
            hosts.restore_link(host)
            hosts.rejoin(host)  # Ray declared it dead: its raylet exits once it hears so
    assert code == 0, text[-3000:]
    assert re.search(r"resumed from step [1-9]\d*", text), text[-3000:]
    assert _final_loss(text) == reference
    assert _live_groups(hosts) == 0
    # fenced by their lease, well before they would have finished on their own (16 s more)
    assert fenced_after and fenced_after[0] < DEFAULT_LEASE_S + 5, fenced_after


# --- the built-in training (hetflow train's path) ---------------------------------------------

DRIVER = """
import json
from hetflow.workloads.train.config import config_from_dict
from hetflow.workloads.train.job import run_training

config = config_from_dict({CONFIG!r}, source="test")

def show(record, job):
    print(f"STEP {record['step']} attempt {record['attempt']}", flush=True)

result = run_training(config, on_progress=show)
print("RESULT_JSON " + json.dumps({"steps": sorted(result.losses), "restarts": result.restarts,
                                   "losses": {str(k): v for k, v in result.losses.items()},
                                   "failures": result.failures}), flush=True)
"""


def _train_config(hosts: HostCluster, tmp: Path, steps: int) -> dict:
    # the paced model (tests/fixtures/user_pkg/paced.py): 20 ms a step whatever the machine,
    # so the kill lands mid-run without the ranks burning the CPU on a large model
    return {"name": "hosts-train", "model": {"spec": "user_pkg.paced:SPEC", "hidden": 16},
            "layout": {"dp": 2},
            "train": {"steps": steps, "batch_size": 64, "lr": 0.003, "log_every": 10},
            "checkpoint": {"dir": str(tmp / "checkpoints"), "interval": 40},
            "resources": {"devices": "cpu", "cpus_per_rank": 1, "max_failures": 2,
                          "ray_address": hosts.address}}


def test_built_in_training_loses_a_host_and_every_step_is_there_once(hosts, tmp_path) -> None:
    steps = 300
    code = DRIVER.replace("{CONFIG!r}", repr(_train_config(hosts, tmp_path, steps)))
    proc = hosts.popen(hosts.head, [sys.executable, "-c", f"ADDRESS = {hosts.address!r}\n" + code],
                       cwd=str(tmp_path))
    lines, victim = [], None
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        found = re.match(r"STEP (\d+) attempt 0", line)
        if victim is None and found and int(found.group(1)) >= 100:
            victim = _train_host(hosts)
            hosts.kill_host(victim)
    assert proc.wait(timeout=120) == 0, "".join(lines[-60:])
    result = json.loads(next(l for l in lines if l.startswith("RESULT_JSON "))[len("RESULT_JSON "):])
    assert victim is not None and result["restarts"] >= 1, result["failures"]
    assert result["steps"] == list(range(1, steps + 1))  # every step's loss, once
    assert _live_groups(hosts) == 0
    hosts.rejoin(victim)


def _train_host(hosts: HostCluster):
    """The worker host whose Ray workers run the training ranks (``ray::FuncWorker`` processes)."""
    for host in hosts.worker_hosts:
        for pid in hosts.pids(host):
            try:
                if "FuncWorker" in Path(f"/proc/{pid}/cmdline").read_text():
                    return host
            except OSError:
                continue
    raise AssertionError("no host runs the training ranks")
