"""`hetflow node start --print` as a user runs it: GCS fault tolerance on Redis, flags passed to
`ray start` after `--`, and the input errors (one line, exit 2). Nothing is started."""

from __future__ import annotations

import socket

from hetflow.cli.main import main


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_gcs_redis_sets_rays_environment_for_the_head(capsys) -> None:
    code, out, _ = run_cli(capsys, "node", "start", "--print", "--num-cpus", "0", "--gcs-redis",
                           "10.0.0.5:6379", "--gcs-namespace", "prod-1", "--", "--port=6380")
    assert code == 0
    line = out.strip().splitlines()[-1]
    assert line.startswith("RAY_REDIS_ADDRESS=10.0.0.5:6379 RAY_external_storage_namespace=prod-1 ")
    assert " ray start --head " in line and line.endswith("--port=6380")


def test_redis_password_comes_from_the_environment_and_is_not_printed(capsys, monkeypatch) -> None:
    monkeypatch.setenv("HETFLOW_GCS_REDIS_PASSWORD", "s3cret")
    code, out, _ = run_cli(capsys, "node", "start", "--print", "--gcs-redis", "10.0.0.5:6379")
    assert code == 0 and "--redis-password '***'" in out and "s3cret" not in out


def test_bad_gcs_options_exit_2_with_one_line(capsys) -> None:
    cases = [
        (["--gcs-redis", "10.0.0.5"], "is not HOST:PORT"),
        (["--gcs-namespace", "x"], "needs --gcs-redis"),
        (["--address", "10.0.0.1:6379", "--gcs-redis", "10.0.0.5:6379"], "is for the head node"),
        (["--", "--head"], "set by hetflow node start itself"),
    ]
    for extra, expected in cases:
        code, out, err = run_cli(capsys, "node", "start", "--print", *extra)
        assert code == 2 and expected in err and len(err.strip().splitlines()) == 1, (extra, err)


def test_a_redis_that_does_not_answer_is_refused_before_ray_starts(capsys) -> None:
    with socket.socket() as s:  # a port nothing listens on (held bound: no one else takes it)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        code, _, err = run_cli(capsys, "node", "start", "--gcs-redis", f"127.0.0.1:{port}")
    assert code == 2 and f"no Redis answers at 127.0.0.1:{port}" in err
