"""The same user-style DDP script under ``torchrun`` and under ``hetflow launch``, side by side.

    .venv/bin/python benchmarks/launch.py                 # about 6 minutes on 2 cores
    .venv/bin/python benchmarks/launch.py --rounds 5 --steps 3000

The script is ``examples/launch/ddp_snapshot.py`` (plain DDP, gloo on CPU, a snapshot file),
unchanged on both sides, 2 processes:

* **torchrun**: ``torchrun --standalone --nproc_per_node 2 SCRIPT ...``
* **hetflow launch**: ``hetflow launch --nproc 2 SCRIPT ...`` as a user runs it on a laptop: no
  cluster, so it starts an embedded local Ray for the run;
* **joined**: the same with ``--address`` of a Ray started beforehand (``ray start --head``, as
  on a cluster): its start-up is the launcher's own cost without Ray's.

Rounds alternate between the two (the machine is noisy); medians are reported.

* throughput: the script's own ``throughput N samples/s`` line (rank 0, after its warm-up steps);
* start-up: command started -> the script's first ``step`` line read from the command's stdout
  (Ray start, actors, Python and torch imports, rendezvous, one step);
* recovery: a run with ``--max-restarts 1`` and a snapshot every 50 steps; once the snapshot
  exists rank 1's process gets SIGKILL; recovery is kill -> the first ``step`` line after the
  script's ``resumed from step`` line (stop the survivors, new processes, new rendezvous,
  snapshot load, one step). torchrun's recovery is measured the same way (``--max-restarts 1``,
  with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, without which its gloo restart can fail,
  pytorch#135712).

Last line: ``RESULT launch_over_torchrun=<x> launch_startup_s=<x> torchrun_startup_s=<x>
launch_joined_startup_s=<x> launch_recovery_s=<x> torchrun_recovery_s=<x>`` (the throughput
ratio is the embedded side's).
"""

from __future__ import annotations

import ray_home  # noqa: F401 - first: Ray's temp folder is this run's own (ray_home.py)

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "examples" / "launch" / "ddp_snapshot.py"
BIN = Path(sys.executable).parent


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "OMP_NUM_THREADS")}
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    env.update(extra)
    return env


JOINED: list[str] = []  # the address of the benchmark's own running Ray, for the "joined" side


def _command(side: str, run_id: str, restarts: int) -> list[str]:
    if side == "torchrun":
        return [str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2",
                "--max-restarts", str(restarts), str(SCRIPT)]
    joined = ["--address", JOINED[0]] if side == "joined" else []
    return [str(BIN / "hetflow"), "launch", "--quiet", *joined, "--nproc", "2",
            "--max-restarts", str(restarts), "--run-id", run_id,
            "--log-dir", str(Path(tempfile.gettempdir()) / "hetflow-bench-launch" / run_id),
            str(SCRIPT)]


def start_ray_head() -> subprocess.Popen:
    """A running local Ray (``ray start --head --block``, loopback), stopped by its PID."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    head = subprocess.Popen([str(BIN / "ray"), "start", "--head", "--block", "--port", str(port),
                             "--node-ip-address", "127.0.0.1", "--num-cpus", "2",
                             "--include-dashboard", "false", "--disable-usage-stats"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env())
    JOINED[:] = [f"127.0.0.1:{port}"]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                time.sleep(3)  # GCS up; give the raylet a moment to register
                return head
        time.sleep(0.3)
    head.terminate()
    raise SystemExit("ray start --head did not come up in 60 s")


class Run:
    """A command whose stdout lines are timestamped as they arrive."""

    def __init__(self, cmd: list[str], env: dict[str, str]) -> None:
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=env)
        self.lines: list[tuple[float, str]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout=timeout)
        self.reader.join(timeout=10)
        return code

    def first(self, pattern: str, after: float = 0.0) -> float | None:
        for t, line in list(self.lines):
            if t >= after and re.search(pattern, line):
                return t
        return None

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)


def _rank_pid(run_id_env: str, rank: str) -> int | None:
    """The script process of ``rank`` whose environment holds ``run_id_env``."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if run_id_env.encode() in env and f"RANK={rank}".encode() in env and SCRIPT.name.encode() in cmdline:
            return int(entry)
    return None


