"""Throughput tables: Gavel's measured file, CSV tables, the catalog roofline, group bandwidth."""

from __future__ import annotations

import math

import pytest

from hetflow.accelerators.synthetic import synthetic_node
from hetflow.core.errors import InputError, ParseError
from hetflow.scheduling.throughput import (
    BUILTIN_PROFILES,
    CompositeThroughputs,
    FixedDurationThroughputs,
    JobProfile,
    RooflineThroughputs,
    canonical_device_type,
    catalog_spec,
    group_bandwidth,
    load_csv_throughputs,
    load_gavel_throughputs,
    load_throughputs,
    ring_allreduce_s,
)
from tests.conftest import TRACES

GAVEL = TRACES / "gavel" / "simulation_throughputs.json"


@pytest.fixture(scope="module")
def gavel():
    return load_gavel_throughputs(GAVEL)


def test_gavel_file_loads_with_canonical_device_types(gavel) -> None:
    assert gavel.device_types() == ("K80", "P100", "V100-16GB")
    assert len(gavel.job_types()) == 26
    # 26 single-GPU keys + 19 each at 2, 4 and 8 GPUs, per device type (83 x 3).
    assert len(gavel.entries) == 83 * 3
    assert gavel.scale_factors("ResNet-50 (batch size 64)") == (1, 2, 4, 8)
    assert gavel.scale_factors("A3C") == (1,)
    # Values straight from the file's "null" entries.
    assert gavel.measured("ResNet-50 (batch size 64)", 1, "V100-16GB") == pytest.approx(4.394774823323071)
    assert gavel.measured("ResNet-50 (batch size 64)", 1, "K80") == pytest.approx(0.6190282202246573)
    assert gavel.measured("Recommendation (batch size 8192)", 1, "K80") == pytest.approx(2.698783123478088)


def test_gavel_cross_node_rates_are_used_when_a_gang_spans_nodes(gavel) -> None:
    lm = "LM (batch size 20)"
    # consolidated 497.3 steps/s on 8 V100s; unconsolidated 58.9 on the reference network
    assert gavel.rate(lm, 8, "V100-16GB") == pytest.approx(497.2952582330656)
    assert gavel.rate(lm, 8, "V100-16GB", 3.125, spans_nodes=True) == pytest.approx(58.88800403527842)
    # at twice the network bandwidth only the communication part halves:
    # step = 1/497.3 + (1/58.9 - 1/497.3) / 2
    expect = 1 / (1 / 497.2952582330656 + (1 / 58.88800403527842 - 1 / 497.2952582330656) / 2)
    assert gavel.rate(lm, 8, "V100-16GB", 6.25, spans_nodes=True) == pytest.approx(expect)
    # ResNet-50 x4 on V100 measured *faster* unconsolidated (11.1 > 9.45): no penalty, no gain
    assert gavel.rate("ResNet-50 (batch size 64)", 4, "V100-16GB", 3.125, True) == pytest.approx(9.451949566394442)


def test_unmeasured_gang_sizes_scale_linearly_and_unknown_types_are_zero(gavel) -> None:
    base = gavel.rate("ResNet-18 (batch size 32)", 8, "P100")
    assert gavel.rate("ResNet-18 (batch size 32)", 16, "P100") == pytest.approx(2 * base)
    assert gavel.rate("A3C", 4, "V100-16GB") == pytest.approx(4 * gavel.rate("A3C", 1, "V100-16GB"))
    assert gavel.rate("no such job", 1, "V100-16GB") == 0.0
    assert gavel.rate("A3C", 1, "H100-SXM") == 0.0


def test_gavel_file_errors_name_the_file(tmp_path) -> None:
    bad = tmp_path / "t.json"
    bad.write_text('{"v100": {"(\'A\', 1)": {"null": -3}}}')
    with pytest.raises(ParseError, match=r"t\.json.*rate -3"):
        load_gavel_throughputs(bad)
    bad.write_text('{"v100": {"A, 1": {"null": 3}}}')
    with pytest.raises(ParseError, match="scale factor"):
        load_gavel_throughputs(bad)
    bad.write_text("{not json")
    with pytest.raises(ParseError, match="not a readable JSON"):
        load_gavel_throughputs(bad)
    with pytest.raises(InputError, match="no such throughput file"):
        load_throughputs(tmp_path / "missing.json")


