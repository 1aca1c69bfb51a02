"""One real H200 host, recorded two ways at the same minute: its vendor tools' output and the
snapshot hetflow's live NVML discovery took (``hetflow inventory --json``). Both came from
``scripts/device_check.sh`` on a lent H200 machine (tests/accelerators/recorded_h200/SOURCES.md).

The recorded files must describe the same device NVML did, and the real ``nvidia-smi topo -m``
there underlines its header with terminal codes even into a file.
"""

from __future__ import annotations

from pathlib import Path

from hetflow.accelerators.load import load_cluster, load_node
from hetflow.accelerators.recorded import nvidia as nv, parse_file, parse_text
from hetflow.accelerators.recorded.base import strip_terminal_codes
from hetflow.core.topology import Vendor
from tests.conftest import fixture_path

HERE = Path(__file__).parent / "recorded_h200"
MiB = 1024**2


def test_topology_matrix_with_terminal_codes_parses() -> None:
    raw = (HERE / "nvidia-smi-topo-m.txt").read_text()
    assert "\x1b[4m" in raw  # as the tool wrote it
    node = parse_file(HERE / "nvidia-smi-topo-m.txt")
    assert [(d.index, d.numa_node) for d in node.devices] == [(0, 0)]
    assert node.links == ()  # one GPU: nothing to link


def test_terminal_codes_change_nothing_a_parser_reads() -> None:
    plain = fixture_path("nvidia-h100-sxm5x8-nvswitch-2numa_nvidia-smi-topo-m.txt").read_text()
    lines = plain.split("\n")
    first = next(i for i, line in enumerate(lines) if "GPU0" in line)
    lines[first] = "\x1b[4m" + lines[first] + "\x1b[0m"
    lines[first + 1] = "\x1b[1;32m" + lines[first + 1] + "\x1b[0m"
    styled = "\n".join(lines)
    fmt = {f.name: f for f in nv.FORMATS}["nvidia-smi-topo-m"]
    a, b = fmt.parse(plain, "x"), parse_text(styled, "x")  # detected and parsed through them
    assert (a.devices, a.links) == (b.devices, b.links)
    assert len(b.devices) == 8 and b.links
    assert strip_terminal_codes(styled) == plain


def test_recorded_tools_agree_with_live_nvml() -> None:
    live = load_cluster(HERE / "inventory.json").nodes[0]
    assert live.sources == ("nvml", "cpu")
    (nvml,) = live.devices
    recorded = load_node([HERE / "nvidia-smi-q.xml", HERE / "nvidia-smi-topo-m.txt"], name="vm")
    (tools,) = recorded.devices
    assert nvml.vendor is tools.vendor is Vendor.NVIDIA
    assert nvml.memory_bytes == tools.memory_bytes == 143771 * MiB  # nvidia-smi: 143771 MiB
    for field in ("name", "model", "arch", "pci_bus_id", "uuid", "numa_node", "device_id"):
        assert getattr(tools, field) == getattr(nvml, field), field
    assert (nvml.model, nvml.arch, nvml.compute_units) == ("H200", "sm_90", 132)
    query = (HERE / "nvidia-smi-query.csv").read_text().splitlines()[1].split(", ")
    assert query[1] == nvml.name and query[2].lower().endswith(nvml.pci_bus_id[-7:].lower())
    assert query[3] == nvml.uuid and query[4] == "143771 MiB"
