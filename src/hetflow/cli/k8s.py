"""``hetflow k8s``: KubeRay manifests for a described cluster, and the helpers its pods run.

    hetflow k8s render --cluster cluster.yaml                     # print the manifests
    hetflow k8s render --cluster cluster.yaml --out deploy/k8s \\
        --image-cuda REGISTRY/hetflow:cuda --image-rocm REGISTRY/hetflow:rocm
    kubectl apply -f deploy/k8s/
    hetflow k8s render --cluster cluster.yaml --serve examples/serve_digits.yaml --out deploy/k8s

``render`` writes two documents (to ``--out DIR`` as ``raycluster.yaml`` and
``hetflow-nodes.yaml``, else to stdout):

* a ``RayCluster`` (``apiVersion: ray.io/v1``) with a head group and **one worker group per
  accelerator type** (nodes of one model and shape; ``replicas`` = their count in the cluster
  file, fixed: ``minReplicas = maxReplicas = replicas``). Each worker group gives Ray exactly
  what ``hetflow node start`` gives it (:mod:`hetflow.runtime.resources`): no Ray GPUs, one
  ``hetflow_dev_<i>`` resource per device (capacity = memory in MiB) and the ``hetflow.io/*``
  labels. The pod asks Kubernetes for the devices (``nvidia.com/gpu`` or ``amd.com/gpu``
  limits) and is placed with a ``nodeSelector`` on the label the vendor's GPU operator sets
  (``nvidia.com/gpu.product``, ``amd.com/gpu.device-id``), or on ``hetflow.io/accelerator``
  where that value is unknown (label those Kubernetes nodes yourself).
* a ``ConfigMap`` with each group's node description (hetflow.node/v1 JSON), mounted in the
  group's pods at ``/etc/hetflow/nodes``.

With ``--serve CONFIG.yaml`` the cluster goes inside a ``RayService`` (``rayservice.yaml``
instead of ``raycluster.yaml``) whose ``serveConfigV2`` deploys the serving config through
hetflow's Serve application builder (``hetflow.serve:app``, the config inline, HTTP on
``0.0.0.0`` in the pods; the head container gets the ``serve`` port KubeRay's serve Service
targets). The models' checkpoint directories must exist at the same paths in the pods (a
shared volume): render prints them.

By default the Ray resources and labels go in the group's ``resources`` and ``labels`` fields
(KubeRay >= 1.5, which refuses ``rayStartParams['labels']``); ``--legacy-params`` puts them in
``rayStartParams`` (``num-gpus``, ``resources``, ``labels``) for older operators.

Every Ray node needs its own ``hetflow.io/node`` label, which a group's shared spec cannot
hold. So each worker pod first runs ``python3 -m hetflow.cli.k8s pod-init`` (the container
command, which KubeRay runs before its ``ray start``): it writes ``hetflow.io/node: <pod name>`` to a labels
file that ``ray start --labels-file`` reads, and starts ``hetflow k8s publish`` in the
background, which waits for the pod's raylet and publishes the group's node description under
the pod's name - what ``hetflow node start`` does on a plain host.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hetflow.core.errors import HetflowError, InputError
from hetflow.core.topology import ClusterSnapshot, NodeTopology, Vendor

NODES_DIR = "/etc/hetflow/nodes"
LABELS_FILE = "/tmp/hetflow/labels.yaml"
DEFAULT_IMAGES = {"cuda": "hetflow:cuda", "rocm": "hetflow:rocm"}
GPU_LIMIT = {Vendor.NVIDIA: "nvidia.com/gpu", Vendor.AMD: "amd.com/gpu"}
# Node labels set by NVIDIA GPU Feature Discovery and AMD's node labeller.
NVIDIA_PRODUCT_LABEL = "nvidia.com/gpu.product"
AMD_DEVICE_ID_LABEL = "amd.com/gpu.device-id"
HETFLOW_ACCELERATOR_LABEL = "hetflow.io/accelerator"
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MAX_CLUSTER_NAME = 53  # KubeRay: 63 minus its longest service suffix ("-serve-svc")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("k8s", help="KubeRay RayCluster manifests for a described cluster",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = p.add_subparsers(dest="k8s_command", metavar="ACTION")
    r = verbs.add_parser("render", help="write the RayCluster and node ConfigMap for --cluster")
    r.add_argument("--cluster", required=True, help="cluster YAML or snapshot JSON (as for `hetflow plan`)")
    r.add_argument("--out", metavar="DIR", help="write raycluster.yaml and hetflow-nodes.yaml here (default: stdout)")
    r.add_argument("--name", default="hetflow", help="RayCluster name (DNS-1035 label, <= 53 chars)")
    r.add_argument("--namespace", help="Kubernetes namespace for both objects")
    r.add_argument("--image-cuda", default=DEFAULT_IMAGES["cuda"], help="image for NVIDIA groups (deploy/Dockerfile.cuda)")
    r.add_argument("--image-rocm", default=DEFAULT_IMAGES["rocm"], help="image for AMD groups (deploy/Dockerfile.rocm)")
    r.add_argument("--image-cpu", help="image for the head and CPU groups (default: --image-cuda)")
    r.add_argument("--head-cpu", default="4", help="head pod CPU request and limit")
    r.add_argument("--head-memory", default="16Gi", help="head pod memory request and limit")
    r.add_argument("--workload", choices=["data", "train", "tune", "serve"],
                   help="size each group's object store for this workload (needs the node's host memory)")
    r.add_argument("--serve", metavar="CONFIG.yaml",
                   help="a serving config: write a RayService deploying it (rayservice.yaml) "
                        "instead of a bare RayCluster")
    r.add_argument("--legacy-params", action="store_true",
                   help="put Ray resources and labels in rayStartParams (KubeRay < 1.5)")
    r.set_defaults(func=run_render)
    i = verbs.add_parser("pod-init", help="(in a worker pod) write the Ray labels file, start the publisher")
    i.add_argument("--node-file", required=True, help="this group's node JSON")
    i.add_argument("--labels-file", default=LABELS_FILE)
    i.add_argument("--name", help="node name (default: the pod's host name)")
    i.set_defaults(func=run_pod_init)
    u = verbs.add_parser("publish", help="(in a worker pod) wait for the raylet, then publish the node")
    u.add_argument("--from", dest="from_file", required=True, help="node JSON to publish")
    u.add_argument("--name", help="node name (default: the pod's host name)")
    u.add_argument("--address", default="auto", help="Ray address (default: this pod's raylet)")
    u.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the raylet")
    u.set_defaults(func=run_publish)
    p.set_defaults(func=lambda args: p.print_help() or 2)


# ---------------------------------------------------------------------------- groups


@dataclasses.dataclass(frozen=True)
class WorkerGroup:
    """Nodes of one accelerator type and shape: one KubeRay worker group."""

    name: str
    template: NodeTopology  # the first such node; every pod of the group publishes it
    nodes: tuple[str, ...]
    ray_resources: dict[str, int]
    ray_labels: dict[str, str]  # without hetflow.io/node, which is per pod

    @property
    def vendor(self) -> Vendor:
        accs = self.template.accelerators
        return accs[0].vendor if accs else Vendor.CPU

    @property
    def model(self) -> str:
        accs = self.template.accelerators or self.template.devices
        return (accs[0].model or accs[0].name or "unknown") if accs else "cpu"


def _dns_label(text: str) -> str:
    value = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return value[:40].strip("-") or "group"


def worker_groups(snapshot: ClusterSnapshot) -> list[WorkerGroup]:
    """Group the cluster's nodes by what Ray must be told about them (vendor, model, device
    resources, labels): one group per accelerator type, split further only where nodes of one
    type differ in shape (device count, memory, fast-link islands)."""
    from hetflow.runtime.resources import NODE_LABEL, node_labels, node_resources

    groups: dict[tuple, list[NodeTopology]] = {}
    for node in snapshot.nodes:
        labels = {k: v for k, v in node_labels(node).items() if k != NODE_LABEL}
        key = (json.dumps(node_resources(node), sort_keys=True), json.dumps(labels, sort_keys=True))
        groups.setdefault(key, []).append(node)
    out: list[WorkerGroup] = []
    used: set[str] = set()
    for nodes in groups.values():
        template = nodes[0]
        accs = template.accelerators
        base = _dns_label(f"{accs[0].model or accs[0].name or 'gpu'}-x{len(accs)}" if accs else "cpu")
        name, n = base, 2
        while name in used:
            name, n = f"{base}-{n}", n + 1
        used.add(name)
        labels = {k: v for k, v in node_labels(template).items() if k != NODE_LABEL}
        out.append(WorkerGroup(name, template, tuple(x.name for x in nodes),
                               node_resources(template), labels))
    return out


def _node_selector(group: WorkerGroup) -> tuple[dict[str, str], str | None]:
    """(nodeSelector, a note when it falls back to hetflow's own label)."""
    from hetflow.accelerators.catalog import default_catalog
    from hetflow.runtime.resources import label_value

    accs = group.template.accelerators
    if not accs:
        return {}, None
    device = accs[0]
    if group.vendor is Vendor.NVIDIA:
        spec = default_catalog().find(device.model or device.name or "")
        names = [device.name] + list(spec.aliases if spec else ())
        # GPU Feature Discovery writes NVML's product name with spaces as dashes.
        product = next((n for n in names if n and " " in n and n.split()[0] in ("NVIDIA", "Tesla")), None)
        if product:
            return {NVIDIA_PRODUCT_LABEL: product.replace(" ", "-")}, None
    if group.vendor is Vendor.AMD:
        spec = default_catalog().find(device.model or device.name or "")
        device_id = device.device_id or (spec.pci_device_ids[0] if spec and spec.pci_device_ids else None)
        if device_id:
            return {AMD_DEVICE_ID_LABEL: device_id.lower().removeprefix("0x")}, None
    value = label_value(group.model)
    return ({HETFLOW_ACCELERATOR_LABEL: value},
            f"group {group.name}: no vendor node label known for {group.model}; label its "
            f"Kubernetes nodes with `kubectl label node NODE {HETFLOW_ACCELERATOR_LABEL}={value}`")


# ---------------------------------------------------------------------------- manifests


@dataclasses.dataclass(frozen=True)
class RenderOptions:
    name: str = "hetflow"
    namespace: str | None = None
    image_cuda: str = DEFAULT_IMAGES["cuda"]
    image_rocm: str = DEFAULT_IMAGES["rocm"]
    image_cpu: str | None = None
    head_cpu: str = "4"
    head_memory: str = "16Gi"
    workload: str | None = None
    legacy_params: bool = False

    def image(self, vendor: Vendor) -> str:
        if vendor is Vendor.AMD:
            return self.image_rocm
        if vendor is Vendor.NVIDIA:
            return self.image_cuda
        return self.image_cpu or self.image_cuda

    @property
    def configmap(self) -> str:
        return f"{self.name}-nodes"


def _metadata(name: str, options: RenderOptions) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {"app.kubernetes.io/part-of": "hetflow"}}
    if options.namespace:
        meta["namespace"] = options.namespace
    return meta


