"""Sia's protocol (SOSP'23, ``siasosp23/artifacts`` at aaf7a0d, ``sia-simulator/``), re-stated.

Sia's simulator replays a workload (``name,time,application,num_replicas,batch_size``) on a
heterogeneous cluster in fixed rounds; every round it steps each job's training for the round
and then asks the policy for the next round's allocations. This module restates its cluster,
its job model (Pollux's: profiled step times per GPU type and placement, statistical efficiency
from the gradient-noise data of each model's validation runs) and its round/restart rules, for
**rigid jobs** (the job's ``num_replicas`` GPUs of one type at its ``batch_size``, as Sia's
simulator runs every job under Gavel). Policies plug in as objects with
``decide(sim) -> {job name: (gpu type, [node index per GPU])}``.

Rules (the artifact's ``cluster.py``, ``job.py``, ``applications.py``, ``simulator_config.py``):

- **Cluster**: 6 nodes x 4 T4 (``aws``), 2 x 8 A100 (``dgx-ext``), 3 x 8 RTX 2080Ti (``rtx``),
  64 GPUs. A job runs on GPUs of one type; its placement is the number of its GPUs per node.
- **Rounds** (60 s by default; Gavel's runs use 360 s): the jobs train for the round with the
  allocation decided at the end of the previous one, time advances, then every job submitted
  by then and not finished is handed to the policy. A job finishing mid-round leaves its GPUs
  idle until the round ends.
- **Restarts**: a job whose GPU type changes, or that starts from no GPUs, or whose placement
  (GPUs per node) changes, spends the model's restart time first (cifar10 50 s, deepspeech2
  25 s, bert 120 s, yolov3 80 s, imagenet 250 s) with no progress; moving to other nodes of
  the same type with the same placement is free (the simulator compares placements, not node
  ids). A job left without GPUs keeps its progress.
- **Job model** (rigid): per GPU GPU-local batch ``ceil(B / n)``, split into gradient
  accumulation steps to fit the profiled maximum local batch, capped by the memory limit of
  ``n``-GPU profiles and by the model's largest validated batch. Step time and sync time come
  from the profile of the exact placement (interpolated in local batch) or, for placements not
  profiled, a linear interpolation over (nodes, GPUs, local batch) of the placement means and
  the scalability runs. An iteration takes ``step + (step - sync) x accum``; progress per
  second is ``gain / iteration time / slowdown`` with ``gain = (var + sqr) / (var / scale +
  sqr)`` (the epoch's gradient statistics at the batch size, ``scale`` = batch / the model's
  smallest validated batch) and the calibration slowdown (cifar10 1.8, the others 1.2). An
  epoch ends at the validation runs' progress mark; its crossing time is rounded to whole
  seconds (as the artifact does); a job is done after its model's last epoch (bert 2, cifar10
  100, deepspeech2 80, imagenet 90, yolov3 50).
- **JCT** = completion time - submission time; averaged over every job of the workload.

Profiles: the artifact's ``traces/<model>/{placements,scalability}-<type>.csv`` and
``validation-<batch>.csv`` (``hetflow traces fetch sia`` puts them under ``profiles/``).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

import numpy as np

from hetflow.core.errors import InputError
from hetflow.scheduling.goodput import GoodputModel, GradParams, PerfParams, batch_grid, fit_perf_params
from hetflow.sim.mechanism import jct_summary, run_rounds
from hetflow.sim.textio import existing, read_text

# GPU type (as hetflow names it) -> (Sia's cluster name / profile suffix, nodes, GPUs per node),
# in Sia's cluster order (simulator_config.cluster_nnodes: aws, dgx-ext, rtx)
SIA_CLUSTER: dict[str, tuple[str, int, int]] = {
    "T4": ("aws", 6, 4),
    "A100": ("dgx-ext", 2, 8),
    "RTX2080Ti": ("rtx", 3, 8),
}
SIA_NAME = {t: v[0] for t, v in SIA_CLUSTER.items()}
TYPE_OF_SIA = {v[0]: t for t, v in SIA_CLUSTER.items()}
MAX_EPOCHS = {"bert": 2, "cifar10": 100, "ncf": 10, "imagenet": 90, "deepspeech2": 80, "yolov3": 50}
RESTART_S = {"cifar10": 50, "deepspeech2": 25, "bert": 120, "yolov3": 80, "imagenet": 250, "ncf": 15}
SLOWDOWN = {"cifar10": 1.8, "imagenet": 1.2, "yolov3": 1.2, "bert": 1.2, "deepspeech2": 1.2, "ncf": 1.5}
DEFAULT_ROUND_S = 60
WORKLOAD_COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")


# -- profiles ------------------------------------------------------------------------------------


def _read_csv(path: Path) -> list[dict[str, str]]:
    try:
        text = read_text(existing(path))
    except OSError as e:
        raise InputError(f"{path}: cannot read Sia profile ({e.strerror or e}); fetch the profiles with "
                         "`hetflow traces fetch sia` and give their folder (--throughputs DIR/profiles)") from None
    return list(csv.DictReader(text.splitlines()))


class SiaApp:
    """One model's profiles on one GPU type (the artifact's ``Application``)."""

    def __init__(self, root: Path, app: str, sia_type: str) -> None:
        folder = Path(root) / app
        self.name = app
        self.validation: dict[int, dict[str, np.ndarray]] = {}
        names = {p.name.split(".")[0] for p in folder.glob("validation-*.csv*")} if folder.is_dir() else set()
        for stem in sorted(names, key=lambda s: int(s.split("-")[-1])):
            rows = _read_csv(folder / f"{stem}.csv")
            self.validation[int(stem.split("-")[-1])] = {
                k: np.array([float(r[k]) for r in rows]) for k in ("progress", "iteration", "grad_sqr", "grad_var")}
        if not self.validation:
            raise InputError(f"{folder}: no validation-<batch>.csv profiles for model {app!r} (Sia's traces/{app}/)")
        prow = _read_csv(folder / f"placements-{sia_type}.csv")
        self.placement_id = np.array([int(r["placement"]) for r in prow], dtype=np.int64)
        self.p_local_bsz = np.array([float(r["local_bsz"]) for r in prow])
        self.p_step = np.array([float(r["step_time"]) for r in prow])
        self.p_sync = np.array([float(r["sync_time"]) for r in prow])
        self.p_nodes = np.array([len(r["placement"]) for r in prow], dtype=np.int64)
        self.p_replicas = np.array([sum(map(int, r["placement"])) for r in prow], dtype=np.int64)
        srow = _read_csv(folder / f"scalability-{sia_type}.csv")
        self.s = {k: np.array([float(r[k]) for r in srow]) for k in ("num_nodes", "num_replicas", "local_bsz",
                                                                     "step_time", "sync_time")}
        self.init_batch_size = min(self.validation)
        self.max_batch_size = max(self.validation)
        self.min_local_bsz = float(self.p_local_bsz.min())
        self.max_local_bsz = 57.0 if (app == "deepspeech2" and sia_type == "rtx") else float(self.p_local_bsz.max())
        self.max_epochs = MAX_EPOCHS.get(app) or min(len(v["progress"]) for v in self.validation.values())
        self.rescale_time = RESTART_S.get(app, 30)
        self._nd = None
        self._xput: dict[tuple[tuple[int, ...], int], tuple[float, float]] = {}
        self._best: dict[tuple[int, ...], np.ndarray] = {}
        self._progress = [0.0] + [min(float(v["progress"][e - 1]) for v in self.validation.values())
                                  for e in range(1, self.max_epochs + 1)]

    # the validation runs -------------------------------------------------------------------

    def _bounds(self, batch_size: float) -> tuple[int, int]:
        lower = upper = None
        for b in self.validation:
            if b <= batch_size:
                lower = b
            if b >= batch_size:
                upper = b
                break
        assert lower is not None and upper is not None, (self.name, batch_size, list(self.validation))
        return lower, upper

    def progress_at(self, epoch: int) -> float:
        return self._progress[epoch]

    def grad_stats(self, batch_size: float, epoch: int) -> tuple[float, float]:
        """(gradient square, gradient variance) at ``batch_size`` in ``epoch``: linear between
        the two validated batches around it."""
        sqr, var = self.grad_stats_all(batch_size)
        return float(sqr[epoch]), float(var[epoch])

    def grad_stats_all(self, batch_size: float) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`grad_stats` at ``batch_size`` for every epoch at once."""
        lo, hi = self._bounds(batch_size)
        ls, lv = self.validation[lo]["grad_sqr"], self.validation[lo]["grad_var"]
        if lo == hi:
            return ls, lv
        us, uv = self.validation[hi]["grad_sqr"], self.validation[hi]["grad_var"]
        return (((batch_size - lo) * us + (hi - batch_size) * ls) / (hi - lo),
                ((batch_size - lo) * uv + (hi - batch_size) * lv) / (hi - lo))

    def best_cost(self, placement: Sequence[int]) -> np.ndarray:
        """Per epoch, the seconds one unit of progress takes on ``placement`` at the batch size
        that makes progress fastest in that epoch (profiled step times, the epoch's gradient
        statistics; the batch grid of :meth:`GoodputModel.optimize`); inf where no batch
        runs. What an adaptive job approaches once its model has learnt the placement."""
        p = self._normal(placement)
        got = self._best.get(p)
        if got is not None:
            return got
        reps = sum(p)
        max_local = self.max_local_bsz_at(p)
        least = max(self.init_batch_size, self.min_local_bsz * reps)
        cost = np.full(self.max_epochs, np.inf)
        if least <= self.max_batch_size and max_local == max_local:
            atomics, accums, ok = batch_grid(reps, self.init_batch_size, self.max_batch_size,
                                             (self.min_local_bsz, max_local))
            for atomic, accum in sorted({(int(a), int(c)) for a, c, k in zip(atomics, accums, ok) if k}):
                cfg = fitted_config(self, p, atomic, accum)
                if not cfg.ok or cfg.batch_size < self.init_batch_size:
                    continue
                sqr, var = self.grad_stats_all(cfg.batch_size)
                scale = cfg.batch_size / self.init_batch_size
                gain = (var + sqr) / (var / scale + sqr)
                cost = np.minimum(cost, cfg.iteration_s / gain[: self.max_epochs])
        self._best[p] = cost
        return cost

    # the throughput profiles -----------------------------------------------------------------

    @staticmethod
    def _normal(placement: Sequence[int]) -> tuple[int, ...]:
        p = tuple(x for x in placement if x)
        return min(p[i:] + p[:i] for i in range(len(p)))

    def max_local_bsz_at(self, placement: Sequence[int]) -> float:
        p = self._normal(placement)
        pid = int("".join(map(str, p)))
        mask = self.placement_id == pid
        if mask.any():
            return float(self.p_local_bsz[mask].max())
        s = self.s
        sel = (s["num_nodes"] >= len(p)) & (s["num_replicas"] >= sum(p))
        return float(s["local_bsz"][sel].max()) if sel.any() else math.nan

    def step_sync(self, placement: Sequence[int], local_bsz: int) -> tuple[float, float]:
        """(step time, sync time) of one iteration at ``local_bsz`` per GPU; (-1, -1) outside
        the profiles (the artifact's ``get_throughput``)."""
        p = self._normal(placement)
        key = (p, int(local_bsz))
        got = self._xput.get(key)
        if got is not None:
            return got
        from scipy.interpolate import LinearNDInterpolator, interp1d

        pid = int("".join(map(str, p)))
        mask = self.placement_id == pid
        if mask.any():
            f = interp1d(self.p_local_bsz[mask], np.stack([self.p_step[mask], self.p_sync[mask]], axis=1), axis=0)
            try:
                ret = f(local_bsz)
            except ValueError:
                ret = np.array([-1.0, -1.0])
        else:
            if self._nd is None:
                self._nd = LinearNDInterpolator(*self._nd_points())
            ret = self._nd([min(len(p), 16), sum(p), local_bsz])[0]
            if not np.all(np.isfinite(ret)):
                ret = np.array([-1.0, -1.0])  # outside the hull: NaN (the artifact would fail here)
        got = (float(ret[0]), float(ret[1]))
        self._xput[key] = got
        return got

    def _nd_points(self) -> tuple[np.ndarray, np.ndarray]:
        # placements grouped by (nodes, GPUs, local batch) and averaged (pandas' groupby order:
        # sorted keys), then the scalability rows in file order
        groups: dict[tuple[int, int, float], list[int]] = {}
        for i in range(len(self.placement_id)):
            groups.setdefault((int(self.p_nodes[i]), int(self.p_replicas[i]), float(self.p_local_bsz[i])), []).append(i)
        xs, ys = [], []
        for k in sorted(groups):
            idx = groups[k]
            xs.append(k)
            ys.append((float(np.mean(self.p_step[idx])), float(np.mean(self.p_sync[idx]))))
        s = self.s
        for i in range(len(s["num_nodes"])):
            xs.append((s["num_nodes"][i], s["num_replicas"][i], s["local_bsz"][i]))
            ys.append((s["step_time"][i], s["sync_time"][i]))
        return np.array(xs, dtype=float), np.array(ys, dtype=float)


