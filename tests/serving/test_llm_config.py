"""``engine: vllm`` models without starting an engine: config rules (one line each), pools
planned on the devices hetflow's planner picks (with the vendor's visibility variables), the
front door's backend for a model's replicas (weights by pool), the engine's command line, and
per-upstream stats summed over an LLM model's replicas. tests/serving/test_llm_ray.py starts
real vLLM engines."""

from __future__ import annotations

import pytest

from hetflow.accelerators.synthetic import synthetic_node
from hetflow.core.errors import InputError, Unschedulable
from hetflow.core.topology import ClusterSnapshot
from hetflow.workloads.serve.config import serve_config_from_dict
from hetflow.workloads.serve.llm import VLLMEngine, engine_argv, engine_env
from hetflow.workloads.serve.plan import plan_pools
from hetflow.workloads.serve.upstream import backend_sections, llm_backend, read_upstream_stats


def llm(**fields):
    doc = {"name": "chat", "engine": "vllm", "vllm": {"model": "org/some-model"}, **fields}
    return serve_config_from_dict({"name": "app", "models": [doc]}).models[0]


@pytest.mark.parametrize("fields, words", [
    ({"vllm": None}, "engine: vllm needs vllm:"),
    ({"train": {"model": {"kind": "mlp", "hidden": [8]}}}, "drop train"),
    ({"fallback": "other"}, "fallback 'other' is not a model or upstream"),
    ({"autoscaling": {"min_replicas": 1, "max_replicas": 2}, "pools": [{}]}, "give autoscaling per pool"),
    ({"pools": [{"replicas": 2, "autoscaling": {"max_replicas": 3}}]}, "give replicas (a fixed count) or autoscaling, not both"),
    ({"pools": [{"nodes": 2, "autoscaling": {"max_replicas": 3}}]}, "not supported for an engine over several nodes"),
    ({"pools": [{"autoscaling": {"min_replicas": 3, "max_replicas": 2}}]}, "min_replicas <= initial_replicas <= max_replicas"),
    ({"pools": [{"autoscaling": {"min_replicas": 0}}]}, "min_replicas"),
    ({"pools": [{"devices": {"kind": "cpu", "vendor": "amd"}}]}, "pool 1: devices.vendor/model need devices.kind gpu"),
    ({"pools": [{"devices": "auto"}]}, "devices.kind auto is not for an LLM pool: write cpu or gpu"),
    ({"pools": [{"engine": {"dtype": "int3"}}]}, "pool 1 engine.dtype"),
    ({"vllm": {"model": "m", "tensor_parallel_size": 0}}, "tensor_parallel_size"),
    ({"routing": {"affinity": "sticky"}}, "routing.affinity"),
    ({"routing": {"balance_factor": 100}}, "routing.balance_factor"),
])
def test_bad_llm_entries_are_one_line(fields, words) -> None:
    with pytest.raises(InputError) as err:
        llm(**fields)
    text = str(err.value)
    assert words in text and "\n" not in text.strip()


UPSTREAMS = [{"name": "cloud", "url": "https://api.example.com/v1", "model": "gpt-up"},
             {"name": "triton", "url": "http://triton:8000", "protocol": "kserve-v2"}]
LLM = {"name": "chat", "engine": "vllm", "vllm": {"model": "org/some-model"}}
DIGITS = {"name": "digits", "train": {"model": {"kind": "mlp", "hidden": [8]}}}


def test_an_llm_falls_back_to_an_openai_upstream_and_the_front_door_plans_it() -> None:
    from hetflow.workloads.serve.plan import front_plan

    upstreams = [{**UPSTREAMS[0], "fallback": "cloud2"}, *UPSTREAMS[1:],
                 {"name": "cloud2", "url": "https://other.example.com/v1"}]
    config = serve_config_from_dict({"name": "app", "models": [{**LLM, "fallback": "cloud"}],
                                     "upstreams": upstreams})
    plan = front_plan(config, {}, {"chat": [("p1-r0", "127.0.0.1", 9000, 1)]})
    assert plan.upstream_fallbacks == {"chat": "cloud"}
    assert plan.upstream_chains == {"cloud": ("cloud2",)}  # and on, while cloud is out
    assert [u.name for u in plan.upstreams if u.local] == ["chat"]


