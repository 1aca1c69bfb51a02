"""Pollux's goodput model: how fast a data-parallel job makes progress at a batch size.

A job's *goodput* at ``n`` replicas on ``k`` nodes with per-replica batch ``m`` and ``s``
gradient-accumulation steps is its **throughput** (examples per second, from a fitted step-time
model) times its **statistical efficiency** (the progress an example buys at that batch size,
from the gradient noise scale): Qiao et al., "Pollux: Co-adaptive Cluster Scheduling for
Goodput-Optimized Deep Learning", OSDI'21, sections 3.1-3.2; the same model drives AdaptDL and
Sia (SOSP'23), whose simulator's job model (``sia-simulator/goodput.py``) this restates.

- **Step time.** One accumulation step takes ``T_acc = alpha_c + beta_c m``; the gradient
  exchange ``T_net = alpha + beta max(n - 2, 0)`` with (alpha, beta) = (alpha_n, beta_n) across
  nodes, (alpha_r, beta_r) inside one node, ~0 alone; the optimiser step overlaps the two:
  ``T_opt = (T_acc^gamma + T_net^gamma)^(1/gamma)``, gamma in [1, 10]. An iteration of batch
  ``B = n m (s + 1)`` takes ``s T_acc + T_opt``.
- **Efficiency.** With gradient statistics ``sqr = |g|^2`` and ``var = tr(Sigma)`` measured at
  the initial batch ``B0``: ``gain = (var + sqr) / (var / (B / B0) + sqr)`` iterations' worth
  of progress per iteration (between 1 and B / B0), efficiency ``gain / (B / B0)``.
- **Fit.** The seven step-time parameters are fitted to the (nodes, replicas, batch, compute
  time, step time) points a job has run at, minimising the RMSE of the log times plus two small
  regularisers (gamma near 1; the retrogression terms small against the constants), with
  bounds; parameters the points cannot identify are pinned (no multi-node point: no network
  terms; one batch size: the constant compute term is half the mean).
- **Optimise.** For a placement, batch sizes on a geometric grid of 50 from the least the
  placement allows to the model's largest; the per-replica batch capped by memory (more goes to
  accumulation steps); the goodput-maximising one wins.

Pure numpy/scipy; the gradient of the fit's objective is written out (the reference uses
autograd for it).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import scipy.optimize

EPS = 1e-8


class PerfParams(NamedTuple):
    alpha_c: float  # constant term of an accumulation step's compute time
    beta_c: float  # compute time per example of the per-replica batch
    alpha_n: float  # constant term of the gradient exchange across nodes
    beta_n: float  # its growth per replica beyond two
    alpha_r: float  # constant term of the exchange inside one node
    beta_r: float  # its growth per replica beyond two
    gamma: float  # overlap of compute and exchange (1: none, larger: more)


class GradParams(NamedTuple):
    sqr: float  # squared norm of the true gradient
    var: float  # trace of the per-example gradient covariance


def accum_time(p: PerfParams, atomic_bsz):
    return p.alpha_c + p.beta_c * np.asarray(atomic_bsz, dtype=float)


def network_time(p: PerfParams, num_nodes, num_replicas):
    nodes, reps = np.asarray(num_nodes), np.asarray(num_replicas)
    conds = [nodes > 1, reps > 1]
    bottleneck = np.select(conds, [p.alpha_n, p.alpha_r], EPS)
    retro = np.select(conds, [p.beta_n, p.beta_r], EPS)
    return bottleneck + retro * np.maximum(reps - 2, EPS)


def log_optim_time(p: PerfParams, acc, net):
    g = p.gamma
    return np.log(acc ** g + net ** g) / g


@dataclass(frozen=True)
class GoodputModel:
    """Goodput of one job on one device type (module docstring)."""

    perf: PerfParams
    grad: GradParams
    init_batch_size: float

    def throughput(self, num_nodes, num_replicas, atomic_bsz, accum_steps):
        """Examples per second."""
        acc = accum_time(self.perf, atomic_bsz)
        opt = np.exp(log_optim_time(self.perf, acc, network_time(self.perf, num_nodes, num_replicas)))
        batch = np.asarray(num_replicas) * np.asarray(atomic_bsz) * (np.asarray(accum_steps) + 1)
        return batch / (np.asarray(accum_steps) * acc + opt)

    def efficiency(self, batch_size):
        scale = np.asarray(batch_size, dtype=float) / self.init_batch_size
        denom = self.grad.var / scale + self.grad.sqr
        gain = np.where(denom > 0, (self.grad.var + self.grad.sqr) / np.where(denom > 0, denom, 1.0), 1.0)
        return gain / scale

    def goodput(self, num_nodes, num_replicas, atomic_bsz, accum_steps):
        batch = np.asarray(num_replicas) * np.asarray(atomic_bsz) * (np.asarray(accum_steps) + 1)
        return self.throughput(num_nodes, num_replicas, atomic_bsz, accum_steps) * self.efficiency(batch)

    def optimize(self, num_nodes: int, num_replicas: int, max_batch_size: float,
                 atomic_bsz_range: tuple[float, float]) -> tuple[float, int, int]:
        """(goodput, per-replica batch, accumulation steps) of the best batch size for one
        placement, accumulation allowed; goodput 0 where no batch size fits the range."""
        atomic, accum, ok = batch_grid(num_replicas, self.init_batch_size, max_batch_size, atomic_bsz_range)
        good = np.where(ok, self.goodput(num_nodes, num_replicas, atomic, accum), 0.0)
        i = int(np.argmax(good))
        return float(good[i]), int(atomic[i]), int(accum[i])


def batch_grid(num_replicas: int, init_batch_size: float, max_batch_size: float,
               atomic_bsz_range: tuple[float, float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The candidates :meth:`GoodputModel.optimize` chooses among: (per-replica batch,
    accumulation steps, inside the per-replica range) for 50 global batches on a geometric grid
    from the least the placement allows to ``max_batch_size``; more than the per-replica
    maximum goes to accumulation steps (one replica accumulates past the initial batch)."""
    lo_atomic, hi_atomic = atomic_bsz_range
    lo_atomic = lo_atomic or 1
    hi_atomic = hi_atomic or max_batch_size
    least = max(init_batch_size, lo_atomic * num_replicas)
    batch = np.geomspace(least, max_batch_size) if least <= max_batch_size else np.array([least])
    local = batch / num_replicas
    accum = np.ceil(local / hi_atomic - EPS) - 1
    if num_replicas == 1:
        accum = np.where(local > init_batch_size + EPS, np.maximum(accum, 1), accum)
    accum = accum.astype(int)
    atomic = np.ceil(local / (accum + 1) - EPS).astype(int)
    return atomic, accum, (lo_atomic <= atomic) & (atomic <= hi_atomic)