def throughput_round(side: str, args: argparse.Namespace, index: int) -> dict:
    run_id = f"bench-{side}-{index}-{os.getpid()}"
    # the head was started with Ray's default token authentication: a driver joining by
    # address must say so (Ray's rule for explicit addresses)
    env = _env(**({"RAY_AUTH_MODE": "token"} if side == "joined" else {}))
    run = Run(_command(side, run_id, 0) + ["--steps", str(args.steps), "--warmup", str(args.warmup),
                                           "--log-every", "100000"], env)
    code = run.wait(timeout=600)
    if code != 0:
        raise SystemExit(f"{side} failed ({code}):\n{run.text()[-3000:]}")
    rate = float(re.findall(r"throughput ([0-9.]+) samples/s", run.text())[0])
    first = run.first(r"step \d+ loss")
    assert first is not None
    return {"samples_per_s": rate, "startup_s": first - run.t0}


def recovery_round(side: str, args: argparse.Namespace, index: int) -> float:
    run_id = f"bench-rec-{side}-{index}-{os.getpid()}"
    with tempfile.TemporaryDirectory() as tmp:
        snapshot = Path(tmp) / "snap.pt"
        # a mark in the environment every rank inherits (torchrun --standalone draws its own
        # run id; the embedded Ray's workers inherit this process's environment)
        marker = f"HETFLOW_BENCH_RUN={run_id}"
        env = _env(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1", HETFLOW_BENCH_RUN=run_id)
        run = Run(_command(side, run_id, 1) + ["--steps", str(args.recovery_steps), "--snapshot", str(snapshot),
                                               "--save-every", "50", "--log-every", "10",
                                               "--step-sleep", "0.01"], env)
        deadline = time.monotonic() + 300
        while not snapshot.exists() and run.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        pid = _rank_pid(marker, "1")
        if pid is None:
            run.proc.kill()
            raise SystemExit(f"{side}: rank 1 not found to kill:\n{run.text()[-2000:]}")
        killed = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        code = run.wait(timeout=600)
        resumed = run.first(r"resumed from step", after=killed)
        first = run.first(r"step \d+ loss", after=resumed or killed)
        if code != 0 or resumed is None or first is None:
            raise SystemExit(f"{side} did not recover ({code}):\n{run.text()[-3000:]}")
        return first - killed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6000, help="steps per throughput run")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--recovery-steps", type=int, default=400)
    parser.add_argument("--recovery-rounds", type=int, default=2)
    args = parser.parse_args()

    runs: dict[str, list[dict]] = {"torchrun": [], "hetflow": [], "joined": []}
    head = start_ray_head()
    try:
        for i in range(args.rounds):
            order = ("torchrun", "hetflow", "joined")
            for side in order if i % 2 == 0 else order[::-1]:
                runs[side].append(throughput_round(side, args, i))
                r = runs[side][-1]
                print(f"round {i} {side:9s} {r['samples_per_s']:8.0f} samples/s  "
                      f"start-up {r['startup_s']:.1f}s", flush=True)
    finally:
        head.send_signal(signal.SIGTERM)  # `ray start --block` stops its cluster on SIGTERM
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
    recovery: dict[str, list[float]] = {"torchrun": [], "hetflow": []}
    for i in range(args.recovery_rounds):
        for side in ("torchrun", "hetflow"):
            recovery[side].append(recovery_round(side, args, i))
            print(f"recovery {i} {side:9s} {recovery[side][-1]:.1f}s", flush=True)

    def med(side: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[side])

    ratio = med("hetflow", "samples_per_s") / med("torchrun", "samples_per_s")
    print(f"RESULT launch_over_torchrun={ratio:.3f} launch_startup_s={med('hetflow', 'startup_s'):.1f} "
          f"torchrun_startup_s={med('torchrun', 'startup_s'):.1f} "
          f"launch_joined_startup_s={med('joined', 'startup_s'):.1f} "
          f"launch_recovery_s={statistics.median(recovery['hetflow']):.1f} "
          f"torchrun_recovery_s={statistics.median(recovery['torchrun']):.1f}")


if __name__ == "__main__":
    main()
