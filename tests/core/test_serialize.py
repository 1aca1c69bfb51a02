"""Round trips and strictness of the versioned JSON form."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from hetflow.core.errors import InputError
from hetflow.core.serialize import SNAPSHOT_SCHEMA, dumps, loads_snapshot, snapshot_to_dict
from hetflow.core.topology import (
    Allocation, ClusterSnapshot, Device, Link, LinkKind, NodeTopology, PcieLevel, Vendor,
)

opt_int = st.one_of(st.none(), st.integers(min_value=0, max_value=2**40))
opt_text = st.one_of(st.none(), st.text(max_size=12))


@st.composite
def nodes(draw, name: str) -> NodeTopology:
    n = draw(st.integers(min_value=0, max_value=5))
    devices = tuple(
        Device(
            index=i,
            vendor=draw(st.sampled_from(list(Vendor))),
            model=draw(opt_text), name=draw(opt_text), memory_bytes=draw(opt_int),
            arch=draw(opt_text), numa_node=draw(st.one_of(st.none(), st.integers(0, 7))),
            pci_bus_id=draw(opt_text), uuid=draw(opt_text), partition=draw(opt_text),
            package=draw(st.one_of(st.none(), st.integers(0, 7))),
            compute_units=draw(opt_int), device_id=draw(opt_text),
        )
        for i in range(n)
    )
    links = []
    for a in range(n):
        for b in range(a + 1, n):
            if draw(st.booleans()):
                links.append(Link(
                    a, b, kind=draw(st.sampled_from(list(LinkKind))),
                    pcie_level=draw(st.one_of(st.none(), st.sampled_from(list(PcieLevel)))),
                    count=draw(st.one_of(st.none(), st.integers(1, 18))),
                    weight=draw(st.one_of(st.none(), st.integers(0, 100))),
                    hops=draw(st.one_of(st.none(), st.integers(0, 5))),
                    bandwidth_gbps=draw(st.one_of(st.none(), st.floats(0, 2000, allow_nan=False))),
                    bandwidth_note=draw(opt_text),
                ))
    return NodeTopology(
        name=name, devices=devices, links=tuple(links), cpu_cores=draw(opt_int),
        host_memory_bytes=draw(opt_int), numa_nodes=draw(st.one_of(st.none(), st.integers(1, 8))),
        sources=tuple(draw(st.lists(st.text(max_size=8), max_size=2))),
    )


@st.composite
def snapshots(draw) -> ClusterSnapshot:
    k = draw(st.integers(min_value=0, max_value=3))
    ns = tuple(draw(nodes(f"n{i}")) for i in range(k))
    allocs = tuple(
        Allocation(job_id=draw(st.text(min_size=1, max_size=5)), node=n.name, device=d.index,
                   memory_bytes=draw(opt_int), exclusive=draw(st.booleans()))
        for n in ns for d in n.devices if draw(st.booleans())
    )
    return ClusterSnapshot(nodes=ns, inter_node_gbps=draw(st.floats(0.1, 1000)), allocations=allocs)


@settings(max_examples=60, deadline=None)
@given(snapshots())
def test_snapshot_json_round_trip(snap: ClusterSnapshot) -> None:
    text = dumps(snap)
    assert loads_snapshot(text) == snap
    assert json.loads(text)["schema"] == SNAPSHOT_SCHEMA


def _one() -> dict:
    node = NodeTopology("a", devices=(Device(0, Vendor.AMD, memory_bytes=1), Device(1, Vendor.AMD)),
                        links=(Link(0, 1, LinkKind.XGMI, weight=15),))
    return snapshot_to_dict(ClusterSnapshot(nodes=(node,)))


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(schema="hetflow.snapshot/v99"), "this hetflow reads"),
        (lambda d: d["nodes"][0]["devices"][0].update(colour="red"), "nodes[0].devices[0]: unknown key 'colour'"),
        (lambda d: d["nodes"][0]["devices"][0].update(memory_bytes="80GB"), "nodes[0].devices[0].memory_bytes: expected an integer"),
        (lambda d: d["nodes"][0]["devices"][0].update(vendor="intel"), "expected one of ['nvidia', 'amd', 'cpu']"),
        (lambda d: d["nodes"][0]["links"][0].update(pcie_level="XYZ"), "nodes[0].links[0].pcie_level"),
        (lambda d: d["nodes"][0]["links"][0].pop("kind"), "nodes[0].links[0].kind: missing required field"),
        (lambda d: d["nodes"][0]["links"][0].update(a=1, b=0), "ordered"),
        (lambda d: d.update(nodes="x"), "nodes: expected a list"),
    ],
)
def test_bad_snapshot_is_refused_with_its_path(mutate, message) -> None:
    data = _one()
    mutate(data)
    with pytest.raises(InputError) as e:
        loads_snapshot(json.dumps(data), "snap.json")
    assert message in str(e.value)
    assert str(e.value).startswith("snap.json")


def test_invalid_json_names_line() -> None:
    with pytest.raises(InputError, match=r"snap.json:2: not valid JSON"):
        loads_snapshot('{\n "schema": oops}', "snap.json")
