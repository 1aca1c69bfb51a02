"""Where tuning trials run: hetflow's planner request -> Ray Tune trial resources.

A trial is one process on at most one device. Three cases, in order of preference:

1. **hetflow-managed GPU nodes** (published with ``hetflow node``; ``base.resources.devices.kind``
   not ``cpu``): the planner places the trial as a one-device request. With a memory size
   (``trial.devices.memory`` or ``base.resources.devices.memory``) the request is shareable
   (``exclusive=False``): the trial's bundle takes the device's resource ``hetflow_dev_<i>``
   only up to that memory (MiB), so several small trials share one device and Ray's resource
   accounting refuses to over-commit it. Without one, a trial takes the whole device. The
   bundle is pinned to the planned node by a ``bundle_label_selector`` on ``hetflow.io/node``.
   Planning again with each placed trial recorded as an allocation gives every **slot** (a
   place one trial can run) that fits at once; at most that many trials run concurrently.
2. **plain Ray GPUs** (no hetflow nodes): one Ray GPU per trial (Ray picks it, first fit).
3. **CPUs**: ``trial.cpus`` CPUs per trial; as many trials at once as the CPUs allow.

Tune asks for a trial's resources once, when it creates the trial, and gets only the trial's
config. With several slots the driver therefore keeps a per-run ledger of how many live
(pending, running or paused) trials hold each slot: :class:`SlotAssigner` hands a new trial
the slot with the fewest, and :class:`SlotLedgerSync`, a Tune callback, recounts the ledger
from Tune's own trial list at every step (so trials that ended, and trials restored from an
interrupted run, are counted right). Ray still guards correctness: a trial whose slot is busy
waits for it.

Inside the trial, :func:`bind_planned_device` makes the device of its bundle the only visible
one (``CUDA_VISIBLE_DEVICES`` / ``HIP_VISIBLE_DEVICES``) before torch touches a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ray.tune import Callback, PlacementGroupFactory
from ray.tune.experiment import Trial

from hetflow.core.errors import Unschedulable
from hetflow.core.request import PlacementRequest
from hetflow.core.topology import Allocation, ClusterSnapshot
from hetflow.core.units import format_bytes
from hetflow.runtime.binding import BoundDevice
from hetflow.runtime.binding import bind_assigned_devices as bind_planned_device
from hetflow.runtime.resources import (
    NODE_LABEL,
    device_ask,
    label_value,
)


@dataclass(frozen=True)
class TrialSlot:
    """One place a trial can run: its single bundle, and the node and device it is pinned to.

    ``bundle`` holds CPUs and, on a hetflow node, the device's resource share (MiB units);
    ``node``/``device`` are None for CPU and plain-Ray-GPU trials.
    """

    bundle: dict[str, float]
    node: str | None = None
    device: int | None = None
    memory_bytes: int | None = None  # what the trial asked for on the device (None: all of it)

    @property
    def label_selector(self) -> dict[str, str] | None:
        return {NODE_LABEL: label_value(self.node)} if self.node is not None else None

    def factory(self) -> PlacementGroupFactory:
        """The ``PlacementGroupFactory`` Tune reserves for a trial in this slot."""
        kwargs = {}
        if self.label_selector is not None:
            kwargs["bundle_label_selector"] = [self.label_selector]
        return PlacementGroupFactory([dict(self.bundle)], strategy="PACK", **kwargs)

    def describe(self) -> str:
        if self.node is None:
            gpu = " + 1 Ray GPU" if self.bundle.get("GPU") else ""
            return f"{self.bundle.get('CPU', 0):g} CPU{gpu}"
        share = (format_bytes(self.memory_bytes) if self.memory_bytes is not None
                 else "whole device")
        return f"{self.node}:{self.device} ({share})"


def cpu_slot(cpus_per_trial: float) -> TrialSlot:
    return TrialSlot({"CPU": float(cpus_per_trial)})


def trial_slot(snapshot: ClusterSnapshot, request: PlacementRequest,
               cpus_per_trial: float) -> TrialSlot:
    """Plan one trial (a one-device request) on ``snapshot``: its device and resource share.

    Raises Unschedulable (the planner's reason) when no device can take it.
    """
    from hetflow.scheduling.planner import plan

    assert request.parallel_layout.is_resolved and request.parallel_layout.world_size == 1, \
        "a tuning trial is one process on one device"
    placement = plan(snapshot, request)
    ref = placement.devices[0]
    ask = device_ask(snapshot, [ref], placement.memory_bytes, placement.exclusive)
    bundle = {k: float(v) for k, v in ask.bundle(cpus_per_trial).items()}
    memory = None if placement.exclusive else placement.memory_bytes
    return TrialSlot(bundle, node=ref.node, device=ref.device, memory_bytes=memory)


def trial_resources(snapshot: ClusterSnapshot, request: PlacementRequest | None,
                    cpus_per_trial: float) -> PlacementGroupFactory:
    """A planner request for one trial -> the trial's Tune resources (a PlacementGroupFactory).

    ``request`` None means a CPU trial: one bundle of ``cpus_per_trial`` CPUs. Otherwise the
    planner places it on ``snapshot``: one bundle of the CPUs plus the planned device's
    resource (its memory share when ``request.exclusive`` is False, else the whole device),
    pinned to the planned node by a bundle label selector.
    """
    if request is None:
        return cpu_slot(cpus_per_trial).factory()
    return trial_slot(snapshot, request, cpus_per_trial).factory()


def plan_trial_slots(snapshot: ClusterSnapshot, request: PlacementRequest,
                     cpus_per_trial: float, limit: int) -> list[TrialSlot]:
    """Every trial that fits at once (at most ``limit``): plan one, record it, plan again.

    Raises Unschedulable when not even one trial fits.
    """
    slots: list[TrialSlot] = []
    while len(slots) < limit:
        job = f"{request.job_id}-{len(slots)}"
        try:
            slot = trial_slot(snapshot, replace(request, job_id=job), cpus_per_trial)
        except Unschedulable:
            if not slots:
                raise
            break
        slots.append(slot)
        assert slot.node is not None and slot.device is not None
        held = (slot.memory_bytes if slot.memory_bytes is not None
                else snapshot.node(slot.node).device(slot.device).memory_bytes)
        snapshot = replace(snapshot, allocations=snapshot.allocations + (
            Allocation(job, slot.node, slot.device, held, exclusive=slot.memory_bytes is None),))
    return slots


# Driver-side ledgers: run key -> live trials per trial resource request. Module-level because
# Tune unpickles the trainable (and with it the assigner) afresh each time it asks for resources.
_LEDGERS: dict[str, dict[PlacementGroupFactory, int]] = {}
_LIVE = (Trial.PENDING, Trial.RUNNING, Trial.PAUSED)


def distinct_slots(slots: tuple[TrialSlot, ...]) -> tuple[list[PlacementGroupFactory], list[int]]:
    """Slots with the same resources on the same device are one Tune request held several
    times: the distinct factories, and how many trials each may hold at once."""
    factories: list[PlacementGroupFactory] = []
    capacity: list[int] = []
    for slot in slots:
        factory = slot.factory()
        if factory in factories:
            capacity[factories.index(factory)] += 1
        else:
            factories.append(factory)
            capacity.append(1)
    return factories, capacity


@dataclass(frozen=True)
class SlotAssigner:
    """Tune's per-trial resource function: the slot group with the lowest share of live trials."""

    key: str
    slots: tuple[TrialSlot, ...]

    def __call__(self, config: dict[str, Any]) -> PlacementGroupFactory:
        factories, capacity = distinct_slots(self.slots)
        claims = _LEDGERS.setdefault(self.key, {})
        index = min(range(len(factories)),
                    key=lambda i: (claims.get(factories[i], 0) / capacity[i], i))
        claims[factories[index]] = claims.get(factories[index], 0) + 1
        return factories[index]


class SlotLedgerSync(Callback):
    """Tune callback: recount a run's ledger from Tune's own trial list at every step (trials
    that ended, and trials restored with a resumed run, are then counted right)."""

    def __init__(self, key: str) -> None:
        self.key = key

    def on_step_begin(self, iteration: int, trials: list[Any], **info: Any) -> None:
        claims: dict[PlacementGroupFactory, int] = {}
        for trial in trials:
            if trial.status in _LIVE and trial.placement_group_factory is not None:
                factory = trial.placement_group_factory
                claims[factory] = claims.get(factory, 0) + 1
        _LEDGERS[self.key] = claims


@dataclass
class TrialPlacement:
    """What the runner hands to Tune: per-trial resources, concurrency, and one line for people."""

    resources: Any  # a PlacementGroupFactory, or a SlotAssigner
    max_concurrent: int | None
    how: str
    slots: tuple[TrialSlot, ...] = ()
    callbacks: list[Any] = field(default_factory=list)


def trial_request(job_id: str, memory_bytes: int | None, vendor: Any = None,
                  model: str | None = None) -> PlacementRequest:
    """One trial as a planner request: one device, shared by memory when a size is known."""
    return PlacementRequest.parse(job_id, count=1, memory=memory_bytes, share=memory_bytes is not None,
                                  vendor=vendor, model=model)


def place_trials(config: Any, key: str) -> TrialPlacement:
    """Decide where the trials of a ``TuningConfig`` run on the connected Ray cluster."""
    import ray

    from hetflow.core.request import parse_vendor
    from hetflow.core.units import parse_bytes
    from hetflow.runtime.binding import live_snapshot, published_accelerators

    res, cpus = config.base.resources, config.trial.cpus
    concurrent = config.budget.concurrent
    if res.devices.kind != "cpu" and published_accelerators():
        memory = config.trial_memory
        request = trial_request(f"{config.name}-trial", parse_bytes(memory) if memory else None,
                                parse_vendor(res.devices.vendor), res.devices.model)
        limit = min(concurrent or config.budget.trials, config.budget.trials)
        slots = tuple(plan_trial_slots(live_snapshot(), request, cpus, limit))
        counts: dict[str, int] = {}
        for slot in slots:
            counts[slot.describe()] = counts.get(slot.describe(), 0) + 1
        how = (f"{len(slots)} trial(s) at once on hetflow devices: "
               + ", ".join(f"{where} x{n}" if n > 1 else where for where, n in counts.items()))
        factories, _ = distinct_slots(slots)
        if len(factories) == 1:  # every slot on one device: one request, held len(slots) times
            return TrialPlacement(factories[0], len(slots), how, slots)
        _LEDGERS.pop(key, None)
        return TrialPlacement(SlotAssigner(key, slots), len(slots), how, slots,
                              [SlotLedgerSync(key)])
    gpus = ray.cluster_resources().get("GPU", 0) if res.devices.kind != "cpu" else 0
    if res.devices.kind == "gpu" and not gpus:
        raise Unschedulable(
            f"{config.name}: base.resources.devices.kind is gpu but the Ray cluster has no "
            "hetflow-managed nodes and no Ray GPUs; start the GPU nodes with `hetflow node` "
            "(or `ray start --num-gpus N`), or set base.resources.devices: cpu")
    slot = TrialSlot({"CPU": float(cpus), "GPU": 1.0}) if gpus else cpu_slot(cpus)
    where = "one Ray GPU each (Ray chooses which)" if gpus else f"{cpus:g} CPU each"
    return TrialPlacement(slot.factory(), concurrent, f"trials get {where}", (slot,))


__all__ = [
    "BoundDevice", "SlotAssigner", "SlotLedgerSync", "TrialPlacement", "TrialSlot",
    "bind_planned_device", "cpu_slot", "distinct_slots", "place_trials", "plan_trial_slots",
    "trial_request", "trial_resources", "trial_slot",
]
