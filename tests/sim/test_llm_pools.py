"""hetflow's LLM pools on Helix's settings (hetflow.sim.llm_pools): no Ray, no network."""

from __future__ import annotations

import dataclasses
from collections import Counter

import pytest

from hetflow.sim import llm_pools as lp


def test_helix_clusters_read_back() -> None:
    assert Counter(lp.load_cluster("cluster24")) == {"A100": 4, "L4": 8, "T4": 12}
    c42 = Counter(lp.load_cluster("cluster42"))
    assert sum(c42.values()) == 42 and c42["A100"] == 4 and c42["T4x4"] == 4
    assert lp.vram_gb("A100") == 40 and lp.vram_gb("T4x4") == 64


def test_profiles_are_helix_numbers() -> None:
    m70, m30 = lp.load_model("llama70b"), lp.load_model("llama30b")
    assert (m70.layers, m30.layers) == (80, 60)
    assert m70.devices["A100"].max_num_layers == 12 and m30.devices["T4x4"].max_num_layers == 30
    assert m30.devices["A100"].vllm_num_blocks[18] == 2097
    assert m70.devices["A100"].decode_ms[1] == (2, 1.4)


@pytest.mark.parametrize("model", ["llama30b", "llama70b"])
@pytest.mark.parametrize("cluster", ["cluster24", "cluster42"])
def test_no_node_of_helix_holds_a_whole_model(model: str, cluster: str) -> None:
    assert lp.plan_pools(lp.load_model(model), lp.load_cluster(cluster), "node") == []


def test_a_model_that_fits_only_a100_gets_engines_only_there() -> None:
    small = dataclasses.replace(lp.load_model("llama70b"), layers=12)  # A100 holds 12, L4 7, T4 4
    engines = lp.plan_pools(small, lp.load_cluster("cluster24"), "node")
    assert [e.pool for e in engines] == ["A100"] * 4
    one = lp.pipeline_capacity(small, [("A100", 12)])
    assert all(e.capacity == one and e.stages == (12,) for e in engines)
    caps = [e.capacity for e in engines]
    assert lp.routed_throughput(caps, lp.proportional_weights(caps), 10 * one) == pytest.approx(4 * one)


def test_pipeline_pools_respect_memory() -> None:
    m30 = lp.load_model("llama30b")
    pipes = lp.plan_pools(m30, lp.load_cluster("cluster24"), "pipeline")
    depth = {e.pool: len(e.nodes) for e in pipes}
    assert depth == {"A100": 4, "L4": 6, "T4": 9}  # ceil(60 / 18), ceil(60 / 11), ceil(60 / 7)
    assert all(sum(e.stages) == 60 for e in pipes)
    assert lp.plan_pools(lp.load_model("llama70b"), lp.load_cluster("cluster24"), "pipeline") == []


def test_capacity_hand_computed() -> None:
    dev = lp.DeviceProfile(name="X", max_num_layers=2, vllm_num_blocks={1: 10**6, 2: 10**6},
                           decode_max_tokens={1: 10, 2: 10}, prompt_ms=((0, 1.0), (1000, 1.0)),
                           decode_ms=((0, 1.0), (100, 1.0)))
    model = lp.ModelProfile(name="toy", layers=2, hidden=0, devices={"X": dev})
    # 10 in flight; round trip 2 layers x 1 ms + 2 hops x 1 ms; prompt the same
    assert lp.pipeline_capacity(model, [("X", 2)]) == pytest.approx(10 * 240 / (0.004 + 240 * 0.004))
    # two stages of one layer: 3 hops
    two = lp.pipeline_capacity(model, [("X", 1), ("X", 1)])
    assert two == pytest.approx(10 * 240 / (0.005 + 240 * 0.005))
    with pytest.raises(ValueError):
        lp.pipeline_capacity(model, [("X", 1)])


def test_routing_rule() -> None:
    assert lp.proportional_weights([200.0, 100.0, 50.0]) == [256, 128, 64]
    caps = [100.0, 50.0]
    assert lp.routed_throughput(caps, lp.proportional_weights(caps), 150) == pytest.approx(150)
    assert lp.routed_throughput(caps, lp.proportional_weights(caps), 90) == pytest.approx(90)
    assert lp.routed_throughput(caps, [1, 1], 150) == pytest.approx(125)  # 75 + 50: the fast one idles
    assert lp.routed_throughput([], [], 10) == 0.0


def test_helix_layout_reads_with_offset() -> None:
    layout = lp.read_layout(lp.DATA / "layouts" / "cluster24_llama70b_ilp_sol.ini")
    assert layout[0] == [7, 8, 9, 10] and len(layout) == 24
    assert set().union(*layout.values()) == set(range(80))


def test_reference_numbers_are_helix_printed_results() -> None:
    s = lp.reference()["settings"]
    assert lp.reference()["commit"].startswith("148b733")
    got = {k: (v["helix"]["decode_tokens_per_s"], v["separate"]["decode_tokens_per_s"]) for k, v in s.items()}
    assert got == {"llama70b/cluster24": (252.1, 124.3), "llama30b/cluster24": (339.6, 309.0),
                   "llama70b/cluster42": (645.6, 219.3)}