def _quoted_resources(resources: dict[str, int]) -> str:
    """rayStartParams['resources'] as KubeRay's and Ray's docs write it: a JSON object in double
    quotes with escaped inner quotes, because KubeRay pastes the value into a shell command."""
    body = json.dumps(resources, sort_keys=True, separators=(", ", ": "))
    return '"' + body.replace('"', '\\"') + '"'


def _worker_group_spec(group: WorkerGroup, options: RenderOptions, notes: list[str]) -> dict[str, Any]:
    from hetflow.runtime.object_store import choose_object_store_memory

    selector, note = _node_selector(group)
    if note:
        notes.append(note)
    params: dict[str, str] = {"labels-file": LABELS_FILE}
    if options.workload and group.template.host_memory_bytes:
        choice = choose_object_store_memory(group.template.host_memory_bytes, options.workload,
                                            accelerators=len(group.template.accelerators))
        if choice.bytes is not None:
            params["object-store-memory"] = str(choice.bytes)
            notes.append(f"group {group.name}: {choice.describe()}")
    container: dict[str, Any] = {
        "name": "ray-worker",
        "image": options.image(group.vendor),
        # KubeRay runs the container command before its `ray start` (bash -lc "<cmd> && ray start ...").
        "command": [f"python3 -m hetflow.cli.k8s pod-init --node-file {NODES_DIR}/{group.name}.json "
                    f"--labels-file {LABELS_FILE}"],
        "volumeMounts": [{"name": "hetflow-nodes", "mountPath": NODES_DIR, "readOnly": True}],
    }
    count = len(group.template.accelerators)
    if group.vendor in GPU_LIMIT and count:
        container["resources"] = {"limits": {GPU_LIMIT[group.vendor]: str(count)}}
    spec: dict[str, Any] = {
        "groupName": group.name,
        "replicas": len(group.nodes),
        "minReplicas": len(group.nodes),
        "maxReplicas": len(group.nodes),
    }
    if options.legacy_params:
        params["num-gpus"] = "0"
        if group.ray_resources:
            params["resources"] = _quoted_resources(group.ray_resources)
        params["labels"] = ",".join(f"{k}={v}" for k, v in sorted(group.ray_labels.items()))
    else:
        # "GPU": "0" becomes --num-gpus=0 (KubeRay maps keys ending in "gpu"); without it KubeRay
        # would give Ray the pod's GPU limit and Ray's own first-fit would hand devices out.
        spec["resources"] = {"GPU": "0", **{k: str(v) for k, v in sorted(group.ray_resources.items())}}
        spec["labels"] = dict(sorted(group.ray_labels.items()))
    spec["rayStartParams"] = params
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "volumes": [{"name": "hetflow-nodes", "configMap": {"name": options.configmap}}],
    }
    if selector:
        pod_spec["nodeSelector"] = selector
    spec["template"] = {
        "metadata": {"labels": {"app.kubernetes.io/part-of": "hetflow", "hetflow.io/group": group.name}},
        "spec": pod_spec,
    }
    return spec


