"""``hetflow.placement``: the planner's exact devices for any Ray code.

Ray schedules GPUs first-fit and knows no links; hetflow's planner knows both. These helpers
plan a request against the live cluster (the hetflow nodes published with ``hetflow node``),
reserve the chosen devices in Ray, and hand back what plain Ray code needs to run there - so a
user's own actor, a Serve deployment or a Tune trial sees exactly the planned device(s)::

    import hetflow.placement as hp

    opts = hp.options(devices=1, memory="20GiB", vendor="amd")      # one actor or task
    engine = MyEngine.options(**opts).remote()                       # sees exactly that GPU

    with hp.group(layout={"tp": 4}, memory="40GiB") as g:           # a gang: TP on the fastest links
        ranks = [Worker.options(**o).remote(r) for r, o in enumerate(g.options)]
        ...                                                          # released on exit

    app = Model.options(**hp.serve_options(devices=1)).bind()       # a Serve deployment
    tune.Tuner(tune.with_resources(fn, hp.tune_resources(devices=1)), ...)   # a Tune trial
    # inside the trial (or any task holding a planned device, before torch touches the GPU):
    hp.bind()

What each form reserves:

* ``group`` and ``options`` create a placement group now (one bundle per rank: the device's
  resource ``hetflow_dev_<i>`` - all of it, or its memory share in MiB - on exactly its node by
  label) and wait until Ray commits it (``timeout_s``; ``Unschedulable`` says what it waited
  for, nothing is kept). Each rank's options carry the bundle, the device resource and a
  ``runtime_env`` whose visibility variables (``CUDA_VISIBLE_DEVICES``; on AMD also
  ``HIP_VISIBLE_DEVICES``; Ray's NOSET flags) name exactly its device before the process starts.
  ``group`` is released on leaving its ``with`` block (or ``release()``); ``options``'s group by
  ``release(opts)`` or when this driver exits (Ray removes a job's placement groups with it).
* ``serve_options`` and ``tune_resources`` plan now but let Serve and Tune create the groups
  (one per replica / trial): ``placement_group_bundles`` + ``placement_group_bundle_label_selector``
  for Serve, a ``PlacementGroupFactory`` with a bundle label selector for Tune. Serve's replica
  gets the visibility in its ``runtime_env``; a Tune trial calls :func:`bind` first (Tune gives a
  trial's process no environment of its own). A device taken by someone else between the plan
  and Serve's or Tune's reservation leaves the replica or trial pending until it is free.

Requests: ``devices=N`` (N devices that talk to each other, planned as one tensor-parallel
group), or ``layout={"dp", "pp", "tp"}``; ``memory`` per device (shares the device with other
jobs by memory when ``share=True``), ``vendor``, ``model``, ``arch``, ``strategy`` - or a
:class:`~hetflow.core.request.PlacementRequest`. A job's ranks never mix vendors.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from hetflow.core.errors import InputError, Unschedulable
from hetflow.core.placement import Placement
from hetflow.core.request import ParallelLayout, PlacementRequest

_COUNTER = itertools.count()


def request(request: PlacementRequest | None = None, *, devices: int | None = None,
            layout: Mapping[str, int] | ParallelLayout | None = None,
            memory: str | int | None = None, share: bool = False, vendor: str | None = None,
            model: str | None = None, arch: str | None = None, strategy: str = "pack",
            mixed_models: bool = False, name: str | None = None) -> PlacementRequest:
    """The :class:`PlacementRequest` these arguments describe (``request`` itself if given)."""
    if request is not None:
        return request
    if devices is not None and layout is not None:
        raise InputError("give devices=N or layout={dp, pp, tp}, not both")
    if isinstance(layout, Mapping):
        unknown = set(layout) - {"dp", "pp", "tp"}
        if unknown:
            raise InputError(f"layout: unknown key {sorted(unknown)[0]!r}; give dp, pp and tp")
        layout = ParallelLayout(**{k: int(v) for k, v in layout.items()})
    return PlacementRequest.parse(
        name or f"placement-{os.getpid()}-{next(_COUNTER)}",
        count=None if layout is not None else (1 if devices is None else devices), layout=layout,
        memory=memory, vendor=vendor, model=model, arch=arch, share=share, strategy=strategy,
        mixed_models=mixed_models,
    )


def plan(req: PlacementRequest | None = None, **kwargs: Any) -> Placement:
    """Plan the request on the live cluster (nothing reserved); ``Unschedulable`` with the
    planner's reason when it cannot fit now."""
    from hetflow.runtime.binding import live_snapshot
    from hetflow.scheduling.planner import plan as plan_on

    _need_ray()
    snapshot = live_snapshot()
    if not snapshot.nodes:
        raise Unschedulable("no hetflow-managed nodes in this Ray cluster: start each GPU node "
                            "with `hetflow node start` (it publishes the node's devices and links)")
    return plan_on(snapshot, request(req, **kwargs))


