"""Joining a Ray cluster, or starting an embedded local one, for a driver that runs N ranks.

    session = connect(address=None, ranks=2)      # embedded local Ray, the machine's cores
    ...
    session.close()                               # shuts Ray down only if it was started here

Rules shared by ``hetflow launch`` and ``hetflow.train.run``:

* ``address`` (or ``RAY_ADDRESS``): join that cluster. A ``host:port`` nothing answers on fails
  at once with one line instead of Ray's retries. Token authentication follows Ray's own rule
  for explicit addresses: the token is sent only with ``RAY_AUTH_MODE=token``.
* neither: an embedded local Ray with the machine's cores, like ``torchrun --standalone``. Its
  ranks share the cores (at most one CPU each, at most ``RANKS_PER_CORE`` ranks per core; more
  is refused as Unschedulable, exit 3).
* Ray already initialised in this process (a driver inside a cluster job): used as it is.

Set ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` before Ray is first imported (``connect`` does it
when it imports Ray first): otherwise Ray rewrites a loopback address to the host's and can
hang (../shared/RAY-NOTES.md).
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from typing import Any

from hetflow.core.errors import InputError, Unschedulable

RANKS_PER_CORE = 8


@dataclass
class Session:
    started: bool  # this call started or joined Ray (close() shuts it down)
    embedded_cores: int | None  # the embedded local Ray's CPUs; None on a cluster

    def cpus_per_rank(self, ranks: int, asked: float | None) -> float:
        """CPUs to reserve per rank: ``asked``; else 1 on a cluster, a fair share when embedded."""
        if asked is not None:
            return asked
        return 1.0 if self.embedded_cores is None else min(1.0, self.embedded_cores / ranks)

    def close(self) -> None:
        if self.started:
            import ray

            ray.shutdown()


def check_reachable(address: str) -> None:
    """A ``host:port`` that nothing answers on is one InputError now."""
    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=5).close()
    except OSError as exc:
        raise InputError(f"cannot reach a Ray cluster at {address} ({exc.strerror or exc}); "
                         "check --address / RAY_ADDRESS, or leave both unset for a local Ray") from None


def connect(address: str | None, ranks: int, runtime_env: dict[str, Any] | None = None,
            what: str = "--nproc") -> Session:
    """Join or start Ray for a driver of ``ranks`` ranks (see the module docstring).
    ``runtime_env``: the job's (e.g. a ``working_dir``: Ray uploads local directories only for a
    whole job); refused when Ray is already initialised without it."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    if ray.is_initialized():
        if runtime_env:
            raise InputError("a working_dir needs a driver of its own: give it to ray.init's "
                             "runtime_env instead")
        return Session(False, None)
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        check_reachable(address)
        ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR,
                 runtime_env=runtime_env)
        return Session(True, None)
    cores = os.cpu_count() or 1
    if ranks > RANKS_PER_CORE * cores:
        raise Unschedulable(
            f"{what} {ranks}: this machine has {cores} CPU cores and an embedded local Ray runs "
            f"at most {RANKS_PER_CORE} ranks per core ({RANKS_PER_CORE * cores}); use fewer "
            "ranks, or join a cluster with --address")
    # A Ray of this run only: nobody scrapes its metrics, and on a small machine their
    # collection competes with the ranks for the same cores.
    ray.init(address="local", num_cpus=cores, include_dashboard=False, log_to_driver=False,
             logging_level=logging.ERROR, runtime_env=runtime_env,
             _system_config={"enable_metrics_collection": False})
    return Session(True, cores)


__all__ = ["RANKS_PER_CORE", "Session", "check_reachable", "connect"]
