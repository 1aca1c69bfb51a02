"""Planning a serving config: each model's replica spec, input, memory and replica groups
(:func:`plan_models`; trains a missing checkpoint when the config says how), and the plan as
``hetflow serve --dry-run`` shows it (:func:`describe_plan`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ray

from hetflow.workloads.serve.access import AccessPlan
from hetflow.workloads.serve.config import (
    ModelServeConfig,
    ServeConfig,
    fallback_chain,
    upstream_chain,
    upstream_fallback,
)
from hetflow.workloads.serve.front import (
    FrontPlan,
    app_prefix,
    group_prefix,
)
from hetflow.workloads.serve.llm import DEFAULT_GPU_MEMORY
from hetflow.workloads.serve.placement import ReplicaGroup, plan_replica_groups
from hetflow.workloads.serve.upstream import plan_upstreams
from hetflow.workloads.serve.protocol import (
    InputSpec,
)
from hetflow.workloads.serve.web import url_of


if TYPE_CHECKING:  # torch is imported where a model is built, not by the gateway's replicas
    from hetflow.workloads.serve.inference import ReplicaSpec


@dataclass(frozen=True)
class ModelPlan:
    """One model ready to deploy: its replicas' spec and where they go."""

    entry: Any  # ModelServeConfig
    spec: ReplicaSpec
    input: InputSpec
    groups: list[ReplicaGroup]
    memory_bytes: int
    generative: bool = False  # its spec's serving output is sequence_logits (a causal LM)


def plan_models(config: ServeConfig, dry_run: bool = False,
                may_train: bool = True) -> dict[str, ModelPlan]:
    """Checkpoints found (or trained, unless ``dry_run`` or not ``may_train``), input specs
    and replica groups for every model. Needs a connected Ray (it reads the live hetflow
    snapshot)."""
    from hetflow.runtime.binding import live_snapshot
    from hetflow.workloads.serve.inference import (
        ReplicaSpec,
        entry_input_spec,
        entry_output,
        estimate_memory_bytes,
        source_of,
        train_config_of,
    )
    from hetflow.workloads.serve.placement import check_memory, plan_replica_groups

    snapshot = live_snapshot()
    ray_gpus = float(ray.cluster_resources().get("GPU", 0))
    plans: dict[str, ModelPlan] = {}
    for entry in config.models:
        if entry.engine == "vllm":  # planned and started by llm.py (plan_llm_pools)
            continue
        train = train_config_of(entry)
        checkpoint = ensure_checkpoint(entry, train, dry_run, may_train) \
            if train is not None and not entry.safetensors else None
        memory = check_memory(entry, estimate_memory_bytes(
            train, entry.precision, entry.torchscript or entry.exported))
        groups = plan_replica_groups(config.name, entry, snapshot, ray_gpus, memory)
        # Slots planned for this model hold memory for the next model's plan too.
        device = "cpu" if groups[0].compute == "cpu" else entry.devices.kind
        spec = ReplicaSpec(entry.name, train.model_dump(mode="json") if train else None,
                           checkpoint, entry.precision, device, entry.threads_per_replica,
                           source_of(entry))
        plans[entry.name] = ModelPlan(entry, spec, entry_input_spec(entry, train), groups,
                                      memory, entry_output(train) == "sequence_logits")
        snapshot = _with_groups(snapshot, config.name, entry, groups, memory)
    _check_fallback_inputs(config, plans)
    check_cpus(config, {n: mp.groups for n, mp in plans.items()}, float(ray.cluster_resources().get("CPU", 0)),
               refuse=_local_ray_started_here())
    return plans


def _local_ray_started_here() -> bool:
    """Whether this process started the Ray it is connected to (an embedded local Ray, which no
    node joins and no autoscaler grows), rather than joining a cluster."""
    try:
        import ray._private.worker as worker

        node = worker._global_node
        return node is not None and bool(node.all_processes)
    except Exception:  # noqa: BLE001 - Ray moved it: treat the cluster as one that may grow
        return False


def group_cpus(group: ReplicaGroup) -> float:
    """CPUs a replica group holds at its fixed (or least autoscaled) size."""
    count = group.num_replicas if group.num_replicas is not None else group.autoscaling["min_replicas"]
    per = group.ray_actor_options.get("num_cpus") or 0.0
    if group.placement_group_bundles:
        per = sum(b.get("CPU", 0.0) for b in group.placement_group_bundles)
    return count * float(per)


