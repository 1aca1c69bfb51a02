"""One policy everywhere: under FGD's packing protocol ``hetflow`` is the registry's policy class
and its placer (``TopologyPlacer.with_mix``, the controller's code) through an adapter, and a
small scenario gets the same node and GPUs from that placer called directly as the controller
calls it and from the protocol.

The scenario: four nodes of two GPU models (two of them identical, so the node rank decides
ties), pods sharing GPUs, whole-GPU pods, a pod bound to one model, a pod without GPUs and a
gang that fits nowhere.
"""

from __future__ import annotations

import pytest

import hetflow.sim.fgd as fgd
from hetflow.core.errors import InputError
from hetflow.core.topology import ClusterSnapshot, Device, NodeTopology, Vendor
from hetflow.scheduling.policies.capacity import WHOLE, ClusterModel, FreeCapacity, Request
from hetflow.scheduling.policies.hetflow import HetflowPolicy
from hetflow.scheduling.policies.placer import FirstFitPlacer, TopologyPlacer
from hetflow.scheduling.policies.registry import POLICIES, make_policy
from hetflow.sim.fgd import FgdNode, FgdPod, make_packing_policy, simulate_fgd, typical_pods
from hetflow.sim.live_fgd import LivePacking

NODES = [FgdNode("a", 16000, 65536, 2, "T4"), FgdNode("b", 32000, 131072, 4, "T4"),
         FgdNode("c", 8000, 32768, 2, "P100"), FgdNode("d", 16000, 65536, 2, "T4")]
PODS = [FgdPod("p0", 2000, 4096, 1, 500), FgdPod("p1", 2000, 4096, 1, 300), FgdPod("p2", 4000, 8192, 1, 1000),
        FgdPod("p3", 1000, 2048, 1, 700, "P100"), FgdPod("p4", 8000, 16384, 2, 1000), FgdPod("p5", 6000, 8192, 0, 0),
        FgdPod("p6", 2000, 4096, 1, 500), FgdPod("p7", 1000, 2048, 1, 200), FgdPod("p8", 1000, 2048, 4, 1000),
        FgdPod("p9", 2000, 4096, 1, 500), FgdPod("p10", 2000, 4096, 1, 800), FgdPod("p11", 3000, 4096, 1, 1000)]
RANKS = {"a-first": [0, 1, 2, 3], "d-first": [3, 1, 2, 0]}


