"""Serving under load loses a replica host, on real hosts (network namespaces).

``hetflow serve CONFIG --detach`` runs on the head host (its front door, HAProxy, lives there)
with two replicas of one model, one per worker host (1.5 CPUs each on 2-CPU hosts). ``hey``
(an external load tool) sends requests from the head host for ``LOAD_S`` seconds; a few
seconds in, every process of one worker host is SIGKILLed at once. Checked: no request fails
(the front door retries a request whose replica connection broke - ``retry-on conn-failure
empty-response`` - and the surviving replica answers), and once the host is back the dead
replica is replaced (two replicas running again). See tests/hosts/netns.py for the hosts.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
from pathlib import Path

import pytest
import yaml

from tests.hosts.netns import HostCluster, available
from tests.net import free_port as _free_port

WHY_NOT = available()
pytestmark = [pytest.mark.ray, pytest.mark.hosts,
              pytest.mark.skipif(WHY_NOT is not None, reason=f"no namespace hosts here: {WHY_NOT}")]

LOAD_S = 12
KILL_AFTER_S = 4
# 8 clients at 25 req/s each: 200 req/s, always requests in flight on both replicas, without
# saturating both cores for the whole load (unthrottled, hey alone took a core)
QPS_PER_CLIENT = 25


def serve_env() -> dict[str, str]:
    from hetflow.workloads.serve.front import FAST_ENV

    return dict(FAST_ENV)


def _replicas_running(hosts: HostCluster, app: str, until: int | None = None,
                      timeout: float = 120) -> tuple[int, float]:
    """(the app's RUNNING replicas, seconds it took) as Ray Serve reports them, read by one
    Python process on the head that joins Ray once: with ``until``, it polls until that many
    run or ``timeout`` passes (a process per poll would cost ~3 CPU-s each: Ray and Serve's
    imports and a join)."""
    code = ("import time\nimport ray\nfrom ray import serve\nray.init(address=ADDRESS)\n"
            f"app_name, until, timeout = {app!r}, {until!r}, {timeout!r}\n"
            "start = time.monotonic()\n"
            "while True:\n"
            "    app = serve.status().applications.get(app_name)\n"
            "    n = sum(d.replica_states.get('RUNNING', 0) for d in app.deployments.values()) if app else 0\n"
            "    if until is None or n >= until or time.monotonic() - start > timeout:\n"
            "        break\n"
            "    time.sleep(0.5)\n"
            "print(f'RUNNING={n} AFTER={time.monotonic() - start:.2f}')\n")
    out = hosts.python(hosts.head, code, check=False, timeout=timeout + 60)
    found = re.findall(r"RUNNING=(\d+) AFTER=([\d.]+)", out.stdout)
    return (int(found[-1][0]), float(found[-1][1])) if found else (0, 0.0)


def _hey_counts(text: str) -> tuple[int, int]:
    """(responses with status 200, everything else: other statuses and transport errors)."""
    ok = bad = 0
    for code, count in re.findall(r"\[(\d{3})\]\s+(\d+) responses", text):
        if code == "200":
            ok += int(count)
        else:
            bad += int(count)
    errors = text.split("Error distribution:", 1)
    if len(errors) == 2:
        bad += sum(int(n) for n in re.findall(r"^\s+\[(\d+)\]", errors[1], flags=re.M))
    return ok, bad


def lose_a_replica_host(hosts: HostCluster, tmp: Path) -> dict[str, float]:
    """Serve, load with hey, kill a replica host mid-load, bring it back; the figures."""
    hey = shutil.which("hey")
    if hey is None:
        raise RuntimeError("hey is not installed: run scripts/system_deps.sh (apt-get install -y hey)")
    port = _free_port()
    # a non-loopback host: API keys are required (auth.mode auto); the load sends one
    from hetflow.workloads.serve.keys import DirectoryKeyStore, create_key

    key = create_key(DirectoryKeyStore(tmp / "keys"), "load")
    config = {"name": "hostloss", "http": {"host": hosts.head.address, "port": port},
              "auth": {"store": str(tmp / "keys")},
              "limits": {"request_timeout_s": 30},
              "models": [{"name": "m", "weights": "random", "devices": "cpu", "replicas": 2,
                          "cpus_per_replica": 1.5, "batching": {"enabled": False},
                          "train": {"model": {"kind": "mlp", "hidden": [32]}}}]}
    path = tmp / "serve.yaml"
    path.write_text(yaml.safe_dump(config))
    hosts.run(hosts.head, ["hetflow", "serve", str(path), "--address", hosts.address, "--detach"],
              timeout=300)
    body = tmp / "body.json"
    body.write_text(json.dumps({"inputs": [[0.5] * 64]}))
    url = f"http://{hosts.head.address}:{port}/v1/models/m/predict"
    try:
        load = hosts.popen(hosts.head, [hey, "-z", f"{LOAD_S}s", "-c", "8", "-q", str(QPS_PER_CLIENT),
                                        "-t", "30", "-m", "POST",
                                        "-T", "application/json", "-D", str(body),
                                        "-H", f"Authorization: Bearer {key}", url])
        victim = hosts.worker_hosts[-1]
        before, _ = _replicas_running(hosts, "hostloss.m")
        killed: list[int] = []
        killer = threading.Timer(KILL_AFTER_S, lambda: killed.append(hosts.kill_host(victim)))
        killer.start()
        text, _ = load.communicate(timeout=LOAD_S + 60)
        killer.join()
        ok, bad = _hey_counts(text)
        assert ok > 0, text
        hosts.rejoin(victim)
        replicas, replaced_s = _replicas_running(hosts, "hostloss.m", until=2, timeout=120)
    finally:
        hosts.run(hosts.head, ["hetflow", "serve", str(path), "--address", hosts.address, "--stop"],
                  check=False, timeout=120)
    return {"requests_ok": ok, "requests_lost": bad, "replicas_before": before,
            "processes_killed": killed[0] if killed else 0, "replicas_after": replicas,
            "replaced_after_rejoin_s": replaced_s}


def test_a_replica_host_lost_under_load_loses_no_request(hosts, tmp_path) -> None:
    figures = lose_a_replica_host(hosts, tmp_path)
    print(f"serving host loss: {figures}")
    assert figures["replicas_before"] == 2 and figures["processes_killed"] > 0, figures
    assert figures["requests_lost"] == 0, figures
    assert figures["replicas_after"] == 2, figures  # the dead replica replaced