@pytest.mark.parametrize("models, words", [
    ([{**LLM, "fallback": "triton"}], "model chat (engine: vllm): fallback 'triton' speaks kserve-v2; "
                                      "an LLM's requests are OpenAI's"),
    ([{**LLM, "fallback": "digits"}, DIGITS], "model chat (engine: vllm): fallback 'digits' is a model "
                                              "of this file; an LLM falls back to an upstream"),
    ([LLM, {**DIGITS, "fallback": "chat"}], "model digits: fallback 'chat' is an engine: vllm model, "
                                            "which the gateway cannot call"),
])
def test_a_fallback_that_cannot_take_the_models_requests_is_one_line(models, words) -> None:
    with pytest.raises(InputError) as err:
        serve_config_from_dict({"name": "app", "models": models, "upstreams": UPSTREAMS})
    text = str(err.value)
    assert words in text and "\n" not in text.strip()


@pytest.mark.parametrize("extra", [{"vllm": {"model": "x"}}, {"routing": {"affinity": "none"}}])
def test_vllm_fields_belong_to_engine_vllm(extra) -> None:
    doc = {"name": "m", "train": {"model": {"kind": "mlp", "hidden": [8]}}, **extra}
    with pytest.raises(InputError, match="add engine: vllm"):
        serve_config_from_dict({"models": [doc]})