def controller_model(ranks: list[int]) -> ClusterModel:
    """The nodes as the controller sees a cluster (a snapshot), listed in rank order: the
    protocol's ties go to the lowest rank, the placer's to the first node."""
    order = sorted(range(len(NODES)), key=lambda i: ranks[i])
    return ClusterModel.from_snapshot(ClusterSnapshot(tuple(
        NodeTopology(NODES[i].name, tuple(Device(k, Vendor.NVIDIA, model=NODES[i].model) for k in range(NODES[i].gpus)),
                     cpu_cores=NODES[i].cpu_milli // 1000, host_memory_bytes=NODES[i].memory_mib << 20)
        for i in order)))


def controller_mix() -> tuple[dict, dict]:
    """FGD's typical pods as the controller's demand mix: weight per (GPUs, milli) class and
    the class's weighted mean (CPU, memory)."""
    mix: dict[tuple[int, int], float] = {}
    cpu: dict[tuple[int, int], float] = {}
    for t in typical_pods(PODS):
        key = (t.num_gpu, t.gpu_milli if t.num_gpu else WHOLE)
        mix[key] = mix.get(key, 0.0) + t.weight
        cpu[key] = cpu.get(key, 0.0) + t.weight * t.cpu_milli
    return mix, {k: (cpu[k] / w, 0.0) for k, w in mix.items()}


def direct(placer, ranks: list[int]) -> list[tuple[str, tuple[int, ...]] | None]:
    """Each pod in turn placed by ``placer`` as the policy's fill does (the request, the types
    the pod may use that could fit), taken when placed."""
    model = controller_model(ranks)
    free = FreeCapacity(model)
    out = []
    for p in PODS:
        request = Request(p.num_gpu, p.gpu_milli, p.cpu_milli, p.memory_mib) if p.num_gpu else \
            Request(0, WHOLE, p.cpu_milli, p.memory_mib)
        allowed = set(p.gpu_spec.split("|")) if p.gpu_spec and p.num_gpu else set(model.device_types)
        types = [t for t in model.device_types if t in allowed and free.could_fit(request, t)]
        a = placer.place(free, request, types) if types else None
        if a is None:
            out.append(None)
            continue
        free.take(a)
        node = {n for n, _ in a.slots} | ({a.host} if a.host is not None else set())
        assert len(node) == 1
        out.append((model.nodes[node.pop()].name, tuple(sorted(pos for _, pos in a.slots))))
    return out


def protocol(policy: str, ranks: list[int]) -> list[tuple[str, tuple[int, ...]] | None]:
    run = simulate_fgd(NODES, PODS, policy, seed=1, arrival_order=list(range(len(PODS))), node_ranks=ranks,
                       typical=typical_pods(PODS))
    return [None if p is None else (NODES[p[0]].name, p[1]) for p in run.placements]


def live_hetflow_placer() -> TopologyPlacer:
    mix, host = controller_mix()
    return make_policy("hetflow").placer.with_mix(mix, host)  # what HetflowPolicy._placer_for returns


def test_the_fgd_protocol_runs_the_registry_class_and_placer() -> None:
    adapter = make_packing_policy("hetflow")
    assert isinstance(adapter, LivePacking)
    assert type(adapter.policy) is type(make_policy("hetflow")) and adapter.name == "hetflow"
    assert type(adapter.policy.placer) is TopologyPlacer
    assert not hasattr(fgd, "HetflowPacking")  # no protocol-only algorithm left


@pytest.mark.parametrize("ranks", list(RANKS.values()), ids=list(RANKS))
def test_the_live_placer_and_the_protocol_place_the_scenario_alike(ranks) -> None:
    want = direct(live_hetflow_placer(), ranks)
    assert protocol("hetflow", ranks) == want
    # the scenario exercises what it claims: a shared GPU, a pod that fails, a pod without GPUs
    slots = [(node, g) for got in want if got for node, gs in [got] for g in gs]
    assert len(slots) > len(set(slots))
    assert None in want and want[PODS.index(next(p for p in PODS if p.num_gpu == 0))] is not None


def test_the_node_rank_decides_the_live_placers_ties() -> None:
    a_first, d_first = (direct(live_hetflow_placer(), r) for r in RANKS.values())
    assert a_first != d_first  # the identical nodes a and d tie: the rank, hence the order, decides
    assert protocol("hetflow", RANKS["d-first"]) == d_first


def test_the_protocol_follows_the_registrys_placer(monkeypatch) -> None:
    """Bypass check: the registry's hetflow given another placer (first fit, which records its
    answers) - the protocol must place every pod where that placer said."""
    answers: list = []

    class Spy(FirstFitPlacer):
        def place(self, free, request, device_types):
            a = super().place(free, request, device_types)
            answers.append(a)
            return a

    ranks = RANKS["d-first"]
    live = direct(live_hetflow_placer(), ranks)
    monkeypatch.setitem(POLICIES, "hetflow", lambda placer=None: HetflowPolicy(placer=Spy()))
    got = protocol("hetflow", ranks)
    want = direct(FirstFitPlacer(), ranks)
    assert got == want
    assert len(answers) >= len([g for g in got if g is not None])
    assert want != live  # first fit places differently from hetflow's own placer


def test_fifo_runs_through_the_adapter_and_other_registry_policies_are_refused_by_name() -> None:
    assert protocol("fifo", RANKS["a-first"]) == direct(FirstFitPlacer(), RANKS["a-first"])
    for name in ("srtf", "las", "max_min_fairness"):
        with pytest.raises(InputError, match=f"policy '{name}' cannot run on --protocol fgd") as e:
            make_packing_policy(name)
        assert "\n" not in str(e.value)
    with pytest.raises(InputError, match="unknown policy"):
        make_packing_policy("nope")
