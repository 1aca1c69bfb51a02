"""How much host memory a node gives Ray's object store, from its memory and its workload.

``hetflow node start`` calls :func:`choose_object_store_memory` and prints the reason
(:meth:`ObjectStoreChoice.describe`), then passes ``--object-store-memory`` to ``ray start``.

What Ray does by itself (Ray 2.60, ``ray/_private/utils.py: resolve_object_store_memory`` and
``services.py: determine_plasma_store_config``, read): 30% of the available memory, capped at
200 GB and at 95% of ``/dev/shm``; an explicit size larger than ``/dev/shm`` and above 10 GB is
refused unless ``RAY_OBJECT_STORE_ALLOW_SLOW_STORAGE`` is set, and a smaller one silently moves
the store to disk-backed ``/tmp``. The minimum is 75 MiB.

What hetflow changes, and why (heuristics, stated so they can be argued with):

* the share depends on the workload: ``data`` pipelines (Ray Data, batch inference) keep their
  blocks in the object store, so they get 45%; ``train`` and ``tune`` keep Ray's 30% (datasets
  and checkpoints pass through it, model state does not); ``serve`` gets 15%, because replicas
  load weights through host memory and requests are small;
* the 200 GB cap is dropped: on a 2 TiB accelerator host it would strand most of the memory a
  data workload wants;
* host memory is kept for the processes that drive the accelerators: 8 GiB per accelerator
  (framework, pinned transfer buffers, data loader workers) plus 4 GiB for the system, but the
  store keeps at least 10% of host memory on a host too small for that;
* ``/dev/shm`` caps it at 95%, as Ray does, so that the store never lands on slow storage and
  ``ray start`` never refuses the size (in containers raise ``--shm-size`` instead).

Pure (no ray import). ``dev_shm_bytes()`` is the one call that reads the machine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hetflow.core.errors import InputError
from hetflow.core.units import format_bytes

GIB = 1 << 30
WORKLOAD_FRACTIONS: dict[str, float] = {"data": 0.45, "train": 0.30, "tune": 0.30, "serve": 0.15}
DEFAULT_FRACTION = 0.30  # Ray's own share, used when the workload is not given
HOST_MEMORY_PER_ACCELERATOR = 8 * GIB
HOST_MEMORY_FOR_SYSTEM = 4 * GIB
FLOOR_SHARE = 0.10  # the least share of host memory the worker reserve may leave the store
SHM_SHARE = 0.95  # Ray's own headroom below the /dev/shm size
MINIMUM_BYTES = 75 * 1024 * 1024  # Ray's OBJECT_STORE_MINIMUM_MEMORY_BYTES


@dataclass(frozen=True)
class ObjectStoreChoice:
    """The object store size for one node and why. ``bytes`` is None when the host memory is
    unknown: then Ray's own default applies and ``ray start`` gets no flag."""

    bytes: int | None
    host_memory_bytes: int | None
    workload: str | None
    fraction: float
    reasons: tuple[str, ...]

    def describe(self) -> str:
        """One line for the console, e.g. ``object store: 230.4 GiB = 30% of ... (train)``."""
        if self.bytes is None:
            return "object store: Ray's default (" + "; ".join(self.reasons) + ")"
        return f"object store: {format_bytes(self.bytes)} - " + "; ".join(self.reasons)

    def ray_start_flag(self) -> list[str]:
        """``["--object-store-memory=N"]``, or nothing when Ray should choose."""
        return [] if self.bytes is None else [f"--object-store-memory={self.bytes}"]


def choose_object_store_memory(
    host_memory_bytes: int | None,
    workload: str | None = None,
    *,
    accelerators: int = 0,
    shm_bytes: int | None = None,
) -> ObjectStoreChoice:
    """The object store size for a node with ``host_memory_bytes`` of memory running
    ``workload`` (``data``, ``train``, ``tune``, ``serve`` or None for Ray's share) with
    ``accelerators`` devices, under a ``/dev/shm`` of ``shm_bytes`` (None: not capped).

    Raises InputError for an unknown workload or negative sizes.
    """
    if workload is not None and workload not in WORKLOAD_FRACTIONS:
        raise InputError(
            f"unknown workload {workload!r}; expected one of {', '.join(sorted(WORKLOAD_FRACTIONS))}"
        )
    if accelerators < 0 or (host_memory_bytes is not None and host_memory_bytes < 0) or (
        shm_bytes is not None and shm_bytes < 0
    ):
        raise InputError("memory sizes and the accelerator count must be >= 0")
    fraction = WORKLOAD_FRACTIONS.get(workload, DEFAULT_FRACTION) if workload else DEFAULT_FRACTION
    if not host_memory_bytes:
        return ObjectStoreChoice(None, host_memory_bytes, workload, fraction,
                                 ("host memory unknown",))
    what = f"for {workload}" if workload else "Ray's share, no workload given"
    size = int(host_memory_bytes * fraction)
    reasons = [f"{fraction:.0%} of {format_bytes(host_memory_bytes)} host memory ({what})"]
    keep = accelerators * HOST_MEMORY_PER_ACCELERATOR + HOST_MEMORY_FOR_SYSTEM
    if host_memory_bytes - size < keep:
        # A small host cannot keep all of that; the store still gets a tenth of it, below which
        # every ray.put of a batch would spill.
        size = max(host_memory_bytes - keep, min(size, int(host_memory_bytes * FLOOR_SHARE)))
        reasons.append(
            f"lowered to keep {format_bytes(host_memory_bytes - size)} for the system and "
            f"{accelerators} accelerator worker{'s' if accelerators != 1 else ''} "
            f"(wanted {format_bytes(keep)})"
        )
    if shm_bytes is not None and size > int(shm_bytes * SHM_SHARE):
        size = int(shm_bytes * SHM_SHARE)
        reasons.append(
            f"capped at 95% of /dev/shm ({format_bytes(shm_bytes)}); a larger store would sit on "
            "slow disk - raise the shared-memory size (docker --shm-size) to allow more"
        )
    if size < MINIMUM_BYTES:
        size = MINIMUM_BYTES
        reasons.append(f"raised to Ray's minimum of {format_bytes(MINIMUM_BYTES)}")
    return ObjectStoreChoice(size, host_memory_bytes, workload, fraction, tuple(reasons))


def dev_shm_bytes(path: str = "/dev/shm") -> int | None:
    """Size of the shared-memory file system, or None where there is none."""
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return stat.f_blocks * stat.f_frsize or None


__all__ = ["ObjectStoreChoice", "WORKLOAD_FRACTIONS", "choose_object_store_memory", "dev_shm_bytes"]
