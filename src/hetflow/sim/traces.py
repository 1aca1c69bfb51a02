"""Job traces for the simulator: real formats and a seeded synthetic generator.

Formats (``load_trace`` detects them by content):

- **Gavel** (``*.trace``): tab-separated, one job per line, 7 columns (older: job type,
  command, step-argument name, needs-data-dir, total steps, arrival s, scale factor; rows with
  scale factor 0 are skipped) or 10 columns (job type, command, working directory,
  step-argument name, needs-data-dir, total steps, scale factor, priority weight, SLO (-1 =
  none), arrival s). The 0-based line number is the job id. Work is in steps. hetflow's
  elastic extension: 13 columns, the 10 and then ``min_gpus``, ``max_gpus``, ``scaling`` (empty
  or ``-``: rigid, or the default curve; see below).
- **Philly** job log CSV (``timestamp,duration,num_gpus,...``): arrival = seconds after the
  first submission. Durations become work by drawing a job type per job (seeded) from a
  throughput model and multiplying by its speed on a reference device type, as Gavel derived
  its Philly traces; without a model the jobs are fixed-duration (same speed everywhere).
  Optional columns ``min_gpus,max_gpus,scaling`` make a row elastic (empty: rigid).
- **Alibaba openb** pod list CSV (``name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,...``):
  shared-GPU requests with CPU and memory, fixed-duration (deletion - creation); and
  ``openb_packing_jobs`` for the fragmentation experiment (requests that never leave, arriving
  until they exceed the cluster). The node list CSV is a cluster: ``load_openb_nodes``.
- **Synthetic** (``synthetic_trace``): Poisson arrivals, Gavel's heavy-tailed durations
  (10^U(1.5,3) minutes with p=0.8, else 10^U(3,4) minutes, on a reference device type), gang
  sizes 1/2/4/8 with p=.70/.10/.15/.05 (Philly-like, as Gavel's generator) or always 1, and job
  types uniform over the throughput model's types. Seeded and reproducible.

**Elastic fields** (Gavel's 13-column layout, Philly's optional columns): ``min_gpus`` and
``max_gpus`` with ``1 <= min_gpus <= num_gpus <= max_gpus`` (num_gpus: the declared gang, the
scale factor in Gavel's files), and ``scaling``, a curve of :mod:`hetflow.scheduling.elastic`
(``eff:0.85``, ``table`` or ``1:1,2:1.8,4:3.2``; empty: ``eff:0.85``). Traces without them can
have a seeded share of jobs made elastic (``hetflow.scheduling.elastic.mark_elastic``,
``hetflow simulate --elastic-fraction``).

Every malformed row raises :class:`~hetflow.core.errors.ParseError` naming the file and line.
A file named ``*.gz`` or ``*.xz`` is read decompressed, in every format (:mod:`hetflow.sim.textio`).
"""

from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Sequence

from hetflow.core.errors import InputError, ParseError
from hetflow.core.topology import ClusterSnapshot, Device, NodeTopology, Vendor
from hetflow.scheduling.elastic import DEFAULT_SCALING, RANGE_RULE, elastic_sizes, parse_scaling, range_error
from hetflow.scheduling.throughput import (
    FIXED_DURATION,
    SpecLookup,
    ThroughputModel,
    canonical_device_type,
    catalog_spec,
)
from hetflow.sim.textio import open_text, read_lines

WHOLE = 1000