class SiaProfiles:
    """Every model's :class:`SiaApp` per GPU type, loaded on first use from ``root``."""

    def __init__(self, root: str | Path, types: Sequence[str] = tuple(SIA_CLUSTER)) -> None:
        self.root = Path(root)
        if not self.root.is_dir():
            raise InputError(f"{root}: not a folder of Sia's profiles (<model>/placements-<type>.csv ...); "
                             "fetch them with `hetflow traces fetch sia` (they are under profiles/)")
        self.types = tuple(types)
        self._apps: dict[tuple[str, str], SiaApp] = {}

    def app(self, name: str, gpu_type: str) -> SiaApp:
        key = (name, gpu_type)
        if key not in self._apps:
            self._apps[key] = SiaApp(self.root, name, SIA_NAME[gpu_type])
        return self._apps[key]


# -- rigid job configuration ----------------------------------------------------------------------


@dataclass(frozen=True)
class RigidConfig:
    """A rigid job on one placement: per-GPU batch, accumulation steps and iteration time."""

    atomic_bsz: int
    accum_steps: int
    batch_size: int  # the batch the job actually trains with (GPUs x local batch)
    step_time: float
    sync_time: float

    @property
    def iteration_s(self) -> float:
        return self.step_time + (self.step_time - self.sync_time) * self.accum_steps

    @property
    def ok(self) -> bool:
        return self.step_time > 0 and self.iteration_s > 0