def check_cpus(config: ServeConfig, groups: dict[str, list[ReplicaGroup]], cluster_cpus: float,
               refuse: bool = True) -> None:
    """When the replicas ask for more CPUs than the whole cluster has (the gateway's replicas and
    ``engine: vllm`` pools count too): with ``refuse`` (a local Ray started here, which nothing
    grows) Unschedulable, exit 3 - the rest would wait for a CPU forever (Ray queues an actor it
    cannot place) while the server is ready on the ones that fit; else (a cluster that nodes may
    join or an autoscaler may grow) one warning line on stderr."""
    from hetflow.core.errors import Unschedulable

    asks = {name: sum(group_cpus(g) for g in gs) for name, gs in groups.items()}
    for entry in config.models:  # engine: vllm models, planned later: each pool's replicas
        if entry.engine == "vllm":
            asks[entry.name] = sum(p.planned_replicas * p.cpus_per_replica for p in entry.effective_pools)
    gateway = config.gateway.replicas * config.gateway.cpus
    total = sum(asks.values()) + gateway
    if cluster_cpus > 0 and total > cluster_cpus + 1e-9:
        def num(x: float) -> str:
            return f"{round(x):,}" if abs(x - round(x)) < 1e-9 else f"{x:,.2f}"
        parts = ", ".join(f"{n} {num(c)}" for n, c in sorted(asks.items(), key=lambda kv: -kv[1]) if c)
        what = (f"the replicas ask for {num(total)} CPUs ({parts}; the gateway {num(gateway)}) and the cluster "
                f"has {num(cluster_cpus)}")
        if refuse:
            raise Unschedulable(f"{what}: lower replicas or cpus_per_replica, or serve on a larger cluster "
                                "(--address)")
        import sys

        print(f"hetflow: warning: {what} now; the rest wait until nodes join or the autoscaler adds them",
              file=sys.stderr)


def _with_groups(snapshot: Any, app: str, entry: Any, groups: list[ReplicaGroup],
                 memory: int) -> Any:
    """The snapshot with the model's planned replicas allocated (for the next model's plan)."""
    from dataclasses import replace

    from hetflow.core.topology import Allocation

    allocs = []
    for group in groups:
        if group.device is None:
            continue
        count = group.num_replicas or group.autoscaling["max_replicas"]
        for i in range(count):
            allocs.append(Allocation(f"{group.deployment}-{i}", group.device.node,
                                     group.device.device, memory,
                                     exclusive=not entry.devices.share))
    return replace(snapshot, allocations=snapshot.allocations + tuple(allocs))


def _check_fallback_inputs(config: ServeConfig, plans: dict[str, ModelPlan]) -> None:
    from hetflow.core.errors import InputError

    for entry in config.models:
        if entry.fallback in plans and plans[entry.fallback].input != plans[entry.name].input:
            raise InputError(f"model {entry.name}: fallback {entry.fallback} takes different "
                             f"input ({plans[entry.fallback].input.description}) than "
                             f"{entry.name} ({plans[entry.name].input.description})")


def ensure_checkpoint(entry: Any, train: Any, dry_run: bool = False,
                      may_train: bool = True) -> str | None:
    """The checkpoint directory to load (None for random weights); trains first when
    ``train_if_missing`` and no complete checkpoint exists (not with ``dry_run``; refused
    when not ``may_train``: Serve's application builder does not train)."""
    from pathlib import Path

    from hetflow.core.errors import InputError
    from hetflow.workloads.train.checkpoint import latest_checkpoint

    if entry.weights == "random":
        return None
    directory = Path(entry.checkpoint_dir).absolute() if entry.checkpoint_dir else train.checkpoint_dir
    if latest_checkpoint(directory) is None:
        if not may_train and not dry_run:
            raise InputError(f"model {entry.name}: no complete checkpoint in {directory}; "
                             "train it first (hetflow train, or hetflow serve once with "
                             "train_if_missing) - Serve's application builder does not train")
        if not entry.train_if_missing:
            raise InputError(f"model {entry.name}: no complete checkpoint in {directory}; train "
                             "it first (hetflow train) or set train_if_missing: true")
        if dry_run:
            return str(directory)  # it would be trained first
        from hetflow.workloads.train.job import run_training

        if entry.checkpoint_dir:
            train = train.with_overrides(checkpoint={"dir": str(directory)})
        run_training(train)
    return str(directory)