@dataclass(frozen=True)
class Job:
    """One job of a trace. ``total_work`` is in the throughput model's steps (seconds for
    fixed-duration jobs); ``math.inf`` means it runs until the simulation ends."""

    job_id: str
    job_type: str
    arrival_s: float
    num_gpus: int
    total_work: float
    weight: float = 1.0
    preemptible: bool = True
    restore_s: float | None = None  # checkpoint-restore cost; None: the simulation's default
    gpu_milli: int = WHOLE  # share of each device in thousandths (< 1000: a shared GPU)
    cpu_milli: int = 0
    memory_mib: int = 0
    allowed_types: frozenset[str] | None = None  # None: any device type
    memory_bytes: int | None = None  # device memory needed per device, when known
    slo_s: float | None = None
    min_gpus: int | None = None  # elastic jobs: the device range (both set, or neither)
    max_gpus: int | None = None
    scaling: str | None = None  # elastic jobs: the scaling curve (hetflow.scheduling.elastic)

    def __post_init__(self) -> None:
        if self.num_gpus < 0 or not 0 < self.gpu_milli <= WHOLE:
            raise InputError(f"job {self.job_id}: bad GPU request {self.num_gpus} x {self.gpu_milli} milli")
        if self.gpu_milli < WHOLE and self.num_gpus != 1:
            raise InputError(f"job {self.job_id}: a GPU share (gpu_milli < 1000) needs num_gpus == 1")
        if not self.total_work > 0 or self.arrival_s < 0 or self.weight <= 0:
            raise InputError(f"job {self.job_id}: work, arrival and weight must be positive")
        if (self.min_gpus is None) != (self.max_gpus is None):
            raise InputError(f"job {self.job_id}: give both min_gpus and max_gpus, or neither")
        if self.max_gpus is not None:
            bad = range_error(self.num_gpus, self.min_gpus, self.max_gpus)  # type: ignore[arg-type]
            if bad:
                raise InputError(f"job {self.job_id}: {bad}")
            if self.min_gpus != self.max_gpus and (self.gpu_milli < WHOLE or self.cpu_milli or self.memory_mib
                                                   or not self.preemptible):
                raise InputError(f"job {self.job_id}: only preemptible whole-GPU jobs without host "
                                 f"resources can be elastic")
            if not parse_scaling(self.scaling or DEFAULT_SCALING).covers(self.min_gpus, self.max_gpus):
                raise InputError(f"job {self.job_id}: scaling {self.scaling!r} does not cover "
                                 f"{self.min_gpus}..{self.max_gpus} devices")

    @property
    def sizes(self) -> tuple[int, ...]:
        """Device counts it may run at: one (its gang) unless it is elastic."""
        if self.max_gpus is None or self.min_gpus == self.max_gpus:
            return (self.num_gpus,)
        return elastic_sizes(self.min_gpus, self.max_gpus, self.num_gpus)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Trace:
    jobs: tuple[Job, ...]
    format: str  # "gavel-7", "gavel-10", "philly", "openb", "synthetic"
    source: str

    def window(self, start: int, stop: int) -> tuple[Job, ...]:
        """Jobs by arrival index (Gavel's steady-state measurement window)."""
        return self.jobs[start:stop]


def _sorted(jobs: Iterable[Job]) -> tuple[Job, ...]:
    return tuple(sorted(jobs, key=lambda j: j.arrival_s))  # stable: file order on ties


def _read_lines(path: Path) -> list[str]:
    return read_lines(path)  # .gz/.xz decompressed (hetflow.sim.textio)


# ---------------------------------------------------------------------------------- Gavel


def _number(text: str, kind: type, what: str, path: Path, line: int):
    try:
        value = kind(text)
    except ValueError:
        kind_name = "an integer" if kind is int else "a number"
        raise ParseError(str(path), f"{what} {text!r} is not {kind_name}", line) from None
    if isinstance(value, float) and not math.isfinite(value):
        raise ParseError(str(path), f"{what} {text!r} is not finite", line)
    return value


def load_gavel_trace(path: str | Path) -> Trace:
    """A Gavel trace, 7 or 10 tab-separated columns (decided by the first line)."""
    p = Path(path)
    lines = _read_lines(p)
    rows = [(i, line) for i, line in enumerate(lines) if line.strip()]
    if not rows:
        raise ParseError(str(p), "empty trace")
    width = len(rows[0][1].split("\t"))
    if width not in (7, 10, 13):
        raise ParseError(str(p), f"{width} tab-separated columns; Gavel traces have 7 or 10 (13: with "
                                 f"min_gpus, max_gpus, scaling)", rows[0][0] + 1)
    jobs = []
    for i, line in rows:
        cols = line.split("\t")
        n = i + 1
        if len(cols) != width:
            raise ParseError(str(p), f"{len(cols)} columns where the file has {width}", n)
        if width == 7:
            job_type, _, _, _, steps, arrival, scale = cols
            weight, slo = "1", "-1"
        else:
            job_type, _, _, _, _, steps, scale, weight, slo, arrival = cols[:10]
        total = _number(steps, int, "total steps", p, n)
        k = _number(scale, int, "scale factor", p, n)
        t = _number(arrival, float, "arrival time", p, n)
        w = _number(weight, float, "priority weight", p, n)
        s = _number(slo, float, "SLO", p, n)
        if k == 0:
            continue  # Gavel skips jobs without GPUs
        if total <= 0 or k < 0 or t < 0 or w <= 0:
            raise ParseError(str(p), "steps and scale factor must be > 0, arrival >= 0, weight > 0", n)
        if not job_type:
            raise ParseError(str(p), "empty job type", n)
        extra = _elastic_fields(p, n, k, *cols[10:]) if width == 13 else {}
        jobs.append(Job(str(i), job_type, t, k, float(total), weight=w, slo_s=None if s < 0 else s, **extra))
    return Trace(_sorted(jobs), f"gavel-{width}", str(p))


