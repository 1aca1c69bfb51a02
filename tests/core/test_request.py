"""Requests: the validated parallel layout, its rank order, the request's checks, and the
memory-per-device estimate that can fill a request's memory."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from hetflow.core.errors import InputError
from hetflow.core.request import (
    MeshAxis, ParallelLayout, PlacementRequest, Strategy, WHATEVER_FITS, parse_vendor,
)
from hetflow.core.topology import Vendor
from hetflow.scheduling.memory import (
    bytes_per_param, describe_estimate, estimate_memory_per_device, parse_param_count,
)

GIB = 1024**3


# --- ParallelLayout ---------------------------------------------------------------------------


def test_layout_names_its_axes_outermost_first() -> None:
    layout = ParallelLayout(dp=2, pp=3, tp=4)
    assert layout.axis_names == ("dp", "pp", "tp") == tuple(a.value for a in MeshAxis)
    assert layout.shape == (2, 3, 4)
    assert layout.world_size == 24 and layout.num_tp_groups == 6
    assert layout.describe() == "dp 2 x pp 3 x tp 4"


@pytest.mark.parametrize("kwargs,message", [
    ({"tp": 0}, "tp must be >= 1"),
    ({"dp": -2}, "dp must be >= 1"),
    ({"pp": 1.5}, "pp must be a whole number"),
    ({"tp": True}, "tp must be a whole number"),
    ({"dp": -1, "tp": -1}, "only one of dp, pp, tp may be -1"),
])
def test_layout_rejects_bad_degrees(kwargs, message) -> None:
    with pytest.raises(InputError, match=message):
        ParallelLayout(**kwargs)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 4), st.integers(1, 8))
def test_rank_and_coords_are_inverse_and_tp_is_innermost(dp: int, pp: int, tp: int) -> None:
    layout = ParallelLayout(dp=dp, pp=pp, tp=tp)
    seen = []
    for d in range(dp):
        for p in range(pp):
            group = layout.tp_group_ranks(d, p)
            assert list(group) == list(range((d * pp + p) * tp, (d * pp + p + 1) * tp))
            for t in range(tp):
                rank = layout.rank(d, p, t)
                assert layout.coords(rank) == (d, p, t)
                seen.append(rank)
    assert seen == list(range(layout.world_size))  # dp outer, pp middle, tp inner


def test_minus_one_resolves_to_the_largest_degree_that_fits() -> None:
    layout = ParallelLayout(dp=WHATEVER_FITS, pp=2, tp=4)
    assert not layout.is_resolved and layout.unresolved_axes == (MeshAxis.DP,)
    assert layout.describe() == "dp ? x pp 2 x tp 4"
    assert layout.resolve(20) == ParallelLayout(dp=2, pp=2, tp=4)
    assert layout.resolve(7) is None  # not even one replica of 8
    assert ParallelLayout(tp=-1).resolve(5) == ParallelLayout(tp=5)
    fixed = ParallelLayout(dp=2)
    assert fixed.resolve(1) is fixed


# --- PlacementRequest -------------------------------------------------------------------------


def test_count_request_is_one_gang() -> None:
    r = PlacementRequest("j", count=4)
    assert r.parallel_layout == ParallelLayout(dp=1, pp=1, tp=4)
    assert r.strategy is Strategy.PACK and r.exclusive


@pytest.mark.parametrize("kwargs,message", [
    ({}, "either a device count or a layout"),
    ({"count": 2, "layout": ParallelLayout(tp=2)}, "either a device count or a layout"),
    ({"count": 0}, "device count must be >= 1"),
    ({"count": 1, "memory_bytes": -5}, "memory_bytes must be a byte count"),
    ({"count": 1, "exclusive": False}, "sharing devices needs the memory per device"),
    ({"count": 1, "vendor": "amd"}, "vendor must be one of"),
])
def test_request_rejects_contradictions(kwargs, message) -> None:
    with pytest.raises(InputError, match=message):
        PlacementRequest("j", **kwargs)


def test_request_needs_a_job_id() -> None:
    with pytest.raises(InputError, match="job id"):
        PlacementRequest("", count=1)


def test_request_describes_itself() -> None:
    r = PlacementRequest("j", layout=ParallelLayout(dp=2, pp=2, tp=4), memory_bytes=40 * GIB,
                         vendor=Vendor.AMD, exclusive=True)
    assert r.describe() == "16 devices (dp 2 x pp 2 x tp 4), >= 40.0 GiB each, vendor amd, exclusive"
    shared = PlacementRequest("s", count=1, memory_bytes=20 * GIB, exclusive=False)
    assert shared.describe() == "1 device, >= 20.0 GiB free each, shared by memory"


def test_parse_vendor() -> None:
    assert parse_vendor(" AMD ") is Vendor.AMD
    assert parse_vendor(None) is None
    with pytest.raises(InputError, match="unknown vendor 'intel'; expected one of nvidia, amd, cpu"):
        parse_vendor("intel")


# --- memory per device ------------------------------------------------------------------------


def test_bytes_per_param_follow_the_documented_formula() -> None:
    assert bytes_per_param("train", "bf16", "adam") == 16  # 2 + 2 + 4 master + 8 moments
    assert bytes_per_param("train", "bf16", "sgd") == 12
    assert bytes_per_param("train", "fp32", "adamw") == 16  # 4 + 4 + 8, no master copy
    assert bytes_per_param("inference", "bf16") == 2
    assert bytes_per_param("inference", "int4") == 0.5


def test_training_estimate_is_about_18_bytes_per_param_split_by_tp_and_pp() -> None:
    one = estimate_memory_per_device(7e9, runtime_overhead_bytes=0)
    assert one == int(7e9 * 18)
    split = estimate_memory_per_device(7e9, tp=4, pp=2, runtime_overhead_bytes=0)
    assert split == pytest.approx(one / 8, abs=1)
    assert estimate_memory_per_device(7e9, tp=4, pp=2) == split + GIB


def test_inference_estimate_is_bytes_per_param_times_1_2() -> None:
    got = estimate_memory_per_device(70e9, mode="inference", dtype="fp16", tp=8, runtime_overhead_bytes=0)
    assert got == pytest.approx(70e9 * 2 * 1.2 / 8, abs=1)


def test_sharding_divides_only_the_optimizer_side() -> None:
    plain = estimate_memory_per_device(1e9, runtime_overhead_bytes=0, activation_factor=1.0)
    sharded = estimate_memory_per_device(1e9, shard=8, runtime_overhead_bytes=0, activation_factor=1.0)
    assert plain == int(16e9)
    assert sharded == int(1e9 * (2 + 14 / 8))


@pytest.mark.parametrize("call,message", [
    (lambda: estimate_memory_per_device(0), "positive"),
    (lambda: estimate_memory_per_device(1e9, dtype="fp7"), "unknown dtype"),
    (lambda: estimate_memory_per_device(1e9, optimizer="lion"), "unknown optimizer"),
    (lambda: estimate_memory_per_device(1e9, mode="finetune"), "unknown mode"),
    (lambda: estimate_memory_per_device(1e9, tp=0), "tp must be"),
    (lambda: estimate_memory_per_device(1e9, activation_factor=0.5), "activation factor"),
])
def test_estimate_rejects_bad_inputs(call, message) -> None:
    with pytest.raises(InputError, match=message):
        call()


def test_parameter_counts_as_people_write_them() -> None:
    assert parse_param_count("7B") == 7e9
    assert parse_param_count("350m") == 350e6
    assert parse_param_count("1.3e9") == 1.3e9
    assert parse_param_count(1_000) == 1000.0
    with pytest.raises(InputError, match="cannot read parameter count"):
        parse_param_count("seven")
    assert describe_estimate(7e9, tp=2).startswith("estimated: 7e+09 params x 16 B/param (train adam, bf16)")


# --- one request type: every other shape parses into PlacementRequest -------------------------


def _shapes() -> dict[str, PlacementRequest]:
    """The same ask written in each request shape hetflow reads."""
    from hetflow.control.jobspec import job_from_dict
    from hetflow.workloads.train.config import config_from_dict

    job = job_from_dict({"name": "j", "kind": "python", "python": {"script": "/x.py"},
                         "devices": {"count": 4, "model": "H100", "vendor": "nvidia", "memory": "40GiB"}})
    train = config_from_dict({"name": "j", "layout": {"tp": 4},
                              "resources": {"devices": {"vendor": "nvidia", "model": "H100", "memory": "40GiB"}}},
                             source="test")
    return {
        "job file": job.placement_request,
        "train config": train.resources.placement_request("j", train.layout.parallel),
        "keywords": PlacementRequest.parse("j", layout=ParallelLayout(tp=4), memory="40 GiB",
                                           vendor="NVIDIA", model="H100"),
    }


def test_every_request_shape_parses_into_the_one_core_request() -> None:
    expected = PlacementRequest("j", layout=ParallelLayout(tp=4), memory_bytes=40 * 1024**3,
                                vendor=Vendor.NVIDIA, model="H100")
    for shape, request in _shapes().items():
        assert request == expected, shape


@pytest.mark.parametrize("kwargs, message", [
    ({"memory": "40 gigs"}, "40 gigs"),
    ({"vendor": "intel"}, "unknown vendor 'intel'"),
    ({"strategy": "scatter"}, "strategy must be one of"),
    ({"share": True}, "sharing devices needs the memory per device"),
])
def test_parsed_requests_say_what_was_wrong(kwargs, message) -> None:
    with pytest.raises(InputError, match=message):
        PlacementRequest.parse("j", count=1, **kwargs)
