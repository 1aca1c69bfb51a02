"""FGD's packing protocol (Weng et al., ATC'23), rule for rule, and its reference policies.

    nodes, pods = load_openb(node_csv, pod_csv)
    run = simulate_fgd(nodes, pods, "FGD", seed=42, arrival_order=..., node_ranks=...)
    run.alloc_by_arrival      # {x: GPU allocation % at arrived demand x % of capacity}

What the artifact (hkust-adsl/kubernetes-scheduler-simulator) does, re-stated in
data/traces/alibaba-gpu-2023/fgd-reference/PROTOCOL.md and docs/simulator.md:

- **Cluster**: the GPU nodes only; every GPU is 1000 milli-GPU, tracked per device; CPU and
  memory are hard limits.
- **Pods** ("inflation" to 130 %): per seed, the pods sorted by name are shuffled, then clones
  drawn uniformly with replacement are appended until the next one would push the GPU request
  past 1.3 x capacity. The artifact's exact sequences (Go's ``math/rand``) can be replayed from
  a file (``arrival_order``); otherwise this module draws its own with ``random.Random(seed)``.
- **Online, one pod at a time, never leaving**: filter the feasible nodes (CPU, memory, GPU
  type, a GPU with enough free milli, or ``num_gpu`` idle GPUs), score them with the policy as
  integers, take the highest, ties to the lowest node rank (a per-seed permutation); a pod that
  fits nowhere fails for good. One sample after every pod.
- **Accounting**: allocation rate = allocated milli / total milli; the samples are binned by
  ``round(100 x arrived / capacity)`` and averaged (PROTOCOL.md section 6).
- **Policies** (the artifact's names): ``BestFit``, ``DotProd``, ``GpuPacking``, ``GpuClustering``,
  ``FGD`` (fragmentation gradient descent over the typical pods), ``Random``; and the live
  controller's policies by their registry names: ``hetflow`` (and ``fifo``) place each pod with
  the registry class and its placer through :mod:`hetflow.sim.live_fgd` - for ``hetflow``,
  ``TopologyPlacer.with_mix``: FGD's fragmentation score against the typical pods, then the
  node's CPU balance against its free GPUs (a pod without GPUs: the most spare CPU first), then
  the tightest fit, then the lowest node rank (the adapter orders the cluster by rank).

For the reference policies a node's score for a class of pod changes only when that node
changes, so scores are cached per pod class and recomputed only for nodes touched since;
fragmentation is memoised per node state. This is what makes one seed run in seconds where the
artifact takes 47 minutes (the live placer scores every node for every pod, as it does in the
controller: some 20 s a seed).
"""

from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from hetflow.core.errors import InputError
from hetflow.sim.mechanism import run_arrivals
from hetflow.sim.textio import open_text

if TYPE_CHECKING:
    from hetflow.sim.live_fgd import LivePacking

MILLI = 1000
MAX_CPU = 128000.0  # the artifact's "largest machine", for normalising
MAX_GPU = 8000.0
POPULARITY = 95  # typical pods: the most frequent specs up to 95 % of pods


@dataclass(frozen=True)
class FgdNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True)
class FgdPod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int  # per GPU
    gpu_spec: str = ""  # "A|B": admissible GPU models; empty: any

    @property
    def gpu_request(self) -> int:
        return self.num_gpu * self.gpu_milli

    @property
    def key(self) -> tuple:
        return (self.cpu_milli, self.memory_mib, self.num_gpu, self.gpu_milli, self.gpu_spec)


def _int(row: dict, col: str, path: Path, line: int) -> int:
    try:
        return int(float(row[col]))
    except (KeyError, TypeError, ValueError):
        raise InputError(f"{path}:{line}: column {col!r} must be a number") from None


def _rows(path: str | Path, columns: Sequence[str], what: str):
    from hetflow.sim.traces import _csv_rows

    p = Path(path)
    if not p.is_file():
        raise InputError(f"{p}: no such {what}")
    return p, _csv_rows(p, columns, what)