def describe_plan(config: ServeConfig, plans: dict[str, ModelPlan],
                  llm_groups: dict[str, list[tuple[int, ReplicaGroup]]] | None = None) -> dict[str, Any]:
    """What ``deploy`` would place and start (``hetflow serve --dry-run``); ``llm_groups``:
    :func:`plan_llm_pools`' answer for the ``engine: vllm`` models."""
    fast = set(plans) - via_gateway(plans)
    llm = {}
    for name, groups in (llm_groups or {}).items():
        entry = config.model(name)
        routing = entry.routing.model_dump() if entry.routing is not None else {"affinity": "none"}
        llm[name] = {"routing": routing, "fallback": entry.fallback,
                     "engines": [_describe_engine(entry, i, g) for i, g in groups]}
    return {
        "llm": llm,
        "front_door": {"url": url_of(config.http.host, config.http.port), "haproxy": None},
        "applications": [
            *[{"name": g.deployment, "model": n, "route_prefix": group_prefix(config.name, n, i),
               "ingress": "ModelServer", "replicas": g.num_replicas,
               "autoscaling": g.autoscaling, "compute": g.compute,
               "device": str(g.device) if g.device else None,
               "path": "direct" if n in fast else "gateway"}
              for n, mp in plans.items() for i, g in enumerate(mp.groups)],
            {"name": config.name, "route_prefix": app_prefix(config.name), "ingress": "Gateway",
             "replicas": config.gateway.replicas}],
        "models": {n: {"input": mp.input.description, "precision": mp.entry.precision,
                       "checkpoint": mp.spec.checkpoint, "source": mp.spec.source or None,
                       "memory_bytes": mp.memory_bytes, "fallback": mp.entry.fallback,
                       "generative": mp.generative,
                       "placement": [g.describe() for g in mp.groups]}
                   for n, mp in plans.items()},
    }


def llm_queue_limit(entry: Any) -> int:
    """An ``engine: vllm`` model's requests in flight per engine past which the front door
    answers 503: ``queue_limit``, else twice the most sequences an engine of it runs at once
    (``max_num_seqs``; vLLM's 256 when not set) - a full batch running and one waiting."""
    if entry.queue_limit is not None:
        return entry.queue_limit
    return 2 * max(entry.vllm.merged(p.engine).max_num_seqs or 256 for p in entry.effective_pools)


def _describe_engine(entry: Any, pool: int, group: ReplicaGroup) -> dict[str, Any]:
    """One planned engine group of an ``engine: vllm`` model: its pool (from 1), replicas, what
    it computes on and, when placed on hetflow devices, which (node:index, in rank order)."""
    from hetflow.runtime.resources import DEVICE_RESOURCE_PREFIX

    resources = group.ray_actor_options.get("resources") or {}
    node = group.device.node if group.device is not None else None
    devices = [f"{node}:{k[len(DEVICE_RESOURCE_PREFIX):]}" for k in resources
               if node is not None and k.startswith(DEVICE_RESOURCE_PREFIX)]
    engine = entry.vllm.merged(entry.effective_pools[pool].engine)
    out = {"pool": pool + 1, "replicas": group.num_replicas, "compute": group.compute,
           "devices": devices, "ray_gpus": group.ray_actor_options.get("num_gpus") or 0,
           "tensor_parallel_size": engine.tensor_parallel_size,
           "weight": entry.effective_pools[pool].weight}
    scaling = entry.effective_pools[pool].autoscaling
    if scaling is not None:  # its engines are planned up to max_replicas; the front door scales
        out["autoscaling"] = {"min_replicas": scaling.min_replicas,
                              "initial_replicas": scaling.initial_replicas or scaling.min_replicas,
                              "max_replicas": scaling.max_replicas,
                              "target_ongoing_requests": scaling.target_ongoing_requests}
    if group.stages:
        out["nodes"] = len(group.stages)
        out["pipeline_parallel_size"] = engine.pipeline_parallel_size
        split = (group.stages[0].get("runtime_env") or {}).get("env_vars", {}).get("VLLM_PP_LAYER_PARTITION")
        if split:
            out["layer_split"] = [int(k) for k in split.split(",")]
        if group.stage_nodes:  # each node's devices, the engine's first node first
            out["devices"] = [f"{node}:{k[len(DEVICE_RESOURCE_PREFIX):]}"
                              for node, options in zip(group.stage_nodes, group.stages)
                              for k in options.get("resources") or {}
                              if k.startswith(DEVICE_RESOURCE_PREFIX)]
    return out


