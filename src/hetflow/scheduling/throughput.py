"""How fast each job type runs on each device type: measured tables and a catalog roofline.

A :class:`ThroughputModel` answers one question::

    rate(job_type, num_gpus, device_type, group_gbps, spans_nodes) -> steps per second

for a job of ``num_gpus`` devices (a gang, all of one type). ``group_gbps`` is the collective
bandwidth of the placement (:func:`group_bandwidth`: the slowest device's links inside the
group, at most the network when the group spans nodes); ``spans_nodes`` says whether it does.
0.0 means "does not run there" (does not fit in memory, or was never measured and cannot be
estimated).

Three models, all data-driven:

- :class:`MeasuredThroughputs` - a table read from a file: Gavel's
  ``simulation_throughputs.json`` (``load_gavel_throughputs``) or a CSV
  (``job_type,num_gpus,device_type,steps_per_s[,cross_node_steps_per_s]``). A measured number is
  the rate inside one node; the cross-node ("unconsolidated") number, when present, is the rate
  over the reference network, and a gang spanning nodes at another network speed gets
  step time = 1/rate + (1/cross - 1/rate) x reference / bandwidth (the communication part
  scales with the network).
- :class:`RooflineThroughputs` - estimated from the accelerator catalog and a
  :class:`JobProfile` (FLOPs, memory traffic and gradient bytes per device per step):
  step time = max(FLOPs / peak compute, bytes / memory bandwidth) + ring all-reduce time over
  the group's bandwidth. Jobs whose memory does not fit a device get 0 there.
- :class:`FixedDurationThroughputs` - for traces that give durations, not work (Philly's log,
  Alibaba's pods): every device runs the job at 1 "second of work" per second.

:class:`CompositeThroughputs` asks several models in order (first that knows the job type).
Device types are canonical catalog names (:func:`canonical_device_type`).
"""

from __future__ import annotations

import ast
import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping, Protocol, Sequence

from hetflow.accelerators.spec import AcceleratorSpec
from hetflow.core.errors import InputError, ParseError
from hetflow.core.topology import LinkKind, NodeTopology

#: Job type of jobs whose work is given as seconds of run time (see FixedDurationThroughputs).
FIXED_DURATION = "fixed-duration"

# Trace-specific spellings of device types, before the catalog canonicalises them: Gavel's
# lower-case keys and Alibaba's openb model codes. Data about the trace formats, not logic.
TRACE_SPELLINGS: Mapping[str, str] = {
    "v100": "V100-16GB",  # Gavel measured on AWS p3 (V100 SXM2 16 GB)
    "p100": "P100",
    "k80": "K80",
    "V100M16": "V100-16GB",
    "V100M32": "V100-32GB",
}

SpecLookup = Callable[[str], "AcceleratorSpec | None"]


def catalog_spec(name: str) -> AcceleratorSpec | None:
    """The catalog row for ``name`` (any alias), or None when the catalog does not know it."""
    try:
        from hetflow.accelerators.catalog import default_catalog
    except ImportError:  # the catalog module is optional for measured-only simulations
        return None
    try:
        return default_catalog().lookup(name)
    except (LookupError, ValueError, InputError):
        return None


def canonical_device_type(name: str, lookup: SpecLookup = catalog_spec) -> str:
    """Canonical catalog name for a device type as a trace spells it; unknown names stay as given
    (Alibaba's undisclosed G2/G3 codes are device types of their own)."""
    spelled = TRACE_SPELLINGS.get(name, TRACE_SPELLINGS.get(name.lower(), name))
    spec = lookup(spelled)
    return spec.name if spec is not None else spelled


class ThroughputModel(Protocol):
    """Speed of a job type on a device type. Implementations are immutable and pure."""

    def knows(self, job_type: str) -> bool:
        """True when this model has numbers (or can estimate them) for ``job_type``."""

    def job_types(self) -> tuple[str, ...]:
        """The job types this model can be asked about (for trace generators)."""

    def rate(
        self,
        job_type: str,
        num_gpus: int,
        device_type: str,
        group_gbps: float = math.inf,
        spans_nodes: bool = False,
    ) -> float:
        """Steps per second of the whole gang; 0.0 when the job cannot run on that type."""