def load_fgd_nodes(path: str | Path) -> list[FgdNode]:
    p, rows = _rows(path, ("sn", "cpu_milli", "memory_mib", "gpu", "model"), "node list (openb_node_list_gpu_node.csv)")
    nodes = []
    for n, row in rows:
        gpus = _int(row, "gpu", p, n)
        if gpus > 0:  # the protocol's cluster is the GPU nodes
            nodes.append(FgdNode(row["sn"], _int(row, "cpu_milli", p, n), _int(row, "memory_mib", p, n), gpus,
                                 row["model"] or ""))
    if not nodes:
        raise InputError(f"{p}: no GPU nodes")
    return sorted(nodes, key=lambda x: x.name)


def load_fgd_pods(path: str | Path) -> list[FgdPod]:
    """Pods in file order (the row index is what ``arrival_order`` files refer to)."""
    p, rows = _rows(path, ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"), "pod list (openb_pod_list_*.csv)")
    pods = []
    for n, row in rows:
        num = _int(row, "num_gpu", p, n)
        milli = _int(row, "gpu_milli", p, n) if num > 0 else 0
        milli = min(milli, MILLI) if milli > 0 else 0  # the artifact's clamp
        if num > 0 and milli == 0:
            num = 0
        pods.append(FgdPod(row["name"], _int(row, "cpu_milli", p, n), _int(row, "memory_mib", p, n), num, milli,
                           (row.get("gpu_spec") or "").strip()))
    if not pods:
        raise InputError(f"{p}: no pods")
    return pods


# ------------------------------------------------------------------------- typical pods


@dataclass(frozen=True)
class TypicalPod:
    cpu_milli: int
    gpu_milli: int
    num_gpu: int
    gpu_spec: frozenset[str] | None  # None: any model
    weight: float


def typical_pods(pods: Sequence[FgdPod], threshold: float = POPULARITY) -> list[TypicalPod]:
    """Group by (CPU, per-GPU milli, GPU count, gpu_spec), most frequent first (ties: larger
    tuple first), keep groups until they cover ``threshold`` % of pods, renormalise weights."""
    counts: dict[tuple, int] = {}
    for p in pods:
        k = (p.cpu_milli, p.gpu_milli, p.num_gpu, p.gpu_spec)
        counts[k] = counts.get(k, 0) + 1
    groups = sorted(counts.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)
    total = float(len(pods))
    expected = threshold * total / 100.0
    cum = 0.0
    chosen = []
    for k, c in groups:
        if cum >= expected:
            break
        cum += c
        chosen.append((k, c / total))
    out = []
    for (cpu, milli, num, spec), share in chosen:
        out.append(TypicalPod(cpu, milli, num, frozenset(spec.split("|")) if spec else None, share / (cum / total)))
    return out


# ------------------------------------------------------------------------------ workload


def inflate(pods: Sequence[FgdPod], capacity_milli: int, ratio: float, seed: int) -> list[int]:
    """The protocol's arrival sequence, drawn with ``random.Random(seed)``: indices into
    ``pods``; positions past ``len(pods)`` are clones. (The artifact's own sequences come from
    Go's generator; replay them with ``arrival_order``.)"""
    rng = random.Random(seed)
    by_name = sorted(range(len(pods)), key=lambda i: pods[i].name)
    order = list(by_name)
    rng.shuffle(order)
    total = sum(pods[i].gpu_request for i in order)
    target = ratio * capacity_milli
    while True:
        i = by_name[rng.randrange(len(by_name))]
        if total + pods[i].gpu_milli > target:  # the artifact's test (per-GPU milli; see PROTOCOL.md)
            break
        order.append(i)
        total += pods[i].gpu_request
    return order


def _seed_column(path: str | Path, seed: int, key: str) -> tuple[Path, list[tuple[str, str]]]:
    """(key, value) of column ``seed<seed>`` of a per-seed CSV (blank values left out)."""
    p = Path(path)
    col = f"seed{seed}"
    if not p.is_file():
        raise InputError(f"{p}: no such file (the per-seed CSV with columns {key},seed42,...)")
    with open_text(p) as f:
        reader = csv.DictReader(f)
        if col not in (reader.fieldnames or []) or key not in (reader.fieldnames or []):
            raise InputError(f"{p}: no column {col} (or {key}); it has {', '.join(reader.fieldnames or [])}")
        return p, [(row[key], row[col]) for row in reader if (row[col] or "").strip()]


def read_arrival_order(path: str | Path, seed: int, n_pods: int) -> list[int]:
    """``position,seed42,...`` -> the sequence for ``seed``: row indices into the pod CSV (a
    clone appears as the row it copies)."""
    p, rows = _seed_column(path, seed, "position")
    order = [int(v) for _, v in rows]
    bad = [i for i in order if not 0 <= i < n_pods]
    if bad:
        raise InputError(f"{p}: seed{seed} names pod row {bad[0]}, but the pod list has {n_pods} rows")
    return order


def read_node_ranks(path: str | Path, seed: int, nodes: Sequence[FgdNode]) -> list[int]:
    """``node,seed42,...`` -> each node's tie-break rank for ``seed`` (lower wins), in ``nodes`` order."""
    p, rows = _seed_column(path, seed, "node")
    ranks = {name: int(v) for name, v in rows}
    missing = [n.name for n in nodes if n.name not in ranks]
    if missing:
        raise InputError(f"{p}: no rank for node {missing[0]}")
    return [ranks[n.name] for n in nodes]


# ------------------------------------------------------------------------------- cluster


class FgdCluster:
    """Free CPU, memory and per-GPU milli of every node, and the fragmentation measure."""

    def __init__(self, nodes: Sequence[FgdNode], typical: Sequence[TypicalPod]) -> None:
        self.nodes = list(nodes)
        self.cpu = [n.cpu_milli for n in nodes]
        self.mem = [n.memory_mib for n in nodes]
        self.gpus = [[MILLI] * n.gpus for n in nodes]
        self.model = [n.model for n in nodes]
        self.typical = list(typical)
        self._frag_memo: dict[tuple, float] = {}
        self.capacity_milli = MILLI * sum(n.gpus for n in nodes)

    def frag(self, model: str, cpu_free: int, gpus: Sequence[int]) -> float:
        """F(n) in milli-GPU: the idle GPU milli that the typical pods (weighted) cannot use,
        accumulated per category and summed except 'satisfied' as the artifact does."""
        key = (model, cpu_free, tuple(sorted(gpus)))
        hit = self._frag_memo.get(key)
        if hit is not None:
            return hit
        idle = sum(gpus)
        buckets = [0.0] * 7  # q1, q2, q3, q4, xl, xr, no_access
        for t in self.typical:
            if t.gpu_milli == 0:
                buckets[4 if cpu_free >= t.cpu_milli else 5] += t.weight * float(idle)
                continue
            if t.gpu_spec is not None and model not in t.gpu_spec:
                buckets[6] += t.weight * float(idle)
                continue
            fits = sum(1 for g in gpus if g >= t.gpu_milli) >= t.num_gpu
            cpu_ok = cpu_free >= t.cpu_milli
            if fits and cpu_ok:
                small = sum(g for g in gpus if g < t.gpu_milli)
                buckets[1] += t.weight * float(small)
                buckets[2] += t.weight * float(idle - small)
            elif fits:
                buckets[3] += t.weight * float(idle)
            else:
                buckets[1 if cpu_ok else 0] += t.weight * float(idle)
        value = 0.0
        for i, b in enumerate(buckets):
            if i != 2:
                value += b
        self._frag_memo[key] = value
        return value

    def node_frag(self, i: int) -> float:
        return self.frag(self.model[i], self.cpu[i], self.gpus[i])

    def feasible(self, i: int, pod: FgdPod, spec: frozenset[str] | None) -> bool:
        if self.cpu[i] < pod.cpu_milli or self.mem[i] < pod.memory_mib:
            return False
        if pod.num_gpu == 0:
            return True
        if spec is not None and self.model[i] not in spec:
            return False
        return sum(1 for g in self.gpus[i] if g >= pod.gpu_milli) >= pod.num_gpu

    def best_fit_gpus(self, i: int, pod: FgdPod) -> tuple[int, ...]:
        """Sharing pod: the GPU with the least free milli that fits (lowest index on ties);
        whole GPUs: the lowest-indexed idle ones."""
        g = self.gpus[i]
        if pod.num_gpu == 0:
            return ()
        if pod.num_gpu == 1 and pod.gpu_milli < MILLI:
            best = min((free, k) for k, free in enumerate(g) if free >= pod.gpu_milli)
            return (best[1],)
        return tuple([k for k, free in enumerate(g) if free >= pod.gpu_milli][: pod.num_gpu])

    def bind(self, i: int, pod: FgdPod, gpus: Sequence[int]) -> None:
        self.cpu[i] -= pod.cpu_milli
        self.mem[i] -= pod.memory_mib
        for k in gpus:
            self.gpus[i][k] -= pod.gpu_milli
            assert self.gpus[i][k] >= 0


# ------------------------------------------------------------------------------ policies

Score = tuple  # (comparable score, gpu choice)


class PackingPolicy:
    """``score(cluster, i, pod) -> (score, gpus)`` for a feasible node; higher wins, ties to
    the lowest node rank. Scores must depend only on node i's state and the pod."""

    name = "base"
    uses_random = False

    def score(self, c: FgdCluster, i: int, pod: FgdPod) -> Score:
        raise NotImplementedError


class BestFit(PackingPolicy):
    name = "BestFit"

    def score(self, c: FgdCluster, i: int, pod: FgdPod) -> Score:
        s = 0.0
        s += (float(c.cpu[i]) - float(pod.cpu_milli)) / MAX_CPU * 0.5
        s += (float(sum(c.gpus[i])) - float(pod.gpu_request)) / MAX_GPU * 0.5
        # the artifact then min-max rescales over feasible nodes: monotone, same winner
        return int((1.0 - s) * 100.0), c.best_fit_gpus(i, pod)


class DotProd(PackingPolicy):
    name = "DotProd"

    def score(self, c: FgdCluster, i: int, pod: FgdPod) -> Score:
        dot = (c.cpu[i] / MAX_CPU) * (pod.cpu_milli / MAX_CPU) + (sum(c.gpus[i]) / MAX_GPU) * (pod.gpu_request / MAX_GPU)
        return int(100.0 * (1.0 - dot / 2.0)), c.best_fit_gpus(i, pod)


class GpuPacking(PackingPolicy):
    name = "GpuPacking"

    def score(self, c: FgdCluster, i: int, pod: FgdPod) -> Score:
        if pod.gpu_milli <= 0:
            return 0, ()
        g = c.gpus[i]
        gpus = c.best_fit_gpus(i, pod)
        idle = sum(1 for free in g if free == MILLI)
        if idle == len(g):  # a free node: smaller first
            return max(100 // 3 - idle, idle), gpus
        order = sorted(range(len(g)), key=lambda k: (g[k], k))
        need, use, opened = pod.num_gpu, [], 0
        for k in order:
            if need == 0:
                break
            if pod.gpu_milli <= g[k]:
                need -= 1
                use.append(k)
                opened += g[k] == MILLI
        if opened > 0:  # idle GPUs on a used node
            return max(100 // 2 - opened, 100 // 3), gpus
        ratio = sum(g[k] * 100 // MILLI for k in use)
        return max(100 - ratio // 10, 100 // 2), gpus


class GpuClustering(PackingPolicy):
    name = "GpuClustering"

    def __init__(self) -> None:
        self.tags: dict[int, list[str]] = {}

    def score(self, c: FgdCluster, i: int, pod: FgdPod) -> Score:
        if pod.num_gpu == 0:
            return 0, ()
        tag = "share" if pod.num_gpu == 1 and pod.gpu_milli < MILLI else f"{pod.num_gpu}-gpu"
        b = int(25 * (MAX_GPU - sum(c.gpus[i])) / MAX_GPU)
        tags = self.tags.get(i, [])
        if not tags:
            s = 25 + b
        elif all(t == tag for t in tags):
            s = 75 + b
        elif tag in tags:
            s = 50 + b
        else:
            s = b
        return s, c.best_fit_gpus(i, pod)

    def bound(self, i: int, pod: FgdPod) -> None:
        if pod.num_gpu:
            self.tags.setdefault(i, []).append("share" if pod.num_gpu == 1 and pod.gpu_milli < MILLI
                                               else f"{pod.num_gpu}-gpu")


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


class Fgd(PackingPolicy):
    """Fragmentation gradient descent: score = trunc(100 x sigmoid((F - F') / 1000)), F' the
    node's fragmentation after placing the pod; a sharing pod tries every GPU that fits."""

    name = "FGD"

    def _after(self, c: FgdCluster, i: int, pod: FgdPod, gpus: Sequence[int]) -> float:
        g = list(c.gpus[i])
        for k in gpus:
            g[k] -= pod.gpu_milli
        return c.frag(c.model[i], c.cpu[i] - pod.cpu_milli, g)

    def score(self, c: FgdCluster, i: int, pod: FgdPod) -> Score:
        before = c.node_frag(i)
        if pod.num_gpu == 1 and pod.gpu_milli < MILLI:
            best, choice = 0, None
            for k, free in enumerate(c.gpus[i]):
                if free >= pod.gpu_milli:
                    s = int(_sigmoid((before - self._after(c, i, pod, (k,))) / 1000.0) * 100.0)
                    if choice is None or s > best:
                        best, choice = s, (k,)
            return best, choice
        gpus = c.best_fit_gpus(i, pod)
        return int(_sigmoid((before - self._after(c, i, pod, gpus)) / 1000.0) * 100.0), gpus


# registry policies run through the adapter (the live classes); the registry's ``bestfit`` is
# FGD's BestFit here (names are matched in any case), the others are refused (live_fgd.UNEXPRESSED)
LIVE_POLICIES = ("fifo", "hetflow")
FGD_POLICIES = ("Random", "DotProd", "GpuClustering", "GpuPacking", "BestFit", "FGD", *LIVE_POLICIES)
FGD_REFERENCE = ("DotProd", "GpuPacking", "BestFit", "FGD")
# the CSV's directory names
FGD_CSV_NAMES = {"Random": "01-Random", "DotProd": "02-DotProd", "GpuClustering": "03-GpuClustering",
                 "GpuPacking": "04-GpuPacking", "BestFit": "05-BestFit", "FGD": "06-FGD"}


def make_packing_policy(name: str) -> "PackingPolicy | LivePacking":
    """FGD's reference policies by their names (any case); ``hetflow`` is the live controller's
    policy class through :mod:`hetflow.sim.live_fgd` (the same placer ``hetflow submit`` runs), and
    so is ``fifo``; another registry policy is refused by name with the reason (InputError)."""
    from hetflow.scheduling.policies.registry import POLICIES
    from hetflow.sim.live_fgd import live_fgd_policy

    table: dict[str, Callable[[], PackingPolicy]] = {
        "BestFit": BestFit, "DotProd": DotProd, "GpuPacking": GpuPacking, "GpuClustering": GpuClustering,
        "FGD": Fgd, "Random": RandomFit,
    }
    lower = {k.lower(): v for k, v in table.items()}
    factory = table.get(name) or lower.get(name.lower())
    if factory is not None:
        return factory()
    if name in POLICIES:
        return live_fgd_policy(name)
    raise InputError(f"unknown policy {name!r} for --protocol fgd; choose from {', '.join(FGD_POLICIES)}")


class RandomFit(PackingPolicy):
    """One feasible node uniformly at random (statistically like the artifact's; its draws
    come from Go's generator and parallel filtering, so not replayable)."""

    name = "Random"
    uses_random = True


# ------------------------------------------------------------------------------- the run


@dataclass
class FgdRun:
    policy: str
    seed: int
    arrived_pct: np.ndarray  # per submitted pod: 100 x arrived / capacity
    alloc_pct: np.ndarray  # per submitted pod: 100 x allocated / capacity
    frag_milli: np.ndarray  # per submitted pod: cluster fragmentation (milli-GPU)
    capacity_milli: int
    failed: int
    wall_s: float
    placements: list[tuple[int, tuple[int, ...]] | None] = field(default_factory=list)

    def binned(self, values: np.ndarray | None = None, digits: int | None = 2) -> dict[int, float]:
        """The artifact's discretisation: per integer x, the mean of the samples whose
        round(arrived %) is x, else of those within x +- 1; ``alloc`` samples are rounded to 2
        decimals first and the mean to 2 decimals."""
        vals = np.round(self.alloc_pct, 2) if values is None else values
        keys = np.array([round(float(a)) for a in self.arrived_pct])
        out: dict[int, float] = {}
        for x in range(0, int(keys.max()) + 1 if len(keys) else 0):
            sel = vals[keys == x]
            if not len(sel):
                sel = vals[(keys >= x - 1) & (keys <= x + 1)]
            if len(sel):
                m = float(np.mean(sel))
                out[x] = round(m, digits) if digits is not None else m
        return out

    @property
    def alloc_by_arrival(self) -> dict[int, float]:
        return self.binned()

    @property
    def frag_by_arrival(self) -> dict[int, float]:
        mean = self.binned(self.frag_milli, digits=None)
        return {x: round(100.0 * v / self.capacity_milli, 2) for x, v in mean.items()}


class FgdRules:
    """FGD's protocol as arrival rules (:func:`hetflow.sim.mechanism.run_arrivals` drives
    them): each pod of the inflated sequence, in order, placed by the policy - the live
    registry policy's placer (:class:`~hetflow.sim.live_fgd.LivePacking`), a random feasible
    node, or the best score over the nodes (ties to the lower node rank) - then bound, and the
    arrived / allocated shares and the cluster's fragmentation sampled."""

    def __init__(self, nodes: Sequence[FgdNode], pods: Sequence[FgdPod], policy: str, seed: int,
                 ratio: float, arrival_order: Sequence[int] | None, node_ranks: Sequence[int] | None,
                 typical: Sequence[TypicalPod] | None) -> None:
        from hetflow.sim.live_fgd import LivePacking

        self.pods = pods
        self.pol = make_packing_policy(policy)
        typical = list(typical) if typical is not None else typical_pods(pods)
        self.cluster = FgdCluster(nodes, typical)
        self.n = n = len(nodes)
        self.order = (list(arrival_order) if arrival_order is not None
                      else inflate(pods, self.cluster.capacity_milli, ratio, seed))
        if node_ranks is None:
            node_ranks = random.Random(seed + 1).sample(range(n), n)
        self.rank = np.asarray(node_ranks, dtype=np.int64)
        self.live = isinstance(self.pol, LivePacking)
        if self.live:
            self.pol.start(nodes, [int(r) for r in self.rank], typical)
        self.rng = random.Random(seed)
        self.changed = np.full(n, -1, dtype=np.int64)
        self.cache: dict[tuple, list] = {}  # pod class -> [last step evaluated, scores, choices]
        self.arrived = self.allocated = 0
        self.arrived_pct = np.empty(len(self.order))
        self.alloc_pct = np.empty(len(self.order))
        self.frag = np.empty(len(self.order))
        self.node_f = np.array([self.cluster.node_frag(i) for i in range(n)])
        self.total_f = float(self.node_f.sum())
        self.failed = 0
        self.placements: list[tuple[int, tuple[int, ...]] | None] = []
        self.spec_of: dict[str, frozenset[str] | None] = {}

    def arrivals(self) -> list[int]:
        return self.order

    def _spec(self, pod: FgdPod) -> frozenset[str] | None:
        if pod.gpu_spec not in self.spec_of:
            self.spec_of[pod.gpu_spec] = frozenset(pod.gpu_spec.split("|")) if pod.gpu_spec else None
        return self.spec_of[pod.gpu_spec]

    def decide(self, step: int, idx: int) -> tuple[int, tuple[int, ...]] | None:
        pod, cluster, n = self.pods[idx], self.cluster, self.n
        if self.live:  # the live policy's placer (hetflow.sim.live_fgd); apply() checks feasibility
            return self.pol.place(step, pod)
        spec = self._spec(pod)
        if self.pol.uses_random:
            feas = [i for i in range(n) if cluster.feasible(i, pod, spec)]
            if not feas:
                return None
            chosen = feas[self.rng.randrange(len(feas))]
            if not (pod.num_gpu == 1 and pod.gpu_milli < MILLI):
                return chosen, cluster.best_fit_gpus(chosen, pod)
            fits = [k for k, free in enumerate(cluster.gpus[chosen]) if free >= pod.gpu_milli]
            return chosen, (fits[self.rng.randrange(len(fits))],)
        entry = self.cache.get(pod.key)
        if entry is None:
            entry = self.cache[pod.key] = [-1, [None] * n, [None] * n]
        last, scores, choices = entry
        for i in np.flatnonzero(self.changed >= last):
            i = int(i)
            if cluster.feasible(i, pod, spec):
                scores[i], choices[i] = self.pol.score(cluster, i, pod)
            else:
                scores[i] = None
        entry[0] = step
        chosen, best = None, None
        for i in range(n):
            sc = scores[i]
            if sc is not None and (best is None or sc > best or (sc == best and self.rank[i] < self.rank[chosen])):
                chosen, best = i, sc
        return (chosen, choices[chosen]) if chosen is not None else None

    def apply(self, step: int, idx: int, decision: tuple[int, tuple[int, ...]] | None) -> None:
        pod, cluster = self.pods[idx], self.cluster
        self.arrived += pod.gpu_request
        if decision is None:
            self.failed += 1
            self.placements.append(None)
        else:
            chosen, gpus = decision
            assert cluster.feasible(chosen, pod, self._spec(pod)), f"pod {step}: infeasible placement"
            cluster.bind(chosen, pod, gpus)
            if isinstance(self.pol, GpuClustering):
                self.pol.bound(chosen, pod)
            self.allocated += pod.gpu_request
            self.changed[chosen] = step
            f = cluster.node_frag(chosen)
            self.total_f += f - self.node_f[chosen]
            self.node_f[chosen] = f
            self.placements.append((chosen, tuple(gpus)))
        cap = cluster.capacity_milli
        self.arrived_pct[step] = 100.0 * self.arrived / cap
        self.alloc_pct[step] = 100.0 * self.allocated / cap
        self.frag[step] = self.total_f


def simulate_fgd(nodes: Sequence[FgdNode], pods: Sequence[FgdPod], policy: str, seed: int = 42,
                 ratio: float = 1.3, arrival_order: Sequence[int] | None = None,
                 node_ranks: Sequence[int] | None = None, typical: Sequence[TypicalPod] | None = None,
                 progress: Callable[[int, int], None] | None = None) -> FgdRun:
    rules = FgdRules(nodes, pods, policy, seed, ratio, arrival_order, node_ranks, typical)
    stats = run_arrivals(rules, progress)
    return FgdRun(rules.pol.name, seed, rules.arrived_pct, rules.alloc_pct, rules.frag,
                  rules.cluster.capacity_milli, rules.failed, stats.wall_s, rules.placements)
