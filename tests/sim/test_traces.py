"""Trace loaders on the real files in data/traces (some xz-compressed), on malformed rows, and the generator."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from hetflow.core.errors import InputError, ParseError
from hetflow.scheduling.throughput import FIXED_DURATION, load_gavel_throughputs
from hetflow.sim.traces import (
    detect_format,
    load_gavel_trace,
    load_openb_nodes,
    load_openb_pods,
    load_philly_csv,
    load_trace,
    openb_packing_jobs,
    parse_synthetic_spec,
    synthetic_trace,
)
from tests.conftest import TRACES

GAVEL_DIR = TRACES / "gavel" / "philly_vc_traces_seed0"
PHILLY = TRACES / "philly" / "philly-first2000.csv"  # the first 2,000 of Sia's 82,247 rows (data/README.md)
OPENB = TRACES / "alibaba-gpu-2023"


@pytest.fixture(scope="module")
def gavel_speeds():
    return load_gavel_throughputs(TRACES / "gavel" / "simulation_throughputs.json")


# ------------------------------------------------------------------------------- Gavel


def test_gavel_7_column_trace_as_in_the_file() -> None:
    t = load_gavel_trace(GAVEL_DIR / "23dbec.trace")
    assert t.format == "gavel-7" and len(t.jobs) == 9
    first, third = t.jobs[0], t.jobs[2]
    assert (first.job_id, first.job_type, first.total_work, first.arrival_s, first.num_gpus) == (
        "0", "Transformer (batch size 128)", 14612.0, 0.0, 1)
    assert (third.job_type, third.total_work, third.arrival_s, third.num_gpus) == (
        "Transformer (batch size 256)", 19178.0, 182095.0, 8)
    assert Counter(j.num_gpus for j in t.jobs) == {1: 2, 8: 7}


def test_every_philly_vc_trace_loads() -> None:
    files = sorted(GAVEL_DIR.glob("*.trace*"))  # the 10 of 100 KiB or more as .trace.xz
    assert len(files) == 15 and sum(f.suffix == ".xz" for f in files) == 10
    total = sum(len(load_gavel_trace(f).jobs) for f in files)
    assert total == 15264  # one job per line, no scale-factor-0 rows in these files


def test_gavel_10_column_format(tmp_path) -> None:
    # A real 7-column row rewritten in the 10-column layout (working dir, weight 2, SLO 3600).
    row = (GAVEL_DIR / "795a4c.trace").read_text().splitlines()[1].split("\t")
    job_type, command, step_arg, data_dir, steps, arrival, scale = row
    ten = "\t".join([job_type, command, "/work", step_arg, data_dir, steps, scale, "2", "3600", arrival])
    skipped = "\t".join([job_type, command, "/work", step_arg, data_dir, steps, "0", "1", "-1", "5"])
    p = tmp_path / "ten.trace"
    p.write_text(skipped + "\n" + ten + "\n")
    t = load_gavel_trace(p)
    assert t.format == "gavel-10" and len(t.jobs) == 1
    j = t.jobs[0]
    assert (j.job_id, j.job_type, j.total_work, j.arrival_s, j.weight, j.slo_s) == (
        "1", "Recommendation (batch size 8192)", 1066.0, 1511.0, 2.0, 3600.0)


@pytest.mark.parametrize("bad_line, message", [
    ("A\tcmd\t-step\t1\tmany\t0.0\t1", "total steps 'many' is not an integer"),
    ("A\tcmd\t-step\t1\t10\tsoon\t1", "arrival time 'soon' is not a number"),
    ("A\tcmd\t-step\t1\t10\t0.0", "6 columns where the file has 7"),
    ("A\tcmd\t-step\t1\t-10\t0.0\t1", "must be > 0"),
])
def test_gavel_malformed_rows_name_file_and_line(tmp_path, bad_line: str, message: str) -> None:
    good = (GAVEL_DIR / "795a4c.trace").read_text().splitlines()[0]
    p = tmp_path / "bad.trace"
    p.write_text(f"{good}\n{good}\n{bad_line}\n")
    with pytest.raises(ParseError) as e:
        load_gavel_trace(p)
    assert e.value.line == 3 and str(e.value).startswith(f"{p}:3: ") and message in str(e.value)


def test_gavel_trace_of_unknown_width(tmp_path) -> None:
    p = tmp_path / "w.trace"
    p.write_text("a\tb\tc\n")
    with pytest.raises(ParseError, match="3 tab-separated columns; Gavel traces have 7 or 10"):
        load_gavel_trace(p)


# ------------------------------------------------------------------------------- Philly


def test_philly_log_as_fixed_duration_jobs() -> None:
    t = load_philly_csv(PHILLY)
    assert len(t.jobs) == 2000  # every row asks for GPUs
    first = t.jobs[0]  # the slice's earliest submission, file line 1986: 2017-09-07 09:57:50, 1 GPU, 2643038 s
    assert (first.job_id, first.arrival_s, first.num_gpus, first.total_work, first.job_type) == (
        "philly-1986", 0.0, 1, 2643038.0, FIXED_DURATION)
    # its last submission 2017-10-09 07:01:55 is 31 days, 21:04:05 after the first
    assert t.jobs[-1].arrival_s == 31 * 86400 + 21 * 3600 + 4 * 60 + 5
    assert Counter(j.num_gpus for j in t.jobs) == {1: 1901, 2: 49, 4: 20, 8: 30}


def test_philly_log_with_job_types_drawn_from_a_table(gavel_speeds) -> None:
    t = load_philly_csv(PHILLY, gavel_speeds, seed=3, limit=2000)
    assert len(t.jobs) == 2000
    assert {j.job_type for j in t.jobs} <= set(gavel_speeds.job_types())
    # work = duration x the drawn type's V100 rate; the seed makes the draw reproducible
    again = load_philly_csv(PHILLY, gavel_speeds, seed=3, limit=2000)
    assert [(j.job_type, j.total_work) for j in t.jobs] == [(j.job_type, j.total_work) for j in again.jobs]


def test_philly_malformed_rows(tmp_path) -> None:
    p = tmp_path / "p.csv"
    p.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n"
                 "2017-10-09 07:01:55,66.0,1,66.0,x\n"
                 "2017-10-09 07:01:55,-5,1,66.0,x\n")
    with pytest.raises(ParseError) as e:
        load_philly_csv(p)
    assert e.value.line == 3 and "duration must be > 0" in str(e.value)
    p.write_text("timestamp,duration,num_gpus\nyesterday,66.0,1\n")
    with pytest.raises(ParseError, match=r"p\.csv:2: timestamp 'yesterday'"):
        load_philly_csv(p)


# ------------------------------------------------------------------------------- Alibaba


def test_openb_node_list_is_a_heterogeneous_cluster() -> None:
    snap = load_openb_nodes(OPENB / "openb_node_list_gpu_node.csv")
    assert len(snap.nodes) == 1213 and snap.num_accelerators == 6212
    models = Counter(d.model for n in snap.nodes for d in n.devices)
    # V100M16 nodes: 28 x 4 + 19 x 1 + 8 x 8 GPUs; G2: 549 x 8
    assert models["V100-16GB"] == 195 and models["G2"] == 4392 and models["T4"] == 842
    first = snap.nodes[0]
    assert (first.name, first.cpu_cores, first.host_memory_bytes) == ("openb-node-0000", 64, 262144 * 2**20)
    everything = load_openb_nodes(OPENB / "openb_node_list_all_node.csv", gpu_only=False)
    assert len(everything.nodes) == 1523


def test_openb_pod_list_requests() -> None:
    t = load_openb_pods(OPENB / "openb_pod_list_default.csv")
    assert len(t.jobs) == 8152
    assert sum(1 for j in t.jobs if j.num_gpus == 0) == 1088
    assert sum(1 for j in t.jobs if j.num_gpus > 1) == 75
    pod1 = next(j for j in t.jobs if j.job_id == "openb-pod-0001")
    assert (pod1.gpu_milli, pod1.cpu_milli, pod1.memory_mib, pod1.arrival_s, pod1.total_work) == (
        460, 6000, 12288, 427061.0, 12902960 - 427061)
    assert not pod1.preemptible and pod1.allowed_types is None
    spec = load_openb_pods(OPENB / "openb_pod_list_gpuspec33.csv")
    pod9 = next(j for j in spec.jobs if j.job_id == "openb-pod-0009")
    assert pod9.allowed_types == frozenset({"V100-16GB", "V100-32GB"})


@pytest.mark.parametrize("row, message", [
    ("p,100,100,2,500,,LS,Running,0,10,0", "only one GPU can be shared"),
    ("p,100,100,1,1500,,LS,Running,0,10,0", "0 <= gpu_milli <= 1000"),
    ("p,100,100,1,x,,LS,Running,0,10,0", "gpu_milli 'x' is not an integer"),
    ("p,100,100,1,500,,LS", "fields where the header has 11"),
])
def test_openb_malformed_pods(tmp_path, row: str, message: str) -> None:
    header = (OPENB / "openb_pod_list_default.csv").read_text().splitlines()[:2]
    p = tmp_path / "pods.csv"
    p.write_text("\n".join(header + [row]) + "\n")
    with pytest.raises(ParseError) as e:
        load_openb_pods(p)
    assert e.value.line == 3 and message in str(e.value)


def test_openb_malformed_nodes(tmp_path) -> None:
    p = tmp_path / "nodes.csv"
    p.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,1024,2,\n")
    with pytest.raises(ParseError, match=r"nodes\.csv:2: node n0 has 2 GPUs but no model"):
        load_openb_nodes(p)


def test_packing_arrivals_exceed_capacity_and_never_leave() -> None:
    pods = load_openb_pods(OPENB / "openb_pod_list_default.csv").jobs
    jobs = openb_packing_jobs(pods, 6212, overload=1.3, seed=1)
    asked = sum(j.num_gpus * j.gpu_milli for j in jobs) / 1000
    assert 1.3 * 6212 <= asked < 1.3 * 6212 + 8
    assert all(math.isinf(j.total_work) and not j.preemptible for j in jobs)
    assert [j.arrival_s for j in jobs[:3]] == [0.0, 1.0, 2.0]
    assert len({j.job_id for j in jobs}) == len(jobs)


# ------------------------------------------------------------------------------- synthetic


def test_synthetic_trace_is_seeded_and_gavel_like(gavel_speeds) -> None:
    a = synthetic_trace(gavel_speeds, 3000, 6.0, seed=7)
    b = synthetic_trace(gavel_speeds, 3000, 6.0, seed=7)
    assert a.jobs == b.jobs
    assert a.jobs != synthetic_trace(gavel_speeds, 3000, 6.0, seed=8).jobs
    sizes = Counter(j.num_gpus for j in a.jobs)
    assert 0.66 < sizes[1] / 3000 < 0.74 and 0.03 < sizes[8] / 3000 < 0.07
    # Poisson arrivals at 6/hour: the mean gap is 600 s (within a few percent at 3000 jobs)
    assert a.jobs[-1].arrival_s / 2999 == pytest.approx(600, rel=0.06)
    # durations on the V100: 10^U(1.5, 3) or 10^U(3, 4) minutes, so 31.6 min .. 10^4 min
    minutes = [j.total_work / gavel_speeds.rate(j.job_type, j.num_gpus, "V100-16GB") / 60 for j in a.jobs]
    assert min(minutes) >= 10**1.5 - 1e-6 and max(minutes) <= 10**4 + 1e-6
    assert 0.15 < sum(m > 1000 for m in minutes) / len(minutes) < 0.25
    single = synthetic_trace(gavel_speeds, 200, 6.0, seed=1, multi_gpu=False)
    assert {j.num_gpus for j in single.jobs} == {1}


def test_synthetic_spec_and_format_detection(tmp_path, gavel_speeds) -> None:
    assert parse_synthetic_spec("synthetic:jobs=10,rate=2.5,seed=4") == {"jobs": 10, "rate": 2.5, "seed": 4}
    with pytest.raises(InputError, match="synthetic trace option 'speed=3'"):
        parse_synthetic_spec("synthetic:speed=3")
    assert len(load_trace("synthetic:jobs=12,rate=3", gavel_speeds).jobs) == 12
    assert detect_format(GAVEL_DIR / "795a4c.trace") == "gavel"
    assert detect_format(PHILLY) == "philly"
    assert detect_format(OPENB / "openb_pod_list_default.csv") == "openb-pods"
    assert detect_format(OPENB / "openb_node_list_gpu_node.csv") == "openb-nodes"
    other = tmp_path / "x.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(InputError, match="not a trace hetflow knows"):
        detect_format(other)
    with pytest.raises(InputError, match="pass it as --cluster"):
        load_trace(str(OPENB / "openb_node_list_gpu_node.csv"), gavel_speeds)
