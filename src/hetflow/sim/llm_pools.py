"""hetflow's LLM pool serving on Helix's clusters: which engines fit, what each sustains, and
what routing by measured capacity delivers - against Helix's own placement.

hetflow serves one model name over *pools* of vLLM engines (``hetflow.workloads.serve.llm``,
docs/serving.md "LLMs"): an engine is one vLLM server over whole devices of one node
(``tensor_parallel_size``) or, with a pool's ``nodes: N``, over N nodes of the pool's devices
(vLLM's multi-node mode: ``pipeline_parallel_size`` stages, one a node), all engines
are servers of one HAProxy backend, and each engine's weight follows the tokens/s it is
measured to sustain (``CapacityMeter``, ``capacity_weights``). With weights proportional to
capacity every engine saturates at the same offered load, so the model's throughput is
``min(offered, sum of engine capacities)`` (:func:`routed_throughput`).

Helix (Mei et al., ASPLOS'25; artifact ``Thesys-lab/Helix-ASPLOS25``) places *layers* of one
model over a cluster of single- and multi-GPU nodes of several types and routes each request
along a path of nodes by max flow. Its settings (``data/helix/README.md``): LLaMA-1 30B (60
layers) and LLaMA-2 70B (80 layers), fp16, on a 24-node cluster (4 A100-40GB, 8 L4, 12 T4, one
GPU a node) and a 42-node cluster (also V100, 2xL4, 2xT4, 4xT4 nodes). The numbers used here are
the ones Helix's simulator uses (``data/helix/profiles.json``, restated from its
``simulator/model_manager``): per device type, the most layers a node holds
(``max_num_layers``: parameters plus room for the KV cache), vLLM's KV blocks and the decode
batch limit per layer count, and the measured per-layer time of a prompt / decode batch.

Two ways to lay hetflow's pools over such a cluster (:func:`plan_pools`):

- ``span="node"`` - engines inside one node: the whole model on one node (Helix profiles a
  2xL4 / 2xT4 / 4xT4 node as one unit, which is what a tensor-parallel engine over that node's
  devices is). It fits where the model's layers are at most the type's ``max_num_layers``. On
  Helix's clusters no node type holds either model (the largest holds 30 of 60 and 18 of 80
  layers), so there is no such engine at all.
- ``span="pipeline"`` - hetflow's pools with ``nodes``: a replica is a pipeline over nodes of one
  type (one pool per type, ``devices: {model: ...}``), as few stages as memory allows; routing
  between pools is by capacity. This is Helix's "separate pipelines" baseline, whose throughput
  Helix's own simulator gives (there overfilling nodes past Helix's own memory limit).
- :func:`plan_mixed_pipelines` - replicas that are pipelines over nodes of several types with an
  uneven layer split, formed greedily by estimated capacity: hetflow pools with ``node_models``
  (each node's type, in pipeline order) and ``layer_split`` (vLLM's ``VLLM_PP_LAYER_PARTITION``),
  one pool per engine shape (:func:`pool_entries` writes them). This is what ``sim_over_helix``
  counts: the mix is chosen here, from Helix's per-layer profiles; hetflow's live planner then
  places each listed node type on a node of its own.

A replica's capacity (:func:`pipeline_capacity`): as many sequences in flight as the
fullest stage's KV cache allows at Helix's planning high-water mark, each a 750-token prompt and
240 output tokens (Helix's averages), one token per round trip through all layers at that batch
plus the 1 ms / 1 Gbit/s hops. It is an estimate from the same profiles, not Helix's event
simulation (on Helix's "separate" 30B pools it gives 0.8x what Helix's simulator gives); the
figures reported come from Helix's simulator (``data/helix/reference.json``), the estimate is
printed beside them.
"""

from __future__ import annotations

import configparser
import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

DATA = Path(__file__).resolve().parent / "data" / "helix"