def test_figures() -> None:
    # 70B: no single node type's nodes hold its 80 layers within Helix's memory limit (A100 4 x 12,
    # L4 8 x 7, T4 12 x 4): no engine over nodes of one type; one over A100 and L4 nodes
    primary = lp.evaluate(lp.PRIMARY)
    assert primary.one_type_over_helix == 0.0 and primary.runnable_replicas == 1
    assert lp.sim_over_helix() == pytest.approx(primary.runnable_estimate / 252.1)
    assert 0.5 < lp.sim_over_helix() < 1.0
    r = lp.evaluate("llama30b/cluster24")
    # 30B: one engine over nodes of each type (A100 x4, L4 x6, T4 x9), routed by capacity
    assert r.pipeline_replicas == 3 and r.node_engines == 0
    assert r.one_type_over_helix == pytest.approx(r.pipeline_estimate / 339.6)
    assert r.sim_over_helix >= r.one_type_over_helix  # one type per engine is a mix too
    # the 42-node cluster: mixes of 1-, 2- and 4-GPU nodes are not one vLLM engine; uniform ones are
    wide = lp.evaluate("llama70b/cluster42")
    assert wide.runnable_estimate <= wide.mixed_estimate
    for engine in lp.plan_mixed_pipelines(lp.load_model("llama70b"), lp.load_cluster("cluster42"), uniform=True):
        widths = {lp.devices_per_node(lp.load_cluster("cluster42")[n]) for n in engine.nodes}
        assert len(widths) == 1
    assert r.pipelines_over_helix == pytest.approx(309.0 / 339.6)
    assert r.equal_weights < r.separate  # equal weights leave the A100 pool's capacity unused
    assert 0.5 * r.separate < r.separate_estimate < 1.5 * r.separate  # the estimate is near Helix's


def test_data_small_and_credited() -> None:
    files = [p for p in lp.DATA.rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) < 200_000
    readme = (lp.DATA / "README.md").read_text()
    assert "148b733080c0c5d3ddca0fe3c985b2e52a7f7b35" in readme and "Apache" in readme


@pytest.mark.parametrize("setting", ["llama70b/cluster24", "llama30b/cluster24"])
def test_mixed_pipelines_hold_the_model_within_memory(setting: str) -> None:
    model_name, cluster = setting.split("/")
    model, nodes = lp.load_model(model_name), lp.load_cluster(cluster)
    mixed = lp.plan_mixed_pipelines(model, nodes)
    assert mixed and all(e.capacity > 0 for e in mixed)
    used = [n for e in mixed for n in e.nodes]
    assert len(used) == len(set(used))  # no node in two replicas
    for e in mixed:
        assert sum(e.stages) == model.layers and len(e.nodes) == len(e.stages) <= lp.MAX_STAGES
        assert all(0 < k <= model.devices[nodes[n]].max_num_layers for n, k in zip(e.nodes, e.stages))
        assert e.capacity == pytest.approx(lp.pipeline_capacity(
            model, [(nodes[n], k) for n, k in zip(e.nodes, e.stages)]))
    slots = sum(model.devices[t].max_num_layers for t in nodes)
    assert len(mixed) <= slots // model.layers
    single = lp.plan_pools(model, nodes, "pipeline")
    assert sum(e.capacity for e in mixed) >= sum(e.capacity for e in single)


def test_a_model_no_single_type_holds_runs_on_a_mixed_pipeline() -> None:
    model, nodes = lp.load_model("llama70b"), lp.load_cluster("cluster24")
    per_type = Counter(nodes)
    assert all(n * model.devices[t].max_num_layers < model.layers for t, n in per_type.items())
    mixed = lp.plan_mixed_pipelines(model, nodes)
    assert len({nodes[n] for n in mixed[0].nodes}) > 1


def test_mixed_split_fills_the_fast_device_first() -> None:
    def dev(name: str, ms: float) -> lp.DeviceProfile:
        return lp.DeviceProfile(name=name, max_num_layers=3, vllm_num_blocks={k: 10**6 for k in (1, 2, 3)},
                                decode_max_tokens={1: 10, 2: 10, 3: 10}, prompt_ms=((0, ms), (1000, ms)),
                                decode_ms=((0, ms), (100, ms)))
    model = lp.ModelProfile(name="toy", layers=4, hidden=0, devices={"F": dev("F", 1.0), "S": dev("S", 5.0)})
    (engine,) = lp.plan_mixed_pipelines(model, ["S", "F", "S"])
    # F holds 3, one S the last: 3 x 1 ms + 1 x 5 ms beats 2 + 2 (12 ms) and any S-only pair
    assert sorted(zip(engine.nodes, engine.stages)) == [(0, 1), (1, 3)]
    assert engine.capacity == pytest.approx(10 * 240 / (0.011 + 240 * 0.011))