def render_raycluster(snapshot: ClusterSnapshot, options: RenderOptions) -> tuple[dict[str, Any], list[str]]:
    """The RayCluster (ray.io/v1) for ``snapshot``, and notes for the user."""
    from importlib.metadata import version

    if len(options.name) > MAX_CLUSTER_NAME or not _DNS1035.match(options.name):
        raise InputError(f"--name {options.name!r}: a RayCluster name is a DNS-1035 label (lower-case "
                         f"letters, digits and '-', starting with a letter) of at most {MAX_CLUSTER_NAME} characters")
    if not snapshot.nodes:
        raise InputError("the cluster has no nodes; nothing to render")
    notes: list[str] = []
    head_container = {
        "name": "ray-head",
        "image": options.image(Vendor.CPU),
        "ports": [{"containerPort": 6379, "name": "gcs-server"},
                  {"containerPort": 8265, "name": "dashboard"},
                  {"containerPort": 10001, "name": "client"},
                  {"containerPort": 8080, "name": "metrics"}],
        "resources": {"limits": {"cpu": options.head_cpu, "memory": options.head_memory},
                      "requests": {"cpu": options.head_cpu, "memory": options.head_memory}},
    }
    cluster = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": _metadata(options.name, options),
        "spec": {
            "rayVersion": version("ray"),
            "enableInTreeAutoscaling": False,
            "headGroupSpec": {
                "rayStartParams": {"dashboard-host": "0.0.0.0"},
                "template": {"metadata": {"labels": {"app.kubernetes.io/part-of": "hetflow"}},
                             "spec": {"containers": [head_container]}},
            },
            "workerGroupSpecs": [_worker_group_spec(g, options, notes) for g in worker_groups(snapshot)],
        },
    }
    return cluster, notes