def via_gateway(plans: dict[str, ModelPlan]) -> set[str]:
    """Models served through the gateway rather than straight to their replicas (see
    ``FrontPlan.via_gateway``): the autoscaled ones."""
    return {n for n, mp in plans.items() if mp.entry.autoscaling is not None}


def plan_pools(app: str, entry: Any, snapshot: Any, ray_gpus: float
               ) -> list[tuple[int, ReplicaGroup]]:
    """``(pool index, ReplicaGroup)`` for every pool of an ``engine: vllm`` entry, planned on
    the live snapshot like hetflow's own replicas (one device per replica, exclusive unless
    the pool shares). Raises InputError / Unschedulable."""
    out = []
    for i, pool in enumerate(entry.effective_pools):
        engine = entry.vllm.merged(pool.engine)
        memory = pool.devices.memory_bytes if pool.devices.memory is not None else DEFAULT_GPU_MEMORY
        if pool.nodes > 1:
            groups, snapshot = _multi_node_groups(app, entry, i, pool, engine, snapshot, memory)
            out += [(i, group) for group in groups]
            continue
        if pool.devices.kind == "gpu" and engine.tensor_parallel_size > 1:
            groups, snapshot = _tensor_parallel_groups(app, entry, i, pool, engine.tensor_parallel_size,
                                                       snapshot, ray_gpus, memory)
            out += [(i, group) for group in groups]
            continue
        shadow = ModelServeConfig.model_construct(
            name=f"{entry.name}-p{i + 1}", devices=pool.devices.model_copy(update={"strategy": "pack"}),
            replicas=pool.planned_replicas, autoscaling=None, cpus_per_replica=pool.cpus_per_replica,
            precision="fp32", gpu_fraction=1.0)
        for group in plan_replica_groups(app, shadow, snapshot, ray_gpus, memory):
            out.append((i, group))
    return out


def _tensor_parallel_groups(app: str, entry: Any, index: int, pool: Any, tp: int, snapshot: Any,
                            ray_gpus: float, memory: int) -> tuple[list[ReplicaGroup], Any]:
    """A tensor-parallel pool: each replica one engine over ``tp`` whole devices of one node,
    planned as the planner plans a tensor-parallel group (on the node's fastest links: NVLink /
    NVSwitch / xGMI islands before PCIe), one replica at a time on the updated snapshot; the
    engine sees exactly those devices, in that order. Without hetflow nodes, ``tp`` of Ray's
    own GPUs per replica. Returns the groups and the snapshot with them taken."""
    from hetflow.core.errors import Unschedulable
    from hetflow.core.request import PlacementRequest
    from hetflow.runtime.resources import device_ask
    from hetflow.workloads.serve.placement import has_devices, plan_in_turn

    base = f"{app}.{entry.name}-p{index + 1}"
    where = f"model {entry.name}: pool {index + 1}"
    count = pool.planned_replicas  # autoscaling: its maximum, planned up front
    if not has_devices(snapshot, pool):
        if count * tp > ray_gpus + 1e-9:
            raise Unschedulable(f"{where}: {count} replicas x tensor_parallel_size {tp} "
                                f"need {count * tp} GPUs; the cluster has no hetflow GPU "
                                f"node and {ray_gpus:g} Ray GPUs")
        options = {"num_cpus": pool.cpus_per_replica, "num_gpus": tp}
        return [ReplicaGroup(entry.name, f"{base}-tp{tp}", count, None, options,
                             compute="gpu")], snapshot
    requests = [PlacementRequest.parse(
        f"{base}-r{r}", count=tp, memory=memory, memory_note="LLM replica (per device)",
        vendor=pool.devices.vendor, model=pool.devices.model, share=False) for r in range(count)]
    placements, snapshot = plan_in_turn(requests, snapshot, lambda r, exc: (
        f"{where}: replica {r + 1} of {count} (tensor_parallel_size {tp}) does not fit "
        f"({exc}); lower replicas or tensor_parallel_size"))
    groups = []
    for r, placement in enumerate(placements):
        if len(placement.nodes) != 1:
            raise Unschedulable(f"{where}: replica {r + 1}'s {tp} devices must be on one node; "
                                f"the best placement spans {', '.join(placement.nodes)} - lower "
                                "tensor_parallel_size to a node's device count")
        ask = device_ask(snapshot, placement.devices, None, exclusive=True)
        name = f"{base}-r{r}-{'-'.join(str(ref.device) for ref in placement.devices)}"
        groups.append(ReplicaGroup(
            entry.name, name, 1, None, ask.actor_options(pool.cpus_per_replica),
            placement_group_bundles=[ask.bundle(pool.cpus_per_replica)],
            bundle_label_selector=[ask.selector], device=placement.devices[0], compute="gpu",
            env=ask.env))
    return groups, snapshot


