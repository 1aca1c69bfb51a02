"""``hetflow node start``: join this machine to a Ray cluster as a hetflow node.

    hetflow node start --print                     # show the `ray start` command, run nothing
    hetflow node start                             # start a head node here
    hetflow node start --address HEAD:6379         # join a running cluster
    hetflow node start --from topo.txt --name n1   # describe the node from recorded output
    hetflow node start --workload data             # size the object store for a data pipeline
    hetflow node start --gcs-redis REDIS:6379      # a head whose GCS state survives a restart
    hetflow node start -- --port=6380 --temp-dir=/data/ray   # anything after -- goes to ray start

The node gives Ray no GPU resource; each accelerator becomes the custom resource
``hetflow_dev_<i>`` (capacity = its memory in MiB) and the node gets ``hetflow.io/*`` labels
(vendor, model, memory, devices, fast-link island size). After `ray start`, the node's topology
is published in Ray's internal KV, where the planner reads it (docs/placement.md explains why).
The object store is sized from this host's memory and the workload, and the reason printed
(hetflow.runtime.object_store; docs/deployment.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import socket
import subprocess
import sys
from pathlib import Path

from hetflow.core.errors import HetflowError, InputError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("node", help="start this machine as a hetflow node of a Ray cluster",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = p.add_subparsers(dest="node_command", metavar="ACTION")
    s = verbs.add_parser("start", help="run (or --print) `ray start` with hetflow's resources and labels")
    s.add_argument("--address", help="address of the Ray head to join (default: start a head)")
    s.add_argument("--from", dest="from_files", nargs="+", metavar="FILE",
                   help="describe the node from recorded tool output instead of probing")
    s.add_argument("--model", help="accelerator model for recorded files that do not name it")
    s.add_argument("--name", help="node name (default: this host's name)")
    s.add_argument("--num-cpus", type=int, help="CPUs to give Ray (default: Ray's own count)")
    s.add_argument("--node-ip-address", metavar="IP",
                   help="address this node's Ray listens on (ray start --node-ip-address; on "
                        "hosts with several networks, the one the other nodes reach)")
    s.add_argument("--workload", choices=["data", "train", "tune", "serve"],
                   help="size the object store for this workload (default: Ray's 30%% share)")
    s.add_argument("--object-store-memory", metavar="SIZE",
                   help="object store size, e.g. 200GiB (default: chosen from memory and --workload)")
    s.add_argument("--ray-gpus", metavar="K|I,J",
                   help="leave devices to Ray's own GPU accounting (num_gpus works for them): a "
                        "count K (the K highest-numbered) or device indices (6,7; one: 7,); "
                        "hetflow manages the rest, no device is in both")
    s.add_argument("--gcs-redis", metavar="HOST:PORT",
                   help="head only: keep Ray's GCS state in this Redis (Ray's GCS fault "
                        "tolerance), so a restarted head gets the cluster back - actors, "
                        "placement groups, hetflow's job queue; password from "
                        "HETFLOW_GCS_REDIS_PASSWORD (docs/reliability.md)")
    s.add_argument("--gcs-namespace", metavar="NAME",
                   help="with --gcs-redis: the cluster's key prefix in Redis (give each cluster "
                        "sharing one Redis its own; a restarted head must reuse it)")
    s.add_argument("--print", dest="print_only", action="store_true",
                   help="print the command and exit without starting anything")
    s.add_argument("ray_args", nargs=argparse.REMAINDER, metavar="-- RAY_START_ARGS",
                   help="after --: more `ray start` flags, passed as they are (e.g. --port=6380)")
    s.set_defaults(func=run_start)
    p.set_defaults(func=lambda args: p.print_help() or 2)


def _node(args: argparse.Namespace):
    name = args.name or socket.gethostname()
    if args.from_files:
        from hetflow.accelerators.load import load_node

        return load_node(args.from_files, name=name, model=args.model)
    from hetflow.accelerators.discover import discover_local
    from hetflow.accelerators.enrich import enrich_node

    return dataclasses.replace(enrich_node(discover_local()), name=name)


def _object_store(args: argparse.Namespace, node) -> tuple[int | None, str]:
    """(bytes for --object-store-memory or None, the line that says why)."""
    from hetflow.accelerators.cpu import host_memory_bytes
    from hetflow.core.units import format_bytes, parse_bytes
    from hetflow.runtime.object_store import choose_object_store_memory, dev_shm_bytes

    if args.object_store_memory:
        size = parse_bytes(args.object_store_memory)
        return size, f"object store: {format_bytes(size)} (--object-store-memory)"
    # The store lives on this host, so its memory counts, even when --from describes the devices.
    memory = host_memory_bytes() if args.from_files else (node.host_memory_bytes or host_memory_bytes())
    choice = choose_object_store_memory(memory, args.workload, accelerators=len(node.accelerators),
                                        shm_bytes=dev_shm_bytes())
    return choice.bytes, choice.describe()


def _ray_args(rest: list[str] | None) -> list[str]:
    rest = list(rest or [])
    if rest[:1] == ["--"]:
        rest = rest[1:]
    for flag in rest:
        name = flag.split("=", 1)[0]
        if name in ("--head", "--address", "--resources", "--labels", "--num-gpus"):
            raise InputError(f"{name} after -- is set by hetflow node start itself; use its own "
                             "options (--address, --ray-gpus) instead")
    return rest


def _head_address(args: argparse.Namespace) -> str:
    """The head just started here: with --node-ip-address, that address and the port (from
    the flags after --, else Ray's 6379); without it, the address `ray start` recorded."""
    if not args.node_ip_address:
        return "auto"
    port = "6379"
    rest = _ray_args(args.ray_args)
    for i, flag in enumerate(rest):
        if flag.startswith("--port="):
            port = flag.split("=", 1)[1]
        elif flag == "--port" and i + 1 < len(rest):
            port = rest[i + 1]
    return f"{args.node_ip_address}:{port}"


def _gcs_storage(args: argparse.Namespace) -> tuple[dict[str, str], list[str]]:
    """The head's environment and ``ray start`` flags for GCS fault tolerance on Redis
    (Ray's own mechanism: ``RAY_REDIS_ADDRESS``, ``--redis-password``,
    ``RAY_external_storage_namespace``); the Redis must answer now."""
    import os

    if args.gcs_namespace and not args.gcs_redis:
        raise InputError("--gcs-namespace needs --gcs-redis HOST:PORT")
    if not args.gcs_redis:
        return {}, []
    if args.address:
        raise InputError("--gcs-redis is for the head node (it holds the GCS); drop --address, "
                         "or drop --gcs-redis on a worker node")
    from hetflow.runtime.session import _host_port

    where = _host_port(args.gcs_redis)
    if where is None or args.gcs_redis.startswith("ray://"):
        raise InputError(f"--gcs-redis {args.gcs_redis!r} is not HOST:PORT (e.g. 10.0.0.5:6379)")
    if not args.print_only:
        try:
            socket.create_connection(where, timeout=5).close()
        except OSError as exc:
            raise InputError(f"no Redis answers at {args.gcs_redis} ({exc.strerror or exc}); "
                             "start it first (e.g. `redis-server --port PORT --bind IP`)") from None
    env = {"RAY_REDIS_ADDRESS": args.gcs_redis}
    if args.gcs_namespace:
        env["RAY_external_storage_namespace"] = args.gcs_namespace
    password = os.environ.get("HETFLOW_GCS_REDIS_PASSWORD")
    return env, (["--redis-password", password] if password else [])


def run_start(args: argparse.Namespace) -> int:
    from hetflow.runtime.resources import (
        fast_islands,
        format_command,
        ray_gpu_env,
        ray_start_command,
        split_ray_gpus,
    )

    if args.num_cpus is not None and args.num_cpus < 0:
        raise InputError("--num-cpus must be >= 0")
    if args.address and not args.print_only:
        from hetflow.runtime.session import check_reachable

        check_reachable(args.address)  # `ray start --address` retries a dead head for minutes
    gcs_env, gcs_args = _gcs_storage(args)
    whole = _node(args)
    node, ray_devices = split_ray_gpus(whole, args.ray_gpus)
    env = {**ray_gpu_env(whole, ray_devices), **gcs_env}
    store_bytes, store_reason = _object_store(args, node)
    extra = [f"--node-ip-address={args.node_ip_address}"] if args.node_ip_address else []
    extra += gcs_args + _ray_args(args.ray_args)
    cmd = ray_start_command(node, args.address, num_cpus=args.num_cpus,
                            object_store_memory=store_bytes, extra=extra, ray_gpus=len(ray_devices))
    islands = fast_islands(node)
    print(f"# node {node.name}: {len(node.accelerators)} accelerators managed by hetflow, fast-link "
          f"islands {[len(i) for i in islands] if islands else []}")
    if ray_devices:
        print(f"# left to Ray's GPU accounting (num_gpus): devices {', '.join(map(str, ray_devices))}")
    print(f"# {store_reason}")
    shown = cmd if "--redis-password" not in cmd else [
        "***" if i and cmd[i - 1] == "--redis-password" else c for i, c in enumerate(cmd)]
    print(format_command(shown, env))
    if args.print_only:
        return 0
    import os

    done = subprocess.run([_ray_executable(), *cmd[1:]], check=False, env={**os.environ, **env})
    if done.returncode != 0:
        raise HetflowError(f"`ray start` failed with exit code {done.returncode} (see its output above)")
    import ray

    from hetflow.runtime.binding import publish_node

    # A driver on this host must use the same address as the node, or Ray refuses to connect.
    where = {"_node_ip_address": args.node_ip_address} if args.node_ip_address else {}
    ray.init(address=args.address or _head_address(args), log_to_driver=False, **where)
    try:
        publish_node(node)
    finally:
        ray.shutdown()
    print(f"published the topology of {node.name} to the cluster", file=sys.stderr)
    return 0


def _ray_executable() -> str:
    """The ``ray`` command of this installation: beside this Python (a virtualenv that is not
    activated), else on PATH."""
    import shutil

    beside = Path(sys.executable).parent / "ray"
    if beside.is_file():
        return str(beside)
    found = shutil.which("ray")
    if found is None:
        raise HetflowError("the `ray` command is not installed beside this Python or on PATH; "
                           "install hetflow's dependencies (pip install -e .) in this environment")
    return found