def render_rayservice(cluster: dict[str, Any], serving: Any,
                      options: RenderOptions) -> tuple[dict[str, Any], list[str]]:
    """A RayService (ray.io/v1) running ``cluster``'s RayCluster spec and deploying the serving
    config ``serving`` (a ServeConfig) with hetflow's application builder; notes for the
    user (the paths the pods must have)."""
    import copy

    import yaml

    from hetflow.workloads.serve.builder import check_tooling_auth, serve_config_document

    check_tooling_auth(serving)  # a RayService has no hetflow front door to check keys
    document = serve_config_document(serving, host="0.0.0.0")
    spec = copy.deepcopy(cluster["spec"])
    head = spec["headGroupSpec"]["template"]["spec"]["containers"][0]
    head["ports"].append({"containerPort": document["http_options"]["port"], "name": "serve"})
    notes = []
    for model in document["applications"][0]["args"]["serving"]["models"]:
        for key in ("checkpoint_dir", "torchscript", "exported", "safetensors"):
            if model.get(key):
                notes.append(f"model {model['name']}: {key} {model[key]} must exist in the pods "
                             "(a shared volume at that path)")
    service = {"apiVersion": "ray.io/v1", "kind": "RayService",
               "metadata": _metadata(options.name, options),
               "spec": {"serveConfigV2": yaml.safe_dump(document, sort_keys=False),
                        "rayClusterConfig": spec}}
    return service, notes


def render_configmap(snapshot: ClusterSnapshot, options: RenderOptions) -> dict[str, Any]:
    """The ConfigMap holding each worker group's node description (hetflow.node/v1 JSON)."""
    from hetflow.core.serialize import node_to_dict

    # Compact: a ConfigMap holds at most 1 MiB, and a 64-partition node has 2016 links.
    data = {f"{g.name}.json": json.dumps(node_to_dict(g.template), sort_keys=True, separators=(",", ":"))
            for g in worker_groups(snapshot)}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _metadata(options.configmap, options),
            "data": data}


def to_yaml(doc: dict[str, Any]) -> str:
    """Block-style YAML; multi-line strings (the node JSON) as literal blocks, readable in kubectl."""
    import yaml

    class _Dumper(yaml.SafeDumper):
        pass

    def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    _Dumper.add_representer(str, _str)
    return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1000)


