"""Real hosts on one machine: Linux network namespaces on a bridge, a Ray node in each.

    with HostCluster(workers=2) as hosts:
        hosts.run(hosts.head, ["hetflow", "launch", "--address", hosts.address, ...])
        hosts.kill_host(hosts.workers[0])      # every process of that host, at once
        hosts.cut_link(hosts.workers[1])       # its network gone, its processes still running

Each host is a namespace ``hf<id>-<k>`` with its own address ``10.<a>.<b>.<k+1>/24`` on a veth
pair whose other end sits on a bridge in the root namespace (``.254``). Host 0 runs the Ray
head (no CPUs for work), the others join it with ``ray start`` - as machines of a real cluster
would - declaring the resources and labels that ``hetflow node start`` would give them (fake
accelerators from the catalog). Every process a host runs is a process of its namespace
(``ip netns pids``), so a host loss kills exactly those and teardown ends exactly what was
started here; the namespaces, veths and bridge are deleted at the end. Traffic stays on those
addresses (Ray's GCS, raylets, object transfers, the ranks' gloo).

Needs root and ``ip`` (iproute2); :func:`available` says whether this machine allows it and
why not. GCS health checks are tightened (1 s period, 3 misses) so a lost host is declared
dead in seconds instead of Ray's default 15-30 s; the figure is a setting, documented in
docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
HEALTH = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3",
          "RAY_health_check_initial_delay_ms": "1000", "RAY_health_check_timeout_ms": "1000"}


def available() -> str | None:
    """None when namespaces can be made here, else why not (a skip reason)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    probe = f"hfprobe{secrets.token_hex(3)}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = (["ip", "netns", "exec", ns] if ns else []) + ["ip", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=check)


@dataclass
class Host:
    name: str  # the namespace
    address: str  # its IP
    veth: str  # the root-side end of its link
    cpus: int
    node: Any = None  # the hetflow NodeTopology it declares (None: a CPU-only host)


