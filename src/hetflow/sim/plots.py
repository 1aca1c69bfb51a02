"""PNG plots of simulation runs (matplotlib, headless Agg backend).

``plot_jct_cdf(runs, path)``: cumulative distribution of job completion times, one line per
policy. ``plot_utilisation(runs, path)``: allocated (solid) and effective (dashed) GPU share
over time, one colour per policy. ``runs`` maps a policy name to its per-job rows and
utilisation series as :mod:`hetflow.sim.metrics` returns them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import matplotlib

matplotlib.use("Agg")  # no display; must precede pyplot
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

_HOUR = 3600.0


def plot_jct_cdf(rows_by_policy: Mapping[str, Sequence[Mapping[str, Any]]], path: str | Path) -> Path:
    """CDF of the measured jobs' JCT (hours, log scale) per policy."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    drawn = 0
    for policy, rows in rows_by_policy.items():
        jct = np.sort([r["jct_s"] / _HOUR for r in rows if r["measured"] and r["jct_s"] is not None])
        if len(jct) == 0:
            continue
        ax.step(jct, np.arange(1, len(jct) + 1) / len(jct), where="post", label=f"{policy} (avg {jct.mean():.1f} h)")
        drawn += 1
    if not drawn:  # open-ended jobs (packing runs) never finish
        ax.text(0.5, 0.5, "no measured job finished", ha="center", va="center", transform=ax.transAxes)
        return _save(fig, path)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (hours)")
    ax.set_ylabel("fraction of jobs")
    ax.set_ylim(0, 1.01)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title("JCT distribution")
    return _save(fig, path)


def plot_utilisation(series_by_policy: Mapping[str, Mapping[str, Sequence[float]]], path: str | Path) -> Path:
    """Allocated (solid) and effective (dashed) share of the cluster's GPUs over time."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    if not any(series["t"] for series in series_by_policy.values()):
        ax.text(0.5, 0.5, "empty run", ha="center", va="center", transform=ax.transAxes)
        return _save(fig, path)
    for i, (policy, series) in enumerate(series_by_policy.items()):
        if not series["t"]:
            continue
        t = np.array(series["t"]) / _HOUR
        color = f"C{i}"
        ax.plot(t, series["allocated"], color=color, label=f"{policy} allocated")
        ax.plot(t, series["effective"], color=color, linestyle="--", label=f"{policy} effective")
    ax.set_xlabel("time (hours)")
    ax.set_ylabel("share of GPUs")
    ax.set_ylim(0, 1.05)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower left", fontsize=7, ncol=2)
    ax.set_title("Utilisation over time")
    return _save(fig, path)


def _save(fig: Any, path: str | Path) -> Path:
    p = Path(path)
    fig.tight_layout()
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p