def _multi_node_groups(app: str, entry: Any, index: int, pool: Any, engine: Any, snapshot: Any,
                       memory: int) -> tuple[list[ReplicaGroup], Any]:
    """A pool whose engines span ``pool.nodes`` nodes: each replica's tensor_parallel_size x
    pipeline_parallel_size processes split evenly over that many distinct nodes. On hetflow GPU
    nodes each node's share is planned like a tensor-parallel group (fastest links, memory),
    node after node, never twice on one node; on CPUs or Ray's own GPUs Ray puts one bundle per
    node (``STRICT_SPREAD``). Returns the groups (one per replica on hetflow nodes) and the
    snapshot with them taken."""
    from dataclasses import replace

    from hetflow.core.errors import Unschedulable
    from hetflow.scheduling.planner import plan
    from hetflow.core.request import PlacementRequest
    from hetflow.runtime.resources import device_ask
    from hetflow.workloads.serve.placement import has_devices

    n = pool.nodes
    per = engine.tensor_parallel_size * engine.pipeline_parallel_size // n
    base = f"{app}.{entry.name}-p{index + 1}"
    where = f"model {entry.name}: pool {index + 1}"
    cpus = pool.cpus_per_replica
    models = pool.node_models or [pool.devices.model] * n
    if pool.devices.kind == "gpu" and has_devices(snapshot, pool):
        groups = []
        for r in range(pool.planned_replicas):
            stages, nodes, first, held = [], [], None, []
            for s in range(n):
                view = replace(snapshot, nodes=tuple(nd for nd in snapshot.nodes if nd.name not in nodes))
                request = PlacementRequest.parse(
                    f"{base}-r{r}-n{s + 1}", count=per, memory=memory,
                    memory_note="LLM replica (per device)", vendor=pool.devices.vendor,
                    model=models[s], share=False)
                try:
                    placement = plan(view, request)
                except Unschedulable as exc:
                    raise Unschedulable(
                        f"{where}: replica {r + 1}'s node {s + 1} of {n} ({per} devices on one "
                        f"node it does not use yet) does not fit ({exc}); lower replicas or "
                        "nodes") from None
                if len(placement.nodes) != 1:
                    raise Unschedulable(f"{where}: replica {r + 1} needs {per} free devices on each "
                                        f"of {n} nodes; node {s + 1}'s best placement spans "
                                        f"{', '.join(placement.nodes)} - raise nodes")
                snapshot = placement.apply_to(snapshot)
                ask = device_ask(snapshot, placement.devices, None, exclusive=True)
                options = ask.actor_options(cpus)
                options["label_selector"] = dict(ask.selector)
                stages.append(options)
                nodes.append(placement.nodes[0])
                first = first or placement.devices[0]
                node = snapshot.node(placement.nodes[0])
                held.append(sum(node.device(ref.device).memory_bytes for ref in placement.devices))
            split = layer_split(entry, pool, engine, held, where)
            if split:
                for options in stages:  # every stage's processes load their own layers by it
                    options["runtime_env"]["env_vars"]["VLLM_PP_LAYER_PARTITION"] = ",".join(map(str, split))
            groups.append(ReplicaGroup(entry.name, f"{base}-r{r}-x{n}", 1, None, stages[0],
                                       device=first, compute="gpu", stages=tuple(stages),
                                       stage_nodes=tuple(nodes)))
        return groups, snapshot
    if pool.node_models:
        raise Unschedulable(f"{where}: node_models need hetflow GPU nodes (Ray's own GPUs carry "
                            "no model): start the nodes with hetflow node start, or drop node_models")
    gpus = per if pool.devices.kind == "gpu" else 0
    bundle = {k: float(v) for k, v in (("CPU", cpus), ("GPU", gpus)) if v > 0} or {"CPU": 0.01}
    if ray.is_initialized():
        fit = sum(1 for nd in ray.nodes() if nd.get("Alive")
                  and all(nd.get("Resources", {}).get(k, 0) >= v for k, v in bundle.items()))
        if fit < n:
            raise Unschedulable(f"{where}: one engine over {n} nodes needs {n} nodes with "
                                f"{bundle} each; the cluster has {fit} - lower nodes")
    options: dict[str, Any] = {"num_cpus": bundle.get("CPU", 0.0), "num_gpus": gpus}
    split = layer_split(entry, pool, engine, [], where)  # only a given one: no memory known here
    if split:
        options["runtime_env"] = {"env_vars": {"VLLM_PP_LAYER_PARTITION": ",".join(map(str, split))}}
    return [ReplicaGroup(entry.name, f"{base}-x{n}", pool.planned_replicas, None, options,
                         compute=pool.devices.kind, stages=(options,) * n,
                         spread=(bundle,) * n)], snapshot


