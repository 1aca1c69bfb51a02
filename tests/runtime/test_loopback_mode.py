"""When hetflow puts Ray in loopback mode (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``): only for a
cluster to join on loopback. An embedded local Ray, and a cluster at a real address, keep the
node IP Ray picks (the machine's LAN address wherever there is a default route): a driver in
loopback mode would report 127.0.0.1 and could not join a cluster at a real address.

Each case runs in a fresh interpreter (the variable only matters before Ray's first import, and
this test process has imported Ray), with Ray's temp folder in a directory of the test's own
(a recorded ``ray_current_cluster`` is one of the cases)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
PROBE = """
import json, os, sys
from hetflow.runtime.session import ray_loopback_mode
address = sys.argv[1] if sys.argv[1] != "-" else None
set_here = ray_loopback_mode(address)
print(json.dumps([set_here, os.environ.get("{env}"), "ray" in sys.modules]))
""".replace("{env}", ENV)


def probe(address: str | None, tmp_path, **env: str) -> list:
    base = {k: v for k, v in os.environ.items() if k not in (ENV, "RAY_ADDRESS")}
    base.update(RAY_TMPDIR=str(tmp_path), **env)
    out = subprocess.run([sys.executable, "-c", PROBE, address or "-"], env=base,
                         capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


@pytest.mark.parametrize("address, expected", [
    (None, [False, None]),                      # embedded local Ray: Ray's own node IP
    ("local", [False, None]),
    ("192.0.2.2:6379", [False, None]),          # a cluster at a real address
    ("10.1.2.3:6379", [False, None]),
    ("127.0.0.1:6379", [True, "0"]),            # a head started on loopback
    ("localhost:6379", [True, "0"]),
    ("ray://127.0.0.1:10001", [True, "0"]),
    ("[::1]:6379", [True, "0"]),
])
def test_only_a_cluster_on_loopback_gets_loopback_mode(tmp_path, address, expected) -> None:
    assert probe(address, tmp_path) == [*expected, False]


def test_ray_address_and_the_recorded_cluster_count_as_the_address(tmp_path) -> None:
    assert probe(None, tmp_path, RAY_ADDRESS="127.0.0.1:6379")[:2] == [True, "0"]
    assert probe(None, tmp_path, RAY_ADDRESS="192.0.2.2:6379")[:2] == [False, None]
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("127.0.0.1:6379")
    assert probe("auto", tmp_path)[:2] == [True, "0"]
    (tmp_path / "ray" / "ray_current_cluster").write_text("192.0.2.2:6379")
    assert probe("auto", tmp_path)[:2] == [False, None]


def test_the_users_own_setting_is_kept(tmp_path) -> None:
    assert probe("127.0.0.1:6379", tmp_path, **{ENV: "1"})[:2] == [False, "1"]


@pytest.mark.parametrize("env", [{}, {"TMPDIR": "/var/tmp/x"}, {"RAY_TMPDIR": "/tmp/r", "TMPDIR": "/var/tmp"}])
def test_the_address_file_is_where_ray_itself_looks(monkeypatch, env) -> None:
    from ray._common.utils import get_ray_address_file

    from hetflow.runtime.session import ray_address_file

    for key in ("RAY_TMPDIR", "TMPDIR"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert str(ray_address_file()) == get_ray_address_file(None)
