"""Joining a Ray cluster, or starting an embedded local one, for a driver that runs N ranks.

    session = connect(address=None, ranks=2)      # embedded local Ray, the machine's cores
    ...
    session.close()                               # shuts Ray down only if it was started here

Rules shared by ``hetflow launch`` and ``hetflow.train.run``:

* ``address`` (or ``RAY_ADDRESS``): join that cluster. A ``host:port`` nothing answers on fails
  at once with one line instead of Ray's retries. Token authentication follows Ray's own rule
  for explicit addresses: the token is sent only with ``RAY_AUTH_MODE=token``.
* neither: an embedded local Ray with the machine's cores, like ``torchrun --standalone``. Its
  ranks share the cores (at most one CPU each, at most ``RANKS_PER_CORE`` ranks per core; more
  is refused as Unschedulable, exit 3).
* Ray already initialised in this process (a driver inside a cluster job): used as it is.

Ray's node IP is left as Ray picks it (on a machine with a default route: the address of
that route's interface, not 127.0.0.1), as when a user calls ``ray.init()`` themselves, and
every part of hetflow works with it. Only a cluster to join *on loopback* (``--address
127.0.0.1:6379`` of a head started with ``--node-ip-address=127.0.0.1``) needs Ray's loopback
mode, ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` set before Ray is first imported (else Ray
rewrites 127.0.0.1 to the host's address and cannot reach the head): :func:`ray_loopback_mode`
sets it then, and only then (a driver in loopback mode reports 127.0.0.1 as its IP, which
breaks joining a cluster at a real address).
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetflow.core.errors import InputError, Unschedulable

RANKS_PER_CORE = 8


@dataclass
class Session:
    started: bool  # this call started or joined Ray (close() shuts it down)
    embedded_cores: int | None  # the embedded local Ray's CPUs; None on a cluster

    def cpus_per_rank(self, ranks: int, asked: float | None) -> float:
        """CPUs to reserve per rank: ``asked``; else 1 on a cluster, a fair share when embedded."""
        if asked is not None:
            return asked
        return 1.0 if self.embedded_cores is None else min(1.0, self.embedded_cores / ranks)

    def close(self) -> None:
        if self.started:
            import ray

            ray.shutdown()


CONNECT_TIMEOUT_S = 3.0  # a TCP connect to a live head takes milliseconds; this bounds a dead one


def ray_address_file() -> Path:
    """Where ``ray start`` records the address of the cluster it started on this machine:
    Ray's rule (``ray._common.utils.get_default_system_temp_dir``), written out here because
    importing Ray to ask would read Ray's settings before :func:`ray_loopback_mode` can set
    one: ``RAY_TMPDIR``, else ``TMPDIR`` (Linux), else /tmp; then ``ray/ray_current_cluster``."""
    import sys

    if "RAY_TMPDIR" in os.environ:
        base = os.environ["RAY_TMPDIR"]
    elif sys.platform.startswith("linux") and "TMPDIR" in os.environ:
        base = os.environ["TMPDIR"]
    elif sys.platform.startswith(("linux", "darwin")):
        base = "/tmp"
    else:
        import tempfile

        base = tempfile.gettempdir()
    return Path(base) / "ray" / "ray_current_cluster"


def effective_address(address: str | None) -> tuple[str | None, str]:
    """What ``ray.init(address=address)`` joins, and where that came from (for messages).

    Ray's own order: an explicit ``host:port``/``ray://...``; for ``None`` and ``"auto"``,
    ``RAY_ADDRESS``, then the cluster ``ray start`` last recorded on this machine. ``(None,
    "")`` means Ray starts a new local instance (``address`` None or ``"local"`` and nothing
    recorded); ``("auto", "")``: ``auto`` with nothing recorded (Ray then looks for a running
    GCS process, or says there is none)."""
    if address not in (None, "auto"):
        return (None, "") if address == "local" else (address, "--address")
    env = os.environ.get("RAY_ADDRESS")
    if env:
        return (None, "") if env == "local" else (env, "RAY_ADDRESS")
    try:
        recorded = ray_address_file().read_text().strip()
    except OSError:
        recorded = ""
    if recorded:
        return recorded, f"the cluster `ray start` last started here ({ray_address_file()})"
    return (address, "") if address == "auto" else (None, "")


LOOPBACK_MODE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def ray_loopback_mode(address: str | None, default: str | None = None) -> bool:
    """Before Ray is imported: put Ray in loopback mode when the cluster ``ray.init(address or
    default)`` joins is on loopback (see the module docstring). No effect when Ray is already
    imported (it read the variable then), when the user set the variable, or for any other
    address (an embedded local Ray keeps Ray's own node IP). True when it set the variable."""
    import sys

    if "ray" in sys.modules or LOOPBACK_MODE_ENV in os.environ:
        return False
    target, _ = effective_address(address or default)
    where = _host_port(target) if target not in (None, "auto") else None
    if where is None or where[0] not in ("127.0.0.1", "localhost", "::1"):
        return False
    os.environ[LOOPBACK_MODE_ENV] = "0"
    return True


def _host_port(address: str) -> tuple[str, int] | None:
    rest = address.split("://", 1)[1] if "://" in address else address
    rest = rest.split("/", 1)[0]
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]") or "127.0.0.1", int(port)


