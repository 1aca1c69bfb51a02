"""``hetflow launch`` without Ray: the torchrun environment rules, the spec's checks, and bad
input on the command line (one line, exit 2, no traceback, nothing started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hetflow.core.errors import InputError
from hetflow.workloads.launch.env import torchrun_env
from hetflow.workloads.launch.launcher import resolve_target
from hetflow.workloads.launch.spec import LaunchSpec
from tests.launch.common import SCRIPTS, hetflow_launch


def test_local_and_group_ranks_follow_the_nodes_in_rank_order() -> None:
    envs = torchrun_env(["b", "b", "a", "a", "b"], "10.0.0.2", 29500, run_id="r1",
                        restart_count=2, max_restarts=3)
    assert [e["RANK"] for e in envs] == ["0", "1", "2", "3", "4"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "0", "1", "2"]
    assert [e["LOCAL_WORLD_SIZE"] for e in envs] == ["3", "3", "2", "2", "3"]
    assert [e["GROUP_RANK"] for e in envs] == ["0", "0", "1", "1", "0"]
    for e in envs:
        assert e["WORLD_SIZE"] == e["ROLE_WORLD_SIZE"] == "5"
        assert e["ROLE_RANK"] == e["RANK"] and e["ROLE_NAME"] == "default"
        assert e["GROUP_WORLD_SIZE"] == "2"
        assert (e["MASTER_ADDR"], e["MASTER_PORT"]) == ("10.0.0.2", "29500")
        assert e["TORCHELASTIC_RESTART_COUNT"] == "2" and e["TORCHELASTIC_MAX_RESTARTS"] == "3"
        assert e["TORCHELASTIC_RUN_ID"] == "r1" and e["TORCHELASTIC_USE_AGENT_STORE"] == "False"
        assert e["OMP_NUM_THREADS"] == "1"  # several ranks on every node


def test_omp_threads_follow_torchrun_and_the_user_wins() -> None:
    alone = torchrun_env(["a", "b"], "h", 1, run_id="r", restart_count=0, max_restarts=0,
                         omp_threads=4)
    assert [e["OMP_NUM_THREADS"] for e in alone] == ["4", "4"]
    user = torchrun_env(["a", "a"], "h", 1, run_id="r", restart_count=0, max_restarts=0,
                        user_env={"OMP_NUM_THREADS": "3", "RANK": "x-user"})
    assert [e["OMP_NUM_THREADS"] for e in user] == ["3", "3"]
    assert user[1]["RANK"] == "x-user"  # --env is set last, as documented


@pytest.mark.parametrize("fields, words", [
    ({"script": "a.py", "nproc": 6, "tp": 4}, "does not divide --nproc 6"),
    ({"script": "a.py", "module": "m"}, "exactly one of a script"),
    ({}, "exactly one of a script"),
    ({"script": "a.py", "env": {"1BAD": "x"}}, "not valid"),
])
def test_the_spec_refuses_what_cannot_run(fields: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        LaunchSpec(**fields)


def test_layout_hint_becomes_dp_pp_tp() -> None:
    layout = LaunchSpec(script="a.py", nproc=16, tp=4, pp=2).layout
    assert (layout.dp, layout.pp, layout.tp) == (2, 2, 4)


def test_targets_resolve_against_the_working_dir(tmp_path: Path) -> None:
    (tmp_path / "proj" / "pkg").mkdir(parents=True)
    (tmp_path / "proj" / "main.py").write_text("print(1)\n")
    (tmp_path / "proj" / "pkg" / "__init__.py").write_text("")
    (tmp_path / "proj" / "pkg" / "train.py").write_text("print(2)\n")
    # a script path inside the working dir, given relative to it or to the current directory
    for script in ("main.py", str(tmp_path / "proj" / "main.py")):
        t = resolve_target(LaunchSpec(script=script, working_dir=str(tmp_path / "proj")), tmp_path)
        assert t.argv[2] == "main.py" and t.cwd is None and t.working_dir == str((tmp_path / "proj").resolve())
    t = resolve_target(LaunchSpec(module="pkg.train", args=("--x", "1"),
                                  working_dir="proj"), tmp_path)
    assert t.argv[1:] == ["-u", "-m", "pkg.train", "--x", "1"]
    t = resolve_target(LaunchSpec(script="proj/main.py"), tmp_path)
    assert t.argv[2] == str(tmp_path / "proj" / "main.py") and t.cwd == str(tmp_path)
    with pytest.raises(InputError, match="no such script other.py in --working-dir"):
        resolve_target(LaunchSpec(script="other.py", working_dir="proj"), tmp_path)
    with pytest.raises(InputError, match="no module named pkg.nothing"):
        resolve_target(LaunchSpec(module="pkg.nothing", working_dir="proj"), tmp_path)
    with pytest.raises(InputError, match="a directory"):
        resolve_target(LaunchSpec(script="proj"), tmp_path)


@pytest.mark.parametrize("args, words", [
    (["--nproc", "2", "no_such_script.py"], "no such script no_such_script.py"),
    (["--nproc", "3", "--tp", "2", str(SCRIPTS / "env_dump.py")], "does not divide --nproc 3"),
    (["--nproc", "2", "--frobnicate", str(SCRIPTS / "env_dump.py")], "unrecognized arguments: --frobnicate"),
    (["--nproc", "0", str(SCRIPTS / "env_dump.py")], "--nproc"),
    (["-m", "no_such_pkg.train"], "no module named no_such_pkg.train"),
    (["--working-dir", "/no/such/dir", "a.py"], "--working-dir /no/such/dir: no such directory"),
    (["--env", "NOEQUALS", str(SCRIPTS / "env_dump.py")], "expected K=V"),
    (["--memory", "lots", str(SCRIPTS / "env_dump.py")], "lots"),
    ([], "no script given"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], words: str, tmp_path: Path) -> None:
    run = hetflow_launch(*args, timeout=60, cwd=tmp_path)
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], run.stderr
    assert "Traceback" not in run.stderr and not run.stdout
    assert not (tmp_path / "results").exists()  # nothing started, no log directory