ELASTIC_COLUMNS = ("min_gpus", "max_gpus", "scaling")


def _elastic_fields(p: Path, n: int, num_gpus: int, lo: str | None, hi: str | None,
                    scaling: str | None) -> dict:
    """A row's elastic fields (empty or ``-``: none) as Job keyword arguments, checked."""
    blank = lambda v: v is None or v.strip() in ("", "-")  # noqa: E731
    if blank(lo) and blank(hi):
        if not blank(scaling):
            raise ParseError(str(p), "scaling given without min_gpus and max_gpus", n)
        return {}
    if blank(lo) or blank(hi):
        raise ParseError(str(p), f"give both min_gpus and max_gpus (or neither); {RANGE_RULE}", n)
    lo_n = _number(lo.strip(), int, "min_gpus", p, n)  # type: ignore[union-attr]
    hi_n = _number(hi.strip(), int, "max_gpus", p, n)  # type: ignore[union-attr]
    bad = range_error(num_gpus, lo_n, hi_n)
    if bad:
        raise ParseError(str(p), bad, n)
    curve = None if blank(scaling) else scaling.strip()  # type: ignore[union-attr]
    try:
        parsed = parse_scaling(curve or DEFAULT_SCALING)
    except InputError as e:
        raise ParseError(str(p), str(e), n) from None
    if not parsed.covers(lo_n, hi_n):
        raise ParseError(str(p), f"scaling {curve!r} does not cover {lo_n}..{hi_n} devices", n)
    return {"min_gpus": lo_n, "max_gpus": hi_n, "scaling": curve}


# ---------------------------------------------------------------------------------- Philly

PHILLY_COLUMNS = ("timestamp", "duration", "num_gpus")


def _draw_type(rng: random.Random, model: ThroughputModel, types: Sequence[str], num_gpus: int,
               reference: Sequence[str]) -> tuple[str, float] | None:
    """A job type (uniform) that runs at this gang size on a reference type, with that rate."""
    usable = []
    for jt in types:
        rate = next((r for r in (model.rate(jt, num_gpus, dt) for dt in reference) if r > 0), 0.0)
        if rate > 0:
            usable.append((jt, rate))
    return rng.choice(usable) if usable else None