def test_csv_table_and_its_errors(tmp_path) -> None:
    good = tmp_path / "speeds.csv"
    good.write_text("job_type,num_gpus,device_type,steps_per_s,cross_node_steps_per_s\n"
                    "bert,1,MI300X,10,\n"
                    "bert,8,mi300x,70,20\n")
    t = load_throughputs(good)
    assert t.rate("bert", 1, "MI300X") == 10.0
    assert t.rate("bert", 8, "MI300X", 3.125, True) == pytest.approx(20.0)
    bad = tmp_path / "bad.csv"
    bad.write_text("job_type,num_gpus,device_type,steps_per_s\nbert,1,H100,10\nbert,two,H100,3\n")
    with pytest.raises(ParseError) as e:
        load_csv_throughputs(bad)
    assert e.value.line == 3 and "bad.csv:3" in str(e.value)
    bad.write_text("job,gpus\n")
    with pytest.raises(ParseError, match="missing columns"):
        load_csv_throughputs(bad)


def test_trace_spellings_go_through_the_catalog() -> None:
    assert canonical_device_type("v100") == "V100-16GB"
    assert canonical_device_type("V100M32") == "V100-32GB"
    assert canonical_device_type("T4") == "T4"
    assert canonical_device_type("G2") == "G2"  # undisclosed Alibaba code: its own type
    assert canonical_device_type("H100") == catalog_spec("H100").name


def test_roofline_follows_catalog_peaks_memory_and_links() -> None:
    roof = RooflineThroughputs.builtin()
    h100, l40s, mi300x = (catalog_spec(n) for n in ("H100", "L40S", "MI300X"))
    assert h100 and l40s and mi300x
    # 7B fine-tuning needs 70 GiB per device: no L40S (48 GB); fits 80 GB and 192 GB parts.
    assert roof.rate("llama-7b-finetune", 1, "L40S") == 0.0
    assert roof.rate("llama-7b-finetune", 1, "H100") > 0
    # A compute-bound fp32 job runs faster on the L40S than on the H100 (higher fp32 peak)...
    assert (roof.rate("rl-fp32", 1, "L40S") / roof.rate("rl-fp32", 1, "H100")
            == pytest.approx(l40s.fp32_tflops / h100.fp32_tflops))
    # ...and a memory-bound one in proportion to memory bandwidth.
    assert (roof.rate("dlrm", 1, "MI300X") / roof.rate("dlrm", 1, "H100")
            == pytest.approx(mi300x.memory_bandwidth_gbps / h100.memory_bandwidth_gbps))
    # Communication: 8 GPUs over a 25 GB/s network are slower than over 450 GB/s NVSwitch,
    # by exactly the ring all-reduce time difference.
    p = {x.name: x for x in BUILTIN_PROFILES}["gpt-1.3b"]
    fast, slow = roof.rate("gpt-1.3b", 8, "H100", 450.0), roof.rate("gpt-1.3b", 8, "H100", 25.0)
    assert 1 / slow - 1 / fast == pytest.approx(
        ring_allreduce_s(8, p.gradient_bytes, 25.0 * 0.75) - ring_allreduce_s(8, p.gradient_bytes, 450.0 * 0.75))


def test_roofline_with_a_hand_made_device() -> None:
    from hetflow.accelerators.spec import AcceleratorSpec
    from hetflow.core.topology import Vendor

    spec = AcceleratorSpec("toy", Vendor.AMD, (), 10 * 10**9, None, 100.0, 100.0, 50.0, 1000.0,
                           None, None, None, None, None, "test")
    roof = RooflineThroughputs({"j": JobProfile("j", 45e12, 0.0, 0.0, 1e9)}, lookup=lambda n: spec)
    # 45 TFLOP per step at 100 TFLOPS x 0.45 efficiency = 1 s per step
    assert roof.rate("j", 1, "toy") == pytest.approx(1.0)
    big = RooflineThroughputs({"j": JobProfile("j", 1e12, 0, 0, 20e9)}, lookup=lambda n: spec)
    assert big.rate("j", 1, "toy") == 0.0  # 20 GB does not fit 10 GB


def test_composite_and_fixed_duration() -> None:
    both = CompositeThroughputs((RooflineThroughputs.builtin(), FixedDurationThroughputs()))
    assert both.rate("fixed-duration", 3, "anything") == 1.0
    assert both.knows("resnet50") and not both.knows("nope")
    assert "fixed-duration" in both.job_types()


def test_group_bandwidth_adds_dedicated_links_and_takes_the_slowest_device() -> None:
    mi300x = synthetic_node("8x MI300X", "m")  # xGMI full mesh, 64 GB/s per pair
    assert group_bandwidth(mi300x, [0, 1]) == pytest.approx(64.0)
    assert group_bandwidth(mi300x, list(range(8))) == pytest.approx(7 * 64.0)
    h100 = synthetic_node("8x H100", "h")  # NVSwitch: the port is shared, 450 GB/s
    assert group_bandwidth(h100, [0, 1]) == group_bandwidth(h100, list(range(8))) == pytest.approx(450.0)
    assert group_bandwidth(h100, [3]) == math.inf