AVG_INPUT = 750  # Helix's AVG_INPUT_LEN (Azure conversation trace), tokens
AVG_OUTPUT = 240  # Helix's AVG_OUTPUT_LEN, tokens
BLOCK_TOKENS = 16  # vLLM's block size in Helix's profiles
KV_HWM = 0.3  # Helix's KV_CACHE_HWM: the share of a node's KV cache its planner counts on
HIDDEN = {"llama30b": 6656, "llama70b": 8192}  # Helix's activation_size / 2 bytes
LINK_S, LINK_BPS = 1e-3, 1e9  # Helix's clusters: every link 1 ms, 1 Gbit/s

MODELS = ("llama30b", "llama70b")
CLUSTERS = ("cluster24", "cluster42")
SETTINGS = ("llama70b/cluster24", "llama30b/cluster24", "llama70b/cluster42")
PRIMARY = "llama70b/cluster24"


def _interpolate(points: list[tuple[int, float]], x: float) -> float:
    """Piecewise-linear value of a (tokens, ms) profile at ``x`` (clamped past its ends)."""
    xs = [p[0] for p in points]
    if x <= xs[0]:
        return points[0][1]
    if x >= xs[-1]:
        x0, y0 = points[-2]
        x1, y1 = points[-1]
        return y1 + (y1 - y0) / (x1 - x0) * (x - x1)  # Helix extrapolates the last segment too
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class DeviceProfile:
    """One node type running one model, as Helix profiled it."""

    name: str
    max_num_layers: int
    vllm_num_blocks: dict[int, int]
    decode_max_tokens: dict[int, int]
    prompt_ms: tuple[tuple[int, float], ...]
    decode_ms: tuple[tuple[int, float], ...]

    def fits(self, layers: int) -> bool:
        """Whether one node of this type holds ``layers`` layers (Helix's ``max_num_layers``)."""
        return 0 < layers <= self.max_num_layers

    def settings(self, layers: int) -> tuple[int, int]:
        """(KV blocks, decode batch limit) with ``layers`` layers on the node; past
        ``max_num_layers`` the limit's, as Helix's simulator does for its over-full layouts."""
        k = min(layers, self.max_num_layers)
        return self.vllm_num_blocks[k], self.decode_max_tokens[k]

    def concurrency(self, layers: int) -> float:
        """Sequences a node holding ``layers`` layers keeps in flight: the share of its KV cache
        Helix's scheduler fills (:data:`KV_HWM`) over a whole sequence, at most its decode batch."""
        blocks, batch = self.settings(layers)
        return min(KV_HWM * blocks * BLOCK_TOKENS / (AVG_INPUT + AVG_OUTPUT), float(batch))

    def layer_ms(self, phase: Literal["prompt", "decode"], tokens: float) -> float:
        """Milliseconds one layer takes for a batch of ``tokens`` tokens."""
        return _interpolate(list(self.prompt_ms if phase == "prompt" else self.decode_ms), tokens)


@dataclass(frozen=True)
class ModelProfile:
    """A model's layer count and its profile on each node type."""

    name: str
    layers: int
    hidden: int
    """Activation size per token, in fp16 values (what a pipeline hop carries)."""
    devices: dict[str, DeviceProfile]


@lru_cache(maxsize=None)
def load_model(model: str) -> ModelProfile:
    """Helix's profiles of ``model`` (``llama30b`` or ``llama70b``) from ``data/helix``."""
    raw = json.loads((DATA / "profiles.json").read_text())["models"][model]
    devices = {}
    for name, d in raw["devices"].items():
        devices[name] = DeviceProfile(
            name=name, max_num_layers=int(d["max_num_layers"]),
            vllm_num_blocks={int(k): int(v) for k, v in d["vllm_num_blocks"].items()},
            decode_max_tokens={int(k): int(v) for k, v in d["decode_max_tokens"].items()},
            prompt_ms=tuple((int(a), float(b)) for a, b in d["prompt_ms"]),
            decode_ms=tuple((int(a), float(b)) for a, b in d["decode_ms"]))
    return ModelProfile(name=model, layers=int(raw["layers"]), hidden=HIDDEN[model], devices=devices)