def rigid_config(app: SiaApp, placement: Sequence[int], batch_size: int, profile_cap: bool = True) -> RigidConfig:
    """The artifact's ``Job.update_local_bsz`` with batch-size tuning off (Gavel's and rigid
    jobs); ``profile_cap`` False: without the memory cap of the ``n``-GPU profiles, as Sia's
    policy rates a rigid job (``SiaPolicy.get_throughputs``)."""
    p = tuple(x for x in placement if x)
    replicas = sum(p)
    max_local = app.max_local_bsz_at(p)
    local = math.ceil(batch_size / replicas - 1e-8)
    accum = math.ceil(local / max_local - 1e-8) - 1 if max_local == max_local else 0
    if replicas == 1 and batch_size > app.init_batch_size:
        accum = max(1, accum)
    atomic = math.ceil(local / (accum + 1) - 1e-8)
    return fitted_config(app, p, atomic, accum, profile_cap)


def fitted_config(app: SiaApp, placement: tuple[int, ...], atomic: int, accum: int,
                  profile_cap: bool = True) -> RigidConfig:
    """A per-GPU batch and accumulation steps, capped by the memory limit of ``n``-GPU profiles
    (``profile_cap``) and the model's largest validated batch (the end of
    ``Job.update_local_bsz``)."""
    replicas = sum(placement)
    mask = app.p_replicas == replicas
    if profile_cap and mask.any():
        atomic = int(min(atomic, app.p_local_bsz[mask].max()))
    atomic = min(int(atomic), int(app.max_batch_size / (replicas * (accum + 1))))
    step, sync = app.step_sync(placement, atomic)
    return RigidConfig(atomic, int(accum), replicas * atomic * (accum + 1), step, sync)