def test_pools_go_to_the_devices_the_planner_picks_with_the_vendors_variables() -> None:
    snapshot = ClusterSnapshot(nodes=(synthetic_node("2x H100-SXM", "nv"),
                                      synthetic_node("2x MI300X", "amd")))
    entry = llm(pools=[{"devices": {"vendor": "nvidia"}, "replicas": 2, "weight": 3},
                       {"devices": {"model": "MI300X"}, "replicas": 1,
                        "engine": {"dtype": "float16"}},
                       {"devices": "cpu", "replicas": 1, "cpus_per_replica": 2}])
    groups = plan_pools("app", entry, snapshot, 0)
    by_pool: dict[int, list] = {}
    for pool, group in groups:
        by_pool.setdefault(pool, []).append(group)
    nvidia = by_pool[0]
    assert sorted((g.device.node, g.device.device) for g in nvidia) == [("nv", 0), ("nv", 1)]
    assert all(g.env["CUDA_VISIBLE_DEVICES"] == str(g.device.device) for g in nvidia)
    assert all(g.env["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] == "1" for g in nvidia)
    (amd,) = by_pool[1]
    assert amd.device.node == "amd" and amd.env["HIP_VISIBLE_DEVICES"] == str(amd.device.device)
    (cpu,) = by_pool[2]
    assert cpu.compute == "cpu" and cpu.ray_actor_options["num_cpus"] == 2
    assert cpu.ray_actor_options["runtime_env"]["env_vars"]["CUDA_VISIBLE_DEVICES"] == ""
    # an engine replica holds its device alone: the whole of it is reserved
    units = {next(iter(g.ray_actor_options["resources"].values())) for g in nvidia}
    assert len(units) == 1 and units.pop() > 0
    assert entry.vllm.merged(entry.pools[1].engine).dtype == "float16"


def test_pools_that_do_not_fit_say_so() -> None:
    snapshot = ClusterSnapshot(nodes=(synthetic_node("2x H100-SXM", "nv"),))
    with pytest.raises(Unschedulable):
        plan_pools("app", llm(pools=[{"devices": {"vendor": "amd"}}]), snapshot, 0)
    with pytest.raises(Unschedulable, match="replica 2 of 2 .*tensor_parallel_size 2"):
        plan_pools("app", llm(pools=[{"devices": "gpu", "replicas": 2,
                                      "engine": {"tensor_parallel_size": 2}}]), snapshot, 0)
    two_nodes = ClusterSnapshot(nodes=(synthetic_node("2x H100-SXM", "a"), synthetic_node("2x H100-SXM", "b")))
    with pytest.raises(Unschedulable, match="on one node"):  # 4 devices exist, not on one node
        plan_pools("app", llm(pools=[{"devices": "gpu", "engine": {"tensor_parallel_size": 4}}]),
                   two_nodes, 0)
    with pytest.raises(Unschedulable, match="need 4 GPUs"):  # Ray's own GPUs, too few
        plan_pools("app", llm(pools=[{"devices": "gpu", "replicas": 2,
                                      "engine": {"tensor_parallel_size": 2}}]), ClusterSnapshot(nodes=()), 2)


def test_a_tensor_parallel_replica_gets_a_fast_group_of_one_node_and_sees_exactly_it() -> None:
    """tensor_parallel_size 4 on a DGX-1 (V100s in a hybrid cube mesh, one device taken): the
    engine's group is the free NVLink quad; a second pool then gets what is left."""
    from hetflow.core.topology import Allocation

    dgx1 = ClusterSnapshot(nodes=(synthetic_node("8x V100", "dgx1"),),
                           allocations=(Allocation("someone-else", "dgx1", 0),))
    entry = llm(pools=[{"devices": "gpu", "replicas": 1, "engine": {"tensor_parallel_size": 4}},
                       {"devices": "gpu", "replicas": 3}])
    groups = plan_pools("app", entry, dgx1, 0)
    (pool, tp), *rest = groups
    devices = [int(d) for d in tp.env["CUDA_VISIBLE_DEVICES"].split(",")]
    assert pool == 0 and sorted(devices) == [4, 5, 6, 7]  # the quad without the busy device 0
    node = dgx1.nodes[0]
    assert all(node.bandwidth(a, b) >= 25.0 for a in devices for b in devices if a != b)  # NVLink
    held = tp.ray_actor_options["resources"]
    assert sorted(held) == sorted(f"hetflow_dev_{d}" for d in devices)
    assert all(units == node.device(int(k.rsplit("_", 1)[1])).memory_bytes // (1 << 20)
               for k, units in held.items())  # whole devices
    assert tp.bundle_label_selector == [{"hetflow.io/node": "dgx1"}]
    assert tp.placement_group_bundles[0]["hetflow_dev_4"] == held["hetflow_dev_4"]
    others = {g.device.device for p, g in rest if p == 1}
    assert len(others) == 3 and not others & set(devices) and 0 not in others
    argv = engine_argv(entry.vllm.merged(entry.pools[0].engine), "chat", "127.0.0.1", 9000)
    assert "--tensor-parallel-size 4 --disable-uvicorn-access-log" in " ".join(argv)
    assert argv[-2:] == ["--distributed-executor-backend", "mp"]  # the group on those devices


def test_an_engine_over_two_nodes_gets_each_nodes_share_on_a_node_of_its_own() -> None:
    """tensor_parallel_size 2 x pipeline_parallel_size 2 over 2 nodes: 2 devices on each of two
    different nodes, each share on its node's fast links and seeing exactly them; a second
    replica takes the two nodes left, and a third finds no two nodes free."""
    snapshot = ClusterSnapshot(nodes=tuple(synthetic_node("2x H100-SXM", n) for n in "abc")
                               + (synthetic_node("4x H100-SXM", "d"),))
    pool = {"devices": {"model": "H100"}, "nodes": 2,
            "engine": {"tensor_parallel_size": 2, "pipeline_parallel_size": 2}}
    groups = plan_pools("app", llm(pools=[{**pool, "replicas": 2}]), snapshot, 0)
    assert len(groups) == 2
    seen = []
    for _pool, group in groups:
        assert group.num_replicas == 1 and len(group.stages) == 2 and not group.spread
        assert len(set(group.stage_nodes)) == 2  # never two shares on one node
        for node, options in zip(group.stage_nodes, group.stages):
            assert options["label_selector"] == {"hetflow.io/node": node}
            assert len(options["resources"]) == 2
            assert options["runtime_env"]["env_vars"]["CUDA_VISIBLE_DEVICES"] in ("0,1", "2,3")
            seen += [(node, k) for k in options["resources"]]
    assert len(seen) == len(set(seen)) == 8  # every device once: the two replicas share none
    with pytest.raises(Unschedulable, match="replica 3's node 2 of 2"):
        plan_pools("app", llm(pools=[{**pool, "replicas": 3}]), snapshot, 0)


def test_an_engine_over_nodes_of_several_types_splits_layers_by_memory(tmp_path) -> None:
    """node_models [A100-40GB, T4, T4]: one stage a node, in that order, each on its model; the
    model's 48 layers split by the nodes' memory (40 : 16 : 16 GiB -> 27/11/10, largest remainders), set for every
    stage's processes; a given split is used as given and checked against the model."""
    import json

    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 48}))
    snapshot = ClusterSnapshot(nodes=(synthetic_node("1x T4", "t1"), synthetic_node("1x A100-40GB", "a1"),
                                      synthetic_node("1x T4", "t2"), synthetic_node("1x T4", "t3")))
    entry = serve_config_from_dict({"name": "app", "models": [{
        "name": "chat", "engine": "vllm",
        "vllm": {"model": str(tmp_path), "pipeline_parallel_size": 3},
        "pools": [{"devices": "gpu", "node_models": ["A100-40GB", "T4", "T4"]}]}]}).models[0]
    assert entry.pools[0].nodes == 3
    (_, group), = plan_pools("app", entry, snapshot, 0)
    assert group.stage_nodes[0] == "a1" and set(group.stage_nodes[1:]) <= {"t1", "t2", "t3"}
    splits = {o["runtime_env"]["env_vars"]["VLLM_PP_LAYER_PARTITION"] for o in group.stages}
    assert splits == {"27,11,10"}
    from hetflow.workloads.serve.plan import describe_plan

    plan = describe_plan(serve_config_from_dict({"name": "app", "models": [entry.model_dump(exclude_none=True)]}),
                         {}, {"chat": [(0, group)]})
    (engine,) = plan["llm"]["chat"]["engines"]
    assert engine["nodes"] == 3 and engine["layer_split"] == [27, 11, 10]
    assert engine["devices"][0].startswith("a1:")
    given = entry.pools[0].model_copy(update={"layer_split": [30, 9, 9]})
    entry_given = entry.model_copy(update={"pools": [given]})
    (_, group), = plan_pools("app", entry_given, snapshot, 0)
    assert group.stages[2]["runtime_env"]["env_vars"]["VLLM_PP_LAYER_PARTITION"] == "30,9,9"
    wrong = entry.model_copy(update={"pools": [given.model_copy(update={"layer_split": [30, 9, 8]})]})
    with pytest.raises(Unschedulable, match="adds up to 47 layers, the model has 48"):
        plan_pools("app", wrong, snapshot, 0)
    with pytest.raises(Unschedulable, match="node_models need hetflow GPU nodes"):
        plan_pools("app", entry, ClusterSnapshot(nodes=()), 8)
    with pytest.raises(InputError, match="node_models lists 2 nodes, nodes is 3"):
        llm(pools=[{"devices": "gpu", "nodes": 3, "node_models": ["T4", "T4"]}])
    with pytest.raises(InputError, match="layer_split has 2 stages, pipeline_parallel_size is 3"):
        llm(vllm={"model": "m", "pipeline_parallel_size": 3},
            pools=[{"devices": "gpu", "nodes": 3, "layer_split": [1, 2]}])