def ring_allreduce_s(num_gpus: int, nbytes: float, gbps: float) -> float:
    """Seconds for a ring all-reduce of ``nbytes`` over ``num_gpus`` devices at ``gbps`` GB/s."""
    if num_gpus <= 1 or nbytes <= 0:
        return 0.0
    if gbps <= 0:
        return math.inf
    return 2.0 * (num_gpus - 1) / num_gpus * nbytes / (gbps * 1e9)


# Link kinds whose pair bandwidth is a dedicated point-to-point link: a device talks to several
# peers at once, each at the pair's speed. Through a switch (NVSwitch) or over PCIe the pair
# bandwidth is the device's whole port, shared by all its peers.
_DEDICATED = {LinkKind.NVLINK, LinkKind.XGMI, LinkKind.SAME_PACKAGE}


def group_bandwidth(node: NodeTopology, devices: Sequence[int]) -> float:
    """Collective bandwidth (GB/s per device) of a group of devices inside one node.

    When every pair of the group is joined by a dedicated link (an xGMI mesh, directly
    NVLinked GPUs), a device drives all its links at once: its bandwidth is the sum of its links
    to the other members, and the group runs at its slowest device. Otherwise - a switch port
    (NVSwitch) or PCIe between some pair - the group runs at its weakest pair, as a ring through
    that pair would (and as the placement planner's tensor-parallel bottleneck counts it). So
    one PCIe-only pair slows a whole NVLink group. A single device has infinite bandwidth.
    """
    if len(devices) <= 1:
        return math.inf
    weakest = math.inf
    all_dedicated = True
    sums = {a: 0.0 for a in devices}
    for i, a in enumerate(devices):
        for b in devices[i + 1:]:
            link = node.link(a, b)
            bw = node.bandwidth(a, b)
            weakest = min(weakest, bw)
            if link is None or link.kind not in _DEDICATED:
                all_dedicated = False
            sums[a] += bw
            sums[b] += bw
    return min(sums.values()) if all_dedicated else weakest


# ---------------------------------------------------------------------------- measured tables


@dataclass(frozen=True)
class _Measured:
    rate: float  # steps/s at the ideal placement (Gavel: "consolidated")
    cross_node_rate: float | None  # steps/s measured across nodes (Gavel: "unconsolidated")


