"""Autoscaled ``engine: vllm`` pools without an engine: the rule (engines wanted for the
ongoing requests, the delays), the planning of ``max_replicas`` engine slots on exact devices
up front, and the dry run. tests/serving/test_llm_autoscale_ray.py scales real vLLM engines."""

from __future__ import annotations

import pytest

from hetflow.accelerators.synthetic import synthetic_node
from hetflow.core.errors import Unschedulable
from hetflow.core.topology import ClusterSnapshot
from hetflow.workloads.serve.config import serve_config_from_dict
from hetflow.workloads.serve.llm import pool_slots
from hetflow.workloads.serve.plan import describe_plan, plan_pools
from hetflow.workloads.serve.scaling import ScaleClock, wanted_engines


def llm(**fields):
    doc = {"name": "chat", "engine": "vllm", "vllm": {"model": "org/some-model"}, **fields}
    return serve_config_from_dict({"name": "app", "models": [doc]}).models[0]


@pytest.mark.parametrize("ongoing, target, low, high, wanted", [
    (0, 4, 1, 3, 1),      # idle: the floor
    (4, 4, 1, 3, 1),      # exactly one engine's worth
    (4.5, 4, 1, 3, 2),    # a little over: one more
    (100, 4, 1, 3, 3),    # the ceiling
    (7, 2, 2, 8, 4),
    (0, 16, 2, 4, 2),
])
def test_a_pool_wants_ongoing_over_target_engines_within_its_bounds(ongoing, target, low, high, wanted) -> None:
    assert wanted_engines(ongoing, target, low, high) == wanted


def test_a_want_acts_only_once_it_has_held_for_its_delay() -> None:
    clock = ScaleClock()
    assert clock.step(1, 2, now=0.0, up_delay_s=5, down_delay_s=30) == 0  # began
    assert clock.step(1, 2, now=4.9, up_delay_s=5, down_delay_s=30) == 0
    assert clock.step(1, 2, now=5.0, up_delay_s=5, down_delay_s=30) == 1
    # the next step up waits a whole delay again, from the step taken
    assert clock.step(2, 3, now=6.0, up_delay_s=5, down_delay_s=30) == 0
    assert clock.step(2, 3, now=10.0, up_delay_s=5, down_delay_s=30) == 1
    # a want that falls back in between starts the count again
    assert clock.step(3, 2, now=11.0, up_delay_s=5, down_delay_s=30) == 0
    assert clock.step(3, 3, now=20.0, up_delay_s=5, down_delay_s=30) == 0
    assert clock.step(3, 2, now=21.0, up_delay_s=5, down_delay_s=30) == 0
    assert clock.step(3, 2, now=50.9, up_delay_s=5, down_delay_s=30) == 0
    assert clock.step(3, 2, now=51.0, up_delay_s=5, down_delay_s=30) == -1


def test_an_autoscaled_pool_plans_its_maximum_on_distinct_devices_and_starts_its_initial() -> None:
    snapshot = ClusterSnapshot(nodes=(synthetic_node("4x H100-SXM", "nv"),))
    entry = llm(pools=[{"devices": {"vendor": "nvidia"},
                        "autoscaling": {"min_replicas": 1, "initial_replicas": 2, "max_replicas": 3,
                                        "target_ongoing_requests": 8}},
                       {"devices": "cpu", "replicas": 1}])
    pool = entry.pools[0]
    assert (pool.initial_replicas, pool.planned_replicas) == (2, 3)
    assert (entry.pools[1].initial_replicas, entry.pools[1].planned_replicas) == (1, 1)
    groups = plan_pools("app", entry, snapshot, 0)
    slots = pool_slots(groups)
    assert len(slots[0]) == 3 and len(slots[1]) == 1
    devices = [(g.device.node, g.device.device) for g in slots[0]]
    assert len(set(devices)) == 3  # each engine slot its own device, held for it by the plan
    assert all(g.env["CUDA_VISIBLE_DEVICES"] == str(g.device.device) for g in slots[0])
    config = serve_config_from_dict({"name": "app", "models": [entry.model_dump(exclude_unset=True)]})
    described = describe_plan(config, {}, {"chat": groups})["llm"]["chat"]["engines"]
    scaled = [e for e in described if e["pool"] == 1]
    assert all(e["autoscaling"] == {"min_replicas": 1, "initial_replicas": 2, "max_replicas": 3,
                                    "target_ongoing_requests": 8} for e in scaled)
    assert all("autoscaling" not in e for e in described if e["pool"] == 2)


def test_a_model_level_autoscaling_scales_its_one_pool() -> None:
    entry = llm(autoscaling={"min_replicas": 1, "max_replicas": 2})
    (pool,) = entry.effective_pools
    assert pool.autoscaling is not None and pool.planned_replicas == 2 and pool.initial_replicas == 1


def test_an_autoscaled_pool_whose_maximum_does_not_fit_says_so() -> None:
    snapshot = ClusterSnapshot(nodes=(synthetic_node("2x H100-SXM", "nv"),))
    with pytest.raises(Unschedulable, match="replica 3 of 3 does not fit"):
        plan_pools("app", llm(pools=[{"devices": "gpu", "autoscaling": {"max_replicas": 3}}]), snapshot, 0)
    with pytest.raises(Unschedulable, match="replica 2 of 2 .*tensor_parallel_size 2"):
        plan_pools("app", llm(pools=[{"devices": "gpu", "autoscaling": {"max_replicas": 2},
                                      "engine": {"tensor_parallel_size": 2}}]), snapshot, 0)
