"""The command line's shared conventions, as a user meets them: each verb run as its own process.

- an unreachable ``--address`` / ``RAY_ADDRESS`` (and a cluster recorded by ``ray start`` that
  is gone) fails within 10 s with one line and exit 2, for every verb that connects;
- one exit code per meaning (the table in docs/cli.md is the one the code uses);
- with ``--json`` an error is one JSON object on stdout;
- a missing torch or scikit-learn is one line with the install command (exit 2);
- the bash completion script, sourced in bash, completes verbs, options and paths.

No Ray is started here: each case must fail before Ray would be.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
DEADLINE_S = 10.0  # the bound for an unreachable cluster (a hang fails the test)


_HELD: list[socket.socket] = []  # bound, never listening: refused, and no other process gets them


def dead_address() -> str:
    """host:port on loopback that nothing listens on - held bound (not listening) for the rest
    of the run, so no other process (another test's Ray) can take the port meanwhile."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    _HELD.append(s)
    return f"127.0.0.1:{s.getsockname()[1]}"


def hetflow(*args: str, env: dict[str, str] | None = None, prelude: str = "",
            cwd: Path = REPO, timeout: float = DEADLINE_S) -> subprocess.CompletedProcess:
    """``hetflow ARGS`` in a fresh interpreter (``prelude`` runs first, e.g. to hide a package)."""
    base = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    base["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO), base.get("PYTHONPATH", "")])
    code = f"import sys\n{prelude}\nfrom hetflow.cli.main import main\nsys.exit(main())"
    return subprocess.run([sys.executable, "-c", code, *args], env={**base, **(env or {})}, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def one_line_error(done: subprocess.CompletedProcess, code: int, pattern: str) -> str:
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hetflow: error: "), done.stderr
    assert re.search(pattern, lines[0]), lines[0]
    assert "Traceback" not in done.stderr and done.stdout == ""
    return lines[0]


# Every verb that connects to a cluster, with the way the address reaches it.
CONNECTING = [
    ("train", ["train", str(EXAMPLES / "train_digits.yaml")], "env"),
    ("tune", ["tune", str(EXAMPLES / "tune_digits.yaml"), "--address", "{addr}"], "flag"),
    ("serve", ["serve", str(EXAMPLES / "serve_digits.yaml")], "env"),
    ("run", ["run", str(EXAMPLES / "digits.yaml"), "--address", "{addr}"], "flag"),
    ("launch", ["launch", "--nproc", "1", str(EXAMPLES / "launch" / "ddp_snapshot.py")], "env"),
    ("submit", ["submit", str(EXAMPLES / "jobs" / "sleep-python.yaml"), "--address", "{addr}"], "flag"),
    ("status", ["status"], "env"),
    ("cancel", ["cancel", "x-1", "--address", "{addr}"], "flag"),
    ("logs", ["logs", "x-1"], "env"),
    ("top", ["top", "--once"], "env"),
    ("node start", ["node", "start", "--address", "{addr}"], "flag"),
]


@pytest.mark.parametrize("name, argv, how", CONNECTING, ids=[c[0] for c in CONNECTING])
def test_an_unreachable_cluster_fails_fast_with_one_line(name: str, argv: list[str], how: str) -> None:
    addr = dead_address()
    argv = [a.replace("{addr}", addr) for a in argv]
    done = hetflow(*argv, env={"RAY_ADDRESS": addr} if how == "env" else None)
    line = one_line_error(done, 2, rf"cannot reach the Ray cluster at {re.escape(addr)} ")
    assert ("RAY_ADDRESS" in line) == (how == "env")  # it says where the address came from


def test_a_cluster_ray_start_recorded_but_gone_is_named(tmp_path: Path) -> None:
    addr = dead_address()
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text(addr + "\n")
    for argv in (["status"], ["train", str(EXAMPLES / "train_digits.yaml")]):
        done = hetflow(*argv, env={"RAY_TMPDIR": str(tmp_path)})
        one_line_error(done, 2, rf"no Ray cluster answers at {re.escape(addr)}, the cluster `ray start` "
                                r"last started here .*ray_current_cluster.*`ray stop`")


def test_a_port_that_accepts_but_is_no_ray_head_fails_fast() -> None:
    """Something listens there but never answers (ray.init would wait for minutes)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        addr = "127.0.0.1:%d" % listener.getsockname()[1]
        done = hetflow("status", "--address", addr)
    one_line_error(done, 2, rf"{re.escape(addr)} \(from --address\) accepts connections but does not answer "
                            r"as a Ray head")


def test_a_malformed_address_is_bad_input() -> None:
    done = hetflow("status", "--address", "nohost-noport")
    one_line_error(done, 2, r"'nohost-noport' \(--address\) is not host:port")


def test_json_errors_are_one_json_object_on_stdout() -> None:
    addr = dead_address()
    cases = [(["status", "--json", "--address", addr], 2, "input", "cannot reach"),
             (["plan", "--cluster", str(EXAMPLES / "cluster-mixed.yaml"), "--count", "4096", "--json"], 3,
              "unschedulable", ""),
             (["status", "--json", "--no-such-flag"], 2, "input", "unrecognized arguments"),
             (["train", str(EXAMPLES / "train_digits.yaml"), "--set", "nodot", "--json"], 2, "input", "--set")]
    for argv, code, kind, text in cases:
        done = hetflow(*argv)
        assert done.returncode == code, (argv, done.returncode, done.stdout, done.stderr)
        error = json.loads(done.stdout)["error"]
        assert error["exit_code"] == code and error["kind"] == kind and text in error["message"], error
        assert done.stderr == ""


def test_the_documented_exit_code_table_is_the_one_the_code_uses() -> None:
    from hetflow.cli.main import EXIT_CODES

    text = (REPO / "docs" / "cli.md").read_text()
    rows = dict(re.findall(r"^\| (\d+) \| `(\w+)` \|", text, re.M))
    assert {int(k): v for k, v in rows.items()} == {code: kind for code, (kind, _) in EXIT_CODES.items()}


def test_top_and_status_agree_without_a_cluster(tmp_path: Path) -> None:
    """The measured inconsistency of the issue: `top` exited 1 where `status` exited 2."""
    addr = dead_address()
    codes = {v: hetflow(*v.split(), env={"RAY_ADDRESS": addr}).returncode for v in ("status", "top --once")}
    assert codes == {"status": 2, "top --once": 2}


HIDE = "sys.modules['torch'] = None"  # `import torch` then fails as it does where it is not installed


@pytest.mark.parametrize("argv", [["train", "examples/train_digits.yaml"], ["tune", "examples/tune_digits.yaml"],
                                  ["serve", "examples/serve_digits.yaml"], ["run", "examples/digits.yaml"]],
                         ids=lambda a: a[0])
def test_a_missing_torch_is_one_line_with_the_install_commands(argv: list[str]) -> None:
    line = one_line_error(hetflow(*argv, prelude=HIDE), 2, r"PyTorch is not installed")
    for build in ("whl/cpu", "whl/cu", "whl/rocm"):
        assert f"pip install torch --index-url https://download.pytorch.org/{build}" in line


def test_a_missing_scikit_learn_is_one_line_for_the_digits_data() -> None:
    done = hetflow("train", "examples/train_digits.yaml", prelude="sys.modules['sklearn'] = None")
    one_line_error(done, 2, r"scikit-learn is not installed; the digits dataset .*pip install -e '\.\[demo\]'")
    # a verb that needs neither still works without them
    done = hetflow("plan", "--cluster", "examples/cluster-mixed.yaml", "--count", "2", "--json",
                   prelude=HIDE + "; sys.modules['sklearn'] = None")
    assert done.returncode == 0 and json.loads(done.stdout)


def test_the_extras_are_declared() -> None:
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = [re.split(r"[<>=\[ ]", d)[0] for d in project["dependencies"]]
    assert "torch" not in names and "scikit-learn" not in names
    extras = project["optional-dependencies"]
    assert extras["torch"][0].startswith("torch") and extras["demo"][0].startswith("scikit-learn")
    assert "hetflow[torch,demo]" in extras["dev"]  # `make test` / `make demo` install .[dev]
    assert re.search(r'^TORCH\s+\?= torch==2\.13\.0$', (REPO / "Makefile").read_text(), re.M)


def complete(script: Path, line: str) -> list[str]:
    """What bash offers for ``line`` (the cursor at its end) with the script sourced."""
    words = line.split(" ")
    bash = f"""
source {script}
COMP_WORDS=({' '.join(repr(w) for w in words)})
COMP_CWORD={len(words) - 1}
COMP_LINE={line!r}
COMP_POINT={len(line)}
_shtab_hetflow
printf '%s\\n' "${{COMPREPLY[@]}}"
"""
    done = subprocess.run(["bash", "-c", bash], capture_output=True, text=True, timeout=20, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_bash_completion_completes_verbs_options_and_files(tmp_path: Path) -> None:
    done = hetflow("completion", "bash")
    assert done.returncode == 0, done.stderr
    script = tmp_path / "hetflow.bash"
    script.write_text(done.stdout)
    assert {"submit", "status"} <= set(complete(script, "hetflow s"))
    assert set(complete(script, "hetflow s")) <= {"simulate", "serve", "submit", "status"}
    assert {"--follow", "--tail"} <= set(complete(script, "hetflow logs --"))
    assert "--dry-run" in complete(script, "hetflow train --")
    assert "examples/train_digits.yaml" in complete(script, "hetflow train examples/train_d")
    assert sorted(complete(script, "hetflow completion ")) == ["bash", "tcsh", "zsh"]


DRY_RUNS = [
    (["train", "examples/train_digits.yaml"], lambda d: d["placement"]["ranks"] == 2 and d["backend"] == "gloo"),
    (["launch", "--nproc", "2", "examples/launch/ddp_snapshot.py", "--steps", "5"],
     lambda d: d["placement"]["ranks"] == 2 and d["argv"][-2:] == ["--steps", "5"]),
    (["submit", "examples/jobs/digits-cpu.yaml"], lambda d: d["job"]["name"] == "digits-cpu" and d["cluster"] is None),
    (["run", "examples/digits.yaml"], lambda d: d["placement"]["ranks"] == 2 and d["stages"]["tune"] == "off"),
]


def ray_processes_under(root: Path) -> list[str]:
    """Command lines of live processes that name ``root`` (Ray's raylet and GCS name their temp dir)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            cmd = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # the process ended meanwhile
        if str(root) in cmd:
            found.append(cmd)
    return found


@pytest.mark.parametrize("argv, check", DRY_RUNS, ids=lambda a: a[0] if isinstance(a, list) else "")
def test_dry_run_says_what_would_start_and_starts_nothing(argv: list[str], check, tmp_path: Path) -> None:
    env = {"RAY_TMPDIR": str(tmp_path)}  # a new local Ray would make its session directory here
    # a launched script's own options come after SCRIPT: --dry-run and --json go before it
    argv = argv[:1] + ["--dry-run", "--json"] + argv[1:]
    done = hetflow(*argv, env=env, timeout=60)  # (reading a workflow imports torch: seconds)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["dry_run"] is True and check(data), data
    assert data.get("ray", {"new_local_ray": True}).get("new_local_ray") is True
    assert not (tmp_path / "ray").exists() or not list((tmp_path / "ray").glob("session_*"))
    assert ray_processes_under(tmp_path) == []
    if argv[0] == "train":  # the text form (the same facts)
        text = hetflow(*[a for a in argv if a != "--json"], env=env, timeout=60)
        assert text.returncode == 0 and text.stdout.startswith("dry run: nothing was started\n"), text.stderr
        assert "  placement:   2 ranks, 1 CPU each\n" in text.stdout


def test_a_dry_run_that_cannot_fit_exits_3_like_the_run(tmp_path: Path) -> None:
    done = hetflow("train", "examples/train_digits.yaml", "--dry-run", "--set", "layout.dp=64",
                   "--set", "train.batch_size=128", env={"RAY_TMPDIR": str(tmp_path)})
    one_line_error(done, 3, r"64 ranks x 1 CPUs = 64 CPUs, a new local Ray on this machine .* has \d+")