def adaptive_config(app: SiaApp, placement: Sequence[int], model: GoodputModel | None) -> RigidConfig:
    """The artifact's ``Job.update_local_bsz`` with batch-size tuning on: the batch size the
    job's fitted goodput model (:mod:`hetflow.scheduling.goodput`) rates best at this
    placement; before the job has a model on this GPU type, the least batch the placement
    allows (the model's initial batch, or the smallest per-GPU batch on every GPU)."""
    p = tuple(x for x in placement if x)
    replicas = sum(p)
    max_local = app.max_local_bsz_at(p)
    if model is None:
        return rigid_config(app, p, int(max(app.init_batch_size, app.min_local_bsz * replicas)))
    _, atomic, accum = model.optimize(len(p), replicas, app.max_batch_size, (app.min_local_bsz, max_local))
    return fitted_config(app, p, atomic, accum)


def packed_placement(num_gpus: int, per_node: int) -> tuple[int, ...]:
    """Whole nodes first, the rest on one more node (Gavel's ``predict_throughput``)."""
    out: tuple[int, ...] = ()
    while sum(out) < num_gpus:
        out = (*out, min(num_gpus - sum(out), per_node))
    return out


# -- jobs and the simulator -----------------------------------------------------------------------


JOB_KINDS = ("rigid", "adaptive", "scale-gpus")


@dataclass(frozen=True)
class SiaJobSpec:
    name: str
    submission_s: float
    app: str
    num_replicas: int
    batch_size: int
    category: str | None = None  # the workload's category column (None: not given)

    def kind(self, default: str = "rigid") -> str:
        """How the job runs: ``rigid`` (its GPU count and batch), ``scale-gpus`` (its batch,
        any GPU count) or ``adaptive`` (any GPU count, batch size chosen by goodput); a job
        without a category runs as ``default``."""
        return self.category or default


