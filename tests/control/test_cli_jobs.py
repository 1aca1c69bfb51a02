"""``hetflow submit|status|cancel|logs`` parsing and printing (the Ray module runs them live)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from hetflow.cli.jobs import format_job, format_table, register
from hetflow.core.errors import InputError


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hetflow")
    register(p.add_subparsers(dest="command"))
    return p


def test_the_four_verbs_parse() -> None:
    p = parser()
    assert p.parse_args(["submit", "j.yaml", "--address", "h:6379", "--policy", "srtf"]).policy == "srtf"
    assert p.parse_args(["status"]).job is None and p.parse_args(["status", "x-1", "--json"]).json
    assert p.parse_args(["cancel", "x-1"]).job == "x-1"
    assert p.parse_args(["logs", "x-1", "--tail", "100"]).tail == 100


def test_a_bad_job_file_fails_before_connecting(tmp_path: Path) -> None:
    bad = tmp_path / "job.yaml"
    bad.write_text("name: x\nkind: python\npython: {script: run.py}\ndevics: {count: 1}\n")
    args = parser().parse_args(["submit", str(bad), "--address", "127.0.0.1:1"])
    with pytest.raises(InputError, match="devics: unknown key \\(did you mean 'devices'"):
        args.func(args)
    args = parser().parse_args(["submit", str(bad), "--policy", "fastest"])
    with pytest.raises(InputError):
        args.func(args)


RECORD = {"job_id": "digits-3", "status": "RUNNING", "devices": "2x MI210 on a [0 1]", "progress_step": 40,
          "reason": "running on 2x MI210 on a [0 1]", "spec": {"kind": "train"}, "submitted_at": 0.0,
          "runs": [{"token": 1, "device_type": "MI210", "devices": [["a", 0], ["a", 1]], "outcome": "preempted",
                    "start_step": 0, "end_step": 30}],
          "history": [[0.0, "submitted"]]}


def test_status_prints_devices_progress_and_reasons() -> None:
    waiting = {**RECORD, "job_id": "sleep-4", "status": "QUEUED", "devices": None, "progress_step": None,
               "reason": "waiting: needs 2x MI210; MI210: none free"}
    table = format_table([RECORD, waiting]).splitlines()
    assert table[0].split() == ["JOB", "STATUS", "DEVICES", "STEP", "REASON"]
    assert table[1].startswith("digits-3") and "2x MI210 on a [0 1]" in table[1] and " 40 " in table[1]
    assert table[2].endswith("waiting: needs 2x MI210; MI210: none free")
    detail = format_job(RECORD)
    assert "attempt 1: MI210 a:0 a:1: preempted, steps 0 -> 30" in detail
    assert format_table([]).startswith("no jobs yet")


def test_a_cpu_jobs_attempts_show_its_cpus_and_node() -> None:
    cpu = {**RECORD, "job_id": "digits-cpu-5", "devices": "2 CPUs on vm",
           "runs": [{"token": 1, "device_type": "CPU", "devices": [], "where": "2 CPUs on vm",
                     "outcome": "succeeded", "start_step": 0, "end_step": 300}]}
    assert "  devices: 2 CPUs on vm" in format_job(cpu)
    assert "attempt 1: 2 CPUs on vm: succeeded, steps 0 -> 300" in format_job(cpu)


def test_an_unreachable_cluster_is_a_one_line_error_with_what_to_do() -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on (held bound: no one else takes it)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        args = parser().parse_args(["status", "--address", f"127.0.0.1:{port}"])
        with pytest.raises(InputError, match=r"cannot reach the Ray cluster at 127.0.0.1:\d+ .*`ray start --head`"):
            args.func(args)
