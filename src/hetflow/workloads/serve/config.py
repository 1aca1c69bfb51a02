"""A serving application's configuration: one YAML file -> one frozen, validated ``ServeConfig``.

Every section is a frozen pydantic model that refuses unknown keys; a bad file raises
:class:`~hetflow.core.errors.InputError` naming the key path (``models.0.batching.max_batch``)
and what to write instead. Each field's docstring is its documentation (``docs/serving.md``).

Example (``examples/serve_digits.yaml``)::

    name: digits
    http: {host: 127.0.0.1, port: 8000}
    models:
      - name: digits
        train_config: train_digits.yaml     # relative to this file
        train_if_missing: true
        replicas: 2
        batching: {max_batch_size: 32, batch_wait_timeout_s: 0.002}

Cross-field rules (:func:`combination_errors`): model names are unique; every ``fallback`` and
``default_model`` names a model of the file and fallbacks form no cycle (an ``engine: vllm``
model's fallback is an OpenAI upstream, and no torch model falls back to one); a model gives exactly
one of ``train_config`` / ``train``; ``replicas`` and ``autoscaling`` exclude each other;
bf16/fp16 run on GPUs only and int8 on CPUs only.

Why one file of about 760 lines: every section's schema, read top to bottom as the YAML is;
each field's docstring is its documentation, and the cross-section checks need them all.
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hetflow.core.devices import DeviceKeys, DeviceSpec
from hetflow.core.errors import InputError
from hetflow.core.units import parse_bytes
from hetflow.core.validation import describe
from hetflow.core.yamlfile import read_yaml
from hetflow.workloads.serve.autoscaling import MAX_REPLICAS, AutoscalingConfig
from hetflow.workloads.serve.llm import POOL_DEVICES, LLMPool, LLMRouting, VLLMEngine

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
# Chosen by measurement on a 2-core CPU host (docs/serving.md, "Batching defaults").
DEFAULT_MAX_BATCH_SIZE = 32
DEFAULT_BATCH_WAIT_TIMEOUT_S = 0.002
SERVED_DEVICES = DeviceKeys("a served model", ("kind", "model", "vendor", "memory", "share", "strategy"),
                            {"kind": "auto", "share": True, "strategy": "pack"})
"""A served model's ``devices``: one replica's (hetflow.core.devices)."""



class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class HTTPConfig(_Section):
    """Where the front door (HAProxy) listens."""

    host: str = "127.0.0.1"
    """Address to bind (the replicas' own ports bind it too). The default is loopback only;
    anything else exposes the models to the network, and API keys are then required
    (``auth``)."""
    port: int = Field(8000, ge=1, le=65535)
    """TCP port of the front door."""
    route_prefix: str = Field("/", pattern=r"^/([A-Za-z0-9._~-]+(/[A-Za-z0-9._~-]+)*)?$")
    """Path every endpoint lives under, e.g. ``/digits`` -> ``/digits/v1/models/<m>/predict``
    (and the OpenAI client's ``base_url`` ``.../digits/v1``)."""
    nice: int | None = Field(None, ge=-20, le=19)
    """The front door's (HAProxy's) CPU priority, a Unix nice value. Unset (the default), it is
    its actor's: Ray starts its workers at nice 15, the Serve replicas' and engines' actors
    too. Measured on 2 cores (docs/benchmarks.md): HAProxy at 0 in front of Serve replicas at
    15 took their CPU (capacity 1,261-1,316 req/s against 1,449-1,481, refusals' P99 21.6-48.5
    ms against 13.6-16.7), and in front of a vLLM engine at 0 it gained nothing (one pair:
    TTFT P99 1.39x plain vLLM's against 0.48x). Set it where other work on the node must not
    delay the front door (training ranks, another tenant's jobs). A value below the actor's
    needs root, ``CAP_SYS_NICE`` or ``RLIMIT_NICE``; without it HAProxy keeps its actor's, with
    a line in the actor's log."""
    realtime: int | None = Field(None, ge=1, le=99)
    """Run the front door (HAProxy, every thread, its reloads' workers too) under Linux's
    ``SCHED_FIFO`` real-time policy at this priority (1-99), so that it answers - and refuses
    past a queue limit - as soon as a request arrives instead of waiting for a core behind the
    replicas' work. HAProxy only wakes for network events and does little each time; the
    kernel still keeps 5% of every second for ordinary processes (``sched_rt_runtime_us``).
    Measured on 2 cores at 3x capacity (docs/benchmarks.md, Gateway runs 17-25): the refusals'
    P99 4.1-5.0 ms against 7.9-10.9 unset, the admitted ones' within the runs' spread. Unset
    (the default): the ordinary policy. Needs root, ``CAP_SYS_NICE`` or ``RLIMIT_RTPRIO``;
    without it HAProxy runs as usual, with a line in the actor's log. Takes precedence over
    ``nice`` (which orders only ordinary processes)."""


class LimitsConfig(_Section):
    """What one request may carry. Anything beyond is refused with a 4xx and a message."""

    max_body_bytes: int | str = "1MiB"
    """Largest request body (e.g. ``64KiB``, ``1MiB``); a bigger one gets 413."""
    max_rows: int = Field(32, gt=0)
    """Most input rows in one request; more gets 413."""
    request_timeout_s: float = Field(30.0, gt=0, le=86_400)
    """How long the gateway waits for a model's answer before replying 504."""
    max_new_tokens: int = Field(256, gt=0)
    """Most tokens one ``/v1/completions`` request may ask for (``max_tokens``); more is a 400."""
    client_timeout_s: float = Field(10.0, gt=0)
    """How long a client may take to send its request (headers and body); a slower one gets
    408 from the front door and holds no replica meanwhile."""

    @property
    def body_bytes(self) -> int:
        return parse_bytes(self.max_body_bytes)


class GatewayConfig(_Section):
    """The ingress deployment: parses and checks requests, routes them by model name, falls
    back when a model's replicas are down, and serves /health and /metrics."""

    replicas: int = Field(1, gt=0, le=1_000)
    """Gateway replicas (/metrics shows the sum of every replica's counts, whichever answers)."""
    cpus: float = Field(0.0, ge=0, le=4_096)
    """CPUs Ray reserves for each gateway replica (it mostly waits on I/O)."""
    status_poll_s: float = Field(0.5, gt=0)
    """How often the gateway reads Serve's replica states (to route around a model whose
    replicas are all down)."""
    retries: int = Field(1, ge=0)
    """Extra attempts on the same model when the replica a request was sent to died under it
    (inference is idempotent); then the fallback model is tried."""


class AuthConfig(_Section):
    """API keys at the front door (docs/serving.md, "Gateway"): made with ``hetflow keys
    create``; clients send ``Authorization: Bearer KEY`` (or ``x-api-key``)."""

    mode: Literal["auto", "keys", "none"] = "auto"
    """``keys``: every request but health probes needs a key; ``none``: open to anyone who
    reaches the port; ``auto``: ``keys`` when ``http.host`` is not loopback, else ``none``."""
    store: str = "file"
    """Where the keys live: ``file`` (``~/.hetflow/keys``, or ``$HETFLOW_KEYS_DIR``), a
    directory, or ``cluster`` (the Ray cluster's GCS key-value store, for front doors on any
    node; ``hetflow keys --address``)."""

    def enabled(self, host: str) -> bool:
        return self.mode == "keys" or (self.mode == "auto" and not is_loopback(host))


class BatchingConfig(_Section):
    """Dynamic batching (``@serve.batch``) inside each model replica."""

    enabled: bool = True
    """Gather concurrent requests into one forward pass. Off: each request runs alone."""
    max_batch_size: int = Field(DEFAULT_MAX_BATCH_SIZE, gt=0, le=65_536)
    """Most input rows in one forward pass (rows, not requests: a request may carry several).
    A request with more rows than this runs alone."""
    batch_wait_timeout_s: float = Field(DEFAULT_BATCH_WAIT_TIMEOUT_S, ge=0, le=60)
    """How long the first request of a batch waits for others. It bounds the latency batching
    adds at low load; under load batches fill before it expires."""
    concurrent_batches: int | None = Field(None, gt=0)
    """Batches of this model in flight at once, over all its replicas. Default: 2 per replica
    slot (``replicas``, or ``autoscaling.max_replicas``), so every replica has one batch
    running and the next one on its way; 1 would run the model's batches one after another
    however many replicas it has."""


class InputSection(_Section):
    """What one request row is, for a model file that does not say (TorchScript, torch.export)
    or to override a spec's description."""

    kind: Literal["float", "int"] = "float"
    """``float``: JSON numbers; ``int``: whole numbers (token ids)."""
    width: int = Field(gt=0)
    """Values per row."""
    low: float | None = None
    """Smallest value allowed (inclusive), when the model has a range."""
    high: float | None = None
    """Largest value allowed (inclusive)."""
    outputs: int = Field(gt=1)
    """Classes (or vocabulary) the model's logits cover."""
    description: str = ""
    """Shown in error messages, e.g. ``8 coordinates of a point``."""


class ModelServeConfig(_Section):
    """One served model: where its weights come from, how it runs, how many replicas."""

    name: str = Field(min_length=1, pattern=NAME_PATTERN)
    """Name clients ask for (``POST /v1/models/<name>/predict``)."""
    train_config: str | None = None
    """Training YAML that produced the checkpoint (relative to this file). Its model section
    builds the network and its checkpoint directory holds the weights."""
    train: dict[str, Any] | None = None
    """The training config inline, instead of ``train_config`` (same keys as a training YAML).
    Its ``model`` section names the network: a built-in (``kind: mlp``) or the user's spec by
    import path (``spec: "pkg.mod:SPEC"``)."""
    torchscript: str | None = None
    """A TorchScript file (``torch.jit.save``) to serve instead of a spec's model; needs
    ``input``. Relative to this file."""
    exported: str | None = None
    """A ``torch.export`` program (``torch.export.save``, ``.pt2``) to serve; needs ``input``.
    Relative to this file."""
    safetensors: str | None = None
    """Weights (``safetensors.torch.save_file`` of the model's ``state_dict``) for the model
    the training config's spec builds, instead of a hetflow checkpoint. Relative to this file."""
    input: InputSection | None = None
    """The request row (required with ``torchscript``/``exported``; else the spec's)."""
    preprocess: str | None = None
    """``pkg.mod:fn``: called on each batch's checked rows (a numpy array) before the model;
    returns an array or tensor the model takes."""
    postprocess: str | None = None
    """``pkg.mod:fn``: called on the model's output tensor; returns the logits
    (``(rows, outputs)``) predictions are taken from."""
    checkpoint_dir: str | None = None
    """Take weights from the newest complete checkpoint here instead of the training config's
    directory (relative paths from the current directory, as in training)."""
    weights: Literal["checkpoint", "random"] = "checkpoint"
    """``checkpoint``: the newest complete checkpoint. ``random``: the untrained initial weights
    (``train.seed``), for load tests of model sizes that were never trained."""
    train_if_missing: bool = False
    """When no checkpoint exists yet, run the training config first (``run_training``)."""
    precision: Literal["fp32", "bf16", "fp16", "int8"] = "fp32"
    """``fp32``; ``bf16`` or ``fp16`` weights and activations on GPUs; ``int8``: dynamic
    quantisation of the linear layers (int8 weights, activations quantised per batch) on CPUs."""
    devices: DeviceSpec = Field(default_factory=SERVED_DEVICES.default)
    """One replica's devices (:mod:`hetflow.core.devices`): ``kind`` ``cpu``, ``gpu`` (each
    replica on a GPU: hetflow-managed devices placed by the planner, else Ray's own GPUs) or
    ``auto`` (default: GPUs when the cluster has them, else CPU); ``model`` (a catalog model,
    e.g. ``L40S``) and ``vendor`` (hetflow-managed nodes; either makes it a GPU's); ``memory``,
    the device memory one replica needs, e.g. ``2GiB`` (default: 512 MiB plus twice the weights
    at the serving precision: the planner puts several replicas on one device while their memory
    fits); ``share`` (default ``true``: replicas of this and other jobs share a device by memory;
    ``false``: one whole device per replica); ``strategy`` ``pack`` (default: fill partly used
    devices and nodes first) or ``spread`` (emptiest nodes first). The earlier flat keys
    (``device``, ``accelerator``, ``vendor``, ``memory``, ``share_devices``, ``strategy``) are
    read with a deprecation warning until the next release."""
    gpu_fraction: float | None = Field(None, gt=0, le=1)
    """On Ray's own GPUs (nodes hetflow does not manage): ``num_gpus`` per replica. Default:
    ``devices.memory`` over the GPU's memory (Ray's ``accelerator_type`` looked up in the catalog)
    when ``devices.share``, so replicas share a GPU by memory there too; a whole GPU otherwise."""
    replicas: int | None = Field(None, gt=0, le=MAX_REPLICAS)
    """A fixed number of replicas (default 1 when ``autoscaling`` is not given)."""
    autoscaling: AutoscalingConfig | None = None
    """Scale replicas with the load instead of a fixed number."""
    batching: BatchingConfig = Field(default_factory=BatchingConfig)
    """Dynamic batching."""
    max_ongoing_requests: int | None = Field(None, gt=0, le=1_000_000)
    """Requests Serve sends to one replica before queueing at the caller (default: twice
    ``batching.max_batch_size``, at least 16, so a batch can fill while another runs)."""
    cpus_per_replica: float = Field(1.0, ge=0, le=4_096)
    """CPUs Ray reserves for each replica."""
    threads_per_replica: int = Field(1, gt=0)
    """torch intra-op threads in each replica."""
    health_check_period_s: float = Field(2.0, gt=0)
    """How often Serve checks each replica (a dead one is replaced after it fails)."""
    fallback: str | None = None
    """Model or upstream that answers this model's requests while none of its replicas is
    running, or past its ``queue_limit`` (an upstream: instead of the 503). ``engine: vllm``:
    an upstream of protocol ``openai``."""
    engine: Literal["torch", "vllm"] = "torch"
    """``torch``: hetflow's own replica (a spec's model, TorchScript or torch.export).
    ``vllm``: an LLM on vLLM's OpenAI server (``vllm:`` its engine arguments, ``pools:`` its
    replicas by device; :mod:`hetflow.workloads.serve.llm`)."""
    vllm: VLLMEngine | None = None
    """vLLM's engine arguments (``engine: vllm``)."""
    pools: list[LLMPool] = Field(default_factory=list)
    """``engine: vllm``: replica pools, each on one kind of device with its own engine
    overrides, behind this one model name (default: one pool from ``devices``, ``replicas``,
    ``cpus_per_replica``)."""
    routing: LLMRouting | None = None
    """``engine: vllm``: how the front door picks an engine (default: the one with the fewest
    requests in flight, weighted by measured capacity; ``affinity: prefix`` for prefix-cache
    affinity with bounded load: :class:`~hetflow.workloads.serve.llm.LLMRouting`)."""
    queue_limit: int | None = Field(None, ge=0, le=1_000_000)
    """Requests in flight per running replica past which the front door answers ``503``
    (``Retry-After: 1``) at once instead of queueing, so admitted requests keep their latency
    (default: ``max_ongoing_requests``; ``engine: vllm``: twice the engines' ``max_num_seqs``,
    256 when not set; 0: never refuse)."""

    @model_validator(mode="before")
    @classmethod
    def _devices(cls, data: Any) -> Any:
        """``devices`` (hetflow.core.devices) with its defaults; the earlier flat keys folded
        into it, and into each pool's, with a warning."""
        if not isinstance(data, dict):
            return data
        where = f"models[{data['name']}]" if isinstance(data.get("name"), str) else "models[]"
        pools = data.get("pools")
        if isinstance(pools, list):
            data = {**data, "pools": [POOL_DEVICES.read(p, f"{where}.pools[{i}]")
                                      for i, p in enumerate(pools)]}
        return SERVED_DEVICES.read(data, where)

    @model_validator(mode="after")
    def _check_model(self) -> "ModelServeConfig":
        errors = model_errors(self)
        if errors:
            raise ValueError("; ".join(errors))
        return self

    @property
    def effective_pools(self) -> list[LLMPool]:
        """``engine: vllm``: the pools (given, or one from the entry's device fields)."""
        if self.pools:
            return list(self.pools)
        d = self.devices
        kind = "gpu" if d.kind == "gpu" or d.vendor or d.model else "cpu"
        given = {k: v for k, v in (("model", d.model), ("vendor", d.vendor), ("memory", d.memory))
                 if v is not None}
        if self.autoscaling is not None:
            return [LLMPool(devices={"kind": kind, **given}, autoscaling=self.autoscaling,
                            cpus_per_replica=self.cpus_per_replica)]
        return [LLMPool(devices={"kind": kind, **given}, replicas=self.replicas or 1,
                        cpus_per_replica=self.cpus_per_replica)]

    @property
    def fixed_replicas(self) -> int | None:
        """The fixed replica count, or None when autoscaling."""
        if self.autoscaling is not None:
            return None
        return self.replicas or 1

    @property
    def planned_replicas(self) -> int:
        """Replica slots planned on devices: the fixed count, or autoscaling's maximum."""
        return self.autoscaling.max_replicas if self.autoscaling else (self.replicas or 1)

    @property
    def batches_in_flight(self) -> int:
        """``batching.concurrent_batches``, or 2 per planned replica slot."""
        return self.batching.concurrent_batches or 2 * self.planned_replicas

    @property
    def ongoing_limit(self) -> int:
        if self.max_ongoing_requests is not None:
            return self.max_ongoing_requests
        return max(16, 2 * self.batching.max_batch_size)

    @property
    def effective_queue_limit(self) -> int:
        """``queue_limit``, or ``max_ongoing_requests`` (its default); 0: never refuse."""
        return self.queue_limit if self.queue_limit is not None else self.ongoing_limit

    @property
    def memory_bytes(self) -> int | None:
        """``devices.memory`` in bytes (None: not given)."""
        return self.devices.memory_bytes


class UpstreamConfig(_Section):
    """An external model server the front door routes to: an OpenAI-compatible API (OpenAI,
    vLLM, LiteLLM, another hetflow) or a KServe v2 server (Triton, KServe, another hetflow).
    Clients call it by ``name`` like a local model; a local model names it as its
    ``fallback`` to send it its requests while no local replica is up or the local queue is
    over its limit."""

    name: str = Field(min_length=1, pattern=NAME_PATTERN)
    """The model name clients use for it (also what a local model's ``fallback`` names)."""
    url: str = Field(min_length=1)
    """Base URL: ``https://api.openai.com/v1`` (OpenAI: the part before ``/chat/completions``)
    or ``http://triton:8000`` (KServe v2: the part before ``/v2``)."""
    protocol: Literal["openai", "kserve-v2"] = "openai"
    """What it speaks; only that protocol's requests are routed to it."""
    model: str | None = None
    """Its own name for the model (default: ``name``); the request's model is rewritten to it."""
    api_key_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """Environment variable (of ``hetflow serve``) holding its API key, sent as
    ``Authorization: Bearer``; the key goes to HAProxy's environment only, never into a file."""
    timeout_s: float = Field(60.0, gt=0)
    """Longest wait for its answer."""
    check_interval_s: float = Field(2.0, gt=0)
    """Health check period (GET its model list or ``/v2/health/ready``): 3 failures in a row
    take it out, 2 successes bring it back."""
    ca_file: str | None = None
    """CA bundle for an ``https`` URL (default: the system's)."""
    fallback: str | None = None
    """Another upstream of the same protocol that takes this one's requests (and those of the
    models falling back to it) while this one is out: its health checks failed, or - with a
    fallback - 3 answers in a row were 5xx or a failed connection (it is then out at once,
    until its checks pass twice). A chain may go on (``fallback`` of the fallback)."""

    @model_validator(mode="after")
    def _check_url(self) -> "UpstreamConfig":
        parsed = urllib.parse.urlsplit(self.url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(f"upstream {self.name}: url must be http(s)://host[:port][/path], "
                             f"got {self.url!r}")
        if parsed.query or parsed.fragment:
            raise ValueError(f"upstream {self.name}: url takes no query or fragment")
        try:
            parsed.port
        except ValueError:
            raise ValueError(f"upstream {self.name}: bad port in {self.url!r}") from None
        return self

    @property
    def upstream_model(self) -> str:
        return self.model or self.name


class ServeConfig(_Section):
    """One serving application: models behind one HTTP endpoint."""

    name: str = Field("hetflow", min_length=1, pattern=NAME_PATTERN)
    """Ray Serve application name (also prefixes the deployments' names)."""
    http: HTTPConfig = Field(default_factory=HTTPConfig)
    """The HTTP endpoint."""
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    """Request size and time limits."""
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    """The routing front."""
    auth: AuthConfig = Field(default_factory=AuthConfig)
    """API keys, per-key limits and quotas."""
    models: list[ModelServeConfig] = Field(min_length=1)
    """The served models (at least one)."""
    upstreams: list[UpstreamConfig] = Field(default_factory=list)
    """External model servers routed to as models, or as local models' fallbacks."""
    default_model: str | None = None
    """Model of ``POST /v1/predict`` requests that name none (default: the first)."""
    ray_address: str | None = None
    """Ray cluster to join (``auto``, ``host:port``); default: a running local one, else a new
    one."""

    @model_validator(mode="after")
    def _check_combinations(self) -> "ServeConfig":
        errors = combination_errors(self)
        if errors:
            raise ValueError("; ".join(errors))
        return self

    def upstream(self, name: str) -> UpstreamConfig | None:
        return next((u for u in self.upstreams if u.name == name), None)

    def model(self, name: str) -> ModelServeConfig:
        for m in self.models:
            if m.name == name:
                return m
        raise KeyError(name)

    @property
    def default(self) -> str:
        return self.default_model or self.models[0].name

    def with_overrides(self, **sections: Any) -> "ServeConfig":
        """A copy with top-level sections (or section fields) replaced, validated like a file."""
        data = self.model_dump(mode="json")
        for section, values in sections.items():
            if isinstance(data.get(section), dict) and isinstance(values, dict):
                data[section] = {**data[section], **values}
            else:
                data[section] = values
        return serve_config_from_dict(data, source="overrides")


def model_errors(m: ModelServeConfig) -> list[str]:
    """Rules inside one model entry; each message says how to fix the file."""
    errors = []
    sources = [k for k in ("train_config", "train", "torchscript", "exported")
               if getattr(m, k) is not None]
    if m.engine == "vllm":
        return llm_errors(m, sources)
    if m.vllm is not None or m.pools or m.routing is not None:
        errors.append("vllm, pools and routing are for engine: vllm (an LLM on vLLM); add engine: vllm")
    if len(sources) != 1:
        errors.append("give exactly one of train_config (a training YAML), train (inline), "
                      "torchscript or exported (a model file)"
                      + (f"; got {', '.join(sources)}" if sources else ""))
    if (m.torchscript or m.exported) and m.input is None:
        errors.append("a torchscript or exported model needs input: {kind, width, outputs} "
                      "(the file does not say what a request row is)")
    if (m.torchscript or m.exported) and m.precision == "int8":
        errors.append("int8 quantises the modules of a spec's model; a torchscript or "
                      "exported file serves at fp32, bf16 or fp16")
    if m.safetensors and (m.torchscript or m.exported):
        errors.append("safetensors are weights for a spec's model (train/train_config), "
                      "not for a model file")
    if m.safetensors and (m.weights == "random" or m.checkpoint_dir):
        errors.append("give safetensors, or checkpoint_dir / weights: random, not both")
    for key in ("preprocess", "postprocess"):
        value = getattr(m, key)
        if value is not None and ":" not in value:
            errors.append(f"{key} must be 'package.module:function', got {value!r}")
    if m.replicas is not None and m.autoscaling is not None:
        errors.append("give replicas (a fixed count) or autoscaling, not both")
    if m.precision in ("bf16", "fp16") and m.devices.kind == "cpu":
        errors.append(f"precision {m.precision} serves on GPUs; on CPU use fp32 or int8")
    if m.precision == "int8" and m.devices.kind == "gpu":
        errors.append("int8 dynamic quantisation runs on CPUs; on GPUs use bf16 or fp16")
    if m.fallback == m.name:
        errors.append(f"model {m.name} cannot be its own fallback")
    return errors


def llm_errors(m: ModelServeConfig, sources: list[str]) -> list[str]:
    """Rules of an ``engine: vllm`` entry."""
    errors = []
    if m.vllm is None:
        errors.append("engine: vllm needs vllm: {model: <a model folder>, ...} (vLLM's engine "
                      "arguments)")
    if sources:
        errors.append(f"engine: vllm serves vllm.model; drop {', '.join(sources)}")
    if m.autoscaling is not None and m.pools:
        errors.append("engine: vllm with pools: give autoscaling per pool "
                      "(pools: [{autoscaling: {min_replicas: 1, max_replicas: 4}}])")
    for i, pool in enumerate(m.pools):
        if pool.devices.kind == "cpu" and (pool.devices.vendor or pool.devices.model):
            errors.append(f"pool {i + 1}: devices.vendor/model need devices.kind gpu")
        engine = m.vllm
        if m.vllm is not None and pool.engine:
            try:
                engine = m.vllm.merged(pool.engine)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first["loc"])
                errors.append(f"pool {i + 1} engine.{where}: {first['msg']}")
                engine = None
        if engine is not None and pool.layer_split is not None \
                and len(pool.layer_split) != engine.pipeline_parallel_size:
            errors.append(f"pool {i + 1}: layer_split has {len(pool.layer_split)} stages, "
                          f"pipeline_parallel_size is {engine.pipeline_parallel_size}")
        if engine is not None and pool.nodes > 1:
            world = engine.tensor_parallel_size * engine.pipeline_parallel_size
            if world % pool.nodes:
                errors.append(f"pool {i + 1}: nodes {pool.nodes} must divide the engine's "
                              f"processes (tensor_parallel_size x pipeline_parallel_size = "
                              f"{world}); e.g. pipeline_parallel_size: {pool.nodes}")
    return errors


def combination_errors(config: ServeConfig) -> list[str]:
    """Rules that tie several models or sections together."""
    errors: list[str] = []
    names = [m.name for m in config.models]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        errors.append(f"model names must be unique; repeated: {', '.join(dupes)}")
    known = set(names)
    up_names = [u.name for u in config.upstreams]
    clash = sorted({n for n in up_names if n in known or up_names.count(n) > 1})
    if clash:
        errors.append(f"upstream names must be unique and differ from the models'; repeated: "
                      f"{', '.join(clash)}")
    if config.default_model is not None and config.default_model not in known:
        errors.append(f"default_model {config.default_model!r} is not a model of this file "
                      f"({', '.join(names)})")
    for m in config.models:
        if m.fallback is not None and m.fallback not in known and m.fallback not in up_names:
            errors.append(f"model {m.name}: fallback {m.fallback!r} is not a model or upstream "
                          f"of this file ({', '.join(names + up_names)})")
        elif m.fallback is not None:
            errors.extend(_fallback_kind_errors(config, m))
    errors.extend(_fallback_cycles(config))
    errors.extend(_upstream_fallback_errors(config))
    errors.extend(_size_errors("limits.max_body_bytes", config.limits.max_body_bytes))
    return errors


def _fallback_kind_errors(config: ServeConfig, m: ModelServeConfig) -> list[str]:
    """A fallback must take the model's requests as they come: an ``engine: vllm`` model's
    (OpenAI's, straight from the front door to its engines) go to an upstream of protocol
    ``openai`` only; a torch model's go along the gateway's chain, which cannot call an
    ``engine: vllm`` model."""
    target = next((t for t in config.models if t.name == m.fallback), None)
    upstream = config.upstream(m.fallback) if target is None else None
    if m.engine == "vllm":
        if target is not None:
            return [f"model {m.name} (engine: vllm): fallback {m.fallback!r} is a model of this "
                    "file; an LLM falls back to an upstream of protocol openai (upstreams: "
                    "[{name, url}]) - or list more pools"]
        if upstream is not None and upstream.protocol != "openai":
            return [f"model {m.name} (engine: vllm): fallback {m.fallback!r} speaks "
                    f"{upstream.protocol}; an LLM's requests are OpenAI's: name an upstream "
                    "with protocol: openai"]
    elif target is not None and target.engine == "vllm":
        return [f"model {m.name}: fallback {m.fallback!r} is an engine: vllm model, which the "
                f"gateway cannot call for {m.name}; name a torch model or an upstream"]
    return []


def _upstream_fallback_errors(config: ServeConfig) -> list[str]:
    """An upstream's ``fallback`` is another upstream of its protocol; chains form no cycle."""
    errors = []
    for u in config.upstreams:
        if u.fallback is None:
            continue
        target = config.upstream(u.fallback)
        if u.fallback == u.name:
            errors.append(f"upstream {u.name} cannot be its own fallback")
        elif target is None:
            errors.append(f"upstream {u.name}: fallback {u.fallback!r} is not an upstream of this "
                          f"file ({', '.join(x.name for x in config.upstreams)}); an upstream falls "
                          "back to another upstream")
        elif target.protocol != u.protocol:
            errors.append(f"upstream {u.name}: fallback {u.fallback!r} speaks {target.protocol}, "
                          f"{u.name} {u.protocol}; name an upstream of the same protocol")
    return errors or _first_cycle({u.name: u.fallback for u in config.upstreams}, "upstream fallbacks")


def upstream_chain(config: ServeConfig, name: str) -> list[str]:
    """Upstream ``name`` followed by its fallback, that one's fallback, ... (no repeats)."""
    chain = [name]
    while (u := config.upstream(chain[-1])) is not None and u.fallback is not None \
            and u.fallback not in chain:
        chain.append(u.fallback)
    return chain


def _size_errors(key: str, value: int | str) -> list[str]:
    try:
        parse_bytes(value)
    except InputError as exc:
        return [f"{key}: {exc}"]
    return []


def _first_cycle(fallback: dict[str, str | None], what: str) -> list[str]:
    """One line for the first cycle of ``fallback`` (name -> the next; a name outside it ends
    a chain), else none."""
    for start in fallback:
        seen, name = [start], fallback[start]
        while name is not None and name in fallback:
            if name in seen:
                return [f"{what} form a cycle: {' -> '.join(seen + [name])}"]
            seen.append(name)
            name = fallback[name]
    return []


def _fallback_cycles(config: ServeConfig) -> list[str]:
    return _first_cycle({m.name: m.fallback for m in config.models}, "fallbacks")  # an upstream ends a chain


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine's loopback only (Serve's proxy on the head then, and
    replicas binding that host; else every node's proxy and replicas binding all addresses)."""
    return host in ("127.0.0.1", "localhost", "::1")


def upstream_fallback(config: ServeConfig, name: str) -> str | None:
    """The upstream at the end of model ``name``'s fallback chain, if one is."""
    last = config.model(fallback_chain(config, name)[-1]).fallback
    return last if last is not None and config.upstream(last) is not None else None


def fallback_chain(config: ServeConfig, name: str) -> list[str]:
    """``name`` followed by its fallback, that one's fallback, ... (no repeats; local models
    only: an upstream at the end is :func:`upstream_fallback`)."""
    chain = [name]
    while ((nxt := config.model(chain[-1]).fallback) is not None and nxt not in chain
           and config.upstream(nxt) is None):
        chain.append(nxt)
    return chain


def serve_config_from_dict(data: Any, source: str = "config",
                           base_dir: str | Path | None = None) -> ServeConfig:
    """Validate a parsed document; errors become one InputError naming each key path.

    ``train_config`` paths are taken relative to ``base_dir`` (the YAML file's directory).
    """
    if not isinstance(data, dict):
        raise InputError(f"{source}: expected a mapping with a models list, got "
                         f"{type(data).__name__}")
    if base_dir is not None and isinstance(data.get("models"), list):
        data = {**data, "models": [_absolute_train_path(m, Path(base_dir))
                                   for m in data["models"]]}
    try:
        config = ServeConfig.model_validate(data)
    except ValidationError as exc:
        raise InputError(describe(exc, ServeConfig, source)) from None
    _read_training_configs(config, source)
    return config


def _read_training_configs(config: ServeConfig, source: str) -> None:
    """Read each model's training config now, before any Ray or Serve start: a bad file or a
    model spec that does not import is one line here, not a failed deployment later."""
    from hetflow.workloads.serve.inference import serving_info, train_config_of

    from hetflow.workloads.serve.inference import check_model_source

    for entry in config.models:
        if entry.engine == "vllm":
            _check_llm_model(entry, source)
            continue
        try:
            train = train_config_of(entry)  # its errors name models[<name>].train or the file
        except InputError as exc:
            raise InputError(f"{source}: {exc}") from None
        try:
            if train is not None:
                serving_info(train)
            check_model_source(entry)
        except InputError as exc:
            raise InputError(f"{source}: models[{entry.name}]: {exc}") from None


def _check_llm_model(entry: ModelServeConfig, source: str) -> None:
    assert entry.vllm is not None
    model = entry.vllm.model
    if model.startswith((".", "/", "~")) or Path(model).exists():
        folder = Path(model).expanduser()
        if not (folder / "config.json").is_file():
            raise InputError(f"{source}: models[{entry.name}]: vllm.model {model} is not a "
                             "model folder (no config.json there); give a folder with the "
                             "model's config.json and tokenizer")


def _absolute_train_path(entry: Any, base: Path) -> Any:
    for key in ("train_config", "torchscript", "exported", "safetensors"):
        if isinstance(entry, dict) and isinstance(entry.get(key), str):
            path = Path(entry[key])
            if not path.is_absolute():
                entry = {**entry, key: str((base / path).resolve())}
    vllm = entry.get("vllm") if isinstance(entry, dict) else None
    if isinstance(vllm, dict) and isinstance(vllm.get("model"), str):
        path = Path(vllm["model"])  # a folder beside the file; else a name vLLM resolves
        if not path.is_absolute() and (base / path).exists():
            entry = {**entry, "vllm": {**vllm, "model": str((base / path).resolve())}}
    return entry


def load_serve_config(path: str | Path) -> ServeConfig:
    """Read a serving YAML file. Raises InputError for a missing or invalid file."""
    path = Path(path)
    data = read_yaml(path, "serving config")
    return serve_config_from_dict(data, source=str(path), base_dir=path.parent)


__all__ = [
    "AutoscalingConfig", "BatchingConfig", "GatewayConfig", "HTTPConfig", "InputSection",
    "LimitsConfig",
    "ModelServeConfig", "ServeConfig", "UpstreamConfig", "DEFAULT_BATCH_WAIT_TIMEOUT_S", "DEFAULT_MAX_BATCH_SIZE",
    "fallback_chain", "is_loopback", "upstream_chain", "upstream_fallback", "load_serve_config", "serve_config_from_dict",
]
