"""The Ray side of one rank: an actor that runs :func:`~hetflow.workloads.train.loop.train_rank`.

The actor is created with the options its placement gives it (bundle, device resource and the
visibility environment, set before the process starts, so before torch sees any device). One
actor per rank, one attempt per actor: after a failure the whole group is replaced, which is
simpler and safer than repairing a process group in place.
"""

from __future__ import annotations

import os
from typing import Any

import ray

from hetflow.workloads.train.config import TrainConfig
from hetflow.workloads.train.loop import RankResult, free_port, train_rank


class TrainWorker:
    """One rank of a training group (wrapped with ``ray.remote`` by the group)."""

    def where(self) -> dict[str, Any]:
        """Node address, a free port on it (rank 0's becomes the rendezvous) and the pid."""
        return {"ip": ray.util.get_node_ip_address(), "port": free_port(), "pid": os.getpid(),
                "node_id": ray.get_runtime_context().get_node_id()}

    def train(self, config: TrainConfig, rank: int, world_size: int, init_method: str,
              progress: Any | None, attempt: int, data: Any | None = None) -> RankResult:
        """``data``: the split's arrays, resolved by Ray from the ObjectRef the group passed (a
        top-level argument, so the arrays arrive as read-only views of the object store)."""
        report = None
        if progress is not None and rank == 0:
            # Fire and forget: the step loop never waits on the driver.
            def report(records: list[dict[str, Any]]) -> None:
                progress.record.remote(records)
        return train_rank(config, rank, world_size, init_method, report=report, attempt=attempt,
                          data=data)


class ProgressLog:
    """Loss records from rank 0 of every attempt, kept outside the workers so that they
    survive a failed attempt (an actor of its own; no CPU reserved)."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def record(self, records: list[dict[str, Any]]) -> None:
        self.records.extend(records)

    def since(self, index: int) -> list[dict[str, Any]]:
        return self.records[index:]


__all__ = ["ProgressLog", "TrainWorker"]
