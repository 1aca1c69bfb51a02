"""Local multi-node Ray clusters for the tests: hetflow nodes that declare accelerators they do
not have (``ray.cluster_utils.Cluster``, everything bound to 127.0.0.1)."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # before ray is imported

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from hetflow.core.topology import NodeTopology  # noqa: E402
from hetflow.runtime.binding import publish_node  # noqa: E402
from hetflow.runtime.resources import node_labels, node_resources  # noqa: E402


@contextmanager
def local_ray(num_cpus: int = 2) -> Iterator[None]:
    """One plain local Ray for a test module: ``num_cpus`` CPUs, on 127.0.0.1, no dashboard, shut
    down at the end."""
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


@contextmanager
def hetflow_cluster(nodes: Sequence[NodeTopology], *, head_cpus: int, node_cpus: int = 1,
                    **init: Any) -> Iterator[Cluster]:
    """A CPU head with ``head_cpus`` CPUs and one Ray node per hetflow node (``node_cpus`` CPUs,
    no Ray GPUs, the node's ``hetflow_dev_<i>`` resources and labels), joined by this process
    (``ray.init(address, **init)``) and every node's topology published, as `hetflow node
    start` would. Ray is shut down and the cluster removed on exit."""
    # no autoscaler monitor and no log monitor: a fixed local cluster has nothing to autoscale,
    # and the tests read what their processes print from the processes, not through the
    # driver's log stream (about 1.3 CPU-s a cluster on 2 cores, issue 28; Ray's own
    # Cluster already starts the extra nodes without a log monitor)
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": head_cpus, "node_ip_address": "127.0.0.1", "include_dashboard": False,
        "no_monitor": True, "include_log_monitor": False})
    try:
        for node in nodes:
            cluster.add_node(num_cpus=node_cpus, num_gpus=0, resources=node_resources(node),
                             labels=node_labels(node))
        ray.init(address=cluster.address, **init)
        for node in nodes:
            publish_node(node)
        yield cluster
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