@lru_cache(maxsize=None)
def load_cluster(cluster: str) -> tuple[str, ...]:
    """Node types of Helix's cluster, node 0 first (``cluster24``: its single cluster of 6.3;
    ``cluster42``: its high-heterogeneity cluster of 6.5)."""
    return tuple(json.loads((DATA / "clusters.json").read_text())[cluster]["node_types"])


def vram_gb(node_type: str) -> float:
    """GPU memory of one node of ``node_type`` in GB, from Helix's ``machine_profiles.ini``."""
    cp = configparser.ConfigParser()
    cp.read(DATA / "machine_profiles.ini")
    value = cp[node_type]["vram_size"]
    return float(value.split("*")[0])


@dataclass(frozen=True)
class Engine:
    """One replica of the model: ``stages`` layers on each of ``nodes`` (one node: a hetflow
    engine today), all of type ``pool``."""

    pool: str
    nodes: tuple[int, ...]
    stages: tuple[int, ...]
    capacity: float


def pipeline_capacity(model: ModelProfile, stages: list[tuple[str, int]]) -> float:
    """Output tokens/s of one replica whose stages are ``(node type, layers)`` in order (one
    stage: a hetflow engine on one node).

    ``C`` sequences are in flight, the fewest any stage's KV cache holds
    (:meth:`DeviceProfile.concurrency`); each decodes one token per round trip through all
    layers at batch ``C`` plus one hop per stage boundary (and in and out: 1 ms and the
    activations over 1 Gbit/s), after its 750-token prompt went through once; so
    ``C * 240 / (prompt time + 240 * round trip)``."""
    if sum(k for _t, k in stages) != model.layers:
        raise ValueError(f"stages hold {sum(k for _t, k in stages)} layers, the model has {model.layers}")
    devs = [(model.devices[t], k) for t, k in stages]
    c = min(d.concurrency(k) for d, k in devs)
    hops = len(stages) + 1
    hop_bits = 2 * model.hidden * 8
    round_trip = (sum(k * d.layer_ms("decode", c) for d, k in devs) / 1000
                  + hops * (LINK_S + c * hop_bits / LINK_BPS))
    prompt = (sum(k * d.layer_ms("prompt", AVG_INPUT) for d, k in devs) / 1000
              + hops * (LINK_S + AVG_INPUT * hop_bits / LINK_BPS))
    return c * AVG_OUTPUT / (prompt + AVG_OUTPUT * round_trip)


def _even_split(layers: int, parts: int) -> list[int]:
    base, extra = divmod(layers, parts)
    return [base + 1 if i < extra else base for i in range(parts)]


