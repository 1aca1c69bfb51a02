"""Run training jobs as real multi-process worlds (gloo on CPU) without Ray.

``run_worlds(jobs, processes)`` spawns ``processes`` workers once; each runs every job in order
(a job of world size w uses ranks 0..w-1, the others skip it), so the cost of starting Python and
importing torch is paid once for many layouts. Each job rendezvouses through its own file store.
"""

from __future__ import annotations

import queue as queue_module
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch.multiprocessing as mp

from hetflow.workloads.train.config import TrainConfig


@dataclass
class JobOutcome:
    losses: dict[int, float]  # rank 0's: step -> global mean loss
    start_step: int
    end_step: int
    checkpoint: str | None
    error: str | None = None


def _worker(rank: int, jobs: list[TrainConfig], stores: list[str], queue) -> None:
    from hetflow.workloads.train.loop import train_rank

    for index, (config, store) in enumerate(zip(jobs, stores)):
        world = config.layout.world_size
        if rank >= world:
            continue
        try:
            r = train_rank(config, rank, world, f"file://{store}")
            if rank == 0:
                queue.put((index, JobOutcome(r.losses, r.start_step, r.end_step, r.checkpoint)))
        except Exception as exc:  # reported to the test, which fails with it
            if rank == 0:
                queue.put((index, JobOutcome({}, -1, -1, None, f"{type(exc).__name__}: {exc}")))
            raise


def _context():
    """A fork server that has imported torch and the training loop once for this test process:
    each world's workers fork from it (a clean, single-threaded process: nothing of the test
    process's own threads) instead of starting Python and importing torch again."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "hetflow.workloads.train.loop", __name__])
    return ctx


def run_worlds(jobs: list[TrainConfig], timeout_s: float = 240) -> list[JobOutcome]:
    processes = max(c.layout.world_size for c in jobs)
    tmp = Path(tempfile.mkdtemp(prefix="hetflow-stores-"))
    stores = [str(tmp / f"job{i}") for i in range(len(jobs))]
    ctx = _context()
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, jobs, stores, queue)) for r in range(processes)]
    for p in procs:
        p.start()
    outcomes: dict[int, JobOutcome] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(outcomes) < len(jobs) and time.monotonic() < deadline:
            try:
                index, outcome = queue.get(timeout=1)
            except queue_module.Empty:
                if any(p.exitcode not in (None, 0) for p in procs):
                    break  # a worker crashed without reporting: the missing jobs fail
                continue
            outcomes[index] = outcome
            if outcome.error:
                break
    finally:
        for p in procs:
            p.join(timeout=30 if len(outcomes) == len(jobs) else 1)
            if p.is_alive():
                p.kill()
        queue.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return [outcomes.get(i, JobOutcome({}, -1, -1, None, "not run")) for i in range(len(jobs))]