@dataclass
class PlacedGroup:
    """A reserved gang: ``pg`` (the Ray placement group), ``options`` (one ``.options()`` dict
    per rank, rank order = the planner's), ``placement`` (``.explain()`` says why)."""

    pg: Any
    options: list[dict[str, Any]]
    placement: Placement
    _bound: Any

    def __iter__(self) -> Iterator[Any]:  # pg, options = hetflow.placement.group(...)
        return iter((self.pg, self.options))

    def explain(self) -> str:
        return self.placement.explain()

    def release(self) -> None:
        self._bound.release()

    def __enter__(self) -> "PlacedGroup":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def group(req: PlacementRequest | None = None, *, cpus_per_rank: float = 1.0,
          timeout_s: float = 30.0, **kwargs: Any) -> PlacedGroup:
    """Plan and reserve every rank of the request (see the module docstring)."""
    from hetflow.runtime.binding import live_snapshot, reserve
    from hetflow.scheduling.planner import plan as plan_on

    _need_ray()
    if cpus_per_rank < 0 or timeout_s <= 0:
        raise InputError("cpus_per_rank must be >= 0 and timeout_s > 0")
    snapshot = live_snapshot()
    if not snapshot.nodes:
        raise Unschedulable("no hetflow-managed nodes in this Ray cluster: start each GPU node "
                            "with `hetflow node start` (it publishes the node's devices and links)")
    placement = plan_on(snapshot, request(req, **kwargs))
    bound = reserve(placement, snapshot, cpus_per_rank=cpus_per_rank, timeout_s=timeout_s)
    return PlacedGroup(bound.group, [bound.actor_options(r) for r in range(placement.world_size)],
                       placement, bound)


_HELD: dict[int, PlacedGroup] = {}  # options() groups by id(options dict's group): for release()


def options(req: PlacementRequest | None = None, *, cpus: float = 1.0, timeout_s: float = 30.0,
            **kwargs: Any) -> dict[str, Any]:
    """``.options()`` for one actor or task on the planned device(s): ``devices=N`` gives one
    process N devices (e.g. an inference engine's tensor-parallel workers), on one node."""
    req = request(req, **kwargs)
    if req.layout is not None and req.layout.world_size != 1:
        raise InputError("options() places one process; use group() for several ranks")
    if req.count is not None and req.count > 1:
        return _multi_device_options(req, cpus, timeout_s)
    placed = group(req, cpus_per_rank=cpus, timeout_s=timeout_s)
    opts = placed.options[0]
    _HELD[id(opts["scheduling_strategy"].placement_group)] = placed
    return opts