def layer_split(entry: Any, pool: Any, engine: Any, held: list[int], where: str) -> list[int] | None:
    """The layers of each pipeline stage of an engine whose nodes hold ``held`` bytes of device
    memory each: the pool's ``layer_split``; else, one stage a node over nodes that differ in
    memory, in proportion to it (the layer count from the model folder); else None (vLLM's even
    split). Raises Unschedulable when the given split does not add up to the model's layers."""
    from hetflow.core.errors import Unschedulable
    from hetflow.workloads.serve.llm import model_layers, proportional_split

    layers = model_layers(engine.model)
    if pool.layer_split is not None:
        if layers is not None and sum(pool.layer_split) != layers:
            raise Unschedulable(f"{where}: layer_split adds up to {sum(pool.layer_split)} layers, "
                                f"the model has {layers}")
        return list(pool.layer_split)
    if engine.pipeline_parallel_size != len(held) or len(set(held)) == 1 or layers is None:
        return None
    if layers < len(held):
        raise Unschedulable(f"{where}: {len(held)} pipeline stages for a model of {layers} layers")
    return proportional_split(layers, [float(h) for h in held])


def plan_llm_pools(config: ServeConfig) -> dict[str, list[tuple[int, ReplicaGroup]]]:
    """``engine: vllm`` models -> their pools' replica groups on the live snapshot."""
    from hetflow.runtime.binding import live_snapshot

    llms = [m for m in config.models if m.engine == "vllm"]
    if not llms:
        return {}
    snapshot = live_snapshot()
    ray_gpus = float(ray.cluster_resources().get("GPU", 0))
    return {m.name: plan_pools(config.name, m, snapshot, ray_gpus) for m in llms}


def front_plan(config: ServeConfig, plans: dict[str, ModelPlan],
               llm_servers: dict[str, list[tuple[str, str, int, int]]] | None = None
               ) -> FrontPlan:
    """The front door's plan; ``llm_servers``: ``engine: vllm`` model -> its replicas'
    (name, host, port, weight)."""
    from hetflow.workloads.serve.upstream import llm_backend

    llms = tuple(llm_backend(name, servers, config.limits.request_timeout_s, config.model(name).routing,
                             llm_queue_limit(config.model(name)))
                 for name, servers in sorted((llm_servers or {}).items()))
    return FrontPlan(
        app=config.name, host=config.http.host, port=config.http.port,
        models={n: [g.deployment for g in mp.groups] for n, mp in plans.items()},
        gateway_app=config.name, request_timeout_s=config.limits.request_timeout_s,
        retries=config.gateway.retries, max_body_bytes=config.limits.body_bytes,
        client_timeout_s=config.limits.client_timeout_s,
        route_prefix=config.http.route_prefix,
        fallbacks={n: fallback_chain(config, n)[1:] for n in plans},
        via_gateway=frozenset(via_gateway(plans)),
        access=(AccessPlan(store=config.auth.store, default_model=config.default)
                if config.auth.enabled(config.http.host) else None),
        queue_limits={n: mp.entry.effective_queue_limit for n, mp in plans.items()},
        upstreams=llms + plan_upstreams(config.upstreams),
        # (an engine: vllm model's fallback too: its engines' backend is an upstream's)
        upstream_fallbacks={n: u for n in [*plans, *(llm_servers or {})]
                            if (u := upstream_fallback(config, n)) is not None},
        upstream_chains={u.name: tuple(upstream_chain(config, u.name)[1:])
                         for u in config.upstreams if u.fallback},
        default_model=config.default,
        generative=frozenset(n for n, mp in plans.items() if mp.generative),
        nice=config.http.nice,
        realtime=config.http.realtime,
        front_token=config.auth.enabled(config.http.host))


__all__ = ["describe_plan", "ensure_checkpoint", "front_plan", "ModelPlan", "plan_llm_pools",
           "plan_models", "via_gateway"]