def load_philly_csv(path: str | Path, model: ThroughputModel | None = None,
                    reference_types: Sequence[str] = ("V100-16GB",), seed: int = 0,
                    limit: int | None = None) -> Trace:
    """Philly's job log. See the module docstring for how durations become work."""
    p = Path(path)
    rng = random.Random(seed)
    types = [t for t in (model.job_types() if model else ()) if t != FIXED_DURATION]
    raw: list[tuple[float, float, int, int, dict]] = []
    try:
        f = open_text(p, newline="")
    except OSError as e:
        raise InputError(f"{p}: cannot read ({e.strerror})") from None
    with f:
        reader = csv.DictReader(f)
        missing = [c for c in PHILLY_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ParseError(str(p), f"missing columns {missing}; a Philly log has {','.join(PHILLY_COLUMNS)}", 1)
        for row in reader:
            n = reader.line_num
            try:
                stamp = datetime.strptime(row["timestamp"].strip(), "%Y-%m-%d %H:%M:%S")
                when = stamp.replace(tzinfo=timezone.utc).timestamp()  # no local-time DST shifts
            except (ValueError, AttributeError):
                raise ParseError(str(p), f"timestamp {row['timestamp']!r} is not YYYY-MM-DD HH:MM:SS", n) from None
            duration = _number(row["duration"] or "", float, "duration", p, n)
            gpus = _number(row["num_gpus"] or "", int, "num_gpus", p, n)
            if duration <= 0 or gpus < 0:
                raise ParseError(str(p), f"duration must be > 0 and num_gpus >= 0, got {duration}, {gpus}", n)
            if gpus == 0:
                continue
            extra = _elastic_fields(p, n, gpus, *(row.get(c) for c in ELASTIC_COLUMNS))
            raw.append((when, duration, gpus, n, extra))
            if limit is not None and len(raw) >= limit:
                break
    if not raw:
        raise ParseError(str(p), "no jobs with GPUs")
    raw.sort()
    start = raw[0][0]
    jobs = []
    for when, duration, gpus, n, extra in raw:
        job_type, work = FIXED_DURATION, duration
        if types:
            drawn = _draw_type(rng, model, types, gpus, reference_types)  # type: ignore[arg-type]
            if drawn is None:
                raise InputError(f"{p}:{n}: no job type of the throughput model runs on {gpus} GPUs "
                                 f"of {', '.join(reference_types)}")
            job_type, rate = drawn
            work = duration * rate
        jobs.append(Job(f"philly-{n}", job_type, when - start, gpus, work, **extra))
    return Trace(_sorted(jobs), "philly", str(p))


# ---------------------------------------------------------------------------------- Alibaba

OPENB_NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
OPENB_POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec",
                     "creation_time", "deletion_time")


def _csv_rows(path: Path, columns: Sequence[str], what: str) -> Iterable[tuple[int, dict[str, str]]]:
    try:
        f = open_text(path, newline="")
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror})") from None
    with f:
        reader = csv.DictReader(f)
        missing = [c for c in columns if c not in (reader.fieldnames or [])]
        if missing:
            raise ParseError(str(path), f"missing columns {missing}; {what} has {','.join(columns)}", 1)
        for row in reader:
            if None in row.values() or None in row:
                raise ParseError(str(path), f"{len([v for v in row.values() if v is not None])} fields "
                                            f"where the header has {len(reader.fieldnames or [])}", reader.line_num)
            yield reader.line_num, row


def load_openb_nodes(path: str | Path, lookup: SpecLookup = catalog_spec, gpu_only: bool = True) -> ClusterSnapshot:
    """Alibaba's openb node list as a cluster. Device models go through the catalog (V100M16
    -> V100-16GB); the undisclosed G1-G3 codes stay device types of their own. Links are not
    in the data: the simulator assumes PCIe between a node's GPUs."""
    p = Path(path)
    nodes = []
    for n, row in _csv_rows(p, OPENB_NODE_COLUMNS, "an openb node list"):
        cpu = _number(row["cpu_milli"], int, "cpu_milli", p, n)
        mem = _number(row["memory_mib"], int, "memory_mib", p, n)
        gpus = _number(row["gpu"], int, "gpu", p, n)
        if cpu < 0 or mem < 0 or gpus < 0:
            raise ParseError(str(p), "cpu_milli, memory_mib and gpu must be >= 0", n)
        if cpu % 1000:
            raise ParseError(str(p), f"cpu_milli {cpu} is not whole cores (a node's CPU is counted in cores)", n)
        model = row["model"].strip()
        if gpus and not model:
            raise ParseError(str(p), f"node {row['sn']} has {gpus} GPUs but no model", n)
        if gpu_only and not gpus:
            continue
        device_type = canonical_device_type(model, lookup) if gpus else None
        spec = lookup(device_type) if device_type else None
        devices = tuple(Device(i, Vendor.NVIDIA, model=device_type, name=model,
                               memory_bytes=spec.memory_bytes if spec else None) for i in range(gpus))
        nodes.append(NodeTopology(row["sn"], devices, cpu_cores=cpu // 1000, host_memory_bytes=mem * 2**20,
                                  sources=(f"{p.name}:{n}",)))
    if not nodes:
        raise ParseError(str(p), "no GPU nodes")
    return ClusterSnapshot(tuple(nodes))


