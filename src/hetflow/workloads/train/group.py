"""hetflow's actor group for training: place the ranks, start them, watch them, tear them down.

Why our own group rather than Ray Train: Ray Train V2 makes one placement group of identical
bundles and picks GPUs first-fit, so it cannot put rank r on the device the planner chose for
it. Here each rank's actor gets exactly its planned device (``hetflow.runtime.binding``).

Placement, in order of preference:

1. **hetflow-managed nodes** (published with ``hetflow node``) and ``resources.devices.kind`` not
   ``cpu``: the planner places the dp x pp x tp layout (tensor-parallel groups on the fastest
   links) and :func:`~hetflow.runtime.binding.reserve` binds each rank to its device.
2. **plain Ray GPUs** (no hetflow nodes): one Ray GPU per rank in a placement group; Ray
   chooses which GPUs (first fit) and sets their visibility.
3. **CPU only** (``resources.devices: cpu``, or a cluster with no GPUs at all): one bundle of
   ``cpus_per_rank`` CPUs per rank, in a placement group so that all ranks start together or
   not at all.

A placement that Ray does not commit within ``placement_timeout_s`` is removed and reported as
:class:`~hetflow.core.errors.Unschedulable`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from hetflow.core.errors import HetflowError, Unschedulable
from hetflow.core.request import ParallelLayout
from hetflow.workloads.train.config import ResourcesConfig

FAILURE_GRACE_S = 5.0  # after one rank fails, how long the others get to fail or finish too


class WorkerFailure(HetflowError):
    """A rank's process died or lost its peers: restarting from a checkpoint may help."""


class TrainingCodeError(HetflowError):
    """A rank raised an error of its own (not a lost peer): a restart would only repeat it."""


@dataclass
class Placed:
    """Where the ranks go: ``.options()`` per rank and how to give the resources back."""

    options: list[dict[str, Any]]
    release: Callable[[], None]
    how: str  # one line for the user: which path and which devices
    devices: str = "cpu"  # "hetflow" (planned devices), "ray-gpu" (Ray's first fit) or "cpu"


def place_layout(layout: ParallelLayout, res: ResourcesConfig, job_id: str) -> Placed:
    """Reserve one rank per position of ``layout`` with ``res``'s devices and CPUs: the shared
    placement path of ``hetflow train`` and ``hetflow launch`` (see the module docstring).

    A request that this cluster can never hold is refused at once (Unschedulable) instead of
    waiting ``placement_timeout_s`` for a group Ray would leave pending forever.
    """
    world = layout.world_size
    if res.devices.kind != "cpu":
        from hetflow.runtime.binding import published_accelerators

        if published_accelerators():
            return _place_on_hetflow_nodes(layout, res, job_id)
    gpus = ray.cluster_resources().get("GPU", 0) if res.devices.kind != "cpu" else 0
    if res.devices.kind == "gpu" and not gpus:
        raise Unschedulable(
            f"job {job_id}: resources.devices.kind is gpu but the Ray cluster has no hetflow-managed "
            "nodes and no Ray GPUs; start the GPU nodes with `hetflow node` (or `ray start "
            "--num-gpus N`), or set resources.devices: cpu"
        )
    total = ray.cluster_resources()
    if gpus and world > gpus:
        raise Unschedulable(f"job {job_id}: {world} ranks need one GPU each, the Ray cluster has "
                            f"{gpus:g} GPUs in all; use fewer ranks or add GPU nodes")
    if world * res.cpus_per_rank > total.get("CPU", 0) + 1e-9:
        raise Unschedulable(
            f"job {job_id}: {world} ranks x {res.cpus_per_rank:g} CPUs = "
            f"{world * res.cpus_per_rank:g} CPUs, the Ray cluster has {total.get('CPU', 0):g} in "
            "all; use fewer ranks, fewer CPUs per rank, or add nodes")
    bundle = {"CPU": res.cpus_per_rank, **({"GPU": 1.0} if gpus else {})}
    group = placement_group([dict(bundle) for _ in range(world)], strategy="PACK",
                            name=f"hetflow-{job_id}")
    _wait_committed(group, res.placement_timeout_s, job_id, world, bundle)
    options = [{
        "num_cpus": res.cpus_per_rank,
        "num_gpus": 1 if gpus else 0,
        "scheduling_strategy": PlacementGroupSchedulingStrategy(
            placement_group=group, placement_group_bundle_index=rank),
    } for rank in range(world)]
    kind = "one Ray GPU each (Ray chooses which)" if gpus else f"{res.cpus_per_rank:g} CPU each"
    return Placed(options, lambda: remove_placement_group(group),
                  f"{world} ranks, {kind}, no hetflow-managed nodes in this cluster",
                  devices="ray-gpu" if gpus else "cpu")