# -- fitting ------------------------------------------------------------------------------------


def _objective(x: np.ndarray, nodes, reps, atomic, acc_t, opt_t) -> tuple[float, np.ndarray]:
    """The fit's objective and its gradient in the seven parameters."""
    p = PerfParams(*x)
    n = len(acc_t)
    acc = p.alpha_c + p.beta_c * atomic
    multi, intra = nodes > 1, (nodes <= 1) & (reps > 1)
    m = np.maximum(reps - 2, EPS)
    net = np.where(multi, p.alpha_n + p.beta_n * m, np.where(intra, p.alpha_r + p.beta_r * m, EPS + EPS * m))
    g = p.gamma
    ag, ng = acc ** g, net ** g
    s = ag + ng
    lopt = np.log(s) / g
    r1 = np.log(acc) - np.log(acc_t)
    r2 = lopt - np.log(opt_t)
    e1 = math.sqrt(float(np.mean(r1 ** 2)))
    e2 = math.sqrt(float(np.mean(r2 ** 2)))
    rn, rr = p.beta_n / p.alpha_n, p.beta_r / p.alpha_r
    f = e1 + e2 + 1e-3 * (g - 1) ** 2 + 1e-2 * (rn ** 2 + rr ** 2)
    grad = np.zeros(7)
    # d e1: through log(acc)
    if e1 > 0:
        w1 = r1 / acc / (n * e1)
        grad[0] += w1.sum()
        grad[1] += (w1 * atomic).sum()
    if e2 > 0:
        w2 = r2 / (n * e2)
        d_acc = w2 * acc ** (g - 1) / s
        d_net = w2 * net ** (g - 1) / s
        grad[0] += d_acc.sum()
        grad[1] += (d_acc * atomic).sum()
        grad[2] += d_net[multi].sum()
        grad[3] += (d_net * m)[multi].sum()
        grad[4] += d_net[intra].sum()
        grad[5] += (d_net * m)[intra].sum()
        grad[6] += (w2 * ((ag * np.log(acc) + ng * np.log(net)) / s / g - np.log(s) / g ** 2)).sum()
    grad[6] += 2e-3 * (g - 1)
    grad[3] += 2e-2 * rn / p.alpha_n
    grad[2] -= 2e-2 * rn ** 2 / p.alpha_n
    grad[5] += 2e-2 * rr / p.alpha_r
    grad[4] -= 2e-2 * rr ** 2 / p.alpha_r
    return f, grad


def fit_perf_params(num_nodes, num_replicas, atomic_bsz, compute_time, step_time) -> PerfParams:
    """Step-time parameters fitted to profiled points (module docstring).

    A fit is a pure function of its points, and jobs of one application that ran the same
    configurations on one GPU type hold the same points: the last fits are remembered by their
    points' exact bytes (on a Sia workload of 160 jobs, 1,058 distinct fits of 3,438; the same
    results, the simulation a third faster)."""
    cols = tuple(np.ascontiguousarray(c, dtype=float).ravel()
                 for c in (num_nodes, num_replicas, atomic_bsz, compute_time, step_time))
    return _fit_points(tuple(c.tobytes() for c in cols))


@functools.lru_cache(maxsize=8192)
def _fit_points(key: tuple[bytes, ...]) -> PerfParams:
    nodes, reps, atomic, acc_t, opt_t = (np.frombuffer(b, dtype=float) for b in key)
    x0 = [1e-1, 1e-2] * 3 + [1.0 + 1e-3]
    lower = [1e-8, 1e-8] * 3 + [1.0]
    upper = [np.inf, np.inf] * 3 + [10.0]
    if len(np.unique(atomic)) == 1:
        x0[0] = upper[0] = lower[0] = float(np.mean(acc_t)) / 2
    if not np.any(nodes > 1):
        x0[2] = upper[2] = lower[2]
        x0[3] = upper[3] = lower[3]
    if not np.any((nodes == 1) & (reps > 1)):
        x0[4] = upper[4] = lower[4]
        x0[5] = upper[5] = lower[5]
    if not np.any(reps > 2):
        x0[3] = upper[3] = lower[3]
        x0[5] = upper[5] = lower[5]
    bounds = scipy.optimize.Bounds(lower, upper, keep_feasible=True)
    res = scipy.optimize.minimize(_objective, x0, args=(nodes, reps, atomic, acc_t, opt_t), jac=True,
                                  bounds=bounds, tol=1e-5)
    x = [float(v) for v in res.x]
    if not np.any(nodes > 1):
        x[2] = max(x[2], x[4] * 1.1)
        x[3] = max(x[3], x[5] * 1.1)
    return PerfParams(*x)


__all__ = ["GoodputModel", "GradParams", "PerfParams", "batch_grid", "fit_perf_params"]
