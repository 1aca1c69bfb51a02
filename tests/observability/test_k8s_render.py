"""``hetflow k8s render``: KubeRay RayCluster manifests checked against the documented API.

The field lists below are KubeRay's RayCluster ``ray.io/v1`` reference
(ray-project/kuberay docs/reference/api.md: RayCluster, RayClusterSpec, HeadGroupSpec,
WorkerGroupSpec; the group-level ``resources``/``labels`` fields since KubeRay 1.5) and the rules
its validation (ray-operator/controllers/ray/utils/validation.go) enforces: a DNS-1035 cluster
name of at most 53 characters; min and max replicas set when autoscaling is off; no
``rayStartParams['labels']``; resources either in the group's ``resources`` field or in
``rayStartParams``, not both; labels in Kubernetes label syntax. Label syntax and the labels
file are checked with Ray's own parsers (``ray._private.label_utils``).
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml
from ray._private.label_utils import (
    parse_node_labels_from_yaml_file,
    parse_node_labels_string,
    validate_node_label_syntax,
)

from hetflow.accelerators.load import load_cluster
from hetflow.cli import k8s
from hetflow.cli import main as cli_main
from hetflow.core.serialize import node_from_dict
from tests.conftest import REPO

EXAMPLE = REPO / "examples" / "cluster-mixed.yaml"

RAYCLUSTER_FIELDS = {"apiVersion", "kind", "metadata", "spec"}
SPEC_FIELDS = {"upgradeStrategy", "authOptions", "suspend", "managedBy", "autoscalerOptions",
               "headServiceAnnotations", "enableInTreeAutoscaling", "gcsFaultToleranceOptions",
               "headGroupSpec", "rayVersion", "workerGroupSpecs"}
HEAD_FIELDS = {"template", "headService", "enableIngress", "resources", "labels",
               "rayStartParams", "serviceType"}
WORKER_FIELDS = {"suspend", "groupName", "replicas", "minReplicas", "maxReplicas",
                 "idleTimeoutSeconds", "resources", "labels", "rayStartParams", "template",
                 "scaleStrategy", "numOfHosts"}
DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
GIB = 1 << 30
MIB = 1 << 20


def _render(tmp_path: Path, capsys, *extra: str, cluster: Path = EXAMPLE) -> tuple[dict, dict, str]:
    code = k8s._main(["render", "--cluster", str(cluster), "--out", str(tmp_path), *extra])
    _, err = capsys.readouterr()
    assert code == 0, err
    (rc,) = yaml.safe_load_all((tmp_path / "raycluster.yaml").read_text())
    (cm,) = yaml.safe_load_all((tmp_path / "hetflow-nodes.yaml").read_text())
    return rc, cm, err


def _check_documented_fields(rc: dict) -> None:
    assert set(rc) <= RAYCLUSTER_FIELDS and rc["apiVersion"] == "ray.io/v1" and rc["kind"] == "RayCluster"
    name = rc["metadata"]["name"]
    assert DNS1035.match(name) and len(name) <= 53
    spec = rc["spec"]
    assert set(spec) <= SPEC_FIELDS and spec["enableInTreeAutoscaling"] is False
    head = spec["headGroupSpec"]
    assert set(head) <= HEAD_FIELDS
    assert all(isinstance(v, str) for v in head["rayStartParams"].values())
    assert head["template"]["spec"]["containers"][0]["image"]
    names = []
    for group in spec["workerGroupSpecs"]:
        assert set(group) <= WORKER_FIELDS, set(group) - WORKER_FIELDS
        names.append(group["groupName"])
        assert DNS1123.match(group["groupName"])
        for key in ("replicas", "minReplicas", "maxReplicas"):
            assert isinstance(group[key], int) and not isinstance(group[key], bool)
        assert 0 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
        params = group["rayStartParams"]
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in params.items())
        assert "labels" not in params or "labels" not in group  # never both
        resource_params = {"num-cpus", "num-gpus", "memory", "resources"} & set(params)
        assert not (resource_params and group.get("resources")), "resources set twice"
        for key, value in group.get("resources", {}).items():
            assert isinstance(value, str) and re.fullmatch(r"\d+", value), (key, value)
        if "labels" in group:
            validate_node_label_syntax(group["labels"])  # raises on bad Kubernetes label syntax
        containers = group["template"]["spec"]["containers"]
        assert containers and containers[0]["name"] and containers[0]["image"]
        for value in containers[0].get("resources", {}).get("limits", {}).values():
            assert isinstance(value, str)
    assert len(names) == len(set(names))


def test_rendered_raycluster_uses_only_documented_v1_fields(tmp_path, capsys) -> None:
    rc, _, _ = _render(tmp_path, capsys)
    _check_documented_fields(rc)
    assert "labels" not in rc["spec"]["workerGroupSpecs"][0]["rayStartParams"]


def test_one_worker_group_per_accelerator_type(tmp_path, capsys) -> None:
    rc, cm, _ = _render(tmp_path, capsys)
    snapshot = load_cluster(EXAMPLE)
    groups = rc["spec"]["workerGroupSpecs"]
    by_model = {g["labels"].get("hetflow.io/model", "cpu"): g for g in groups}
    assert len(by_model) == len(groups)  # no accelerator type split over two groups
    models = {n.devices[0].model if n.accelerators else "cpu" for n in snapshot.nodes}
    assert set(by_model) == {m if m != "CPU" else "cpu" for m in models}
    # replicas are the node counts of the cluster file: 4 synthetic + 1 recorded MI300X nodes
    assert by_model["MI300X"]["replicas"] == 5
    assert by_model["H100-SXM"]["replicas"] == 4 and by_model["L40S"]["replicas"] == 2
    assert sum(g["replicas"] for g in groups) == len(snapshot.nodes)
    assert set(cm["data"]) == {f"{g['groupName']}.json" for g in groups}


def test_gpu_groups_ask_kubernetes_for_the_devices_and_give_ray_none(tmp_path, capsys) -> None:
    rc, cm, _ = _render(tmp_path, capsys)
    groups = {g["labels"].get("hetflow.io/model", "cpu"): g for g in rc["spec"]["workerGroupSpecs"]}

    mi300x = groups["MI300X"]
    pod = mi300x["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"] == {"amd.com/gpu": "8"}
    assert pod["nodeSelector"] == {"amd.com/gpu.device-id": "74a1"}  # AMD's node labeller
    assert pod["containers"][0]["image"] == k8s.DEFAULT_IMAGES["rocm"]
    # Ray: no GPUs, one 192 GiB device resource per GPU, the hetflow labels but the node name
    assert mi300x["resources"] == {"GPU": "0", **{f"hetflow_dev_{i}": str(192 * GIB // MIB) for i in range(8)}}
    assert mi300x["labels"]["hetflow.io/vendor"] == "amd" and mi300x["labels"]["hetflow.io/devices"] == "8"
    assert "hetflow.io/node" not in mi300x["labels"]

    h100 = groups["H100-SXM"]
    assert h100["template"]["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    # GPU Feature Discovery's product label: the NVML name with dashes
    assert h100["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert h100["resources"]["hetflow_dev_7"] == str(80 * GIB // MIB)

    cpu = groups["cpu"]
    assert "resources" not in cpu["template"]["spec"]["containers"][0]
    assert "nodeSelector" not in cpu["template"]["spec"]
    # the node description every pod of a group publishes is that group's nodes' topology
    node = node_from_dict(json.loads(cm["data"][f"{mi300x['groupName']}.json"]))
    assert len(node.accelerators) == 8 and node.accelerators[0].model == "MI300X"


def test_each_pod_labels_itself_before_ray_start(tmp_path, capsys) -> None:
    rc, cm, _ = _render(tmp_path, capsys)
    for group in rc["spec"]["workerGroupSpecs"]:
        container = group["template"]["spec"]["containers"][0]
        assert group["rayStartParams"]["labels-file"] == k8s.LABELS_FILE
        command = shlex.split(container["command"][0])
        assert command[:4] == ["python3", "-m", "hetflow.cli.k8s", "pod-init"]
        node_file = command[command.index("--node-file") + 1]
        mount = container["volumeMounts"][0]
        assert node_file == f"{mount['mountPath']}/{group['groupName']}.json"
        volume = next(v for v in group["template"]["spec"]["volumes"] if v["name"] == mount["name"])
        assert volume["configMap"]["name"] == cm["metadata"]["name"]


def test_pod_init_writes_a_labels_file_ray_accepts(tmp_path, capsys, monkeypatch) -> None:
    spawned = []
    monkeypatch.setattr(k8s.subprocess, "Popen", lambda cmd, **kw: spawned.append(cmd))
    node_file = tmp_path / "g.json"
    node_file.write_text("{}")
    labels = tmp_path / "sub" / "labels.yaml"
    code = k8s._main(["pod-init", "--node-file", str(node_file), "--labels-file", str(labels),
                      "--name", "hetflow-h100-x8-worker-7f9c2"])
    assert code == 0
    assert parse_node_labels_from_yaml_file(str(labels)) == {"hetflow.io/node": "hetflow-h100-x8-worker-7f9c2"}
    (cmd,) = spawned
    assert cmd[1:5] == ["-m", "hetflow.cli.k8s", "publish", "--from"] and cmd[-1] == "hetflow-h100-x8-worker-7f9c2"
    # a name that is not a label value is made one, the same way the planner's selectors do
    k8s.write_labels_file(labels, k8s.pod_node_name("Pod_01!!"))
    assert parse_node_labels_from_yaml_file(str(labels)) == {"hetflow.io/node": "Pod_01"}
    assert k8s._main(["pod-init", "--node-file", str(tmp_path / "missing.json")]) == 2


def test_legacy_params_put_resources_and_labels_in_ray_start_params(tmp_path, capsys) -> None:
    rc, _, _ = _render(tmp_path, capsys, "--legacy-params")
    _check_documented_fields(rc)
    group = next(g for g in rc["spec"]["workerGroupSpecs"] if g["groupName"].startswith("l40s"))
    params = group["rayStartParams"]
    assert "resources" not in group and "labels" not in group
    assert params["num-gpus"] == "0"
    # KubeRay pastes the value into `ray start --resources=...` in bash: unquote as bash would
    (arg,) = shlex.split(f"--resources={params['resources']}")
    resources = json.loads(arg.removeprefix("--resources="))
    assert resources == {f"hetflow_dev_{i}": 48 * GIB // MIB for i in range(4)}
    labels = parse_node_labels_string(params["labels"])
    assert labels["hetflow.io/model"] == "L40S" and labels["hetflow.io/devices"] == "4"


def test_images_namespace_and_workload_options(tmp_path, capsys) -> None:
    cluster = tmp_path / "c.yaml"
    cluster.write_text("nodes:\n  - {count: 3, node: 8x MI300X, name: mi}\n  - {count: 1, node: 8x H100, name: nv}\n")
    rc, cm, _ = _render(tmp_path, capsys, "--name", "prod-a", "--namespace", "ml",
                        "--image-cuda", "reg/h:cuda", "--image-rocm", "reg/h:rocm", cluster=cluster)
    assert rc["metadata"] == {"name": "prod-a", "namespace": "ml", "labels": {"app.kubernetes.io/part-of": "hetflow"}}
    assert cm["metadata"]["namespace"] == "ml" and cm["metadata"]["name"] == "prod-a-nodes"
    images = {g["groupName"]: g["template"]["spec"]["containers"][0]["image"] for g in rc["spec"]["workerGroupSpecs"]}
    assert images == {"mi300x-x8": "reg/h:rocm", "h100-sxm-x8": "reg/h:cuda"}
    assert rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"] == "reg/h:cuda"


@pytest.mark.parametrize("name", ["Hetflow", "1abc", "a" * 54, "has_underscore"])
def test_bad_cluster_names_are_refused(tmp_path, capsys, name) -> None:
    assert k8s._main(["render", "--cluster", str(EXAMPLE), "--name", name]) == 2
    assert "DNS-1035" in capsys.readouterr().err


def test_render_through_the_hetflow_cli_prints_both_documents(capsys, monkeypatch) -> None:
    if "k8s" not in cli_main.COMMAND_MODULES:  # until the lead registers the verb
        monkeypatch.setattr(cli_main, "COMMAND_MODULES", [*cli_main.COMMAND_MODULES, "k8s"])
    assert cli_main.main(["k8s", "render", "--cluster", str(EXAMPLE)]) == 0
    out, err = capsys.readouterr()
    kinds = [d["kind"] for d in yaml.safe_load_all(out)]
    assert kinds == ["ConfigMap", "RayCluster"]
    assert "# group mi300x-x8: 5 pods, amd.com/gpu=8" in err
    assert cli_main.main(["k8s", "render", "--cluster", "/nonexistent.yaml"]) == 2