@dataclass(frozen=True)
class MeasuredThroughputs:
    """A measured job-type x device-type table.

    Rates hold for a gang inside one node (links inside a node are not told apart: the table
    does not say which they were). ``cross_node_ref_gbps`` is the network the cross-node numbers
    were measured on; a gang spanning nodes gets step time 1/rate + (1/cross - 1/rate) x
    ref / bandwidth, exactly the cross-node number on the reference network, and no penalty
    when no cross-node number was measured. Gang sizes that were not measured scale linearly
    from the largest measured size below them (Gavel's table stops at 8 GPUs).
    """

    entries: Mapping[tuple[str, int, str], _Measured]
    cross_node_ref_gbps: float = 3.125  # 25 Gb/s Ethernet, as on the AWS instances Gavel used
    source: str = ""
    _types: frozenset[str] = field(init=False, repr=False, compare=False)
    _sizes: Mapping[str, tuple[int, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_types", frozenset(k[0] for k in self.entries))
        object.__setattr__(self, "_sizes", {t: tuple(sorted({k[1] for k in self.entries if k[0] == t}))
                                            for t in self._types})

    def knows(self, job_type: str) -> bool:
        return job_type in self._types

    def job_types(self) -> tuple[str, ...]:
        return tuple(sorted(self._types))

    def device_types(self) -> tuple[str, ...]:
        return tuple(sorted({k[2] for k in self.entries}))

    def scale_factors(self, job_type: str) -> tuple[int, ...]:
        return self._sizes.get(job_type, ())

    def measured(self, job_type: str, num_gpus: int, device_type: str) -> float:
        """The isolated ideal-placement rate as measured (0.0 when absent)."""
        m = self.entries.get((job_type, num_gpus, device_type))
        return m.rate if m else 0.0

    def _lookup(self, job_type: str, num_gpus: int, device_type: str) -> tuple[_Measured, float] | None:
        m = self.entries.get((job_type, num_gpus, device_type))
        if m is not None:
            return m, 1.0
        below = [k for k in self.scale_factors(job_type) if k < num_gpus]
        if not below:
            return None
        base = self.entries.get((job_type, below[-1], device_type))
        return (base, num_gpus / below[-1]) if base is not None else None

    def rate(
        self,
        job_type: str,
        num_gpus: int,
        device_type: str,
        group_gbps: float = math.inf,
        spans_nodes: bool = False,
    ) -> float:
        found = self._lookup(job_type, num_gpus, device_type)
        if found is None:
            return 0.0
        m, scale = found
        if m.rate <= 0:
            return 0.0
        if not spans_nodes or m.cross_node_rate is None or num_gpus <= 1:
            return m.rate * scale
        slow = min(m.cross_node_rate, m.rate)  # a faster "slow" measurement is noise: no gain
        if slow <= 0 or group_gbps <= 0:
            return 0.0
        comm = (1.0 / slow - 1.0 / m.rate) * self.cross_node_ref_gbps / group_gbps
        return scale / (1.0 / m.rate + comm)


def _gavel_key(text: str, source: str) -> tuple[str, int]:
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        value = None
    if not (isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str)
            and isinstance(value[1], int) and value[1] > 0):
        raise ParseError(source, f"key {text!r} is not \"('<job type>', <scale factor>)\"")
    return value[0], value[1]


def load_gavel_throughputs(path: str | Path, lookup: SpecLookup = catalog_spec) -> MeasuredThroughputs:
    """Gavel's ``simulation_throughputs.json``: ``{worker: {"('job', k)": {"null": rate, ...}}}``.

    ``<worker>_unconsolidated`` keys give the cross-node rates. Only the isolated ("null")
    numbers are used; co-location pairs are ignored (hetflow does not pack two training jobs
    on one GPU).
    """
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise ParseError(str(p), f"not a readable JSON throughput file ({e})") from None
    if not isinstance(data, dict) or not data:
        raise ParseError(str(p), "expected an object keyed by worker type (v100, p100, ...)")
    consolidated: dict[tuple[str, int, str], float] = {}
    cross: dict[tuple[str, int, str], float] = {}
    for worker, table in data.items():
        if not isinstance(table, dict):
            raise ParseError(str(p), f"worker {worker!r}: expected an object of job keys")
        base, _, suffix = worker.partition("_")
        if suffix not in ("", "unconsolidated"):
            raise ParseError(str(p), f"worker {worker!r}: unknown suffix {suffix!r}")
        device_type = canonical_device_type(base, lookup)
        target = cross if suffix else consolidated
        for key, entry in table.items():
            job_type, k = _gavel_key(key, str(p))
            if not isinstance(entry, dict) or "null" not in entry:
                raise ParseError(str(p), f"{worker} / {key}: expected an object with a \"null\" rate")
            rate = entry["null"]
            if not isinstance(rate, (int, float)) or rate < 0 or not math.isfinite(rate):
                raise ParseError(str(p), f"{worker} / {key}: rate {rate!r} is not a number >= 0")
            target[(job_type, k, device_type)] = float(rate)
    entries = {key: _Measured(rate, cross.get(key)) for key, rate in consolidated.items()}
    if not entries:
        raise ParseError(str(p), "no consolidated worker table (v100, p100, ...) found")
    return MeasuredThroughputs(entries, source=str(p))


CSV_COLUMNS = ("job_type", "num_gpus", "device_type", "steps_per_s")


def load_csv_throughputs(path: str | Path, lookup: SpecLookup = catalog_spec) -> MeasuredThroughputs:
    """CSV with header ``job_type,num_gpus,device_type,steps_per_s[,cross_node_steps_per_s]``."""
    p = Path(path)
    entries: dict[tuple[str, int, str], _Measured] = {}
    try:
        with p.open(newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in CSV_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise ParseError(str(p), f"missing columns {missing}; expected {','.join(CSV_COLUMNS)}", 1)
            for row in reader:
                line = reader.line_num
                try:
                    n = int(row["num_gpus"])
                    rate = float(row["steps_per_s"])
                    cross_text = (row.get("cross_node_steps_per_s") or "").strip()
                    cross_rate = float(cross_text) if cross_text else None
                except (TypeError, ValueError):
                    raise ParseError(str(p), "num_gpus must be an integer and rates numbers", line) from None
                if n <= 0 or rate < 0 or not math.isfinite(rate):
                    raise ParseError(str(p), f"num_gpus must be > 0 and steps_per_s >= 0, got {n}, {rate}", line)
                key = (row["job_type"], n, canonical_device_type(row["device_type"], lookup))
                entries[key] = _Measured(rate, cross_rate)
    except OSError as e:
        raise InputError(f"{p}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError:
        raise ParseError(str(p), "not a text file; expected Gavel's JSON or a CSV with header "
                         + ",".join(CSV_COLUMNS)) from None
    if not entries:
        raise ParseError(str(p), "no rows")
    return MeasuredThroughputs(entries, source=str(p))


def load_throughputs(path: str | Path, lookup: SpecLookup = catalog_spec) -> MeasuredThroughputs:
    """A throughput file in either format, detected by its content."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{p}: no such throughput file (expected Gavel's JSON or a CSV)")
    head = p.read_text(errors="replace")[:200].lstrip()
    return load_gavel_throughputs(p, lookup) if head.startswith("{") else load_csv_throughputs(p, lookup)


# ---------------------------------------------------------------------------- catalog roofline


@dataclass(frozen=True)
class JobProfile:
    """What one training step of a job type costs on each device of its gang (weak scaling:
    per-device work is fixed, so a gang of n does n times the samples per step)."""

    name: str
    flops_per_step: float  # per device
    bytes_per_step: float  # device-memory traffic per device
    gradient_bytes: float  # all-reduced per step (0 for single-device work)
    memory_bytes: float  # device memory the job needs per device
    precision: str = "bf16"  # "bf16", "fp16" or "fp32": which peak it runs at


# Achieved fractions of the vendor peaks. Uniform across devices, so they move all estimates
# together; they only set how compute compares with communication.
COMPUTE_EFFICIENCY = 0.45
MEMORY_EFFICIENCY = 0.8
LINK_EFFICIENCY = 0.75

_GB = 1e9
_GIB = 1024**3

#: A small mix of job types with different characters, for the mixed-cluster benchmark and the
#: synthetic generator when no measured table is given. Numbers are per device per step,
#: derived from 6 x params x tokens for transformers and published per-image FLOPs for CNNs.
BUILTIN_PROFILES: tuple[JobProfile, ...] = (
    # CNN, mixed precision: modest intensity, small gradients.
    JobProfile("resnet50", 3.2e12, 40 * _GB, 0.1 * _GB, 22 * _GIB, "fp16"),
    # BERT-large pre-training, 340M params, 16k tokens per device per step.
    JobProfile("bert-large", 3.3e13, 150 * _GB, 0.68 * _GB, 30 * _GIB),
    # 1.3B-parameter GPT, 16k tokens per device per step: compute-bound, 2.6 GB of gradients.
    JobProfile("gpt-1.3b", 1.28e14, 350 * _GB, 2.6 * _GB, 40 * _GIB),
    # 7B LLM fine-tuning with FSDP: needs an 80 GB-class device, heavy communication.
    JobProfile("llama-7b-finetune", 3.4e14, 900 * _GB, 14 * _GB, 70 * _GIB),
    # LoRA on a 13B model: forward+backward through frozen weights, tiny gradients.
    JobProfile("llama-13b-lora", 2.1e14, 700 * _GB, 0.05 * _GB, 36 * _GIB),
    # Recommendation model with big embedding tables: memory-bandwidth bound.
    JobProfile("dlrm", 4.0e11, 200 * _GB, 1.0 * _GB, 60 * _GIB),
    # Batch LLM inference (decode): reads the weights every step, memory bound.
    JobProfile("llm-batch-inference", 9.0e11, 400 * _GB, 0.0, 30 * _GIB),
    # Reinforcement learning / GAN style fp32 work: non-tensor fp32 throughput matters.
    JobProfile("rl-fp32", 2.0e12, 30 * _GB, 0.02 * _GB, 6 * _GIB, "fp32"),
    JobProfile("cyclegan-fp32", 4.0e12, 60 * _GB, 0.05 * _GB, 10 * _GIB, "fp32"),
)


def _peak_tflops(spec: AcceleratorSpec, precision: str) -> float | None:
    order = {
        "bf16": (spec.bf16_tflops, spec.fp16_tflops, spec.fp32_tflops),
        "fp16": (spec.fp16_tflops, spec.bf16_tflops, spec.fp32_tflops),
        "fp32": (spec.fp32_tflops,),
    }.get(precision)
    if order is None:
        raise InputError(f"unknown precision {precision!r}; use bf16, fp16 or fp32")
    return next((v for v in order if v), None)


@dataclass(frozen=True)
class RooflineThroughputs:
    """Rates estimated from the catalog's peaks and each job type's :class:`JobProfile`."""

    profiles: Mapping[str, JobProfile]
    lookup: SpecLookup = catalog_spec

    @classmethod
    def builtin(cls, lookup: SpecLookup = catalog_spec) -> "RooflineThroughputs":
        return cls({p.name: p for p in BUILTIN_PROFILES}, lookup)

    def knows(self, job_type: str) -> bool:
        return job_type in self.profiles

    def job_types(self) -> tuple[str, ...]:
        return tuple(self.profiles)

    def step_seconds(self, profile: JobProfile, spec: AcceleratorSpec, num_gpus: int, group_gbps: float) -> float:
        """The roofline step time; inf when the device lacks a needed figure or the memory."""
        if spec.memory_bytes is not None and profile.memory_bytes > spec.memory_bytes:
            return math.inf
        peak = _peak_tflops(spec, profile.precision)
        if not peak or not spec.memory_bandwidth_gbps:
            return math.inf
        compute = profile.flops_per_step / (peak * 1e12 * COMPUTE_EFFICIENCY)
        memory = profile.bytes_per_step / (spec.memory_bandwidth_gbps * 1e9 * MEMORY_EFFICIENCY)
        comm = ring_allreduce_s(num_gpus, profile.gradient_bytes, group_gbps * LINK_EFFICIENCY)
        return max(compute, memory) + comm

    def rate(
        self,
        job_type: str,
        num_gpus: int,
        device_type: str,
        group_gbps: float = math.inf,
        spans_nodes: bool = False,
    ) -> float:
        profile = self.profiles.get(job_type)
        spec = self.lookup(device_type)
        if profile is None or spec is None:
            return 0.0
        step = self.step_seconds(profile, spec, num_gpus, group_gbps)
        return 0.0 if math.isinf(step) else 1.0 / step


@dataclass(frozen=True)
class FixedDurationThroughputs:
    """Jobs whose work is "seconds of run time": one unit per second on any device type.

    ``job_type`` (default :data:`FIXED_DURATION`) is the only type it knows; the trace loaders
    of duration-based logs give their jobs that type when no speed table is used.
    """

    job_type: str = FIXED_DURATION

    def knows(self, job_type: str) -> bool:
        return job_type == self.job_type

    def job_types(self) -> tuple[str, ...]:
        return (self.job_type,)

    def rate(self, job_type: str, num_gpus: int, device_type: str,
             group_gbps: float = math.inf, spans_nodes: bool = False) -> float:
        return 1.0 if job_type == self.job_type else 0.0


@dataclass(frozen=True)
class CompositeThroughputs:
    """Asks each model in turn; the first that knows a job type answers for it."""

    models: tuple[ThroughputModel, ...]

    def _model(self, job_type: str) -> ThroughputModel | None:
        return next((m for m in self.models if m.knows(job_type)), None)

    def knows(self, job_type: str) -> bool:
        return self._model(job_type) is not None

    def job_types(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for m in self.models:
            seen.update(dict.fromkeys(m.job_types()))
        return tuple(seen)

    def rate(self, job_type: str, num_gpus: int, device_type: str,
             group_gbps: float = math.inf, spans_nodes: bool = False) -> float:
        m = self._model(job_type)
        return m.rate(job_type, num_gpus, device_type, group_gbps, spans_nodes) if m else 0.0


def default_model(measured: MeasuredThroughputs | None = None,
                  lookup: SpecLookup = catalog_spec) -> CompositeThroughputs:
    """What ``hetflow simulate`` uses: the measured table when given, then the catalog
    roofline of the built-in profiles, then fixed-duration jobs."""
    models: list[ThroughputModel] = []
    if measured is not None:
        models.append(measured)
    models += [RooflineThroughputs.builtin(lookup), FixedDurationThroughputs()]
    return CompositeThroughputs(tuple(models))


def table_rows(model: ThroughputModel, job_types: Iterable[str], device_types: Sequence[str],
               num_gpus: int = 1) -> list[tuple[str, list[float]]]:
    """A printable job-type x device-type table (ideal placement) for docs and `--explain`."""
    return [(jt, [model.rate(jt, num_gpus, dt) for dt in device_types]) for jt in job_types]