def load_workload(path: str | Path) -> list[SiaJobSpec]:
    """A Sia workload CSV (``name,time,application,num_replicas,batch_size[,category]``;
    category ``rigid``, ``adaptive`` or ``scale-gpus``, as the artifact's
    ``utils/categorize_jobs.py`` writes it)."""
    p = Path(path)
    try:
        rows = list(csv.DictReader(read_text(existing(p)).splitlines()))
    except OSError as e:
        raise InputError(f"{p}: cannot read ({e.strerror or e})") from None
    if not rows or any(c not in rows[0] for c in WORKLOAD_COLUMNS):
        raise InputError(f"{p}: not a Sia workload: needs columns {','.join(WORKLOAD_COLUMNS)}")
    out = []
    for i, r in enumerate(rows, start=2):
        try:
            spec = SiaJobSpec(r["name"], float(r["time"]), r["application"], int(r["num_replicas"]),
                              int(float(r["batch_size"])), (r.get("category") or "").strip() or None)
        except (TypeError, ValueError):
            raise InputError(f"{p}:{i}: bad row {r}: time a number, num_replicas and batch_size integers") from None
        if spec.category is not None and spec.category not in JOB_KINDS:
            raise InputError(f"{p}:{i}: category {spec.category!r}: give one of {', '.join(JOB_KINDS)} or leave it empty")
        if spec.app not in MAX_EPOCHS or spec.num_replicas <= 0 or spec.batch_size <= 0:
            raise InputError(f"{p}:{i}: application {spec.app!r} x{spec.num_replicas} batch {spec.batch_size}: "
                             f"models are {', '.join(sorted(MAX_EPOCHS))}, GPUs and batch > 0")
        out.append(spec)
    return out


def workload_files(trace: str | Path) -> list[Path]:
    """A workload CSV, or a folder of them (``workload-<i>.csv``, in number order)."""
    p = Path(trace)
    if p.is_dir():
        def number(f: Path) -> tuple[int, str]:
            tail = f.name.split(".")[0].split("-")[-1]
            return (int(tail) if tail.isdigit() else 1 << 30, f.name)

        files = sorted(p.glob("*.csv*"), key=number)
        if not files:
            raise InputError(f"--trace {p}: a folder with no Sia workload CSVs (workload-1.csv ...)")
        return files
    if not existing(p).is_file():
        raise InputError(f"--trace {p}: no such file or folder")
    return [p]