def test_the_simulators_engine_for_helixs_cluster_is_a_pool_the_planner_places(tmp_path) -> None:
    """The mix benchmarks/llm_helix.py prints for LLaMA-2 70B on Helix's 24-node cluster (4 A100
    + 6 L4 nodes, 11 and 6 layers) written as a pool: the planner puts one stage on each of ten
    distinct nodes of the listed models, in order, and every stage gets the split."""
    import json

    from hetflow.sim import llm_pools as lp

    model, nodes = lp.load_model("llama70b"), lp.load_cluster("cluster24")
    pools = lp.pool_entries(model, lp.plan_mixed_pipelines(model, nodes, uniform=True), nodes)
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": model.layers}))
    names = {"A100": "1x A100-40GB", "L4": "1x L4", "T4": "1x T4"}
    snapshot = ClusterSnapshot(nodes=tuple(synthetic_node(names[t], f"n{i}") for i, t in enumerate(nodes)))
    entry = serve_config_from_dict({"name": "app", "models": [{
        "name": "llama", "engine": "vllm", "vllm": {"model": str(tmp_path)}, "pools": pools}]}).models[0]
    groups = plan_pools("app", entry, snapshot, 0)
    assert len(groups) == sum(p["replicas"] for p in pools) == 1
    (_, group), = groups
    placed = [snapshot.node(n).accelerators[0].model for n in group.stage_nodes]
    assert placed == pools[0]["node_models"] and len(set(group.stage_nodes)) == 10
    split = ",".join(map(str, pools[0]["layer_split"]))
    assert all(o["runtime_env"]["env_vars"]["VLLM_PP_LAYER_PARTITION"] == split for o in group.stages)
    assert sum(pools[0]["layer_split"]) == 80


