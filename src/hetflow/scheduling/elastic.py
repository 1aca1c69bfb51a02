"""Elastic jobs: a device range and a scaling curve, shared by traces, the engine and policies.

A job is *elastic* when it declares ``min_gpus <= num_gpus <= max_gpus`` with ``min_gpus <
max_gpus``; ``num_gpus`` stays its declared (rigid) size, the one its work and rate are given at.
It may run on any of its :func:`elastic_sizes` (powers of two inside the range, and the range's
ends and the declared size). Its speed at ``n`` devices follows a **scaling curve**:

- ``eff:E`` - per-doubling efficiency: ``rate(n) = rate(num_gpus) x (n / num_gpus) x
  E ** log2(n / num_gpus)`` (E = 1: linear; the default :data:`DEFAULT_SCALING` is ``eff:0.85``,
  about the median one-doubling efficiency of Gavel's measured table: 0.83-0.90 for 1 -> 2 GPUs
  on V100, P100 and K80);
- ``table`` - the throughput model's own rate for the job type at ``n`` devices (Gavel's table
  counts a gang's steps summed over its workers, so steps mean the same at every size; its
  entries are noisy - some doublings are super-linear - which is why it is not the default);
- ``N:X,N:X,...`` - relative throughput by device count given by the trace (say
  ``1:1,2:1.8,4:3.2``), linear between the points, covering ``min_gpus..max_gpus``.

(A controller job file may also say ``goodput``: a training job's best goodput at each of its
sizes, made into a points curve by :mod:`hetflow.scheduling.adaptive`; it is not a trace's.)

Curves are relative: the engine multiplies by the job's rate at its declared size on the device
type, so a job run at its declared size is exactly the rigid job. Pure: no engine, no clock.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from typing import Iterable, Sequence

from hetflow.core.errors import InputError

DEFAULT_SCALING = "eff:0.85"
RANGE_RULE = "an elastic job needs 1 <= min_gpus <= num_gpus <= max_gpus"


@dataclass(frozen=True)
class Scaling:
    """A parsed scaling curve (see the module docstring)."""

    kind: str  # "eff", "table" or "points"
    efficiency: float = 1.0
    points: tuple[tuple[int, float], ...] = ()

    def relative(self, n: int, declared: int) -> float | None:
        """Throughput at ``n`` devices over throughput at ``declared``; None for ``table``
        (the throughput model decides)."""
        if self.kind == "table":
            return None
        if self.kind == "eff":
            x = n / declared
            return x * self.efficiency ** math.log2(x)
        return self._at(n) / self._at(declared)

    def _at(self, n: int) -> float:
        pts = self.points
        for (n0, v0), (n1, v1) in zip(pts, pts[1:]):
            if n0 <= n <= n1:
                return v0 + (v1 - v0) * (n - n0) / (n1 - n0)
        if n == pts[0][0]:
            return pts[0][1]
        raise ValueError(f"{n} devices outside the curve's points")

    def covers(self, lo: int, hi: int) -> bool:
        return self.kind != "points" or (self.points[0][0] <= lo and hi <= self.points[-1][0])


def parse_scaling(text: str) -> Scaling:
    """``eff:0.85`` | ``table`` | ``1:1,2:1.8,4:3.2`` -> :class:`Scaling`; InputError says how."""
    spec = text.strip()
    how = "write eff:E (0 < E <= 1, per-doubling efficiency), table, or N:X,N:X points (e.g. 1:1,2:1.8,4:3.2)"
    if spec == "table":
        return Scaling("table")
    if spec == "goodput":  # a job file's curve, made from its goodput section for its sizes
        raise InputError(f"scaling {text!r}: the curve of a job file's goodput section (devices.scaling: "
                         "goodput, hetflow.scheduling.adaptive), not one to parse here; " + how)
    if spec.startswith("eff:"):
        try:
            e = float(spec[4:])
        except ValueError:
            raise InputError(f"scaling {text!r}: {how}") from None
        if not 0 < e <= 1:
            raise InputError(f"scaling {text!r}: the efficiency must be in (0, 1]; {how}")
        return Scaling("eff", efficiency=e)
    points = []
    for part in spec.split(","):
        n_text, colon, x_text = part.partition(":")
        try:
            n, x = int(n_text), float(x_text)
        except ValueError:
            raise InputError(f"scaling {text!r}: {how}") from None
        if not colon or n < 1 or not (x > 0 and math.isfinite(x)):
            raise InputError(f"scaling {text!r}: points need N >= 1 devices and throughput X > 0; {how}")
        points.append((n, x))
    points.sort()
    if len({n for n, _ in points}) != len(points) or len(points) < 2:
        raise InputError(f"scaling {text!r}: give at least two points with distinct device counts; {how}")
    return Scaling("points", points=tuple(points))


def range_error(num_gpus: int, min_gpus: int, max_gpus: int) -> str | None:
    """Why a declared range is not valid (None: valid)."""
    if not 1 <= min_gpus <= num_gpus <= max_gpus:
        return f"min_gpus {min_gpus}, num_gpus {num_gpus}, max_gpus {max_gpus}: {RANGE_RULE}"
    return None


def elastic_sizes(min_gpus: int, max_gpus: int, declared: int) -> tuple[int, ...]:
    """Sizes an elastic job may run at: powers of two in the range, its ends, the declared size."""
    sizes = {min_gpus, max_gpus, declared}
    p = 1
    while p <= max_gpus:
        if p >= min_gpus:
            sizes.add(p)
        p *= 2
    return tuple(sorted(sizes))


def sizes_of(job: object) -> tuple[int, ...]:
    """A job's allowed sizes; a job without ``sizes`` (rigid, or the live controller's) has one."""
    sizes = getattr(job, "sizes", None)
    return tuple(sizes) if sizes else (job.request.num_gpus,)  # type: ignore[attr-defined]


def is_elastic(job: object) -> bool:
    return len(sizes_of(job)) > 1


def mark_elastic(jobs: Sequence, fraction: float, seed: int, largest_node: int,
                 scaling: str = DEFAULT_SCALING) -> tuple:
    """For traces without device ranges: a seeded share of the jobs becomes elastic.

    Each job, in the given order, is drawn with ``random.Random(seed)``; with probability
    ``fraction`` it gets ``min_gpus = ceil(n / 2)``, ``max_gpus = max(n, min(2 n, D))`` (D: the
    cluster's largest node, so growing never forces a gang across nodes it did not already
    span) and ``scaling``. Jobs that already declare a range, are not preemptible, have
    open-ended work, share a GPU or hold host resources are left as they are (still drawn, so
    the marks do not depend on them).
    """
    if not 0 <= fraction <= 1:
        raise InputError(f"--elastic-fraction {fraction}: give a share between 0 and 1")
    parse_scaling(scaling)
    rng = random.Random(seed)
    out = []
    for j in jobs:
        draw = rng.random()
        eligible = (j.max_gpus is None and j.preemptible and math.isfinite(j.total_work)
                    and j.gpu_milli == 1000 and j.num_gpus >= 1 and not j.cpu_milli and not j.memory_mib)
        if eligible and draw < fraction:
            n = j.num_gpus
            lo, hi = (n + 1) // 2, max(n, min(2 * n, largest_node))
            if lo < hi:
                j = replace(j, min_gpus=lo, max_gpus=hi, scaling=scaling)
        out.append(j)
    return tuple(out)


def rigid(jobs: Iterable) -> tuple:
    """The same jobs with their ranges removed: each runs at its declared size only."""
    return tuple(replace(j, min_gpus=None, max_gpus=None, scaling=None) if j.max_gpus is not None else j
                 for j in jobs)


__all__ = ["DEFAULT_SCALING", "RANGE_RULE", "Scaling", "elastic_sizes", "is_elastic", "mark_elastic",
           "parse_scaling", "range_error", "rigid", "sizes_of"]