def _wait_committed(group: Any, timeout_s: float, job_id: str, world: int,
                    bundle: dict[str, float]) -> None:
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(group)
        raise Unschedulable(
            f"job {job_id}: Ray could not reserve {world} x {bundle} within {timeout_s:g}s "
            f"(cluster has {ray.cluster_resources()}); lower layout degrees or "
            "resources.cpus_per_rank, or add nodes"
        )


def _place_on_hetflow_nodes(layout: ParallelLayout, res: ResourcesConfig, job_id: str) -> Placed:
    from hetflow.runtime.binding import live_snapshot, reserve
    from hetflow.scheduling.planner import plan

    snapshot = live_snapshot()
    placement = plan(snapshot, res.placement_request(job_id, layout))
    bound = reserve(placement, snapshot, cpus_per_rank=res.cpus_per_rank,
                    timeout_s=res.placement_timeout_s)
    options = [bound.actor_options(rank) for rank in range(placement.world_size)]
    return Placed(options, bound.release, placement.explain(), devices="hetflow")


class RankGroup:
    """One attempt: one actor per rank of ``layout`` running a function on every rank.

    The one actor group of hetflow's training paths: ``hetflow.train.run`` (a user's
    ``train_func``), ``hetflow train`` (the built-in models' train function, ``loop.train_func``)
    and the controller's train jobs (``placed``: devices the controller already reserved, which
    the group does not release). Each actor is a :class:`~hetflow.workloads.train.worker.FuncWorker`
    that joins the process group, sets the ``hetflow.train`` context and calls the function.
    """

    def __init__(self, layout: ParallelLayout, resources: ResourcesConfig, name: str, attempt: int,
                 placed: Placed | None = None) -> None:
        self.layout, self.res, self.name, self.attempt = layout, resources, name, attempt
        self._given = placed
        self.placed: Placed | None = None
        self.actors: list[Any] = []
        self.where: list[dict[str, Any]] = []
        self.how = ""

    def start(self) -> None:
        """Reserve (unless given), create the actors and wait until each has started."""
        from hetflow.workloads.train.worker import FuncWorker

        self.placed = self._given or place_layout(self.layout, self.res, f"{self.name}-{self.attempt}")
        self.how = self.placed.how
        remote = ray.remote(max_restarts=0, max_concurrency=1)(FuncWorker)
        self.actors = [remote.options(**opts).remote() for opts in self.placed.options]
        try:
            self.where = ray.get([a.where.remote() for a in self.actors],
                                 timeout=self.res.placement_timeout_s)
        except (RayActorError, GetTimeoutError) as exc:
            raise WorkerFailure(f"a rank of {self.name} did not start: {exc}") from None

    @property
    def pids(self) -> list[int]:
        return [w["pid"] for w in self.where]

    def run(self, fn: Callable[..., Any], config: Any, info: dict[str, Any], progress: Any | None,
            tick: Callable[[], None] | None = None, poll_s: float = 0.1) -> list[Any]:
        """``fn(config)`` on every rank until all return; each rank's return value, rank order.
        ``info``: ``checkpoint_dir`` and ``keep_last`` for ``hetflow.train.report``; rank 0's
        reports go to ``progress`` (api.ProgressLog: ``record(records)``); ``tick`` is called about
        every ``poll_s`` while waiting.

        Raises WorkerFailure when a rank's process died (or its collectives lost a peer), and
        TrainingCodeError when a rank raised an error of its own.
        """
        from hetflow.workloads.launch.env import torchrun_env

        assert self.actors and self.placed is not None, "start() first"
        envs = torchrun_env([w["node_id"] for w in self.where], self.where[0]["ip"],
                            self.where[0]["port"], run_id=self.name, restart_count=self.attempt,
                            max_restarts=0, omp_threads=self.res.threads_per_rank)
        if self.placed.devices == "cpu":  # no device visible (Ray leaves the variables unset)
            from hetflow.core.topology import Vendor
            from hetflow.runtime.resources import visibility_env

            envs = [{**visibility_env(Vendor.CPU, []), **env} for env in envs]
        info = {"attempt": self.attempt, "name": self.name, **info}
        fn_ref = ray.put(fn)
        refs = [a.run.remote(fn_ref, config, env, self.layout.shape, self.placed.devices,
                             self.res.threads_per_rank, info, progress if rank == 0 else None)
                for rank, (a, env) in enumerate(zip(self.actors, envs))]
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=poll_s)
            if tick is not None:
                tick()
            for ref in done:
                try:
                    ray.get(ref)
                except (RayActorError, RayTaskError) as exc:
                    self._raise_failure(refs, refs.index(ref), exc)
        return ray.get(refs)

    def _raise_failure(self, refs: list[Any], first_rank: int, first: Exception) -> None:
        """Decide between 'a process died' (restartable) and 'the code failed' (not)."""
        errors: dict[int, Exception] = {first_rank: first}
        ray.wait(refs, num_returns=len(refs), timeout=FAILURE_GRACE_S)
        for rank, ref in enumerate(refs):
            if rank in errors:
                continue
            try:
                ray.get(ref, timeout=0)
            except (RayActorError, RayTaskError) as exc:
                errors[rank] = exc
            except GetTimeoutError:
                pass  # still blocked in a collective: it is waiting for the failed rank
        own = {r: e for r, e in errors.items()
               if isinstance(e, RayTaskError) and not _is_lost_peer(e)}
        died = sorted(r for r, e in errors.items() if isinstance(e, RayActorError))
        if own and not died:
            rank, exc = min(own.items())
            raise TrainingCodeError(f"rank {rank} of {self.name} raised {_cause_text(exc)}")
        what = (f"rank {died[0]}'s process died" if died
                else f"rank {min(errors)} lost its peers ({_cause_text(errors[min(errors)])})")
        raise WorkerFailure(f"{what} (attempt {self.attempt})")

    def shutdown(self) -> None:
        """Kill the actors and give the resources back (not given ones); safe to call twice."""
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []
        if self.placed is not None:
            if self.placed is not self._given:
                self.placed.release()
            self.placed = None


def _is_lost_peer(exc: RayTaskError) -> bool:
    """True when the rank failed inside a collective because another rank went away."""
    import torch.distributed as dist

    cause = getattr(exc, "cause", None)
    if isinstance(cause, dist.DistError):
        return True
    text = str(cause or exc).lower()
    # gloo reports a vanished peer as a plain RuntimeError from its transport
    return any(s in text for s in ("connection closed by peer", "connection reset by peer",
                                   "broken pipe", "gloo/transport", "timed out"))


def _cause_text(exc: Exception) -> str:
    cause = getattr(exc, "cause", None)
    if cause is not None:
        return f"{type(cause).__name__}: {cause}"
    return str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__


__all__ = ["Placed", "RankGroup", "TrainingCodeError", "WorkerFailure", "place_layout"]
