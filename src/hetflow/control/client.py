"""What ``hetflow submit|status|cancel|logs`` call: connect, find (or start) the controller, ask.

    from hetflow.control import client
    with client.connect("auto"):
        job = client.submit(load_job("job.yaml"))      # returns at once: {"job_id": ...}
        client.status()                                # every job, with its reason
        client.cancel(job["job_id"]); client.logs(job["job_id"])

``connect(address)``: ``address`` is what ``ray.init`` takes (``auto``, ``host:port``,
``ray://host:10001``); None means the local running cluster (``auto``). No running cluster is
an :class:`~hetflow.core.errors.InputError` that says how to start one, never a traceback.
Errors raised by the controller (unknown job, a job that can never fit) arrive as themselves.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from typing import Any, Iterator

from hetflow.control.jobspec import JobSpec
from hetflow.core.errors import HetflowError, InputError

CALL_TIMEOUT_S = 120.0  # a controller that restarts answers within this (its calls are retried)


@contextlib.contextmanager
def connect(address: str | None = None) -> Iterator[None]:
    """Connect this process to the cluster for the block (unless it already is)."""
    from hetflow.runtime.session import check_reachable, ray_loopback_mode

    target = address or "auto"
    # an address nobody answers on: one line in seconds, not Ray's retries (and before Ray's import)
    check_reachable(target)
    ray_loopback_mode(target)
    import ray

    if ray.is_initialized():
        yield
        return
    try:
        ray.init(address=target, namespace="hetflow", log_to_driver=False, logging_level="ERROR")
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = "no running Ray cluster was found on this machine" if target == "auto" else \
            f"cannot connect to the Ray cluster at {target}"
        # Ray 2.60 clusters from `ray start` require a token by default, and Ray sends one to
        # an explicit address only when told to (it does so by itself only for "auto").
        token = ("" if target == "auto" or os.environ.get("RAY_AUTH_MODE") else
                 "; if the cluster uses token authentication (the default of `ray start` in Ray "
                 "2.60), set RAY_AUTH_MODE=token and give its token (RAY_AUTH_TOKEN, or "
                 "~/.ray/auth_token; `ray get-auth-token` on the head prints it)")
        raise InputError(
            f"{where} ({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}){token}; "
            "start a cluster with `ray start --head` (or `hetflow node start` on each node), or "
            "pass --address HOST:PORT"
        ) from None
    try:
        yield
    finally:
        ray.shutdown()


def controller(settings: dict[str, Any] | None = None, create: bool = True) -> Any:
    """The controller's handle; started (detached, on the head node) when none runs yet.
    ``settings`` apply only when this call starts it (use :func:`configure` to change them)."""
    import ray

    from hetflow.control.controller import CONTROLLER_NAME, NAMESPACE, HetflowController

    try:
        return ray.get_actor(CONTROLLER_NAME, namespace=NAMESPACE)
    except ValueError:
        if not create:
            raise InputError("no hetflow controller is running on this cluster; "
                             "`hetflow submit JOB.yaml` starts one") from None
    return ray.remote(HetflowController).options(
        name=CONTROLLER_NAME, namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
        max_restarts=-1, max_task_retries=-1, num_cpus=0, max_concurrency=16,
        scheduling_strategy=_head_node_strategy(),
    ).remote(settings)


def _head_node_strategy() -> Any:
    """Prefer the head node (it holds the GCS the state lives in); any node if it cannot."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    for node in ray.nodes():
        if node.get("Alive") and "node:__internal_head__" in (node.get("Resources") or {}):
            return NodeAffinitySchedulingStrategy(node["NodeID"], soft=True)
    return "DEFAULT"


def _call(method: Any, *args: Any, **kwargs: Any) -> Any:
    """Call a controller method and unwrap the user-facing error it raised, if any."""
    import ray
    from ray.exceptions import GetTimeoutError, RayTaskError

    try:
        return ray.get(method.remote(*args, **kwargs), timeout=CALL_TIMEOUT_S)
    except RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, HetflowError):
            raise cause from None
        raise
    except GetTimeoutError:
        raise HetflowError(f"the hetflow controller did not answer within {CALL_TIMEOUT_S:g}s; "
                           "`ray list actors --filter name=hetflow-controller` shows its state") from None


def submit(spec: JobSpec, settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """Queue a resolved job (:func:`~hetflow.control.jobspec.load_job`); its record, at once.
    Raises Unschedulable when it could never run on this cluster."""
    return _call(controller(settings).submit, spec.model_dump(mode="json"), uuid.uuid4().hex)


def status(job_id: str | None = None) -> list[dict[str, Any]]:
    return _call(controller(create=False).status, job_id)


def cancel(job_id: str) -> dict[str, Any]:
    return _call(controller(create=False).cancel, job_id)


def logs(job_id: str, nbytes: int = 64 * 1024, lines: int | None = None) -> str:
    """The job's output (every attempt, the last ``nbytes`` kept); ``lines``: only the last N lines."""
    return _call(controller(create=False).logs, job_id, nbytes, lines)


FOLLOW_POLL_S = 0.5

EXIT_BY_STATUS = {"SUCCEEDED": 0, "FAILED": 1, "CANCELLED": 4}  # hetflow's exit codes (docs/cli.md)


def logs_at(job_id: str, nbytes: int = 64 * 1024, lines: int | None = None) -> dict[str, Any]:
    """:func:`logs` with where the text ends (``token``, ``offset``): :func:`follow` goes on from there."""
    return _call(controller(create=False).logs_at, job_id, nbytes, lines)


def follow(job_id: str, write: Any, *, from_start: bool = True,
           after: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write the job's output as it comes (every attempt) until the job ends; its final record.
    ``from_start``: the current attempt's output from its start, else only what comes from now;
    ``after``: from where a :func:`logs_at` text ended (nothing lost or repeated between them)."""
    handle = controller(create=False)
    if after is not None:
        state = _call(handle.follow, job_id, after["token"], after["offset"])
    else:
        state = _call(handle.follow, job_id, None, None if from_start else -1)
    write(state["text"])
    while not state["finished"]:
        time.sleep(FOLLOW_POLL_S)
        state = _call(handle.follow, job_id, state["token"], state["offset"])
        write(state["text"])
    return status(job_id)[0]


def configure(settings: dict[str, Any]) -> dict[str, Any]:
    """Change the running controller's settings (policy, round_s, ...); kept across restarts."""
    return _call(controller(settings).configure, settings)


def info() -> dict[str, Any]:
    return _call(controller(create=False).info)


__all__ = ["EXIT_BY_STATUS", "cancel", "configure", "connect", "controller", "follow", "info", "logs", "logs_at",
           "status",
           "submit"]