@dataclass
class HostCluster:
    """A Ray cluster of ``1 + workers`` hosts (see the module docstring)."""

    workers: int = 2
    worker_cpus: int = 2
    devices: Sequence[str | None] = ()  # per worker: a synthetic node spec ("8x MI210") or None
    env: dict[str, str] = field(default_factory=dict)
    head_args: Sequence[str] = ()
    gcs_redis: bool = False  # the head keeps its GCS in a real Redis (Ray's GCS fault tolerance)

    def __post_init__(self) -> None:
        tag = secrets.token_hex(2)
        self.tag = tag
        a, b = 10 + int(tag[:2], 16) % 200, int(tag[2:], 16) % 250
        self.prefix = f"10.{a}.{b}"
        self.bridge = f"hfbr{tag}"
        self.hosts: list[Host] = []
        self.port = 6379
        self.started: list[str] = []
        self.redis: subprocess.Popen | None = None
        self.redis_address: str | None = None

    # -- life cycle ---------------------------------------------------------------------------

    def __enter__(self) -> "HostCluster":
        try:
            self._make_network()
            if self.gcs_redis:
                self._start_redis()
            self._start_ray()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def head(self) -> Host:
        return self.hosts[0]

    @property
    def worker_hosts(self) -> list[Host]:
        return self.hosts[1:]

    @property
    def address(self) -> str:
        return f"{self.head.address}:{self.port}"

    def _make_network(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.prefix}.254/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for k in range(1 + self.workers):
            ns, veth = f"hf{self.tag}-{k}", f"hfv{self.tag}{k}"
            subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True)
            self.hosts.append(Host(ns, f"{self.prefix}.{k + 1}", veth,
                                   0 if k == 0 else self.worker_cpus))
            _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", veth, "master", self.bridge)
            _ip("link", "set", veth, "up")
            _ip("addr", "add", f"{self.prefix}.{k + 1}/24", "dev", "eth0", ns=ns)
            _ip("link", "set", "eth0", "up", ns=ns)
            _ip("link", "set", "lo", "up", ns=ns)

    def environment(self, host: Host) -> dict[str, str]:
        """The environment of every process on ``host``."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env.update(HEALTH)
        env.update({"RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1",
                    "RAY_USAGE_STATS_ENABLED": "0", "PATH": f"{BIN}:{env.get('PATH', '')}",
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), str(REPO / "src"),
                                                                str(REPO / "tests" / "fixtures"),
                                                                env.get("PYTHONPATH", "")])),
                    "RAY_ADDRESS": self.address})
        env.update(self.env)
        return env

    def _start_redis(self) -> None:
        """Debian's redis-server in the root namespace on the bridge's address (outside every
        host, so a head loss leaves it running), no persistence to disk; ended by PID."""
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed: run scripts/system_deps.sh "
                               "(apt-get install -y redis-server)")
        import socket

        with socket.socket() as probe:
            probe.bind((f"{self.prefix}.254", 0))
            port = probe.getsockname()[1]
        self._redis_dir = tempfile.mkdtemp(prefix=f"hetflow-redis-{self.tag}-")
        self.redis = subprocess.Popen(
            [binary, "--bind", f"{self.prefix}.254", "--port", str(port), "--save", "",
             "--appendonly", "no", "--protected-mode", "no", "--daemonize", "no",
             "--dir", self._redis_dir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.redis_address = f"{self.prefix}.254:{port}"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection((f"{self.prefix}.254", port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"redis-server did not start on {self.redis_address}")

    def _start_head(self) -> None:
        """``hetflow node start`` on the head host (``ray start --head`` with hetflow's flags;
        with ``gcs_redis``, its documented ``--gcs-redis`` option: Ray's GCS state in Redis)."""
        cmd = ["hetflow", "node", "start", f"--node-ip-address={self.head.address}",
               "--num-cpus=0", "--object-store-memory=256MiB"]
        if self.redis_address:
            cmd += ["--gcs-redis", self.redis_address, "--gcs-namespace", f"hosts-{self.tag}"]
        cmd += ["--", f"--port={self.port}", "--include-dashboard=false", "--disable-usage-stats",
                f"--temp-dir=/tmp/hetflow-hosts-{self.tag}", *self.head_args]
        try:
            self.run(self.head, cmd, timeout=120)
        except RuntimeError:  # a loaded machine: the head's raylet missed Ray's start deadline
            self.kill_host(self.head)
            time.sleep(1)
            self.run(self.head, cmd, timeout=120)

    def restart_head(self) -> float:
        """The head host lost whole (every process SIGKILLed) and started again at the same
        address; returns the seconds until the new head answered with every host alive."""
        started = time.monotonic()
        self.kill_host(self.head)
        while self.pids(self.head):
            time.sleep(0.05)
        # On one machine the worker hosts' raylets carry the head's address in their command
        # lines, which `ray start --head` (scanning this machine's processes) takes for a head
        # still running here if the dead head's address file says the same address; on a real
        # cluster those processes are on other machines. The file goes with the dead head.
        from ray._private.utils import get_ray_address_file

        Path(get_ray_address_file(f"/tmp/hetflow-hosts-{self.tag}")).unlink(missing_ok=True)
        self._start_head()
        self._wait_nodes(len(self.hosts), timeout=90)
        return time.monotonic() - started

    def _start_ray(self) -> None:
        from hetflow.accelerators.synthetic import synthetic_node
        from hetflow.runtime.resources import node_labels, node_resources

        self._start_head()
        specs = list(self.devices) + [None] * (self.workers - len(self.devices))
        for host, spec in zip(self.worker_hosts, specs):
            cmd = ["ray", "start", f"--address={self.address}", f"--node-ip-address={host.address}",
                   f"--num-cpus={host.cpus}", "--num-gpus=0", "--disable-usage-stats"]
            if spec:
                host.node = synthetic_node(spec, host.name)
                cmd.append("--resources=" + json.dumps(node_resources(host.node)))
                cmd.append("--labels=" + ",".join(f"{k}={v}" for k, v in sorted(node_labels(host.node).items())))
            self.run(host, cmd, timeout=120)
        if any(h.node for h in self.worker_hosts):
            published = ", ".join(f"({h.name!r}, {h.node.name!r})" for h in self.worker_hosts if h.node)
            self.python(self.head, "import json, ray\nfrom hetflow.accelerators.synthetic import synthetic_node\n"
                              "from hetflow.runtime.binding import publish_node\n"
                              "ray.init(address=ADDRESS)\n"
                              f"specs = dict(zip([h for h, _ in [{published}]], {[s for s in specs if s]!r}))\n"
                              "for host, spec in specs.items():\n"
                              "    publish_node(synthetic_node(spec, host))\n")
        self._wait_nodes(1 + self.workers)

    def _wait_nodes(self, count: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.alive_nodes() == count:
                return
            time.sleep(0.5)
        raise RuntimeError(f"the namespace cluster did not reach {count} alive nodes")

    # -- reading the GCS from here ----------------------------------------------------------------
    # The root namespace sits on the bridge, so this process reaches the head's GCS directly.
    # A GCS client made for one read and dropped (never kept across a head loss) reads nodes and
    # the key-value store for a fraction of a process that joins Ray as a driver (~2 CPU-s each).

    def _gcs(self):
        from ray._raylet import GcsClient

        return GcsClient(address=self.address)

    def alive_nodes(self) -> int | None:
        """How many nodes the GCS holds alive; None while it does not answer."""
        from ray.core.generated import gcs_pb2

        alive = gcs_pb2.GcsNodeInfo.GcsNodeState.Value("ALIVE")
        try:
            nodes = self._gcs().get_all_node_info(timeout=5)
        except Exception:  # noqa: BLE001 - starting or gone: not answering yet
            return None
        return sum(info.state == alive for info in nodes.values())

    def kv_values(self, prefix: str, namespace: str) -> dict[str, bytes] | None:
        """Every key under ``prefix`` in the GCS key-value store's ``namespace`` with its value;
        None while the GCS does not answer."""
        try:
            client = self._gcs()
            keys = client.internal_kv_keys(prefix.encode(), namespace.encode(), timeout=5)
            values = {k.decode(): client.internal_kv_get(k, namespace.encode(), timeout=5) for k in keys}
        except Exception:  # noqa: BLE001
            return None
        return {k: v for k, v in values.items() if v is not None}

    # -- running things on a host ---------------------------------------------------------------

    def command(self, host: Host, cmd: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", host.name, *cmd]

    def run(self, host: Host, cmd: Sequence[str], timeout: float = 300, check: bool = True,
            cwd: str | None = None) -> subprocess.CompletedProcess:
        out = subprocess.run(self.command(host, cmd), capture_output=True, text=True,
                             env=self.environment(host), timeout=timeout, cwd=cwd)
        if check and out.returncode != 0:
            raise RuntimeError(f"on {host.name}: {' '.join(cmd)} exited {out.returncode}:\n"
                               f"{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
        return out

    def popen(self, host: Host, cmd: Sequence[str], cwd: str | None = None, **kw: Any) -> subprocess.Popen:
        return subprocess.Popen(self.command(host, cmd), env=self.environment(host), cwd=cwd,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)

    def python(self, host: Host, code: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        """Python code on ``host``; ``ADDRESS`` in it is the cluster's address."""
        code = f"ADDRESS = {self.address!r}\n" + code
        return self.run(host, [sys.executable, "-c", code], check=check, timeout=timeout)

    # -- faults ---------------------------------------------------------------------------------

    def pids(self, host: Host) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", host.name], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    def kill_host(self, host: Host) -> int:
        """Every process of ``host`` SIGKILLed at once (a machine that lost power)."""
        pids = self.pids(host)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return len(pids)

    def cut_link(self, host: Host) -> None:
        """``host``'s network gone (its cable pulled); its processes keep running."""
        _ip("link", "set", host.veth, "down")

    def restore_link(self, host: Host) -> None:
        _ip("link", "set", host.veth, "up")

    def rejoin(self, host: Host) -> None:
        """``host`` back in the cluster after a loss (its processes gone): ``ray start`` again."""
        self.kill_host(host)
        cmd = ["ray", "start", f"--address={self.address}", f"--node-ip-address={host.address}",
               f"--num-cpus={host.cpus}", "--num-gpus=0", "--disable-usage-stats"]
        if host.node is not None:
            from hetflow.runtime.resources import node_labels, node_resources

            cmd.append("--resources=" + json.dumps(node_resources(host.node)))
            cmd.append("--labels=" + ",".join(f"{k}={v}" for k, v in sorted(node_labels(host.node).items())))
        self.run(host, cmd, timeout=120)
        self._wait_nodes(len(self.hosts))

    # -- teardown -------------------------------------------------------------------------------

    def close(self) -> None:
        for host in reversed(self.hosts):
            for _ in range(3):
                pids = self.pids(host)
                if not pids:
                    break
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                time.sleep(0.2)
            subprocess.run(["ip", "netns", "del", host.name], capture_output=True)
            _ip("link", "del", host.veth, check=False)
        if self.redis is not None:
            self.redis.kill()
            self.redis.wait(10)
            self.redis = None
            shutil.rmtree(self._redis_dir, ignore_errors=True)
        _ip("link", "del", self.bridge, check=False)
        shutil.rmtree(f"/tmp/hetflow-hosts-{self.tag}", ignore_errors=True)
