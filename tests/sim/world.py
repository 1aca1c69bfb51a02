"""Tiny hand-built clusters, speed tables and traces for the simulator and policy tests.

Device types are plain names ("fast", "slow") unknown to the catalog, so the numbers in a test
are exactly the ones written here (links the nodes do not list count as 16 GB/s PCIe).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from hetflow.core.topology import ClusterSnapshot, Device, NodeTopology, Vendor
from hetflow.scheduling.policies.capacity import ClusterModel
from hetflow.scheduling.throughput import MeasuredThroughputs, _Measured
from hetflow.sim.engine import SimConfig, SimResult, Simulator
from hetflow.sim.traces import Job
from hetflow.scheduling.policies.registry import make_policy


def no_catalog(name: str) -> None:
    return None


def node(name: str, model: str, count: int, cpu_cores: int | None = None,
         memory_mib: int | None = None) -> NodeTopology:
    devices = tuple(Device(i, Vendor.NVIDIA, model=model) for i in range(count))
    return NodeTopology(name, devices, cpu_cores=cpu_cores,
                        host_memory_bytes=None if memory_mib is None else memory_mib * 2**20)


def cluster(*nodes: NodeTopology, inter_node_gbps: float = 25.0) -> ClusterModel:
    snapshot = ClusterSnapshot(tuple(nodes), inter_node_gbps=inter_node_gbps)
    return ClusterModel.from_snapshot(snapshot, lookup=no_catalog)


def table(rates: Mapping[tuple[str, int, str], float | tuple[float, float]],
          cross_ref_gbps: float = 1.0) -> MeasuredThroughputs:
    entries = {}
    for key, value in rates.items():
        rate, cross = value if isinstance(value, tuple) else (value, None)
        entries[key] = _Measured(rate, cross)
    return MeasuredThroughputs(entries, cross_node_ref_gbps=cross_ref_gbps)


def job(i: int, job_type: str, arrival: float, gpus: int, work: float, **kw) -> Job:
    return Job(str(i), job_type, arrival, gpus, work, **kw)


def simulate(model: ClusterModel, jobs: Sequence[Job], policy: str, throughputs, **config) -> SimResult:
    return Simulator(model, jobs, make_policy(policy), throughputs, SimConfig(**config)).run()


def jct(result: SimResult) -> dict[str, float | None]:
    return {r.job.job_id: r.jct_s for r in result.jobs}
