"""What a simulation run measured: per-policy summary, per-job rows, utilisation over time.

Definitions (docs/simulator.md repeats them):

- **measured jobs**: the window's jobs by arrival index (all jobs without a window).
- **JCT**: finish - arrival of measured jobs that finished; ``unfinished`` counts the others.
- **queueing delay**: first start - arrival.
- **makespan**: last finish of a measured job - first arrival of one.
- **span**: [first measured arrival, last measured finish] (or the end of the run).
- **contended time**: the part of the span when the GPUs asked for by jobs that have arrived and
  not finished (running or waiting) are at least the cluster's GPUs - demand exceeds capacity.
- **utilisation**: allocated GPU share (devices held, shared GPUs counted by share) averaged over
  contended time (over the span when there is none; ``contended_share`` says which).
- **effective_utilisation**: the same, counting each device-second by the work it did relative to
  what that job would do on that device type with an ideal placement - restores after
  preemption count 0, a gang slowed by slow links counts its achieved fraction.
- **best_type_utilisation**: like effective, but relative to the job's best device type in the
  cluster: a job kept on a 5x slower GPU counts 0.2 (the throughput-normalised work of Gavel's
  re-runs, where heterogeneity-agnostic policies look busy but get little done).
- **unallocated_gpu_share**: 1 - allocated share over contended time: GPU capacity left unused
  while demand exceeded capacity (fragmentation, or a policy holding jobs back); None if demand
  never exceeded capacity.
- **slowdown** (finish-time fairness): JCT / the job's run time alone on its best type.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from hetflow.scheduling.policies.capacity import WHOLE
from hetflow.sim.engine import SimResult


def _quantile(values: list[float], q: float) -> float | None:
    return float(np.quantile(np.array(values), q)) if values else None


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


class _Steps:
    """A piecewise-constant function of time given by (time, change) events, integrable."""

    def __init__(self, times: np.ndarray, deltas: np.ndarray) -> None:
        order = np.argsort(times, kind="stable")
        self.t = times[order]
        self.v = np.cumsum(deltas[order])

    def at(self, grid: np.ndarray) -> np.ndarray:
        """Value on [grid[i], grid[i+1])."""
        i = np.searchsorted(self.t, grid, side="right") - 1
        return np.where(i >= 0, self.v[np.clip(i, 0, None)] if len(self.v) else 0.0, 0.0)


def _segment_steps(result: SimResult, weight: str) -> _Steps:
    starts, ends, w = [], [], []
    for s in result.segments:
        share = s.devices
        if weight == "allocated":
            a, value = s.start, share
        else:
            a = s.start + s.restore_s
            ref = s.ideal_rate if weight == "effective" else s.best_rate
            value = share * (s.rate / ref if ref > 0 else 0.0)
        if s.end > a and value > 0:
            starts.append(a); ends.append(s.end); w.append(value)
    times = np.array(starts + ends, dtype=float)
    deltas = np.array(w + [-x for x in w], dtype=float)
    return _Steps(times, deltas)


def _demand_steps(result: SimResult) -> tuple[np.ndarray, np.ndarray]:
    if not result.demand:
        return np.array([0.0]), np.array([0.0])
    t = np.array([d[0] for d in result.demand], dtype=float)
    v = np.array([d[1] for d in result.demand], dtype=float)
    return t, v


def _contended(result: SimResult, grid: np.ndarray) -> np.ndarray:
    t, v = _demand_steps(result)
    i = np.searchsorted(t, grid, side="right") - 1
    demand = np.where(i >= 0, v[np.clip(i, 0, None)], 0.0)
    return demand >= result.model.total_devices * WHOLE


def span(result: SimResult) -> tuple[float, float]:
    measured = [result.jobs[i] for i in result.measured]
    if not measured:
        return (0.0, 0.0)
    start = min(r.job.arrival_s for r in measured)
    finishes = [r.finish for r in measured if r.finish is not None]
    done = len(finishes) == sum(1 for r in measured if r.rejected is None)
    end = max(finishes) if finishes and done else result.end_s
    return start, max(end, start)


def _grid(result: SimResult, lo: float, hi: float, steps: list[_Steps]) -> np.ndarray:
    t, _ = _demand_steps(result)
    pts = np.concatenate([t] + [s.t for s in steps] + [np.array([lo, hi])])
    pts = pts[(pts >= lo) & (pts <= hi)]
    return np.unique(pts)


def utilisation(result: SimResult) -> dict[str, float | None]:
    """Allocated, effective and best-type utilisation over contended time (see module doc)."""
    lo, hi = span(result)
    steps = {k: _segment_steps(result, k) for k in ("allocated", "effective", "best_type")}
    grid = _grid(result, lo, hi, list(steps.values()))
    cap = float(result.model.total_devices)
    if len(grid) < 2 or cap <= 0:
        return {"utilisation": None, "effective_utilisation": None, "best_type_utilisation": None,
                "unallocated_gpu_share": None, "contended_share": 0.0}
    left, dt = grid[:-1], np.diff(grid)
    contended = _contended(result, left)
    c_time = float((dt * contended).sum())
    total = float(dt.sum())
    mask = contended if c_time > 0 else np.ones_like(contended)
    denom = cap * (c_time if c_time > 0 else total)
    out: dict[str, float | None] = {}
    for key, name in (("allocated", "utilisation"), ("effective", "effective_utilisation"),
                      ("best_type", "best_type_utilisation")):
        out[name] = float((steps[key].at(left) * dt * mask).sum() / denom) if denom > 0 else None
    out["unallocated_gpu_share"] = (1.0 - out["utilisation"]) if c_time > 0 and out["utilisation"] is not None else None
    out["contended_share"] = c_time / total if total > 0 else 0.0
    return out


def utilisation_series(result: SimResult, bins: int = 200) -> dict[str, list[float]]:
    """Allocated and effective share per time bin over the span (for plots and JSON)."""
    lo, hi = span(result)
    if hi <= lo:
        return {"t": [], "allocated": [], "effective": []}
    edges = np.linspace(lo, hi, bins + 1)
    cap = float(result.model.total_devices)
    out: dict[str, list[float]] = {"t": ((edges[:-1] + edges[1:]) / 2).tolist()}
    for key, name in (("allocated", "allocated"), ("effective", "effective")):
        st = _segment_steps(result, key)
        grid = np.unique(np.concatenate([edges, st.t[(st.t > lo) & (st.t < hi)]]))
        vals = st.at(grid[:-1]) * np.diff(grid)
        cum = np.concatenate([[0.0], np.cumsum(vals)])
        at_edges = np.interp(edges, grid, cum)
        out[name] = (np.diff(at_edges) / (np.diff(edges) * cap)).tolist()
    return out


def job_rows(result: SimResult) -> list[dict[str, Any]]:
    """One row per job of the trace (measured or not), for the per-job JSON and CSV."""
    types: dict[int, set[str]] = {}
    for s in result.segments:
        types.setdefault(s.job, set()).add(s.device_type)
    measured = set(result.measured)
    rows = []
    for i, r in enumerate(result.jobs):
        j = r.job
        isolated = j.total_work / r.best_rate if r.best_rate > 0 and math.isfinite(j.total_work) else None
        jct = r.jct_s
        rows.append({
            "job_id": j.job_id, "job_type": j.job_type, "measured": i in measured,
            "arrival_s": j.arrival_s, "num_gpus": j.num_gpus, "gpu_milli": j.gpu_milli,
            "first_start_s": r.first_start, "finish_s": r.finish, "jct_s": jct,
            "queue_s": None if r.first_start is None else r.first_start - j.arrival_s,
            "slowdown": None if jct is None or not isolated else jct / isolated,
            "preemptions": r.preemptions, "migrations": r.migrations, "resizes": r.resizes,
            "device_types": "|".join(sorted(types.get(i, ()))),
            "total_work": j.total_work if math.isfinite(j.total_work) else None,
            "done_work": r.done_work, "rejected": r.rejected,
        })
    return rows


def summarise(result: SimResult, wall_s: float) -> dict[str, Any]:
    """The per-policy numbers of summary.json."""
    rows = [row for row in job_rows(result) if row["measured"]]
    jcts = [row["jct_s"] for row in rows if row["jct_s"] is not None]
    queues = [row["queue_s"] for row in rows if row["queue_s"] is not None]
    slow = [row["slowdown"] for row in rows if row["slowdown"] is not None]
    lo, hi = span(result)
    finished = [r for i, r in ((i, result.jobs[i]) for i in result.measured) if r.finish is not None]
    util = utilisation(result)
    return {
        "policy": result.policy,
        "jobs_measured": len(rows),
        "finished": len(jcts),
        "unfinished": sum(1 for row in rows if row["jct_s"] is None and row["rejected"] is None),
        "rejected": sum(1 for row in rows if row["rejected"] is not None),
        "avg_jct_s": _mean(jcts),
        "median_jct_s": _quantile(jcts, 0.5),
        "p95_jct_s": _quantile(jcts, 0.95),
        "avg_queue_s": _mean(queues),
        "p95_queue_s": _quantile(queues, 0.95),
        "makespan_s": (max(r.finish for r in finished) - lo) if finished else None,  # type: ignore[type-var]
        "span_s": hi - lo,
        **util,
        "avg_slowdown": _mean(slow),
        "p95_slowdown": _quantile(slow, 0.95),
        "max_slowdown": max(slow) if slow else None,
        "preemptions": sum(row["preemptions"] for row in rows),
        "migrations": sum(row["migrations"] for row in rows),
        "resizes": sum(row["resizes"] for row in rows),
        "decisions": result.decisions,
        "wall_s": wall_s,
    }