def plan_pools(model: ModelProfile, node_types: tuple[str, ...] | list[str],
               span: Literal["node", "pipeline"] = "node") -> list[Engine]:
    """hetflow's pools on a cluster: one pool per node type, as many replicas as fit.

    ``span="node"``: an engine is the whole model on one node (hetflow today), on every node
    whose type holds all layers. ``span="pipeline"``: a replica is a pipeline over
    ``ceil(layers / max_num_layers)`` nodes of one type (layers split evenly), as many as the
    type's nodes make; the rest of its nodes idle."""
    by_type: dict[str, list[int]] = {}
    for i, t in enumerate(node_types):
        by_type.setdefault(t, []).append(i)
    engines = []
    for t, nodes in by_type.items():
        dev = model.devices[t]
        if span == "node":
            if dev.fits(model.layers):
                cap = pipeline_capacity(model, [(t, model.layers)])
                engines += [Engine(t, (n,), (model.layers,), cap) for n in nodes]
            continue
        depth = math.ceil(model.layers / dev.max_num_layers)
        split = _even_split(model.layers, depth)
        cap = pipeline_capacity(model, [(t, k) for k in split])
        for r in range(len(nodes) // depth):
            engines.append(Engine(t, tuple(nodes[r * depth:(r + 1) * depth]), tuple(split), cap))
    return engines


MAX_STAGES = 12
"""The deepest mixed pipeline :func:`plan_mixed_pipelines` forms (vLLM's pipeline parallelism is
run at depths of 2-16 in practice; every stage adds a hop to each token's round trip)."""


def _splits(model: ModelProfile, types: list[str]) -> list[list[int]]:
    """Candidate layer splits of ``model`` over stages of ``types`` (each within its type's
    ``max_num_layers``): in proportion to what each holds, and the fastest devices filled first
    (per-layer decode time at batch 1)."""
    caps = [model.devices[t].max_num_layers for t in types]
    if sum(caps) < model.layers:
        return []
    prop = [model.layers * c // sum(caps) for c in caps]
    i = 0
    while sum(prop) < model.layers:  # hand out the remainder, one layer at a time, in stage order
        if prop[i % len(prop)] < caps[i % len(prop)]:
            prop[i % len(prop)] += 1
        i += 1
    fast = [0] * len(types)
    left = model.layers
    for j in sorted(range(len(types)), key=lambda j: model.devices[types[j]].layer_ms("decode", 1)):
        fast[j] = min(caps[j], left)
        left -= fast[j]
    return [s for s in (prop, fast) if all(s)]


def devices_per_node(node_type: str) -> int:
    """GPUs in one node of a Helix node type (``T4x4``: 4; ``A100``: 1)."""
    head, _, count = node_type.rpartition("x")
    return int(count) if head and count.isdigit() else 1


def plan_mixed_pipelines(model: ModelProfile, node_types: tuple[str, ...] | list[str],
                         max_stages: int = MAX_STAGES, uniform: bool = False) -> list[Engine]:
    """Replicas that are pipelines over nodes of *several* types - what vLLM's pipeline
    parallelism with an uneven layer split (``VLLM_PP_LAYER_PARTITION``) over a Ray placement
    group on chosen nodes would run, which hetflow's serving planner does not place yet.

    Greedy: the replica with the highest estimated capacity (:func:`pipeline_capacity`) over
    every mix of the free nodes' types of at most ``max_stages`` nodes and each candidate split
    (:func:`_splits`) is taken, its nodes removed, and again until no mix holds the model; the
    single-type pipelines of ``plan_pools(..., "pipeline")`` instead where they sum higher. A
    replica is a chain - every token passes each stage once - so nodes left over when no further
    whole chain fits idle (Helix's max-flow layouts use them for parallel copies of slow
    segments, which a vLLM engine cannot express). ``uniform``: only mixes whose nodes have as
    many GPUs each - what one vLLM engine over nodes can be (its processes split evenly over
    its nodes: a 4-GPU node cannot be a stage beside 1-GPU nodes)."""
    import itertools

    free: dict[str, list[int]] = {}
    for i, t in enumerate(node_types):
        free.setdefault(t, []).append(i)
    order = sorted(free)
    engines = []
    while True:
        best: tuple[float, list[str], list[int]] | None = None
        ranges = [range(len(free[t]) + 1) for t in order]
        for counts in itertools.product(*ranges):
            if not 0 < sum(counts) <= max_stages:
                continue
            types = [t for t, c in zip(order, counts) for _ in range(c)]
            if uniform and len({devices_per_node(t) for t in types}) > 1:
                continue
            for split in _splits(model, types):
                cap = pipeline_capacity(model, list(zip(types, split)))
                if best is None or cap > best[0]:
                    best = (cap, types, split)
        if best is None:
            break
        cap, types, split = best
        nodes = tuple(free[t].pop(0) for t in types)
        engines.append(Engine("+".join(sorted(set(types))), nodes, tuple(split), cap))
    single = plan_pools(model, node_types, "pipeline")  # one type per replica is a mix too
    return single if sum(e.capacity for e in single) > sum(e.capacity for e in engines) else engines


def pool_entries(model: ModelProfile, engines: list[Engine], node_types: tuple[str, ...] | list[str]
                 ) -> list[dict]:
    """The serving config's ``pools`` for ``engines`` (one pool per distinct engine shape):
    ``node_models`` in pipeline order, ``layer_split``, ``pipeline_parallel_size``, replicas.
    Helix's node types name catalog models where one matches (``A100`` -> ``A100-40GB``)."""
    catalog = {"A100": "A100-40GB", "V100": "V100-16GB"}
    shapes: dict[tuple, int] = {}
    for e in engines:
        key = (tuple(catalog.get(node_types[n], node_types[n]) for n in e.nodes), e.stages)
        shapes[key] = shapes.get(key, 0) + 1
    return [{"devices": "gpu", "replicas": count, "node_models": list(models),
             "layer_split": list(split), "engine": {"pipeline_parallel_size": len(split)}}
            for (models, split), count in shapes.items()]


def layout_capacity(model: ModelProfile, node_types: tuple[str, ...] | list[str],
                    layout: dict[int, list[int]]) -> float:
    """Estimated output tokens/s of one whole-model pipeline over the nodes of ``layout``
    (node index -> layer indices, as Helix's solution files give them), one stage a node in
    layer order: Helix's "separate pipelines" baseline, one per type."""
    ordered = sorted(layout.items(), key=lambda kv: min(kv[1]))
    stages = [(node_types[n], len(ls)) for n, ls in ordered]
    if not all(model.devices[t].fits(k) for t, k in stages):
        return math.nan  # more layers than the type holds (Helix's "force_set"): not estimated
    return pipeline_capacity(model, stages)


def read_layout(path: Path | str) -> dict[int, list[int]]:
    """A Helix solution file (``[Solution] compute_node_<i>=[layers]`` with ``offset``) ->
    cluster node index -> layer indices."""
    cp = configparser.ConfigParser()
    cp.read(path)
    offset = int(cp["Settings"]["offset"])
    return {int(k.rsplit("_", 1)[1]) - offset: json.loads(v) for k, v in cp["Solution"].items()}


def proportional_weights(capacities: list[float], top: int = 256) -> list[int]:
    """HAProxy weights (1..256) proportional to measured capacity, as ``capacity_weights`` sets
    them for engines with no requests waiting (the largest gets 256)."""
    best = max(capacities, default=0.0)
    if best <= 0:
        return [1] * len(capacities)
    return [max(1, min(top, round(top * c / best))) for c in capacities]


def routed_throughput(capacities: list[float], weights: list[float], offered: float) -> float:
    """Output tokens/s when ``offered`` tokens/s are split by ``weights`` over engines that
    sustain ``capacities`` (an engine past its capacity delivers its capacity; the fluid limit
    of weighted least-outstanding-requests routing, which sends no more to a backed-up engine
    than it finishes)."""
    total = sum(weights)
    if total <= 0 or not capacities:
        return 0.0
    return sum(min(offered * w / total, c) for c, w in zip(capacities, weights))


@lru_cache(maxsize=None)
def reference() -> dict:
    """Helix's own figures (``data/helix/reference.json``): its artifact's printed results and
    the runs of its simulator made for this comparison, each with where it comes from."""
    return json.loads((DATA / "reference.json").read_text())


@dataclass(frozen=True)
class SettingResult:
    """One of Helix's settings: Helix's throughput and hetflow's pools' on it."""

    setting: str
    helix: float
    """Helix's placement + max-flow routing, offline decode tokens/s (Helix's simulator)."""
    separate: float
    """Pools of same-type pipelines, routed by capacity (Helix's simulator, "separate")."""
    node_engines: int
    """Engines inside one node that fit (whole model on one node)."""
    node_throughput: float
    """Their throughput under proportional routing (0 with no engine)."""
    pipeline_replicas: int
    """hetflow's engines over nodes of one type (a pool's ``nodes``; one node where that holds
    the model) that fit, memory-respecting (:func:`plan_pools`, ``span="pipeline"``)."""
    pipeline_estimate: float
    """Their estimated capacity, every engine saturated under capacity routing."""
    separate_estimate: float
    """The same estimate for Helix's "separate" layouts (NaN where not shipped here or where
    they load more layers than a node holds)."""
    runnable_replicas: int
    """hetflow's engines over nodes (``node_models``): the mixes of
    :func:`plan_mixed_pipelines` whose nodes have as many GPUs each (``uniform``)."""
    runnable_estimate: float
    mixed_replicas: int
    mixed_estimate: float
    """Estimated capacity of mixed-type pipelines (:func:`plan_mixed_pipelines`), routed by
    capacity; the estimate runs below Helix's simulator (0.82x on the "separate" 30B layouts)."""
    equal_weights: float
    """The "separate" pools under equal weights, offered the load that capacity-proportional
    routing serves in full (``separate``): what the routing rule is worth (NaN: no per-pool
    figures)."""

    @property
    def sim_over_helix(self) -> float:
        """hetflow's pools as they are - engines over nodes (a pool's ``nodes``; of several
        types with ``node_models`` and ``layer_split``), the mixes of
        :func:`plan_mixed_pipelines` one vLLM engine can be (as many GPUs on each node), routed
        by capacity - over Helix's placement."""
        return self.runnable_estimate / self.helix

    @property
    def one_type_over_helix(self) -> float:
        """Engines over nodes of one type only (one pool per type) over Helix's placement."""
        return self.pipeline_estimate / self.helix

    @property
    def mixed_over_helix(self) -> float:
        """Mixed-type pipelines' estimated capacity over Helix's simulated throughput."""
        return self.mixed_estimate / self.helix

    @property
    def pipelines_over_helix(self) -> float:
        """Pools of single-type pipelines routed by capacity over Helix's placement."""
        return self.separate / self.helix


def evaluate(setting: str) -> SettingResult:
    """Both layouts of hetflow's pools on one of :data:`SETTINGS`, against Helix's figures."""
    model_name, cluster = setting.split("/")
    model, nodes = load_model(model_name), load_cluster(cluster)
    ref = reference()["settings"][setting]
    engines = plan_pools(model, nodes, "node")
    caps = [e.capacity for e in engines]
    offered = sum(caps)
    node_tp = routed_throughput(caps, proportional_weights(caps), offered) if engines else 0.0
    pipes = plan_pools(model, nodes, "pipeline")
    mixed = plan_mixed_pipelines(model, nodes)
    runnable = plan_mixed_pipelines(model, nodes, uniform=True)
    # the "separate" pools' capacities: Helix's simulator's per pool where recorded, else the
    # estimate of Helix's layouts scaled to Helix's simulated total
    pool_caps: list[float] = [float(v) for v in ref.get("separate_pools", {}).values()]
    estimates = []
    for path in sorted((DATA / "layouts").glob(f"{cluster}_{model_name}_separate_*_sol.ini")):
        pool = path.stem.split("_")[3].upper()
        estimates.append(layout_capacity(model, _subcluster(nodes, pool), read_layout(path)))
    sep_est = sum(estimates) if estimates else math.nan
    separate = float(ref["separate"]["decode_tokens_per_s"])
    if not pool_caps and estimates and not math.isnan(sep_est):
        pool_caps = [separate * e / sep_est for e in estimates]
    equal = (routed_throughput(pool_caps, [1.0] * len(pool_caps), sum(pool_caps))
             if pool_caps else math.nan)
    return SettingResult(
        setting=setting, helix=float(ref["helix"]["decode_tokens_per_s"]),
        separate=separate, node_engines=len(engines),
        node_throughput=node_tp, pipeline_replicas=len(pipes),
        pipeline_estimate=sum(e.capacity for e in pipes), separate_estimate=sep_est,
        runnable_replicas=len(runnable), runnable_estimate=sum(e.capacity for e in runnable),
        mixed_replicas=len(mixed), mixed_estimate=sum(e.capacity for e in mixed),
        equal_weights=equal)


def _subcluster(nodes: tuple[str, ...], pool: str) -> tuple[str, ...]:
    """Helix simulates each "separate" pool as a cluster of that type's nodes alone."""
    return tuple(t for t in nodes if t == pool)


def sim_over_helix(setting: str = PRIMARY) -> float:
    """The figure: hetflow's pool routing's throughput over Helix's placement's, on
    ``setting`` (default :data:`PRIMARY`, LLaMA-2 70B on Helix's 24-node cluster, offline)."""
    return evaluate(setting).sim_over_helix