class SiaJob:
    """One job's state (the artifact's ``Job``): ``rigid`` and ``scale-gpus`` jobs train at
    their batch size (batch-size tuning off); an ``adaptive`` job re-chooses its batch size
    after every step with the goodput model it fits to what it has run (the step times of the
    placements and per-GPU batches it has seen on each GPU type, the gradient statistics of its
    last step). A scale-gpus job fits the same model without using it (Sia's policy reads it:
    :mod:`hetflow.sim.sia_reference`)."""

    def __init__(self, spec: SiaJobSpec, profiles: SiaProfiles, kind: str = "rigid") -> None:
        self.spec = spec
        self.name = spec.name
        self.profiles = profiles
        if kind not in JOB_KINDS:
            raise InputError(f"job kind {kind!r}: give one of {', '.join(JOB_KINDS)}")
        self.kind = kind
        self._current: RigidConfig | None = None  # an adaptive job's per-GPU batch now
        self.grad_params: GradParams | None = None
        self._seen: dict[str, dict[tuple[int, int, int], tuple[float, float]]] = {}
        self._perf: dict[str, PerfParams] = {}
        self.epoch = 0
        self.progress = 0.0
        self.current_time = 0.0
        self.rescale_time = 0.0
        self.placement: tuple[int, ...] = ()
        self.gpu_type: str | None = None  # the artifact's current_cluster
        self.completion_time: float | None = None
        self.start_time: float | None = None
        self.num_restarts: int | None = None
        self.attained_service = 0.0
        self.service_by_type: dict[str, float] = {}
        self._cfg: dict[tuple[str, tuple[int, ...]], RigidConfig] = {}
        self._remaining: dict[tuple[str, object], np.ndarray] = {}

    @property
    def submission_time(self) -> float:
        return self.spec.submission_s

    def app(self, gpu_type: str) -> SiaApp:
        return self.profiles.app(self.spec.app, gpu_type)

    @property
    def resizable(self) -> bool:
        """Whether the job runs at any GPU count (``adaptive``, ``scale-gpus``)."""
        return self.kind != "rigid"

    @property
    def batch_size(self) -> int:
        """The batch the job trains with now (0 without GPUs)."""
        if not self.placement:
            return 0
        return self._config_now().batch_size

    def _config_now(self) -> RigidConfig:
        if self.kind == "adaptive":
            assert self._current is not None
            return self._current
        return self.config(self.gpu_type, self.placement)  # type: ignore[arg-type]

    def model(self, gpu_type: str) -> GoodputModel | None:
        """The job's fitted goodput model on ``gpu_type`` (None before it has run there)."""
        perf = self._perf.get(gpu_type)
        if perf is None or self.grad_params is None:
            return None
        return GoodputModel(perf, self.grad_params, self.app(gpu_type).init_batch_size)

    def _rechoose(self) -> None:
        """An adaptive job's batch for its placement (the artifact's ``update_local_bsz``)."""
        if self.kind == "adaptive" and self.placement:
            assert self.gpu_type is not None
            self._current = adaptive_config(self.app(self.gpu_type), self.placement, self.model(self.gpu_type))

    def _observe(self, cfg: RigidConfig, sqr: float, var: float) -> None:
        """Record a step (the artifact's ``update_params``): the gradient statistics, and a new
        (nodes, GPUs, per-GPU batch) point of this GPU type refits its step-time model."""
        self.grad_params = GradParams(sqr, var)
        seen = self._seen.setdefault(self.gpu_type, {})  # type: ignore[arg-type]
        key = (len(self.placement), sum(self.placement), cfg.atomic_bsz)
        if key in seen:
            return
        seen[key] = (cfg.step_time, cfg.sync_time)
        pts = np.array([(*k, v[0] - v[1], v[0]) for k, v in seen.items()], dtype=float)
        self._perf[self.gpu_type] = fit_perf_params(*pts.T)  # type: ignore[index]

    def max_profiled_replicas(self, gpu_type: str) -> int:
        """The most GPUs the job has run on with ``gpu_type`` (0: never ran there)."""
        return max((k[1] for k in self._seen.get(gpu_type, {})), default=0)

    def config(self, gpu_type: str, placement: Sequence[int]) -> RigidConfig:
        """The job at its own batch size on a placement (rigid and scale-gpus jobs)."""
        key = (gpu_type, tuple(x for x in placement if x))
        c = self._cfg.get(key)
        if c is None:
            c = self._cfg[key] = rigid_config(self.app(gpu_type), key[1], self.spec.batch_size)
        return c

    # progress ----------------------------------------------------------------------------------

    def step(self, seconds: float) -> None:
        """Train for ``seconds`` on the current placement (the artifact's ``Job.step``)."""
        if self.completion_time is not None:
            return
        if not self.placement:
            self.current_time += seconds
            return
        assert self.gpu_type is not None
        delay = min(self.rescale_time, seconds)
        self.current_time += delay
        n = sum(self.placement)
        self.attained_service += delay * n
        self.rescale_time -= delay
        seconds -= delay
        app = self.app(self.gpu_type)
        if seconds > 0:
            self.service_by_type[self.gpu_type] = self.service_by_type.get(self.gpu_type, 0.0) + seconds
        cf = 1.0 / SLOWDOWN.get(self.spec.app, 1.2)
        adaptive = self.kind == "adaptive"
        observe = self.resizable  # what Sia's policy reads of a resizable job (sim/sia_reference.py)
        while seconds > 0 and self.completion_time is None:
            assert self.epoch < app.max_epochs
            cfg = self._config_now()
            assert cfg.ok, f"{self.name}: no profile for {self.placement} x {self.gpu_type}"
            scale = cfg.batch_size / app.init_batch_size
            sqr, var = app.grad_stats(cfg.batch_size, self.epoch)
            if observe:
                self._observe(cfg, sqr, var)
            gain = (var + sqr) / (var / scale + sqr)
            goodput = gain / cfg.iteration_s * cf
            nxt = app.progress_at(self.epoch + 1)
            if self.progress + goodput * seconds < nxt:
                self.progress += goodput * seconds
                self.current_time += seconds
                self.attained_service += seconds * n
                seconds = 0
            else:
                self.epoch += 1
                delta = round(float((nxt - self.progress) / goodput))
                assert delta <= seconds
                if self.epoch > app.max_epochs - 1:
                    self.completion_time = self.current_time + delta
                self.progress = nxt
                self.current_time += delta
                self.attained_service += delta * n
                seconds -= delta
            if adaptive:
                self._rechoose()
        self.current_time += seconds

    def remaining_s(self, gpu_type: str, placement: Sequence[int]) -> float:
        """Seconds of training left on this placement (no restart, no rounding); an adaptive
        job's at the fastest batch size of each remaining epoch (:meth:`SiaApp.best_cost`)."""
        if self.kind == "adaptive":
            return self._adaptive_remaining_s(gpu_type, placement)
        cfg = self.config(gpu_type, placement)
        if not cfg.ok:
            return math.inf
        app = self.app(gpu_type)
        key = (gpu_type, cfg.batch_size)
        tail = self._remaining.get(key)
        if tail is None:  # tail[e] = sum over epochs k >= e of (progress mark k+1 - mark k) / gain_k
            scale = cfg.batch_size / app.init_batch_size
            per = np.zeros(app.max_epochs + 1)
            for e in range(app.max_epochs):
                sqr, var = app.grad_stats(cfg.batch_size, e)
                gain = (var + sqr) / (var / scale + sqr)
                per[e] = (app.progress_at(e + 1) - app.progress_at(e)) / gain
            tail = self._remaining[key] = np.cumsum(per[::-1])[::-1]
        e = self.epoch
        if e >= app.max_epochs:
            return 0.0
        sqr, var = app.grad_stats(cfg.batch_size, e)
        gain = (var + sqr) / (var / (cfg.batch_size / app.init_batch_size) + sqr)
        work = (app.progress_at(e + 1) - self.progress) / gain + (tail[e + 1] if e + 1 < len(tail) else 0.0)
        return float(work * cfg.iteration_s * SLOWDOWN.get(self.spec.app, 1.2))

    def _adaptive_remaining_s(self, gpu_type: str, placement: Sequence[int]) -> float:
        app = self.app(gpu_type)
        p = tuple(x for x in placement if x)
        key = (gpu_type, p)
        tail = self._remaining.get(key)  # type: ignore[arg-type]
        if tail is None:
            cost = app.best_cost(p)
            marks = np.array([app.progress_at(e) for e in range(app.max_epochs + 1)])
            per = np.append(np.diff(marks) * cost, 0.0)
            with np.errstate(invalid="ignore"):
                tail = self._remaining[key] = np.cumsum(per[::-1])[::-1]  # type: ignore[index]
        e = self.epoch
        if e >= app.max_epochs:
            return 0.0
        cost = app.best_cost(p)
        work = (app.progress_at(e + 1) - self.progress) * cost[e] + tail[e + 1]
        return float(work * SLOWDOWN.get(self.spec.app, 1.2))

    # allocation changes (the artifact's Job.migrate / Job.reallocate) ---------------------------

    def _restart(self) -> None:
        self.rescale_time = float(self.app(self.gpu_type).rescale_time or 30)  # type: ignore[arg-type]
        self.num_restarts = 0 if self.num_restarts is None else self.num_restarts + 1

    def migrate(self, gpu_type: str | None, placement: tuple[int, ...]) -> None:
        self.gpu_type = gpu_type
        if placement:
            self.placement = placement
            self._rechoose()
            self._restart()
            if self.start_time is None:
                self.start_time = self.current_time
        else:
            self.placement = ()

    def reallocate(self, placement: tuple[int, ...]) -> None:
        if placement:
            if placement != self.placement:
                self.placement = placement
                self._rechoose()
                self._restart()
        else:
            self.placement = ()


