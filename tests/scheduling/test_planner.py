"""Planner behaviour: which devices it picks and why, refusals, sharing, the CLI verb.

Optimality of the TP bottleneck against brute force is in test_planner_bruteforce.py; the
topology builders (bandwidth set on every link) come from there.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace

import pytest

from hetflow.core.errors import InputError, Unschedulable
from hetflow.core.placement import DeviceRef
from hetflow.core.request import ParallelLayout, PlacementRequest, Strategy
from hetflow.core.serialize import dumps
from hetflow.core.topology import Allocation, ClusterSnapshot, Device, Link, LinkKind, NodeTopology, Vendor
from hetflow.scheduling.planner import plan
from tests.scheduling.test_planner_bruteforce import (
    DGX1_NVLINKS, dgx1_hybrid_mesh, mi250_multihop, nvswitch, pcie_two_numa, two_xgmi_hives,
)

GIB = 1024**3


def snap(*nodes: NodeTopology, busy: dict[str, list[int]] | None = None, inter: float = 25.0,
         allocations: tuple[Allocation, ...] = ()) -> ClusterSnapshot:
    held = tuple(Allocation("other", n, i) for n, ids in (busy or {}).items() for i in ids)
    return ClusterSnapshot(nodes=nodes, inter_node_gbps=inter, allocations=held + allocations)


def gang(n: int, **kw) -> PlacementRequest:
    return PlacementRequest("job", count=n, **kw)


def layout(dp: int = 1, pp: int = 1, tp: int = 1, **kw) -> PlacementRequest:
    return PlacementRequest("job", layout=ParallelLayout(dp=dp, pp=pp, tp=tp), **kw)


def sized(name: str, n: int, memory: int | None, vendor: Vendor = Vendor.NVIDIA, model: str = "H100-SXM",
          arch: str = "sm_90") -> NodeTopology:
    devices = tuple(Device(index=i, vendor=vendor, model=model, arch=arch, memory_bytes=memory) for i in range(n))
    links = tuple(Link(a, b, LinkKind.NVSWITCH, bandwidth_gbps=450.0) for a, b in itertools.combinations(range(n), 2))
    return NodeTopology(name=name, devices=devices, links=links)


# --- topology choices Ray's first fit gets wrong ------------------------------------------------


def test_two_gpus_on_a_hybrid_cube_mesh_get_a_double_nvlink_not_first_fit() -> None:
    # Ray, with GPUs 0 and 2 busy, hands out 1 and 3: a single NVLink (25 GB/s)
    s = snap(dgx1_hybrid_mesh("dgx"), busy={"dgx": [0, 2]})
    p = plan(s, gang(2))
    a, b = sorted(d.device for d in p.devices)
    assert DGX1_NVLINKS[(a, b)] == 2
    assert p.tp_bottleneck_gbps == 50.0
    assert "NV" in p.tp_group_weakest[0]


def test_a_pair_is_taken_from_inside_an_nvlink_quad_to_keep_the_other_quad_whole() -> None:
    p = plan(snap(dgx1_hybrid_mesh("dgx")), gang(2))
    chosen = {d.device for d in p.devices}
    assert chosen <= {0, 1, 2, 3} or chosen <= {4, 5, 6, 7}  # (0,4) or (1,5) would break both quads
    assert p.tp_bottleneck_gbps == 50.0


def test_pcie_pairs_share_a_switch_and_groups_of_four_stay_in_one_socket() -> None:
    s = snap(pcie_two_numa("pc"), busy={"pc": [0, 5]})
    pair = plan(s, gang(2))
    assert pair.tp_bottleneck_gbps == 32.0  # PIX: (2,3) or (6,7)
    assert {d.device for d in pair.devices} in ({2, 3}, {6, 7})
    quad = plan(snap(pcie_two_numa("pc"), busy={"pc": [0]}), gang(4))
    assert {d.device for d in quad.devices} == {4, 5, 6, 7}  # socket 1 is whole; socket 0 is not
    assert quad.tp_bottleneck_gbps == 24.0
    assert any("best possible: at the next bandwidth level (32 GB/s) only 0 of the 1" in n for n in quad.notes)


def test_mi250_gang_of_two_takes_one_package() -> None:
    p = plan(snap(mi250_multihop("gcd"), busy={"gcd": [0, 3]}), gang(2))
    assert {d.device for d in p.devices} in ({4, 5}, {6, 7})
    assert p.tp_bottleneck_gbps == 200.0


def test_best_node_is_found_across_the_cluster() -> None:
    s = snap(pcie_two_numa("a"), two_xgmi_hives("b"), nvswitch("c"), busy={"c": [0, 1, 2, 3, 4, 5]})
    p = plan(s, gang(4))
    assert p.nodes == ("b",)
    assert p.tp_bottleneck_gbps == 50.0


# --- groups inside nodes, spanning only when needed ------------------------------------------


def test_tp_group_spans_nodes_only_when_no_node_has_room() -> None:
    s = snap(nvswitch("a"), nvswitch("b"), busy={"a": [0, 1, 2, 3, 4, 5], "b": [2, 3, 4, 5, 6, 7]}, inter=40.0)
    p = plan(s, gang(4))
    assert set(p.nodes) == {"a", "b"}
    assert p.tp_bottleneck_gbps == 40.0
    assert any("span nodes" in n for n in p.notes)
    p3 = plan(s, gang(2))
    assert len(p3.nodes) == 1 and p3.tp_bottleneck_gbps == 450.0


def test_rank_order_is_dp_outer_pp_middle_tp_inner() -> None:
    s = snap(nvswitch("a"), nvswitch("b"))
    p = plan(s, layout(dp=2, pp=2, tp=4))
    assert p.layout.shape == (2, 2, 4)
    for d, st in itertools.product(range(2), range(2)):
        group = p.tp_group(d, st)
        assert group == tuple(p.devices[(d * 2 + st) * 4 + t] for t in range(4))
        assert len({g.node for g in group}) == 1
    assert p.tp_group_gbps == (450.0,) * 4
    # a whole replica (2 stages x 4) fits on each node: its stages share a node
    for d in range(2):
        assert len({g.node for st in range(2) for g in p.tp_group(d, st)}) == 1
    assert p.pp_hop_gbps == (450.0, 450.0)


def test_pipeline_stages_of_a_replica_stay_together_on_a_partly_used_node() -> None:
    s = snap(nvswitch("a"), nvswitch("b"), nvswitch("c"), busy={"a": [0, 1, 2, 3], "b": [0, 1, 2, 3]})
    p = plan(s, layout(dp=2, pp=2, tp=2))
    nodes_per_replica = [{g.node for st in range(2) for g in p.tp_group(d, st)} for d in range(2)]
    assert nodes_per_replica == [{"a"}, {"b"}]
    assert p.pp_hop_gbps == (450.0, 450.0)
    assert "c" not in p.nodes  # pack leaves the whole free node free


def test_pipeline_hops_prefer_well_connected_stages() -> None:
    # two-hive node: stages of tp 2 should pair devices inside one hive, not across PCIe
    p = plan(snap(two_xgmi_hives("h")), layout(pp=2, tp=2))
    assert p.pp_hop_gbps == (50.0,)
    assert p.tp_bottleneck_gbps == 50.0
    assert len({d.device // 4 for d in p.devices}) == 1


# --- pack, spread, determinism ----------------------------------------------------------------


def test_pack_prefers_the_partly_used_node_and_leaves_whole_nodes_free() -> None:
    s = snap(nvswitch("a"), nvswitch("b"), nvswitch("c"), busy={"b": [0, 1, 2, 3, 4]})
    p = plan(s, layout(dp=3))
    assert p.nodes == ("b",)
    assert p.score[2] == 0.0  # no whole free node opened
    assert any("2 whole free nodes left untouched" in n for n in p.notes)


def test_pack_best_fit_takes_the_fullest_node_that_fits() -> None:
    s = snap(nvswitch("a"), nvswitch("b"), busy={"a": [0, 1], "b": [0, 1, 2, 3, 4]})
    assert plan(s, gang(3)).nodes == ("b",)
    assert plan(s, gang(4)).nodes == ("a",)


def test_spread_puts_replicas_on_different_nodes() -> None:
    s = snap(nvswitch("a"), nvswitch("b"), nvswitch("c"), busy={"b": [0, 1]})
    p = plan(s, layout(dp=3, tp=2, strategy=Strategy.SPREAD))
    assert sorted(p.nodes) == ["a", "b", "c"]
    packed = plan(s, layout(dp=3, tp=2))
    assert packed.nodes == ("b",)


def test_planning_is_deterministic_and_leaves_the_snapshot_alone() -> None:
    s = snap(dgx1_hybrid_mesh("x"), mi250_multihop("y"), pcie_two_numa("z"), busy={"x": [3], "y": [1, 6]})
    first = plan(s, layout(dp=3, tp=2))
    again = plan(s, layout(dp=3, tp=2))
    assert first == again
    assert len(s.allocations) == 3


# --- requests: -1, memory, sharing, constraints ------------------------------------------------


def test_minus_one_takes_whatever_fits() -> None:
    s = snap(nvswitch("a"), nvswitch("b"), busy={"a": [0, 1, 2]})
    p = plan(s, layout(dp=-1, tp=4))
    assert p.layout.shape == (3, 1, 4)  # 13 free devices: 3 groups of 4
    assert p.tp_bottleneck_gbps == 450.0  # a holds one group, b two: none spans nodes
    assert all(len({d.node for d in p.tp_group(d, 0)}) == 1 for d in range(3))
    with pytest.raises(Unschedulable, match="at least 16 devices"):
        plan(s, layout(dp=-1, tp=16))


def test_more_memory_than_any_device_has_is_refused_with_that_reason() -> None:
    s = snap(sized("a", 8, 80 * GIB), sized("b", 8, 96 * GIB), busy={"b": [0, 1, 2, 3, 4]})
    with pytest.raises(Unschedulable) as e:
        plan(s, gang(8, memory_bytes=90 * GIB))
    message = str(e.value)
    assert "needs 8 devices" in message and "90.0 GiB" in message
    assert "node a has 8 devices of 80.0 GiB (memory)" in message
    assert "node b has 3 usable devices, 5 devices excluded (occupied)" in message
    assert "--mem" in message and "fewer devices" in message
    assert e.value.exit_code == 3


def test_two_small_replicas_share_a_device_only_when_sharing_is_allowed() -> None:
    s = snap(sized("one", 1, 80 * GIB))
    first = plan(s, PlacementRequest("r1", count=1, memory_bytes=20 * GIB, exclusive=False))
    s = first.apply_to(s)
    second = plan(s, PlacementRequest("r2", count=1, memory_bytes=20 * GIB, exclusive=False))
    assert second.devices == first.devices == (DeviceRef("one", 0),)
    with pytest.raises(Unschedulable, match="occupied"):
        plan(s, PlacementRequest("r3", count=1, memory_bytes=20 * GIB))  # exclusive
    exclusive = plan(snap(sized("one", 1, 80 * GIB)), PlacementRequest("x", count=1, memory_bytes=20 * GIB))
    with pytest.raises(Unschedulable, match="occupied"):
        plan(exclusive.apply_to(snap(sized("one", 1, 80 * GIB))),
             PlacementRequest("r4", count=1, memory_bytes=20 * GIB, exclusive=False))


def test_shared_devices_run_out_of_free_memory() -> None:
    s = snap(sized("one", 1, 80 * GIB))
    for k in range(2):
        s = plan(s, PlacementRequest(f"r{k}", count=1, memory_bytes=30 * GIB, exclusive=False)).apply_to(s)
    with pytest.raises(Unschedulable, match=r"free memory"):
        plan(s, PlacementRequest("r2", count=1, memory_bytes=30 * GIB, exclusive=False))
    assert plan(s, PlacementRequest("r3", count=1, memory_bytes=20 * GIB, exclusive=False)).devices


def test_shared_request_needs_a_device_big_enough_even_when_free() -> None:
    with pytest.raises(Unschedulable, match="memory"):
        plan(snap(sized("one", 1, 16 * GIB)), PlacementRequest("r", count=1, memory_bytes=20 * GIB, exclusive=False))


def test_unknown_memory_is_unusable_when_memory_is_asked_for() -> None:
    s = snap(sized("unknown", 4, None), sized("known", 2, 80 * GIB))
    with pytest.raises(Unschedulable, match=r"node unknown has 4 devices excluded \(memory unknown\)"):
        plan(s, gang(4, memory_bytes=10 * GIB))
    assert plan(s, gang(4)).nodes == ("unknown",)


def test_vendor_model_arch_constraints_select_nodes() -> None:
    s = snap(sized("nv", 8, 80 * GIB), sized("amd", 8, 192 * GIB, Vendor.AMD, "MI300X", "gfx942"))
    assert plan(s, gang(4, vendor=Vendor.AMD)).nodes == ("amd",)
    assert plan(s, gang(4, model="mi300x")).nodes == ("amd",)
    assert plan(s, gang(4, arch="SM_90")).nodes == ("nv",)
    assert plan(s, gang(4, min_memory_bytes=100 * GIB)).nodes == ("amd",)
    assert plan(s, gang(4, model="H100")).nodes == ("nv",)  # a family name matches H100-SXM
    with pytest.raises(Unschedulable, match="node nv has 8 H100-SXM devices"):
        plan(s, gang(4, model="H10"))  # but not a different model that shares a prefix
    with pytest.raises(Unschedulable) as e:
        plan(s, gang(9, vendor=Vendor.AMD))
    assert "node nv has 8 nvidia devices (vendor)" in str(e.value)
    assert "--vendor" in str(e.value)


def test_cpu_only_cluster_refuses_accelerator_jobs() -> None:
    cpu = NodeTopology(name="cpu0", devices=(Device(index=0, vendor=Vendor.CPU),))
    with pytest.raises(Unschedulable, match="no accelerator"):
        plan(snap(cpu), gang(1))


# --- the placement object -------------------------------------------------------------------


def test_placement_allocations_update_a_snapshot() -> None:
    s = snap(nvswitch("a"))
    p = plan(s, layout(dp=2, tp=2, memory_bytes=10 * GIB))
    allocations = p.to_allocations()
    assert [(a.node, a.device) for a in allocations] == [tuple(d) for d in p.devices]
    assert all(a.job_id == "job" and a.memory_bytes == 10 * GIB and a.exclusive for a in allocations)
    s2 = replace(s, allocations=s.allocations + allocations)
    assert s2 == p.apply_to(s)
    nxt = plan(s2, PlacementRequest("next", count=4))
    assert not set(nxt.devices) & set(p.devices)
    with pytest.raises(Unschedulable):
        plan(s2, PlacementRequest("too-many", count=5))


def test_explanation_and_json_describe_the_same_placement() -> None:
    s = snap(dgx1_hybrid_mesh("dgx"), busy={"dgx": [0]})
    p = plan(s, layout(dp=2, pp=1, tp=2, memory_bytes=8 * GIB))
    text = p.explain()
    assert text.splitlines()[0].startswith("job job: 4 devices (dp 2 x pp 1 x tp 2) on 1 node")
    assert "bottleneck 50 GB/s" in text
    assert "why:" in text and "fastest link level on offer" in text
    data = json.loads(json.dumps(p.to_dict()))
    assert [(r["node"], r["device"]) for r in data["ranks"]] == [tuple(d) for d in p.devices]
    assert data["tp_bottleneck_gbps"] == 50.0
    assert data["pp_hops"] == [] and data["score"][1] is None  # no pipeline: no hop traffic


def test_single_device_groups_report_no_tensor_parallel_bandwidth() -> None:
    p = plan(snap(nvswitch("a")), layout(dp=2, pp=2))
    assert p.tp_group_gbps == (None,) * 4
    assert p.tp_bottleneck_gbps is None
    assert p.pp_hop_gbps == (450.0, 450.0)
    assert math.isinf(p.score[0])


def test_a_thousand_gpu_cluster_is_planned_whole() -> None:
    nodes = tuple(nvswitch(f"n{k:03d}") for k in range(128))
    busy = {f"n{k:03d}": list(range(k % 8)) for k in range(128)}
    s = snap(*nodes, busy=busy)
    p = plan(s, layout(dp=8, tp=8))
    assert p.tp_bottleneck_gbps == 450.0
    assert len(p.nodes) == 8 and all(n.endswith(("000", "008", "016", "024", "032", "040", "048", "056")) for n in p.nodes)


# --- the CLI verb ---------------------------------------------------------------------------


@pytest.fixture
def cli_main(monkeypatch):
    from hetflow.cli import main as cli

    if "plan" not in cli.COMMAND_MODULES:  # until the lead registers the verb
        monkeypatch.setattr(cli, "COMMAND_MODULES", cli.COMMAND_MODULES + ["plan"])
    return cli.main


def test_cli_plan_prints_the_placement_and_json(tmp_path, capsys, cli_main) -> None:
    path = tmp_path / "cluster.json"
    path.write_text(dumps(snap(dgx1_hybrid_mesh("dgx"), nvswitch("sw"), busy={"sw": [0, 1, 2, 3, 4]})))
    assert cli_main(["plan", "--cluster", str(path), "--tp", "2", "--dp", "2", "--mem", "10GiB"]) == 0
    out = capsys.readouterr().out
    assert "dp 2 x pp 1 x tp 2" in out and "why:" in out
    assert cli_main(["plan", "--cluster", str(path), "--count", "2", "--vendor", "NVIDIA", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["tp_bottleneck_gbps"] == 450.0 and {r["node"] for r in data["ranks"]} == {"sw"}


def test_cli_plan_exit_codes(tmp_path, capsys, cli_main) -> None:
    path = tmp_path / "cluster.json"
    path.write_text(dumps(snap(sized("a", 8, 80 * GIB))))
    assert cli_main(["plan", "--cluster", str(path), "--count", "8", "--mem", "90GiB"]) == 3
    err = capsys.readouterr().err
    assert "node a has 8 devices of 80.0 GiB (memory)" in err and len(err.strip().splitlines()) == 1
    assert cli_main(["plan", "--cluster", str(path), "--count", "2", "--tp", "2"]) == 2
    assert cli_main(["plan", "--cluster", str(path), "--tp", "-1", "--dp", "-1"]) == 2
    assert cli_main(["plan", "--cluster", str(path), "--share"]) == 2  # sharing needs --mem
    assert cli_main(["plan", "--cluster", str(path), "--vendor", "intel"]) == 2


def test_cli_plan_estimates_memory_from_parameters(tmp_path, capsys, cli_main) -> None:
    path = tmp_path / "cluster.json"
    path.write_text(dumps(snap(sized("a", 8, 80 * GIB))))
    # 70B training with Adam: 70e9 x 18 B / 8 + 1 GiB = ~147.7 GiB per device > 80 GiB
    assert cli_main(["plan", "--cluster", str(path), "--tp", "8", "--params", "70B"]) == 3
    assert "(memory)" in capsys.readouterr().err
    # 7B inference: 7e9 x 2 x 1.2 / 2 + 1 GiB = ~8.8 GiB per device
    assert cli_main(["plan", "--cluster", str(path), "--tp", "2", "--params", "7B", "--mode", "inference"]) == 0
    assert "estimated: 7e+09 params" in capsys.readouterr().out


def test_refusal_is_fast_enough_to_report_at_once() -> None:
    # not a timing assertion: a refusal must not search; it is decided by counting devices
    nodes = tuple(nvswitch(f"n{k:03d}") for k in range(64))
    with pytest.raises(Unschedulable, match="needs 1024 devices"):
        plan(snap(*nodes), gang(1024))


def test_invalid_requests_are_input_errors() -> None:
    with pytest.raises(InputError):
        PlacementRequest("j", count=2, layout=ParallelLayout(tp=2))


def test_model_constraint_accepts_catalog_spellings() -> None:
    from hetflow.accelerators.synthetic import synthetic_node
    from hetflow.core.topology import ClusterSnapshot

    snap = ClusterSnapshot(nodes=(synthetic_node("4x RTX 4090", "ws"), synthetic_node("4x A100-80GB", "a")))
    for spelling in ("RTX4090", "rtx 4090", "NVIDIA GeForce RTX 4090"):
        p = plan(snap, PlacementRequest("j", count=2, model=spelling))
        assert p.nodes == ("ws",), spelling
    with pytest.raises(Unschedulable, match="model"):
        plan(snap, PlacementRequest("j", count=2, model="A10"))  # A10 is not A100


# --- the planner's catalog and reasons ------------------------------------------------------


def test_model_names_follow_the_catalog_the_planner_is_given(tmp_path) -> None:
    from importlib import resources

    import yaml

    from hetflow.accelerators.catalog import load_catalog
    from hetflow.scheduling.planner import Planner, Reason

    data = yaml.safe_load(resources.files("hetflow.accelerators").joinpath("data/catalog.yaml").read_text())
    data["accelerators"] = [row for row in data["accelerators"] if row["name"] != "RTX-4090"]
    path = tmp_path / "catalog.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    s = snap(sized("box", 2, 24 * GIB, model="RTX-4090", arch="sm_89"))
    # the shipped catalog knows "RTX4090" is RTX-4090; one without that row only has the words
    assert len(plan(s, gang(2, model="RTX4090")).devices) == 2
    with pytest.raises(Unschedulable) as refused:
        Planner(load_catalog(path)).plan(s, gang(2, model="RTX4090"))
    assert f"2 RTX-4090 devices ({Reason.MODEL.value})" in str(refused.value)
    assert Reason.MODEL.hint in str(refused.value)