def check_reachable(address: str | None, default: str | None = None) -> None:
    """Fail in seconds with one InputError when the cluster ``ray.init(address or default)``
    would join does not answer (Ray itself retries such an address for minutes, printing
    GCS warnings). ``default``: what the caller passes Ray when no address is given (``None``:
    join a recorded cluster or start a new one; ``"auto"``: a running cluster is required).
    Nothing is checked when Ray would start a new local instance or is already initialised
    in this process."""
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return
    target, source = effective_address(address or default)
    if target in (None, "auto"):
        return
    where = _host_port(target)
    if where is None:
        raise InputError(f"Ray address {target!r} ({source}) is not host:port or ray://host:port; "
                         "fix --address / RAY_ADDRESS")
    try:
        socket.create_connection(where, timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        why = exc.strerror or str(exc) or type(exc).__name__
        if source.startswith("the cluster"):
            raise InputError(f"no Ray cluster answers at {target}, {source}, ({why}): it was stopped "
                             "without `ray stop`; start one with `ray start --head` (or `hetflow node "
                             "start`), or pass --address HOST:PORT") from None
        raise InputError(f"cannot reach the Ray cluster at {target} (from {source}: {why}); check "
                         "the head's address (`ray status` on the head prints it), or start one with "
                         "`ray start --head` / `hetflow node start`") from None
    if not target.startswith("ray://"):
        _probe_gcs(target, where, source)


def _probe_gcs(target: str, where: tuple[str, int], source: str) -> None:
    """One real call to the GCS (``GetClusterId``) with a deadline: a port that accepts
    connections but is not a Ray head (or a head that hangs) would make ``ray.init`` wait for
    minutes too. A refusal for want of a token means a Ray head is there: with
    ``RAY_AUTH_MODE=token`` Ray sends its token, without it one line says to set it."""
    import grpc

    host, port = where
    with grpc.insecure_channel(f"[{host}]:{port}" if ":" in host else f"{host}:{port}") as channel:
        call = channel.unary_unary("/ray.rpc.NodeInfoGcsService/GetClusterId",
                                   request_serializer=lambda b: b, response_deserializer=lambda b: b)
        try:
            call(b"", timeout=CONNECT_TIMEOUT_S)
            return
        except grpc.RpcError as exc:
            code = exc.code()
    if (code is grpc.StatusCode.UNAUTHENTICATED and source == "--address"
            and os.environ.get("RAY_AUTH_MODE", "").lower() != "token"):
        # Ray's rule: to an address given explicitly the token goes only with
        # RAY_AUTH_MODE=token (to a recorded or found cluster it goes when a token exists);
        # without it ray.init retries, then says no cluster runs there
        raise InputError(f"the Ray cluster at {target} (from {source}) wants an authentication token: "
                         "set RAY_AUTH_MODE=token (the token is read from RAY_AUTH_TOKEN or "
                         "~/.ray/auth_token; `ray get-auth-token` on the head prints it)") from None
    if code in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNIMPLEMENTED):
        what = "does not answer as" if code is grpc.StatusCode.DEADLINE_EXCEEDED else "is not"
        raise InputError(f"{target} (from {source}) accepts connections but {what} a Ray head (GCS) "
                         f"({code.name.lower()} within {CONNECT_TIMEOUT_S:g}s); check the head's address "
                         "and port (`ray status` on the head prints it)") from None


def check_embedded(ranks: int, what: str = "--nproc") -> int:
    """The cores of an embedded local Ray for ``ranks`` ranks; Unschedulable when too many."""
    cores = os.cpu_count() or 1
    if ranks > RANKS_PER_CORE * cores:
        raise Unschedulable(
            f"{what} {ranks}: this machine has {cores} CPU cores and an embedded local Ray runs "
            f"at most {RANKS_PER_CORE} ranks per core ({RANKS_PER_CORE * cores}); use fewer "
            "ranks, or join a cluster with --address")
    return cores


def connect(address: str | None, ranks: int, runtime_env: dict[str, Any] | None = None,
            what: str = "--nproc") -> Session:
    """Join or start Ray for a driver of ``ranks`` ranks (see the module docstring).
    ``runtime_env``: the job's (e.g. a ``working_dir``: Ray uploads local directories only for a
    whole job); refused when Ray is already initialised without it."""
    ray_loopback_mode(address)
    import ray

    if ray.is_initialized():
        if runtime_env:
            raise InputError("a working_dir needs a driver of its own: give it to ray.init's "
                             "runtime_env instead")
        return Session(False, None)
    given = address
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address:
        check_reachable(given)  # the message names --address or RAY_ADDRESS
        ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR,
                 runtime_env=runtime_env)
        return Session(True, None)
    cores = check_embedded(ranks, what)
    # A Ray of this run only: nobody scrapes its metrics, and on a small machine their
    # collection competes with the ranks for the same cores.
    ray.init(address="local", num_cpus=cores, include_dashboard=False, log_to_driver=False,
             logging_level=logging.ERROR, runtime_env=runtime_env,
             _system_config={"enable_metrics_collection": False})
    return Session(True, cores)


__all__ = ["CONNECT_TIMEOUT_S", "LOOPBACK_MODE_ENV", "RANKS_PER_CORE", "Session", "check_embedded", "check_reachable",
           "connect", "effective_address", "ray_address_file", "ray_loopback_mode"]
