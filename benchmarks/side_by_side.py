"""What the side-by-side serving benchmarks share (``gateway.py``, ``llm_prefix.py``,
``llm_capacity.py``): one server process that deploys every side's application into one local
Ray, and the client helpers.

The benchmark runs itself again with ``--serve ...`` as that process (:class:`ServerProcess`);
there :func:`serve_until_stdin_closes` prints ``READY`` (plus an optional JSON payload) once
the applications serve, and tears them down when the benchmark closes its stdin - so the
benchmark's own process never imports Ray, and the sides share the machine in one run.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_until_stdin_closes(served: list[Any], payload: Any = None) -> int:
    """In the server process, after deploying ``served`` (``deploy()`` results): print
    ``READY`` (``READY {json}`` with a payload), serve until stdin closes, then shut every
    application, Serve and Ray down and exit at once (Ray's atexit hooks would wait)."""
    print("READY" + ("" if payload is None else " " + json.dumps(payload)), flush=True)
    sys.stdin.read()
    for s in served:
        s.shutdown()
    import ray
    from ray import serve

    serve.shutdown()
    ray.shutdown()
    os._exit(0)


class ServerProcess:
    """``script --serve *args`` as a child process in a session of its own, its stderr in
    ``log``. ``with ServerProcess(...) as server: payload = server.ready()`` (or ``start()`` and
    ``stop()``); on leaving, its stdin is closed (the child shuts down) and, if it has not ended within ``stop_s``, its whole
    process group is killed."""

    def __init__(self, script: str, args: list[str], log: Path, env: dict[str, str] | None = None,
                 stop_s: float = 180.0) -> None:
        self.script, self.args, self.log, self.stop_s = script, args, log, stop_s
        # the child decides its Ray's node address itself (serve_main), whatever ran this one
        base = dict(os.environ if env is None else env)
        base.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
        self.env = base
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> "ServerProcess":
        self.proc = subprocess.Popen([sys.executable, self.script, "--serve", *self.args], env=self.env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log.open("wb"), text=True, start_new_session=True)
        return self

    def ready(self) -> Any:
        """Block until the child says ``READY``: its JSON payload (None when it sent none).
        Raises ``RuntimeError`` with the log's tail when it ends or says anything else."""
        assert self.proc is not None and self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("READY"):
            raise RuntimeError(f"the server did not start; its log: {self.log}\n"
                               + self.log.read_text(errors="replace")[-3000:])
        rest = line[len("READY"):].strip()
        return json.loads(rest) if rest else None

    def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        try:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(timeout=self.stop_s)
        except Exception:  # noqa: BLE001 - whatever went wrong, nothing may stay behind
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def vllm_bench(port: int, model: Path, dataset: list[str], *, num_prompts: int, concurrency: int,
               seed: int, served_name: str = "tiny") -> dict:
    """One ``vllm bench serve`` run (vLLM's own benchmark client, in this process) against the
    OpenAI completions endpoint at ``port``: ``dataset`` is its dataset flags (e.g.
    ``["--dataset-name", "random", ...]``). Its result dict (``output_throughput``,
    ``p99_ttft_ms``, ``completed``, ...)."""
    from vllm.benchmarks import serve as vbench

    parser = argparse.ArgumentParser()
    vbench.add_cli_args(parser)
    ns = parser.parse_args([
        "--backend", "openai", "--base-url", f"http://127.0.0.1:{port}", "--endpoint",
        "/v1/completions", "--model", served_name, "--tokenizer", str(model), *dataset,
        "--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency),
        "--ignore-eos", "--seed", str(seed), "--disable-tqdm"])
    with contextlib.redirect_stdout(io.StringIO()):
        return vbench.main(ns)