def test_layers_split_in_proportion_keep_every_stage_and_the_total() -> None:
    from hetflow.workloads.serve.llm import proportional_split

    assert proportional_split(80, [40, 40, 24, 24]) == [25, 25, 15, 15]
    assert proportional_split(5, [100, 1, 1]) == [3, 1, 1]  # every stage at least one layer
    for layers, weights in [(7, [1, 1, 1]), (61, [3, 2, 2, 5]), (12, [1] * 12)]:
        split = proportional_split(layers, weights)
        assert sum(split) == layers and min(split) >= 1


def test_an_engine_over_nodes_on_cpus_or_ray_gpus_is_spread_by_ray() -> None:
    (_, group), = plan_pools("app", llm(pools=[{"devices": "gpu", "nodes": 2, "replicas": 3,
                                               "engine": {"pipeline_parallel_size": 4}}]),
                             ClusterSnapshot(nodes=()), 8)
    assert group.num_replicas == 3 and len(group.stages) == 2 and not group.stage_nodes
    assert group.spread == ({"CPU": 1.0, "GPU": 2.0},) * 2  # one bundle per node, distinct nodes
    assert group.stages[0]["num_gpus"] == 2
    (_, cpu), = plan_pools("app", llm(pools=[{"devices": "cpu", "nodes": 3, "cpus_per_replica": 2,
                                             "engine": {"tensor_parallel_size": 3}}]),
                           ClusterSnapshot(nodes=()), 0)
    assert cpu.spread == ({"CPU": 2.0},) * 3 and cpu.compute == "cpu"


def test_an_engine_over_nodes_runs_vllms_multi_node_mode() -> None:
    engine = VLLMEngine(model="/m", tensor_parallel_size=2, pipeline_parallel_size=2)
    head = " ".join(engine_argv(engine, "chat", "0.0.0.0", 9000, nnodes=2, node_rank=0,
                                master=("10.0.0.1", 29500)))
    assert "-m vllm.entrypoints.openai.api_server" in head
    for part in ("--pipeline-parallel-size 2", "--distributed-executor-backend mp", "--nnodes 2",
                 "--node-rank 0", "--master-addr 10.0.0.1", "--master-port 29500"):
        assert part in head
    other = engine_argv(engine, "chat", "0.0.0.0", 9000, nnodes=2, node_rank=1,
                        master=("10.0.0.1", 29500))
    assert other[1:3] == ["-m", "hetflow.workloads.serve.vllm_stage"]
    assert "--node-rank 1" in " ".join(other)
    with pytest.raises(ValueError, match="first node"):
        engine_argv(engine, "chat", "h", 1, nnodes=2, node_rank=1)
    with pytest.raises(InputError, match="pool 1: nodes 2 must divide .* = 3"):
        llm(pools=[{"nodes": 2, "engine": {"tensor_parallel_size": 3}}])
    with pytest.raises(InputError, match="nodes"):
        llm(pools=[{"nodes": 0}])


def test_without_hetflow_nodes_a_tensor_parallel_replica_takes_that_many_ray_gpus() -> None:
    groups = plan_pools("app", llm(pools=[{"devices": "gpu", "replicas": 2,
                                           "engine": {"tensor_parallel_size": 2}}]),
                        ClusterSnapshot(nodes=()), 4)
    (_, group), = groups
    assert group.num_replicas == 2 and group.ray_actor_options["num_gpus"] == 2


def test_the_front_door_balances_a_models_replicas_by_pool_weight() -> None:
    plan = llm_backend("chat", [("p1-r0", "127.0.0.1", 8001, 3), ("p2-r0", "10.0.0.2", 8002, 1)], 30)
    text = "\n".join(backend_sections((plan,), ""))
    assert "balance leastconn" in text and "uri /health" in text  # the default
    assert "maxconn" not in text  # no queue limit given to llm_backend: none
    chosen = llm(routing={"affinity": "prefix"}).routing  # (tests/serving/test_llm_routing.py)
    hashed = "\n".join(backend_sections((llm_backend("chat", [("p1-r0", "h", 1, 1)], 30, chosen),), ""))
    assert "balance hash req.body,bytes(0,256)" in hashed and "hash-type consistent" in hashed
    assert "hash-balance-factor 200" in hashed and "balance leastconn" not in hashed
    assert "timeout server 600s" in text  # not the 30 s of a predict: generations take minutes
    assert f"backend {plan.backend}" in text
    assert "server up-p1-r0 127.0.0.1:8001 weight 3 check" in text
    assert "server up-p2-r0 10.0.0.2:8002 weight 1 check" in text
    assert "del-header Authorization" in text  # a client's hetflow key never reaches an engine