def _openb_request(p: Path, n: int, row: dict[str, str],
                   lookup: SpecLookup) -> tuple[int, int, int, int, frozenset[str] | None]:
    cpu = _number(row["cpu_milli"], int, "cpu_milli", p, n)
    mem = _number(row["memory_mib"], int, "memory_mib", p, n)
    gpus = _number(row["num_gpu"], int, "num_gpu", p, n)
    milli = _number(row["gpu_milli"], int, "gpu_milli", p, n)
    if cpu < 0 or mem < 0 or gpus < 0 or milli < 0 or milli > WHOLE:
        raise ParseError(str(p), "cpu_milli, memory_mib, num_gpu >= 0 and 0 <= gpu_milli <= 1000", n)
    if gpus == 0:
        milli = WHOLE
    elif gpus > 1 and milli != WHOLE:
        raise ParseError(str(p), f"{gpus} GPUs with gpu_milli {milli}: only one GPU can be shared", n)
    elif milli == 0:
        raise ParseError(str(p), "a GPU request with gpu_milli 0", n)
    spec = row["gpu_spec"].strip()
    allowed = frozenset(canonical_device_type(s, lookup) for s in spec.split("|") if s) if spec else None
    return gpus, milli, cpu, mem, allowed


def load_openb_pods(path: str | Path, lookup: SpecLookup = catalog_spec) -> Trace:
    """Alibaba's openb pod list: fixed-duration jobs (deletion - creation seconds, at least 1),
    arriving at their creation time, not preemptible."""
    p = Path(path)
    jobs = []
    for n, row in _csv_rows(p, OPENB_POD_COLUMNS, "an openb pod list"):
        gpus, milli, cpu, mem, allowed = _openb_request(p, n, row, lookup)
        created = _number(row["creation_time"], float, "creation_time", p, n)
        deleted = _number(row["deletion_time"], float, "deletion_time", p, n)
        if created < 0:
            raise ParseError(str(p), "creation_time must be >= 0", n)
        jobs.append(Job(row["name"], FIXED_DURATION, created, gpus, max(deleted - created, 1.0),
                        preemptible=False, gpu_milli=milli, cpu_milli=cpu, memory_mib=mem,
                        allowed_types=allowed))
    if not jobs:
        raise ParseError(str(p), "no pods")
    return Trace(_sorted(jobs), "openb", str(p))


def openb_packing_jobs(pods: Sequence[Job], capacity_gpus: float, overload: float = 1.3,
                       seed: int = 0, spacing_s: float = 1.0) -> tuple[Job, ...]:
    """The fragmentation experiment's arrivals (Weng et al., ATC'23): pods in trace order, then
    pods drawn at random (seeded) from the trace, one every ``spacing_s``, never leaving, until
    the GPUs they ask for reach ``overload`` x the cluster's GPUs."""
    if not pods:
        raise InputError("no pods to replay")
    rng = random.Random(seed)
    out: list[Job] = []
    asked = 0.0
    i = 0
    while asked < overload * capacity_gpus:
        base = pods[i] if i < len(pods) else rng.choice(pods)
        out.append(replace(base, job_id=f"{base.job_id}#{i}", arrival_s=i * spacing_s,
                           total_work=math.inf, preemptible=False))
        asked += base.num_gpus * base.gpu_milli / WHOLE
        i += 1
        if i > 100 * max(len(pods), 1):
            raise InputError("the pods ask for almost no GPUs; the cluster never fills")
    return tuple(out)


# ---------------------------------------------------------------------------------- synthetic

GANG_SIZES = ((1, 0.70), (2, 0.10), (4, 0.15), (8, 0.05))


MAX_SYNTHETIC_JOBS = 1_000_000
"""The most jobs a synthetic trace draws (the public traces have up to about 100,000)."""