def _multi_device_options(req: PlacementRequest, cpus: float, timeout_s: float) -> dict[str, Any]:
    """One process holding all N planned devices (Ray puts one actor in one bundle): one bundle
    with every device's resource, on the planned node."""
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from hetflow.runtime.binding import live_snapshot
    from hetflow.runtime.resources import device_ask
    from hetflow.scheduling.planner import plan as plan_on

    import ray

    snapshot = live_snapshot()
    placement = plan_on(snapshot, req)
    nodes = placement.nodes
    if len(nodes) != 1:
        raise Unschedulable(f"job {req.job_id}: {req.count} devices for one process must be on one "
                            f"node; the best placement spans {', '.join(nodes)}. Ask for fewer "
                            "devices, or use group() and one process per device")
    node = snapshot.node(nodes[0])
    ask = device_ask(snapshot, placement.devices, placement.memory_bytes, placement.exclusive)
    bundle = ask.bundle(cpus)
    pg = placement_group([bundle], strategy="PACK", name=f"hetflow-{req.job_id}",
                         bundle_label_selector=[ask.selector])
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(pg)
        raise Unschedulable(f"job {req.job_id}: Ray did not commit {bundle} on {node.name} within "
                            f"{timeout_s:g}s (a device was taken since the plan, or CPUs are short); "
                            "nothing was kept - try again")
    bound = _PlainGroup(pg)
    opts = {**ask.actor_options(cpus),
            "scheduling_strategy": PlacementGroupSchedulingStrategy(placement_group=pg,
                                                                    placement_group_bundle_index=0)}
    _HELD[id(pg)] = PlacedGroup(pg, [opts], placement, bound)
    return opts


@dataclass
class _PlainGroup:
    pg: Any

    def release(self) -> None:
        from ray.util.placement_group import remove_placement_group

        if self.pg is not None:
            remove_placement_group(self.pg)
            self.pg = None


def release(opts: Mapping[str, Any] | PlacedGroup) -> None:
    """Give back what :func:`options` (or :func:`group`) reserved; safe to call twice."""
    if isinstance(opts, PlacedGroup):
        opts.release()
        return
    strategy = opts.get("scheduling_strategy")
    held = _HELD.pop(id(getattr(strategy, "placement_group", None)), None)
    if held is not None:
        held.release()


def serve_options(req: PlacementRequest | None = None, *, cpus: float = 1.0,
                  **kwargs: Any) -> dict[str, Any]:
    """Keyword arguments for ``@serve.deployment(...)`` / ``Deployment.options(...)``: one
    replica on the planned device(s) of one node (Serve reserves the bundle per replica)."""
    from hetflow.runtime.resources import device_ask

    req = request(req, **kwargs)
    placement = plan(req)
    if len(placement.nodes) != 1:
        raise Unschedulable(f"job {req.job_id}: a replica's devices must be on one node; the best "
                            f"placement spans {', '.join(placement.nodes)}")
    from hetflow.runtime.binding import live_snapshot

    ask = device_ask(live_snapshot(), placement.devices, placement.memory_bytes, placement.exclusive)
    return {
        "num_replicas": 1,
        "ray_actor_options": ask.actor_options(cpus),
        "placement_group_bundles": [ask.bundle(cpus)],
        "placement_group_strategy": "STRICT_PACK",
        "placement_group_bundle_label_selector": [ask.selector],
    }


def tune_resources(req: PlacementRequest | None = None, *, cpus: float = 1.0, **kwargs: Any) -> Any:
    """A ``PlacementGroupFactory`` for ``tune.with_resources``: each trial on the planned
    device (one device per trial; call :func:`bind` first thing in the trial)."""
    from ray.tune import PlacementGroupFactory

    from hetflow.runtime.resources import device_ask

    req = request(req, **kwargs)
    placement = plan(req)
    if placement.world_size != 1:
        raise InputError("tune_resources places one device per trial; ask for devices=1")
    from hetflow.runtime.binding import live_snapshot

    ask = device_ask(live_snapshot(), placement.devices, placement.memory_bytes, placement.exclusive)
    return PlacementGroupFactory([{"CPU": cpus, **ask.resources}], strategy="PACK",
                                 bundle_label_selector=[ask.selector])


def bind() -> str:
    """Inside a Ray task, actor or Tune trial that holds planned devices: make exactly those
    visible (``CUDA_VISIBLE_DEVICES`` / ``HIP_VISIBLE_DEVICES``) before torch touches a GPU.
    Returns ``node:devices`` (or ``cpu``)."""
    from hetflow.runtime.binding import bind_assigned_devices

    return bind_assigned_devices().where


def _need_ray() -> None:
    import ray

    if not ray.is_initialized():
        raise InputError("hetflow.placement needs a Ray connection: call ray.init(address=...) first")


__all__ = ["PlacedGroup", "bind", "group", "options", "plan", "release", "request",
           "serve_options", "tune_resources"]