def test_engine_command_line_and_environment() -> None:
    engine = VLLMEngine(model="/m", dtype="float32", max_model_len=512, enforce_eager=True,
                        kv_cache_gib=2, args={"seed": 3, "disable_log_stats": True, "x": False})
    argv = engine_argv(engine, "chat", "127.0.0.1", 9000)
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    joined = " ".join(argv)
    for part in ("--model /m", "--served-model-name chat", "--port 9000", "--max-model-len 512",
                 "--enforce-eager", "--seed 3", "--disable-log-stats"):
        assert part in joined
    assert "--x" not in argv
    cpu = engine_env(engine, "cpu", {"CUDA_VISIBLE_DEVICES": ""}, threads=2)
    assert cpu["VLLM_CPU_KVCACHE_SPACE"] == "2" and cpu["OMP_NUM_THREADS"] == "2"
    gpu = engine_env(engine, "gpu", {"CUDA_VISIBLE_DEVICES": "3"})
    assert gpu["CUDA_VISIBLE_DEVICES"] == "3" and "VLLM_CPU_KVCACHE_SPACE" not in gpu
    own = engine.model_copy(update={"env": {"NCCL_SOCKET_IFNAME": "eth1"}})
    assert engine_env(own, "gpu", {"CUDA_VISIBLE_DEVICES": "3"})["NCCL_SOCKET_IFNAME"] == "eth1"
    with pytest.raises(InputError, match="CUDA_VISIBLE_DEVICES is set by hetflow's placement"):
        llm(vllm={"model": "m", "env": {"CUDA_VISIBLE_DEVICES": "0"}})
    with pytest.raises(InputError, match="is not an environment variable name"):
        llm(pools=[{"engine": {"env": {"A B": "1"}}}])


def test_upstream_stats_sum_a_models_replicas() -> None:
    header = "# pxname,svname,scur,stot,econ,eresp,hrsp_5xx,rtime,status,\n"
    backend = llm_backend("chat", [], 30).backend
    rows = [f"{backend},p1-r0,2,30,0,0,1,10,UP,", f"{backend},p2-r0,0,10,0,0,0,30,DOWN,",
            f"{backend},BACKEND,2,40,0,0,1,15,UP,"]
    stats = read_upstream_stats(header + "\n".join(rows) + "\n")
    chat = stats[backend]
    assert chat["requests"] == 40 and chat["errors"] == 1 and chat["in_flight"] == 2
    assert chat["up"] and chat["response_ms"] == 15  # (10*30 + 30*10) / 40
    assert set(chat["servers"]) == {"p1-r0", "p2-r0"} and not chat["servers"]["p2-r0"]["up"]


VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="chat"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="chat"} 1.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="chat"} 0.25
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="chat"} 1200.0
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{engine="0",model_name="chat"} 300.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="chat"} 9.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="chat"} 10.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="chat"} 10.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="chat"} 0.5
# TYPE vllm:request_time_per_output_token_seconds histogram
vllm:request_time_per_output_token_seconds_count{engine="0",model_name="chat"} 10.0
vllm:request_time_per_output_token_seconds_sum{engine="0",model_name="chat"} 0.04
"""


def test_engine_metrics_become_per_pool_stats() -> None:
    from hetflow.workloads.serve.llm import pool_stats, read_engine_metrics

    one = read_engine_metrics(VLLM_METRICS)
    assert one["running"] == 3 and one["waiting"] == 1 and one["kv_cache"] == 0.25
    assert one["generation_tokens"] == 1200 and one["ttft_count"] == 10 and one["tpot_sum"] == 0.04
    fuller = {**one, "kv_cache": 0.75}
    servers = [("p1-r0", "h", 1, 3), ("p1-r1", "h", 2, 3), ("p2-r0", "h", 3, 1)]
    pools = pool_stats(servers, {"p1-r0": one, "p1-r1": fuller, "p2-r0": None})
    assert sorted(pools) == [1, 2]  # as users count pools (1 = the first), as --dry-run
    assert pools[1]["replicas"] == 2 and pools[1]["answering"] == 2
    assert pools[1]["running"] == 6 and pools[1]["generation_tokens"] == 2400
    assert pools[1]["kv_cache"] == 0.75  # the fullest engine's
    assert pools[2]["replicas"] == 1 and pools[2]["answering"] == 0 and pools[2]["running"] == 0


def test_pool_stats_are_prometheus_families() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from hetflow.workloads.serve.llm import pool_stats, read_engine_metrics
    from hetflow.workloads.serve.metrics import GatewayMetrics

    m = GatewayMetrics()
    m.llm_pools = {"chat": pool_stats([("p1-r0", "h", 1, 1)], {"p1-r0": read_engine_metrics(VLLM_METRICS)})}
    body, _ = m.render()
    samples = {(s.name, s.labels.get("pool")): s.value
               for f in text_string_to_metric_families(body.decode()) for s in f.samples
               if s.labels.get("model") == "chat"}
    assert samples[("hetflow_llm_generation_tokens_total", "1")] == 1200
    assert samples[("hetflow_llm_kv_cache_usage_ratio", "1")] == 0.25
    assert samples[("hetflow_llm_first_token_duration_seconds_count", "1")] == 10
    assert samples[("hetflow_llm_first_token_duration_seconds_sum", "1")] == 0.5


def test_the_dry_run_plan_lists_each_pools_engines_and_their_devices() -> None:
    """``hetflow serve --dry-run``'s plan (describe_plan) for an ``engine: vllm`` model: each
    pool's engines, where they would run (a tensor-parallel group's devices in rank order) and
    the routing."""
    from hetflow.core.topology import Allocation
    from hetflow.workloads.serve.plan import describe_plan

    config = serve_config_from_dict({"name": "app", "models": [{
        "name": "chat", "engine": "vllm", "vllm": {"model": "org/some-model"},
        "routing": {"affinity": "prefix"},
        "pools": [{"devices": "gpu", "replicas": 1, "weight": 4, "engine": {"tensor_parallel_size": 4}},
                  {"devices": "cpu", "replicas": 2, "cpus_per_replica": 2}]}]})
    dgx1 = ClusterSnapshot(nodes=(synthetic_node("8x V100", "dgx1"),),
                           allocations=(Allocation("someone-else", "dgx1", 0),))
    plan = describe_plan(config, {}, {"chat": plan_pools("app", config.models[0], dgx1, 0)})
    chat = plan["llm"]["chat"]
    assert chat["routing"]["affinity"] == "prefix" and chat["routing"]["balance_factor"] == 200
    tp, cpu = chat["engines"]
    assert tp["pool"] == 1 and tp["tensor_parallel_size"] == 4 and tp["weight"] == 4
    assert sorted(tp["devices"]) == ["dgx1:4", "dgx1:5", "dgx1:6", "dgx1:7"]
    assert cpu == {"pool": 2, "replicas": 2, "compute": "cpu", "devices": [], "ray_gpus": 0,
                   "tensor_parallel_size": 1, "weight": 1}


def test_an_llms_queue_limit_defaults_to_two_batches_per_engine() -> None:
    from hetflow.workloads.serve.plan import llm_queue_limit

    assert llm_queue_limit(llm()) == 512  # vLLM's max_num_seqs, 256, when not set
    assert llm_queue_limit(llm(vllm={"model": "m", "max_num_seqs": 8},
                               pools=[{"replicas": 1}, {"replicas": 1, "engine": {"max_num_seqs": 12}}])) == 24
    assert llm_queue_limit(llm(queue_limit=3)) == 3 and llm_queue_limit(llm(queue_limit=0)) == 0



def test_a_bad_front_door_nice_is_one_line() -> None:
    with pytest.raises(InputError, match="http.nice"):
        serve_config_from_dict({"name": "app", "http": {"nice": 25},
                                "models": [{"name": "chat", "engine": "vllm", "vllm": {"model": "m"}}]})