Allocation = tuple[str, tuple[int, ...]]  # (GPU type, node index per GPU)


class RoundPolicy(Protocol):
    name: str

    def decide(self, sim: "SiaSimulator") -> Mapping[str, Allocation]:
        """Allocations for the next round of the active jobs (absent: no GPUs)."""


def placement_of(nodes: Sequence[int]) -> tuple[int, ...]:
    """GPUs per node from a node index per GPU: runs of equal indices (the artifact's rule)."""
    out: list[int] = []
    for i, n in enumerate(nodes):
        if i == 0 or n != nodes[i - 1]:
            out.append(1)
        else:
            out[-1] += 1
    return tuple(out)


@dataclass
class SiaRun:
    policy: str
    workload: str
    jcts: dict[str, float]
    rounds: int
    restarts: dict[str, int]
    makespan_s: float
    wall_s: float
    decide_s: float = 0.0
    unfinished: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {**jct_summary(self.jcts.values()),
                "makespan_s": self.makespan_s, "unfinished": len(self.unfinished),
                "rounds": self.rounds, "restarts": int(sum(self.restarts.values())),
                "wall_s": round(self.wall_s, 2), "decide_s": round(self.decide_s, 2)}


class SiaSimulator:
    """Sia's round loop (``multi_simulator.py`` / ``Cluster.step``) with a pluggable policy."""

    def __init__(self, specs: Sequence[SiaJobSpec], profiles: SiaProfiles, policy: RoundPolicy,
                 round_s: float = DEFAULT_ROUND_S, cluster: Mapping[str, tuple[str, int, int]] = SIA_CLUSTER,
                 max_rounds: int = 200_000, default_kind: str = "rigid") -> None:
        if round_s <= 0 or round_s != int(round_s):
            raise InputError(f"--round-s {round_s}: Sia's rounds are whole seconds > 0 (60; Gavel's 360)")
        self.jobs = [SiaJob(s, profiles, s.kind(default_kind)) for s in specs]
        self.by_name = {j.name: j for j in self.jobs}
        if len(self.by_name) != len(self.jobs):
            raise InputError("the workload names a job twice")
        self.profiles = profiles
        self.policy = policy
        self.round_s = float(round_s)
        self.cluster = dict(cluster)
        self.types = tuple(self.cluster)
        self.nodes = {t: c[1] for t, c in self.cluster.items()}
        self.per_node = {t: c[2] for t, c in self.cluster.items()}
        self.capacity = {t: c[1] * c[2] for t, c in self.cluster.items()}
        self.now = 0.0
        self.max_rounds = max_rounds
        self.allocations: dict[str, Allocation] = {}
        stuck = [j for j in self.jobs if not self.runnable_types(j)]
        if stuck:
            j = stuck[0]
            raise InputError(f"{len(stuck)} job(s) cannot run on any GPU type of Sia's cluster, e.g. {j.name} "
                             f"({j.spec.app} x{j.spec.num_replicas}, batch {j.spec.batch_size}): a gang larger than "
                             f"{max(self.capacity.values())} GPUs or a placement without a profile")

    def active(self) -> list[SiaJob]:
        return [j for j in self.jobs if j.submission_time <= self.now and j.completion_time is None]

    def runnable_types(self, job: SiaJob) -> dict[str, tuple[int, ...]]:
        """GPU types where the job's gang fits and its packed placement has a profile (a
        resizable job: where one GPU has a profile; the value is that placement)."""
        out = {}
        for t in self.types:
            if job.resizable:  # at least one GPU of the type
                app = job.app(t)
                if app.step_sync((1,), int(app.min_local_bsz))[0] > 0:
                    out[t] = (1,)
                continue
            if job.spec.num_replicas > self.capacity[t]:
                continue
            p = packed_placement(job.spec.num_replicas, self.per_node[t])
            if job.config(t, p).ok:
                out[t] = p
        return out

    def _check(self, allocs: Mapping[str, Allocation]) -> None:
        used: dict[tuple[str, int], int] = {}
        for name, (t, nodes) in allocs.items():
            j = self.by_name.get(name)
            if j is None or j.completion_time is not None or j.submission_time > self.now:
                raise AssertionError(f"policy {self.policy.name} allocated {name}, which is not active")
            assert t in self.nodes, f"{name}: unknown GPU type {t}"
            assert j.resizable or len(nodes) == j.spec.num_replicas, \
                f"{name}: rigid job of {j.spec.num_replicas} given {len(nodes)}"
            for n in nodes:
                assert 0 <= n < self.nodes[t], f"{name}: node {n} of {t}"
                used[(t, n)] = used.get((t, n), 0) + 1
        for (t, n), k in used.items():
            assert k <= self.per_node[t], f"node {n} of {t} over-committed ({k} GPUs)"

    def _apply(self, allocs: Mapping[str, Allocation]) -> None:
        new = {k: (t, tuple(v)) for k, (t, v) in allocs.items() if v}
        for job in self.active():
            old = self.allocations.get(job.name)
            now = new.get(job.name)
            if old == now:
                continue
            t, nodes = now if now is not None else (None, ())
            placement = placement_of(nodes)
            if job.gpu_type != t:
                job.migrate(t, placement)
            else:
                job.reallocate(placement)
        self.allocations = new

    # -- the round rules (hetflow.sim.mechanism.run_rounds drives them) ---------------------

    def finished(self) -> bool:
        return all(j.completion_time is not None for j in self.jobs)

    def end_round(self) -> bool:
        """Every job steps through the round on its allocation; completed jobs free theirs."""
        for j in self.jobs:
            j.step(self.round_s)
        self.now += self.round_s
        self.allocations = {k: v for k, v in self.allocations.items()
                            if self.by_name[k].completion_time is None}
        return True

    def admit(self) -> None:
        """Nothing to do: a job is active from its submission time on (:meth:`active`)."""

    def decide(self) -> dict[str, Allocation] | None:
        return dict(self.policy.decide(self)) if self.active() else None

    def start_round(self, allocs: dict[str, Allocation]) -> None:
        self._check(allocs)
        self._apply(allocs)

    def run(self) -> SiaRun:
        stats = run_rounds(self, self.max_rounds)
        jcts = {j.name: j.completion_time - j.submission_time for j in self.jobs if j.completion_time is not None}
        done = [j.completion_time for j in self.jobs if j.completion_time is not None]
        first = min((j.submission_time for j in self.jobs), default=0.0)
        return SiaRun(getattr(self.policy, "name", "?"), "", jcts, stats.rounds,
                      {j.name: j.num_restarts or 0 for j in self.jobs},
                      (max(done) - first) if done else 0.0, stats.wall_s, stats.decide_s,
                      [j.name for j in self.jobs if j.completion_time is None])


# -- policies ---------------------------------------------------------------------------------------


class ReplayPolicy:
    """Replays a reference run's allocations, round by round (a log of the artifact's
    simulator reduced to ``{round time: {job: (sia cluster, node ids)}}`` changes)."""

    name = "replay"

    def __init__(self, changes: Mapping[float, Mapping[str, Any]]) -> None:
        self.changes = {float(k): v for k, v in changes.items()}
        self.current: dict[str, Allocation] = {}

    def decide(self, sim: SiaSimulator) -> dict[str, Allocation]:
        for name, alloc in self.changes.get(sim.now, {}).items():
            if not alloc:
                self.current.pop(name, None)
            else:
                cluster, nodes = alloc
                self.current[name] = (TYPE_OF_SIA.get(cluster, cluster), tuple(nodes))
        active = {j.name for j in sim.active()}
        return {k: v for k, v in self.current.items() if k in active}