def synthetic_trace(model: ThroughputModel, num_jobs: int, jobs_per_hour: float, seed: int = 0,
                    reference_types: Sequence[str] = ("V100-16GB",), multi_gpu: bool = True,
                    job_types: Sequence[str] | None = None, restore_s: float | None = None) -> Trace:
    """Gavel-style synthetic trace (see the module docstring). Durations are drawn on the first
    reference type where the job runs and converted to steps with that type's rate."""
    if num_jobs <= 0 or jobs_per_hour <= 0:
        raise InputError("a synthetic trace needs jobs > 0 and a rate > 0 jobs/hour")
    if num_jobs > MAX_SYNTHETIC_JOBS:
        raise InputError(f"a synthetic trace of {num_jobs:,} jobs is past the {MAX_SYNTHETIC_JOBS:,} it draws; "
                         "lower jobs=")
    rng = random.Random(seed)
    types = [t for t in (job_types or model.job_types()) if t != FIXED_DURATION]
    if not types:
        raise InputError("the throughput model has no job types to draw from")
    t = 0.0
    jobs = []
    for i in range(num_jobs):
        if i:
            t += rng.expovariate(jobs_per_hour / 3600.0)
        gpus = 1
        if multi_gpu:
            u, acc = rng.random(), 0.0
            for size, prob in GANG_SIZES:
                acc += prob
                if u < acc:
                    gpus = size
                    break
            else:
                gpus = GANG_SIZES[-1][0]
        drawn = _draw_type(rng, model, types, gpus, reference_types)
        if drawn is None:
            raise InputError(f"no job type runs on {gpus} GPUs of {', '.join(reference_types)}")
        job_type, rate = drawn
        lo, hi = (1.5, 3.0) if rng.random() < 0.8 else (3.0, 4.0)
        minutes = 10 ** rng.uniform(lo, hi)
        jobs.append(Job(str(i), job_type, t, gpus, minutes * 60.0 * rate, restore_s=restore_s))
    return Trace(tuple(jobs), "synthetic", f"synthetic(seed={seed}, {num_jobs} jobs, {jobs_per_hour}/h)")


SYNTHETIC_KEYS = {"jobs": int, "rate": float, "seed": int, "multi_gpu": int}


def parse_synthetic_spec(text: str) -> dict[str, float | int]:
    """``synthetic:jobs=1000,rate=4,seed=0,multi_gpu=1`` -> keyword arguments (unknown keys are
    an error)."""
    body = text.partition(":")[2]
    out: dict[str, float | int] = {}
    for part in filter(None, (s.strip() for s in body.split(","))):
        key, eq, value = part.partition("=")
        if not eq or key not in SYNTHETIC_KEYS:
            raise InputError(f"synthetic trace option {part!r}: use {', '.join(k + '=' for k in SYNTHETIC_KEYS)}")
        try:
            out[key] = SYNTHETIC_KEYS[key](value)
        except ValueError:
            raise InputError(f"synthetic trace option {key}={value!r} is not a number") from None
    return out


# ---------------------------------------------------------------------------------- detection


def detect_format(path: Path) -> str:
    """"gavel", "philly", "openb-pods" or "openb-nodes", from the file's first line."""
    try:
        with open_text(path, errors="replace") as f:
            first = f.readline()
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror})") from None
    header = [c.strip() for c in first.strip().split(",")]
    if "\t" in first:
        return "gavel"
    if all(c in header for c in PHILLY_COLUMNS):
        return "philly"
    if all(c in header for c in ("num_gpu", "gpu_milli")):
        return "openb-pods"
    if all(c in header for c in OPENB_NODE_COLUMNS):
        return "openb-nodes"
    raise InputError(f"{path}: not a trace hetflow knows (Gavel .trace, Philly CSV, openb pod CSV, "
                     f"or synthetic:jobs=N,rate=R,seed=S)")


def load_trace(spec: str, model: ThroughputModel, reference_types: Sequence[str] = ("V100-16GB",),
               lookup: SpecLookup = catalog_spec, seed: int = 0) -> Trace:
    """A trace from a path (format detected) or a ``synthetic:...`` spec."""
    if spec.startswith("synthetic:") or spec == "synthetic":
        opts = parse_synthetic_spec(spec)
        return synthetic_trace(model, int(opts.get("jobs", 1000)), float(opts.get("rate", 4.0)),
                               int(opts.get("seed", seed)), reference_types,
                               multi_gpu=bool(opts.get("multi_gpu", 1)))
    p = Path(spec)
    if not p.is_file():
        raise InputError(f"{p}: no such trace file")
    fmt = detect_format(p)
    if fmt == "gavel":
        return load_gavel_trace(p)
    if fmt == "philly":
        return load_philly_csv(p, model, reference_types, seed)
    if fmt == "openb-pods":
        return load_openb_pods(p, lookup)
    raise InputError(f"{p}: this is an openb node list; pass it as --cluster, not --trace")
