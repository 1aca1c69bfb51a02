"""The policies Sia's simulator compares, re-stated on :mod:`hetflow.sim.sia`: ``gavel`` and ``sia``.

These are reference policies, as :mod:`hetflow.sim.gavel` re-states Gavel's: they exist to show
that hetflow's restatement of Sia's protocol gives Sia's own figures when it runs Sia's own
policies (``sia_fidelity_worst`` in ``benchmarks/scheduling.py``); hetflow's policy is the live
``HetflowPolicy`` through :mod:`hetflow.sim.live_sia`. From the artifact (``siasosp23/artifacts``
at aaf7a0d, ``sia-simulator/``), run as its ``run_experiment.sh`` runs them:

- ``gavel`` (``gavel.py``, ``--policy=gavel --interval=360``): Gavel with every job rigid at its
  ``num_replicas`` and ``batch_size`` (the paper's "Gavel (TJ)"). Every round, Gavel's
  ``max_sum_throughput_perf`` program (maximise the sum over jobs of throughput x time share,
  each type's GPUs and each job's time at most 1; cvxpy with ECOS, as the artifact) gives each
  job a share of each GPU type; a job's priority on a type is that share over the fraction of
  the type's time it has had (every job starts with half a round on every type); the (job, type)
  pairs are taken in priority order while the type has room for the gang; gangs keep their GPUs
  when they can, the others take GPUs server by server.
- ``sia`` (``sia.py``, ``--policy=sia --policy_p_val=-0.5 --mip_lambda_a=0.01
  --mip_lambda_n=1.1 --project_throughput --share_max_replicas``, 60 s rounds): the mixed-integer
  program of Sia's paper over (GPU type, GPU count) configurations (below, :class:`SiaMipPolicy`).

Measured against the artifact's own runs (docs/benchmarks.md, "Sia's protocol"): Gavel exact on
all 18 workloads, Sia all-rigid equal to 3 digits on 9, Sia adaptive within 2.1 % on 6; on a
19-job slice run by the artifact alone, every job's JCT and restarts exact for all three.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Mapping

import numpy as np

from hetflow.sim.sia import (SIA_NAME, SLOWDOWN, Allocation, SiaJob, SiaSimulator, packed_placement,
                             rigid_config)

# The artifact's allocation configurations (nodes, GPUs) for 4- and 8-GPU nodes; a type offers
# those with no more nodes than it has.
CONFIGS_4GPU = ((1, 1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16),
                (1, 2, 4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60, 64))
CONFIGS_8GPU = ((1, 1, 1, 1, 2, 3, 4, 5, 6, 7, 8), (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64))


def type_configs(nodes: int, per_node: int) -> list[tuple[int, int]]:
    """(nodes, GPUs) configurations of one GPU type (``populate_valid_configs``)."""
    table = CONFIGS_4GPU if per_node == 4 else CONFIGS_8GPU
    return [(n, g) for n, g in zip(*table) if n <= nodes]


# -- Gavel (TJ) -------------------------------------------------------------------------------


def gavel_throughput(job: SiaJob, sim: SiaSimulator, gpu_type: str) -> float:
    """Iterations per second of a rigid job on its packed placement of ``gpu_type``, as
    ``GavelPolicy.predict_throughput`` computes it (one accumulation step at least on one
    GPU; 0.1 where the type has fewer GPUs than the gang)."""
    nodes, per = sim.nodes[gpu_type], sim.per_node[gpu_type]
    most = type_configs(nodes, per)[-1][1]
    scale = job.spec.num_replicas
    if scale > most:
        return 1e-1
    app = job.app(gpu_type)
    placement = packed_placement(scale, per)
    local = math.ceil(job.spec.batch_size / scale - 1e-8)
    max_local = app.max_local_bsz_at(placement)
    if max_local != max_local:  # no profile of that many GPUs (the artifact would fail)
        return 1e-1
    accum = math.ceil(local / max_local - 1e-8) - 1
    if scale == 1:
        accum = max(1, accum)
    atomic = math.ceil(local / (accum + 1) - 1e-8)
    atomic = min(atomic, int(app.max_batch_size / (scale * (accum + 1))))
    step, sync = app.step_sync(placement, atomic)
    it = step + (step - sync) * accum
    if not it > 0 or step <= 0:
        return 1e-1
    return (1.0 / it) / SLOWDOWN.get(job.spec.app, 1.2)


def max_sum_throughput(thr: np.ndarray, scale: np.ndarray, workers: np.ndarray) -> np.ndarray:
    """Gavel's ``ThroughputSumWithPerf``: the share ``x[job, type]`` maximising the summed
    throughput, each type's GPUs and each job's time at most 1 (cvxpy + ECOS, rounded to 5
    decimals as the artifact)."""
    import cvxpy as cp

    m, n = thr.shape
    x = cp.Variable((m, n))
    objective = cp.Maximize(cp.sum(cp.sum(cp.multiply(thr / np.ones((1, n)), x), axis=1)))
    scale_arr = np.repeat(scale.reshape(m, 1), n, axis=1)
    constraints = [x >= 0, cp.sum(cp.multiply(scale_arr, x), axis=0) <= list(workers), cp.sum(x, axis=1) <= 1]
    problem = cp.Problem(objective, constraints)
    try:
        problem.solve(solver="ECOS")
    except cp.error.SolverError:
        problem.solve(solver="CLARABEL")
    return np.asarray(x.value).round(decimals=5).clip(min=0.0).clip(max=1.0)


class SiaGavelPolicy:
    """Gavel as Sia's simulator runs it (``gavel.py``: module docstring)."""

    name = "gavel"
    round_s = 360
    job_kind = "rigid"

    def __init__(self) -> None:
        self.job_time: dict[str, dict[str, float]] = {}
        self.cluster_time: dict[str, float] = {}
        self.current: dict[str, tuple[str, tuple[int, ...]]] = {}  # job -> (type, worker ids of the type)

    def decide(self, sim: SiaSimulator) -> dict[str, Allocation]:
        types = list(sim.types)  # Sia's cluster order (aws, dgx-ext, rtx: also the sorted names)
        interval = sim.round_s
        for t in types:
            self.cluster_time.setdefault(t, 0.0)
        jobs = sim.active()
        for j in jobs:
            if j.name not in self.job_time:
                self.job_time[j.name] = {t: interval / 2 for t in types}
                for t in types:
                    self.cluster_time[t] += interval / 2
        # the program: jobs sorted by name, types sorted by Sia's names
        ids = sorted(j.name for j in jobs)
        by = {j.name: j for j in jobs}
        cols = sorted(types, key=lambda t: SIA_NAME[t])
        thr = np.array([[gavel_throughput(by[i], sim, t) for t in cols] for i in ids])
        scale = np.array([by[i].spec.num_replicas for i in ids], dtype=float)
        x = max_sum_throughput(thr, scale, np.array([sim.capacity[t] for t in cols], dtype=float))
        alloc = {i: {t: float(x[r, c]) for c, t in enumerate(cols)} for r, i in enumerate(ids)}
        # priorities: share / fraction of the type's time had
        queue = []
        for t in types:
            for j in jobs:
                a = alloc[j.name][t]
                frac = self.job_time[j.name][t] / self.cluster_time[t] if self.cluster_time[t] else 0.0
                prio = a * 1e9 if (a != 0.0 and frac <= 0.0) else (a / frac if a != 0.0 else 0.0)
                queue.append((j.name, t, prio, 0.0, a))
        queue.sort(key=lambda e: (e[2], e[3], e[4]), reverse=True)
        left = dict(sim.capacity)
        chosen: dict[str, list[tuple[str, int]]] = {t: [] for t in types}
        taken: set[str] = set()
        for name, t, *_ in queue:
            if left[t] == 0 or name in taken:
                continue
            n = by[name].spec.num_replicas
            if n > left[t]:
                continue
            left[t] -= n
            taken.add(name)
            chosen[t].append((name, n))
        new: dict[str, tuple[str, tuple[int, ...]]] = {}
        for t in types:
            per = sim.per_node[t]
            servers = [list(range(s * per, (s + 1) * per)) for s in range(sim.nodes[t])]
            assigned: set[int] = set()
            ptr = 0
            group = sorted(chosen[t], key=lambda e: e[1], reverse=True)
            for size in sorted({n for _, n in group}, reverse=True):
                for name, n in group:  # keep the GPUs it had, when none is taken yet
                    if n != size:
                        continue
                    prev = self.current.get(name)
                    if prev is not None and prev[0] == t and not any(w in assigned for w in prev[1]):
                        new[name] = prev
                        assigned.update(prev[1])
                for name, n in group:  # the others: server by server
                    if n != size:
                        continue
                    got = list(new[name][1]) if name in new else []
                    while len(got) < n and ptr < len(servers):
                        if not servers[ptr]:
                            ptr += 1
                            continue
                        w = servers[ptr][0]
                        if w not in assigned:
                            got.append(w)
                            assigned.add(w)
                        servers[ptr].pop(0)
                    if len(got) != n:
                        raise RuntimeError(f"could not assign workers to job {name}")
                    new[name] = (t, tuple(got))
        self.current = new
        for name, (t, _) in new.items():
            self.job_time[name][t] += interval
            self.cluster_time[t] += interval
        return {name: (t, tuple(w // sim.per_node[t] for w in ws)) for name, (t, ws) in new.items()}


# -- Sia --------------------------------------------------------------------------------------

ZERO_ALLOC_GAIN = 0.0001  # a configuration's goodput where the job has none
GOODPUT_CLIP = 3000.0  # sim_config.sia_goodput_clip_val


def restart_penalty(job_name: str) -> float:
    """The restart time Sia's policy charges, by the job's name (``get_restart_penalty``; not
    the simulator's restart times)."""
    for key, value in (("deepspeech", 25), ("imagenet", 250), ("cifar", 30), ("bert", 120), ("yolov3", 45)):
        if key in job_name:
            return value
    return 30


def realloc_factor(job: SiaJob, now: float, rigid: bool) -> float:
    """What a change of configuration keeps of a job's goodput: ``(age - restarts x penalty) /
    (age + penalty)``, 1 for a rigid job with less than a penalty's worth of GPU-seconds or
    another job younger than the penalty (the artifact's Pollux-style re-allocation factor)."""
    pen = restart_penalty(job.name)
    age = now - job.submission_time
    if (job.attained_service if rigid else age) < pen:
        return 1.0
    return max(age - (job.num_restarts or 0) * pen, 0) / (age + pen)


def unit_throughput(app) -> float:
    """Examples per second of one GPU as Sia's cluster computes it for projections (the largest
    profiled local batch over the largest one-GPU step time)."""
    one = app.p_replicas == 1
    return float(app.p_local_bsz[one].max() / app.p_step[one].max())


def config_goodputs(model, nodes: np.ndarray, replicas: np.ndarray, max_batch_size: float,
                    atomic_range: tuple[float, float], tune_bsz: bool) -> np.ndarray:
    """Pollux's ``GoodputFunction.optimize`` over many (nodes, GPUs) at once, with its
    ``tune_bsz`` switch (off: the job's own batch size only); examples per second at the best
    batch size of each, 0 where none fits the per-GPU range."""
    nodes = np.asarray(nodes, dtype=np.float32)
    replicas = np.asarray(replicas, dtype=np.float32)
    lo, hi = atomic_range[0] or 1, atomic_range[1] or max_batch_size
    if tune_bsz:
        least = np.maximum(model.init_batch_size, lo * replicas)
    else:
        least = np.full(replicas.shape, max_batch_size, dtype=float)
    batch = np.geomspace(least, max_batch_size)
    local = batch / replicas
    eps = 1e-8
    accum = np.ceil(local / hi - eps) - 1
    accum = np.where((replicas == 1) & (local > model.init_batch_size + eps), np.maximum(accum, 1), accum).astype(int)
    atomic = np.ceil(local / (accum + 1) - eps).astype(int)
    good = model.goodput(nodes, replicas, atomic, accum)
    good = np.where((lo <= atomic) & (atomic <= hi), good, 0.0)
    return good.max(axis=0).astype(np.float32)


class SiaMipPolicy:
    """Sia's policy (``sia.py``, ``SiaPolicy.optimize_mip``), with the artifact's settings.

    Every round, for each active job, a goodput for every (GPU type, nodes, GPUs) configuration
    the type offers (:data:`CONFIGS_4GPU` / :data:`CONFIGS_8GPU`):

    - a resizable job: the goodput of its fitted model (step times it has seen on the type,
      its last gradient statistics) at the best batch size up to its own, for 1 GPU up to
      twice the most it has run on (the most over types); on a type it has not run on, the
      goodput of the first type it has, times the two types' one-GPU throughput ratio; a job
      that has run nowhere yet: 1 for one GPU of each type. Each row is divided by its
      smallest goodput;
    - a rigid job: its throughput on each type at its GPU count and batch, scaled so the
      slowest type gives its GPU count;
    - a job that ran last round: every other configuration times ``(age - restarts x
      penalty) / (age + penalty)`` (rigid jobs: from when they have had a penalty's worth of
      GPU-seconds; the others: once older than the penalty);

    then one configuration at most per job (binary), each type's GPUs at most its count, and a
    job restoring from a checkpoint keeps its configuration; minimised: the sum of the chosen
    goodputs to the power ``p`` (-0.5; rounded to 2 decimals, capped at 3000) plus ``lambda_n``
    (1.1) per job left without GPUs (relative gap 1e-4; CBC as the artifact when ``cylp`` is
    installed - :func:`solve_cbc`, which matters for ties - else HiGHS). GPUs of a
    type go to the chosen jobs largest first: whole nodes for gangs of a node or more, then any
    free GPUs, round-robin over the nodes (``alloc_to_placement_fast``)."""

    name = "sia"
    round_s = 60
    job_kind = "adaptive"

    def __init__(self, p: float = -0.5, lambda_n: float = 1.1, gap: float = 1e-4, solver: str = "auto") -> None:
        if solver not in ("auto", "cbc", "highs"):
            raise ValueError(f"solver {solver!r}: auto, cbc or highs")
        self.solver = solver
        self.p = p
        self.lambda_n = lambda_n
        self.gap = gap
        self.prev: dict[str, dict[str, int | None]] = {"rigid": {}, "adaptive": {}}
        self._ratios: dict[str, dict[str, dict[str, float]]] = {}
        self._rigid_thr: dict[str, dict[str, float]] = {}

    # inputs ------------------------------------------------------------------------------------

    def _configs(self, sim: SiaSimulator) -> list[tuple[str, int, int]]:
        return [(t, n, g) for t in sim.types for n, g in type_configs(sim.nodes[t], sim.per_node[t])]

    def _ratio(self, sim: SiaSimulator, job: SiaJob) -> dict[str, dict[str, float]]:
        """``cluster_throughput_ratios[src][dst]`` of the job's model: one-GPU throughput on
        ``src`` over that on ``dst``."""
        got = self._ratios.get(job.spec.app)
        if got is None:
            unit = {t: unit_throughput(job.app(t)) for t in sim.types}
            got = self._ratios[job.spec.app] = {s: {d: unit[s] / unit[d] for d in sim.types if d != s}
                                                 for s in sim.types}
        return got

    def _rigid_throughputs(self, sim: SiaSimulator, job: SiaJob) -> dict[str, float]:
        """A rigid job's examples per second on each type at its GPU count (``get_throughputs``)."""
        got = self._rigid_thr.get(job.name)
        if got is None:
            got = {}
            n, batch = job.spec.num_replicas, job.spec.batch_size
            for t in sim.types:  # packed, without the profiles' memory cap (Sia's policy's own rule)
                it = rigid_config(job.app(t), packed_placement(n, sim.per_node[t]), batch, profile_cap=False).iteration_s
                got[t] = batch / it / SLOWDOWN.get(job.spec.app, 1.2) if it > 0 else 0.0
            self._rigid_thr[job.name] = got
        return got

    def _adaptive_row(self, sim: SiaSimulator, job: SiaJob, configs: list[tuple[str, int, int]]) -> np.ndarray:
        row = np.full(len(configs), ZERO_ALLOC_GAIN, dtype=np.float32)
        models = {t: job.model(t) for t in sim.types}
        tune = job.kind == "adaptive"
        if job.kind == "adaptive":
            most = max(min(max(2 * job.max_profiled_replicas(t), 1), 64,
                           job.app(t).max_batch_size // job.app(t).min_local_bsz) for t in sim.types)
        else:
            most = job.spec.num_replicas
        most = max(1, most)
        known = [t for t in sim.types if models[t] is not None]
        ones: set[str] = set()  # types whose row is "1 for one GPU" (nnz_speedups)
        cols = {t: [i for i, c in enumerate(configs) if c[0] == t] for t in sim.types}
        for t in sim.types:
            idx = [i for i in cols[t] if 1 <= configs[i][2] <= most]
            if not known:
                ones.add(t)
                continue
            if not idx:
                ones.add(t)
                continue
            nodes = np.array([configs[i][1] for i in idx])
            gpus = np.array([configs[i][2] for i in idx])
            src = t if models[t] is not None else known[0]
            if src != t:  # projected from the first type with a model
                nodes = np.ceil(gpus / sim.per_node[src]).astype(np.uint32)
            app = job.app(src)
            good = config_goodputs(models[src], nodes, gpus, job.spec.batch_size,
                                   (app.min_local_bsz, app.max_local_bsz), tune)
            if src != t:
                good = good * np.float32(self._ratio(sim, job)[t][src])
            row[idx] = good
        mins = [row[cols[t]][row[cols[t]] > ZERO_ALLOC_GAIN].min() for t in sim.types
                if t not in ones and (row[cols[t]] > ZERO_ALLOC_GAIN).any()]
        least = min(mins) if mins else 1.0
        row = row * np.float32(1.0 / least)
        for t in ones:
            for i in cols[t]:
                if configs[i][2] == 1:
                    row[i] = 1.0
        row[row <= ZERO_ALLOC_GAIN] = ZERO_ALLOC_GAIN
        return row

    def _pow(self, m: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore"):
            out = np.round(np.power(m, self.p), decimals=2)
        out[out > GOODPUT_CLIP] = GOODPUT_CLIP
        return out

    # the round ---------------------------------------------------------------------------------

    def decide(self, sim: SiaSimulator) -> dict[str, Allocation]:
        configs, types = self._configs(sim), list(sim.types)
        jobs = sim.active()
        rigid = [j for j in jobs if j.kind == "rigid"]
        adapt = [j for j in jobs if j.kind != "rigid"]
        a_mat = np.array([self._adaptive_row(sim, j, configs) for j in adapt], dtype=np.float32).reshape(
            len(adapt), len(configs))
        r_mat = self._rigid_matrix(sim, rigid, types)
        fixed_a, fixed_r = self._discount(sim.now, a_mat, adapt, r_mat, rigid)
        x = self._solve(sim, configs, types, a_mat, r_mat, adapt, rigid, fixed_a, fixed_r)
        per_type = self._chosen(x, configs, types, adapt, rigid)
        active = {j.name for j in jobs}
        for kind in self.prev:
            self.prev[kind] = {k: v for k, v in self.prev[kind].items() if k in active}
        out: dict[str, Allocation] = {}
        for t in types:
            for name, nodes in place_fast(per_type[t], sim.nodes[t], sim.per_node[t]).items():
                out[name] = (t, tuple(nodes))
        return out

    def _rigid_matrix(self, sim: SiaSimulator, rigid: list[SiaJob], types: list[str]) -> np.ndarray:
        """Rigid jobs x types: throughput at the job's GPU count, scaled so that the slowest
        type that runs it gives its GPU count (0 where a type has no profile for the gang)."""
        r_mat = np.zeros((len(rigid), len(types)))
        for i, j in enumerate(rigid):
            thr = self._rigid_throughputs(sim, j)
            g = np.array([thr[t] for t in types])
            runs = g > 0  # a type without a profile for the gang: goodput 0 (the cap of 3000 after the power)
            if runs.any():
                r_mat[i] = np.where(runs, g * (j.spec.num_replicas / g[runs].min()), 0.0)
        return r_mat

    def _discount(self, now: float, a_mat: np.ndarray, adapt: list[SiaJob], r_mat: np.ndarray,
                  rigid: list[SiaJob]) -> tuple[set[int], set[int]]:
        """In place: a restoring job's row kept to its last configuration (rigid), and every
        other configuration of a job that ran last round times its reallocation factor. The
        restoring jobs (adaptive, rigid), whose configuration the program must keep."""
        a_fac = [realloc_factor(j, now, rigid=False) for j in adapt]
        r_fac = [realloc_factor(j, now, rigid=True) for j in rigid]
        fixed_r = {i for i, j in enumerate(rigid) if j.rescale_time > 0}
        fixed_a = {i for i, j in enumerate(adapt) if j.rescale_time > 0}
        for i in fixed_r:
            keep = self.prev["rigid"][rigid[i].name]
            v = r_mat[i, keep]
            r_mat[i, :] = 0
            r_mat[i, keep] = v
            r_fac[i] = 1.0
        for mat, group, fac, kind in ((r_mat, rigid, r_fac, "rigid"), (a_mat, adapt, a_fac, "adaptive")):
            for i, j in enumerate(group):  # every configuration but the job's last one is discounted
                prev = self.prev[kind].get(j.name)
                if prev is not None:
                    v = mat[i, prev]
                    mat[i, :] *= fac[i]
                    mat[i, prev] = v
        return fixed_a, fixed_r

    def _solve(self, sim: SiaSimulator, configs: list[tuple[str, int, int]], types: list[str], a_mat: np.ndarray,
               r_mat: np.ndarray, adapt: list[SiaJob], rigid: list[SiaJob], fixed_a: set[int],
               fixed_r: set[int]) -> np.ndarray:
        """The program (powers of the goodputs, GPUs per type, restoring jobs fixed), solved:
        the adaptive jobs' configuration choices, then the rigid jobs' type choices, flat."""
        na, nr, nc, nt = len(adapt), len(rigid), len(configs), len(types)
        a_pow = self._pow(a_mat) if na else None
        r_pow = self._pow(r_mat) if nr else None
        reduce = np.zeros((nc, nt), dtype=np.uint32)  # GPUs of each configuration, by type
        for c, (t, _, g) in enumerate(configs):
            reduce[c, types.index(t)] = g
        replicas = np.array([j.spec.num_replicas for j in rigid], dtype=np.uint32).reshape(-1, 1)
        capacity = np.array([sim.capacity[t] for t in types], dtype=np.uint32)
        fix_a = [(i, self.prev["adaptive"][adapt[i].name]) for i in sorted(fixed_a)]
        fix_r = [(i, self.prev["rigid"][rigid[i].name]) for i in sorted(fixed_r)]
        solve = solve_cbc if (self.solver == "cbc" or (self.solver == "auto" and cbc_available())) else solve_highs
        xa, xr = solve(a_pow, r_pow, reduce, replicas, capacity, fix_a, fix_r, self.lambda_n, self.gap)
        return np.concatenate([xa.ravel() if na else np.zeros(0, dtype=int),
                               xr.ravel() if nr else np.zeros(0, dtype=int)])

    def _chosen(self, x: np.ndarray, configs: list[tuple[str, int, int]], types: list[str],
                adapt: list[SiaJob], rigid: list[SiaJob]) -> dict[str, dict[str, int]]:
        """The solution as GPUs per job on each type; each job's choice kept for the next round."""
        na, nc, nt = len(adapt), len(configs), len(types)
        per_type: dict[str, dict[str, int]] = {t: {} for t in types}
        for i, j in enumerate(rigid):
            sel = x[na * nc + i * nt: na * nc + (i + 1) * nt]
            k = int(np.argmax(sel)) if sel.sum() else None
            self.prev["rigid"][j.name] = k
            if k is not None:
                per_type[types[k]][j.name] = j.spec.num_replicas
        for i, j in enumerate(adapt):
            sel = x[i * nc:(i + 1) * nc]
            c = int(np.argmax(sel)) if sel.sum() else None
            self.prev["adaptive"][j.name] = c
            if c is not None:
                t, _, g = configs[c]
                per_type[t][j.name] = g
        return per_type


@functools.lru_cache(maxsize=1)
def cbc_available() -> bool:
    """Whether cvxpy can call CBC (``cylp`` installed: ``pip install hetflow[sia]``); asked once
    a process (cvxpy's ``installed_solvers`` takes ~4 ms, and a policy asks every round)."""
    try:
        import cvxpy as cp

        return "CBC" in cp.installed_solvers()
    except ImportError:  # pragma: no cover - cvxpy is a dependency
        return False


def solve_cbc(a_pow, r_pow, reduce, replicas, capacity, fix_a, fix_r, lambda_n, gap):
    """Sia's program as the artifact writes it in cvxpy (``__solve_mip_rescaled``, the same
    expressions and constraints in the same order), solved with CBC as the artifact does
    (one thread, ``allowablePercentageGap`` = gap x 100): the solver breaks the program's many
    ties (module docstring of :class:`SiaMipPolicy`) as the reference runs did."""
    import cvxpy as cp

    na = 0 if a_pow is None else a_pow.shape[0]
    nr = 0 if r_pow is None else r_pow.shape[0]
    weights = np.ones((1, na + nr), dtype=np.float32)
    xa = cp.Variable(shape=a_pow.shape, integer=True) if na else 0
    xr = cp.Variable(shape=r_pow.shape, integer=True) if nr else 0
    expr = cp.sum(weights[:, :na] @ cp.multiply(xa, a_pow)) if na else 0
    expr += cp.sum(weights[:, na:] @ cp.multiply(xr, r_pow)) if nr else 0
    allocs = cp.sum(xa) if na else 0
    allocs += cp.sum(xr) if nr else 0
    expr += lambda_n * ((na + nr) - allocs)
    constraints = []
    if na:
        constraints += [xa >= 0, xa <= 1]
    if nr:
        constraints += [xr >= 0, xr <= 1]
    used = 0
    if nr:
        used += cp.sum(cp.multiply(xr, np.tile(replicas, (1, r_pow.shape[1]))), axis=0)
    if na:
        used += cp.sum(xa @ reduce, axis=0)
    constraints += [used <= capacity, used >= 0]
    if nr:
        constraints.append(xr @ np.ones((r_pow.shape[1], 1), dtype=np.uint32) <= np.ones((nr, 1), dtype=np.uint32))
        constraints += [xr[i, k] == 1 for i, k in fix_r]
    if na:
        constraints.append(xa @ np.ones((a_pow.shape[1], 1), dtype=np.uint32) <= np.ones((na, 1), dtype=np.uint32))
        constraints += [xa[i, c] == 1 for i, c in fix_a]
    problem = cp.Problem(cp.Minimize(expr), constraints=constraints)
    problem.solve(solver=cp.CBC, numberThreads=1, allowablePercentageGap=gap * 100)
    if problem.status != "optimal":
        raise RuntimeError(f"Sia's program: CBC ended {problem.status}")
    return (np.round(xa.value, decimals=0).astype(int) if na else None,
            np.round(xr.value, decimals=0).astype(int) if nr else None)


def solve_highs(a_pow, r_pow, reduce, replicas, capacity, fix_a, fix_r, lambda_n, gap):
    """The same program with HiGHS (scipy's ``milp``) where CBC is not installed. It finds an
    optimum as good, but breaks ties its own way: on Sia's rigid runs that moved jobs between
    equal choices about 1.4 times as often as CBC, average JCTs -3 % to +24 % off (docs/benchmarks.md)."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    na, nc = (0, 0) if a_pow is None else a_pow.shape
    nr, nt = (0, reduce.shape[1]) if r_pow is None else r_pow.shape
    nvar = na * nc + nr * nt
    cost = np.concatenate([(a_pow - lambda_n).ravel() if na else np.zeros(0),
                           (r_pow - lambda_n).ravel() if nr else np.zeros(0)])
    rows = []
    for k in range(nt):  # GPUs of each type
        r = np.zeros(nvar)
        for i in range(na):
            r[i * nc:(i + 1) * nc] = reduce[:, k]
        for i in range(nr):
            r[na * nc + i * nt + k] = replicas[i, 0]
        rows.append(r)
    hi = list(capacity)
    for i in range(na):  # one configuration per job
        r = np.zeros(nvar)
        r[i * nc:(i + 1) * nc] = 1
        rows.append(r)
        hi.append(1)
    for i in range(nr):
        r = np.zeros(nvar)
        r[na * nc + i * nt: na * nc + (i + 1) * nt] = 1
        rows.append(r)
        hi.append(1)
    lower = np.zeros(nvar)
    for i, c in fix_a:
        lower[i * nc + c] = 1
    for i, k in fix_r:
        lower[na * nc + i * nt + k] = 1
    res = milp(cost, constraints=LinearConstraint(np.array(rows), 0, hi), integrality=np.ones(nvar),
               bounds=Bounds(lower, np.ones(nvar)), options={"mip_rel_gap": gap})
    if res.x is None:
        raise RuntimeError(f"Sia's program found no allocation ({res.message})")
    x = np.round(res.x).astype(int)
    return (x[:na * nc].reshape(na, nc) if na else None, x[na * nc:].reshape(nr, nt) if nr else None)


def place_fast(allocs: Mapping[str, int], nodes: int, per_node: int) -> dict[str, list[int]]:
    """GPUs of one type to jobs, largest first: whole free nodes for each full node the job
    needs, then free GPUs anywhere, a node pointer going round (``alloc_to_placement_fast``)."""
    free = [per_node] * nodes
    cur = 0
    out: dict[str, list[int]] = {}
    for name, want in sorted(allocs.items(), key=lambda kv: kv[1], reverse=True):
        node = cur
        whole = want // per_node
        got: list[int] = []
        checked = 0
        while whole > 0 and checked < nodes:
            if free[node] == per_node:
                free[node] -= per_node
                want -= per_node
                got.extend([node] * per_node)
                whole -= 1
            node = (node + 1) % nodes
            checked += 1
        while want > 0:
            if free[node]:
                take = min(want, free[node])
                want -= take
                free[node] -= take
                got.extend([node] * take)
            node = (node + 1) % nodes
        out[name] = got
        cur = node
    return out


REFERENCE_POLICIES: dict[str, Callable[[], object]] = {"gavel": SiaGavelPolicy, "sia": SiaMipPolicy}
