"""The simulator's loaders read ``.gz`` and ``.xz`` files as the plain file (hetflow.sim.textio):
the same jobs, nodes and reference rows from a compressed copy of each real format, and one
clear line (exit 2) for a damaged one. The repository's own larger traces are xz files."""

from __future__ import annotations

import gzip
import lzma
import shutil
from pathlib import Path

import pytest

from hetflow.core.errors import ParseError
from hetflow.cli.main import main
from hetflow.scheduling.throughput import load_gavel_throughputs
from hetflow.sim.calibration import fgd_expected
from hetflow.sim.cluster import load_sim_snapshot
from hetflow.sim.fgd import load_fgd_pods, read_arrival_order
from hetflow.sim.gavel import load_throughput_table
from hetflow.sim.textio import decompressed_bytes, plain_name, plain_suffix, read_text
from hetflow.sim.traces import (detect_format, load_gavel_trace, load_openb_nodes, load_openb_pods, load_philly_csv,
                                load_trace)
from tests.conftest import TRACES

DATA = TRACES
VC = DATA / "gavel" / "philly_vc_traces_seed0"
OPENB = DATA / "alibaba-gpu-2023"
WRITERS = {"gz": lambda b: gzip.compress(b, mtime=0), "xz": lambda b: lzma.compress(b, format=lzma.FORMAT_XZ)}


def compressed_copy(src: Path, tmp_path: Path, kind: str) -> Path:
    out = tmp_path / f"{src.name}.{kind}"
    out.write_bytes(WRITERS[kind](src.read_bytes()))
    return out


@pytest.fixture(scope="module")
def speeds():
    return load_gavel_throughputs(DATA / "gavel" / "simulation_throughputs.json")


def test_names_without_their_compression_suffix() -> None:
    assert plain_name("a/6214e9.trace.xz") == "6214e9.trace" and plain_name("x.csv") == "x.csv"
    assert plain_suffix("pods.csv.GZ") == ".csv" and plain_suffix("t.trace") == ".trace"


@pytest.mark.parametrize("kind", ["gz", "xz"])
def test_every_trace_format_reads_the_same_compressed(kind: str, tmp_path: Path, speeds) -> None:
    plain = [VC / "51b7ef.trace", DATA / "philly" / "philly-first2000.csv", OPENB / "openb_pod_list_default.csv"]
    for src in plain:
        packed = compressed_copy(src, tmp_path, kind)
        assert detect_format(packed) == detect_format(src)
        assert load_trace(str(packed), speeds).jobs == load_trace(str(src), speeds).jobs, src.name
    assert load_philly_csv(compressed_copy(plain[1], tmp_path, kind), limit=10).jobs == load_philly_csv(
        plain[1], limit=10).jobs
    pods = compressed_copy(OPENB / "openb_pod_list_gpuspec33.csv", tmp_path, kind)
    assert load_openb_pods(pods).jobs == load_openb_pods(OPENB / "openb_pod_list_gpuspec33.csv").jobs
    assert [p.name for p in load_fgd_pods(pods)] == [p.name for p in load_fgd_pods(
        OPENB / "openb_pod_list_gpuspec33.csv")]


@pytest.mark.parametrize("kind", ["gz", "xz"])
def test_a_compressed_node_list_is_a_cluster(kind: str, tmp_path: Path) -> None:
    src = OPENB / "openb_node_list_gpu_node.csv"
    packed = compressed_copy(src, tmp_path, kind)
    a, b = load_sim_snapshot(str(packed)), load_openb_nodes(src)
    assert len(a.nodes) == len(b.nodes) == 1213 and a.num_accelerators == b.num_accelerators == 6212
    with pytest.raises(Exception, match="is a trace; --cluster takes"):
        load_sim_snapshot(str(compressed_copy(OPENB / "openb_pod_list_default.csv", tmp_path, kind)))


def test_the_repositorys_xz_traces_read_like_their_plain_bytes(tmp_path: Path) -> None:
    packed = VC / "6214e9.trace.xz"
    plain = tmp_path / "6214e9.trace"
    plain.write_bytes(lzma.decompress(packed.read_bytes()))
    assert load_gavel_trace(packed).jobs == load_gavel_trace(plain).jobs
    assert len(load_gavel_trace(packed).jobs) == 2000
    assert decompressed_bytes(packed) == plain.read_bytes() and read_text(packed) == plain.read_text()


def test_reference_readers_find_and_read_compressed_files(tmp_path: Path) -> None:
    ref = OPENB / "fgd-reference"
    order = read_arrival_order(ref / "arrival_order_seed42-51.csv.xz", 42, 8152)
    assert len(order) > 8152 and all(0 <= i < 8152 for i in order)  # inflated to 130 % with clones
    # fgd_expected names the plain file; the folder has only its .xz
    assert not (ref / "expected_results" / "analysis_allo_discrete.csv").exists()
    assert ("04-GpuPacking", 43) in fgd_expected(ref)
    calib = DATA / "gavel-calibration" / "seed3" / "throughputs_isolated.csv"
    assert load_throughput_table(compressed_copy(calib, tmp_path, "gz")) == load_throughput_table(calib)


@pytest.mark.parametrize("kind", ["gz", "xz"])
def test_a_damaged_compressed_trace_is_one_line_exit_2(kind: str, tmp_path: Path, capsys) -> None:
    good = compressed_copy(VC / "51b7ef.trace", tmp_path, kind).read_bytes()
    for name, data in (("truncated", good[: len(good) // 2]), ("not-compressed", b"plain text\tnot packed\n"),
                       ("not-text", WRITERS[kind](bytes(range(256)) * 8))):
        bad = tmp_path / f"{name}.trace.{kind}"
        bad.write_bytes(data)
        with pytest.raises(ParseError, match=rf"{bad.name}: not a (readable {'gzip' if kind == 'gz' else 'xz'}"
                                             rf" file|text file once decompressed)"):
            load_gavel_trace(bad)
        code = main(["simulate", "--cluster", "2 * 8x H100", "--trace", str(bad), "--out", str(tmp_path / "o")])
        err = capsys.readouterr().err
        assert code == 2 and err.startswith("hetflow: error: ") and err.count("\n") == 1, err


def test_simulate_runs_on_a_shipped_xz_trace(tmp_path: Path, capsys) -> None:
    src = tmp_path / "small.trace.xz"  # the first 40 jobs of a shipped .xz trace, packed again
    head = "\n".join(read_text(VC / "6c71a0.trace.xz").splitlines()[:40]) + "\n"
    src.write_bytes(lzma.compress(head.encode()))
    shutil.copy(DATA / "gavel" / "simulation_throughputs.json", tmp_path / "speeds.json")
    code = main(["simulate", "--cluster", "2 * 4x V100 + 2 * 4x K80", "--trace", str(src), "--throughputs",
                 str(tmp_path / "speeds.json"), "--policies", "fifo", "--out", str(tmp_path / "out")])
    assert code == 0, capsys.readouterr().err
    assert (tmp_path / "out" / "summary.json").is_file()