def run_render(args: argparse.Namespace) -> int:
    from hetflow.accelerators.load import load_cluster

    snapshot = load_cluster(args.cluster)
    options = RenderOptions(
        name=args.name, namespace=args.namespace, image_cuda=args.image_cuda,
        image_rocm=args.image_rocm, image_cpu=args.image_cpu, head_cpu=args.head_cpu,
        head_memory=args.head_memory, workload=args.workload, legacy_params=args.legacy_params,
    )
    serving = None
    if args.serve:
        from hetflow.workloads.serve.config import load_serve_config

        serving = load_serve_config(args.serve)
    cluster, notes = render_raycluster(snapshot, options)
    configmap = render_configmap(snapshot, options)
    main_doc, main_file = cluster, "raycluster.yaml"
    if serving is not None:
        main_doc, serve_notes = render_rayservice(cluster, serving, options)
        main_file = "rayservice.yaml"
        notes += serve_notes
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / main_file).write_text(to_yaml(main_doc))
        (out / "hetflow-nodes.yaml").write_text(to_yaml(configmap))
        print(f"wrote {out / main_file} and {out / 'hetflow-nodes.yaml'}", file=sys.stderr)
    else:
        sys.stdout.write(to_yaml(configmap) + "---\n" + to_yaml(main_doc))
    for group in cluster["spec"]["workerGroupSpecs"]:
        limits = group["template"]["spec"]["containers"][0].get("resources", {}).get("limits", {})
        print(f"# group {group['groupName']}: {group['replicas']} pods, "
              f"{', '.join(f'{k}={v}' for k, v in limits.items()) or 'no GPUs'}", file=sys.stderr)
    for note in notes:
        print(f"# {note}", file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------- in the pod


def pod_node_name(name: str | None = None) -> str:
    """The node name a pod publishes under: ``name`` or the pod's host name, as a label value."""
    from hetflow.runtime.resources import label_value

    return label_value(name or socket.gethostname())


def write_labels_file(path: str | Path, name: str) -> Path:
    """The per-pod Ray labels ``ray start --labels-file`` reads: ``hetflow.io/node: <name>``."""
    from hetflow.runtime.resources import NODE_LABEL

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{json.dumps(NODE_LABEL)}: {json.dumps(name)}\n")  # JSON strings are YAML
    return path


def run_pod_init(args: argparse.Namespace) -> int:
    if not Path(args.node_file).is_file():
        raise InputError(f"{args.node_file}: no such node file (is the ConfigMap mounted?)")
    name = pod_node_name(args.name)
    write_labels_file(args.labels_file, name)
    # The publisher outlives this command (KubeRay runs `ray start` next); its output goes to
    # the container's log.
    subprocess.Popen([sys.executable, "-m", "hetflow.cli.k8s", "publish",
                      "--from", args.node_file, "--name", name], start_new_session=True)
    print(f"hetflow: node {name}: wrote {args.labels_file}; publishing {args.node_file} once the raylet is up",
          file=sys.stderr)
    return 0


def run_publish(args: argparse.Namespace) -> int:
    import ray

    from hetflow.accelerators.load import load_node
    from hetflow.runtime.binding import publish_node
    from hetflow.runtime.resources import NODE_LABEL

    name = pod_node_name(args.name)
    node = dataclasses.replace(load_node([args.from_file]), name=name)
    deadline = time.monotonic() + args.timeout
    connected = False
    try:
        while True:
            try:
                if not ray.is_initialized():
                    ray.init(address=args.address, log_to_driver=False, logging_level="ERROR")
                    connected = True
                if any(n.get("Alive") and (n.get("Labels") or {}).get(NODE_LABEL) == name for n in ray.nodes()):
                    break
            except ConnectionError:
                pass  # the raylet is not up yet
            if time.monotonic() > deadline:
                raise HetflowError(f"no Ray node labelled {NODE_LABEL}={name} within {args.timeout:g}s; "
                                   "did `ray start` read the labels file?")
            time.sleep(2.0)
        publish_node(node)
    finally:
        if connected:
            ray.shutdown()
    print(f"hetflow: published node {name} ({len(node.accelerators)} accelerators)", file=sys.stderr)
    return 0


def _main(argv: list[str] | None = None) -> int:
    """``python -m hetflow.cli.k8s ACTION ...``: what the pods run, without the full CLI."""
    parser = argparse.ArgumentParser(prog="python -m hetflow.cli.k8s")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["k8s", *(sys.argv[1:] if argv is None else argv)])
    try:
        return int(args.func(args) or 0)
    except HetflowError as e:
        print(f"hetflow: error: {e}", file=sys.stderr)
        return e.exit_code


__all__ = ["RenderOptions", "WorkerGroup", "render_configmap", "render_raycluster", "worker_groups"]

if __name__ == "__main__":
    sys.exit(_main())
