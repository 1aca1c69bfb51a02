"""The Ray job that shows one attempt of a controller job in Ray's own tooling.

Each attempt's runner (:mod:`hetflow.control.runner`) submits, through Ray's
``JobSubmissionClient``, one Ray job with the submission id ``hetflow-<job id>-<attempt>`` whose
entrypoint is this module, placed on the runner's node (an ``entrypoint_label_selector``, zero
CPUs):

    python -m hetflow.control.attempt_job --log LOG --offset N --outcome FILE --cancel FILE --runner-pid PID

It does no work of the job itself - the runner keeps running it, so the controller's
exactly-once rules are unchanged - it *shows* it: its output is the attempt's log from where
the attempt began (``ray job logs``, the dashboard's job page), and it ends when the attempt does,
with the attempt's outcome as its exit code (``ray job list`` then says SUCCEEDED or FAILED; the
runner stops the Ray job of a preempted or cancelled attempt: STOPPED). ``ray job stop`` on it
asks the runner to cancel the hetflow job (the cancel file), as ``hetflow cancel`` does. A runner
that dies without an outcome ends it as FAILED. Plain Python, no Ray: it starts in a fraction
of a second and holds no resources.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

POLL_S = 0.2
OUTCOME_EXIT = {"succeeded": 0, "cancelled": 4}  # anything else: 1 (hetflow's exit codes)
STOPPED = ("preempted", "cancelled")  # the runner stops these Ray jobs (STOPPED): wait for it
STOP_WAIT_S = 10.0


def submission_id(job_id: str, token: int) -> str:
    """The Ray job of attempt ``token`` of ``job_id``: one per attempt (Ray refuses a second)."""
    return f"hetflow-{job_id}-{token}"


def write_outcome(path: Path, outcome: str, message: str) -> None:
    """The attempt's end, for its Ray job (temp file + rename: never half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"outcome": outcome, "message": message}))
    os.replace(tmp, path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def follow(log: Path, offset: int, outcome: Path, cancel: Path, runner_pid: int) -> int:
    stopping = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stopping
        if not outcome.exists():  # `ray job stop` by a user: cancel the hetflow job
            cancel.touch()
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    out = sys.stdout.buffer
    position = offset
    while True:
        ended = outcome.exists()  # read before the log: every line written before the end is shown
        try:
            with open(log, "rb") as f:
                f.seek(position)
                chunk = f.read()
        except FileNotFoundError:
            chunk = b""
        if chunk:
            out.write(chunk)
            out.flush()
            position += len(chunk)
        if ended:
            result = json.loads(outcome.read_text())
            print(f"hetflow attempt ended: {result['outcome']}: {result['message']}", flush=True)
            deadline = time.monotonic() + STOP_WAIT_S
            while result["outcome"] in STOPPED and not stopping and time.monotonic() < deadline:
                time.sleep(POLL_S)
            return 143 if stopping else OUTCOME_EXIT.get(result["outcome"], 1)
        if stopping:
            return 143
        if not _alive(runner_pid):
            print("hetflow attempt lost: its runner ended without an outcome (the controller "
                  "queues the job again)", flush=True)
            return 1
        time.sleep(POLL_S)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hetflow.control.attempt_job", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--log", type=Path, required=True)
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--outcome", type=Path, required=True)
    p.add_argument("--cancel", type=Path, required=True)
    p.add_argument("--runner-pid", type=int, required=True)
    args = p.parse_args(argv)
    return follow(args.log, args.offset, args.outcome, args.cancel, args.runner_pid)


if __name__ == "__main__":
    sys.exit(main())
