"""Device samplers: NVML and amdsmi through the fake libraries, the CPU from /proc for real.

The fakes (tests/accelerators/fakes) follow nvidia-ml-py 13.615.71 and amdsmi 7.0.2: the
expected numbers below are what the fake GPUs are set to, converted by the units the real
libraries document (percent, bytes, milliwatts or watts, cumulative KiB/KB link counters).

    .venv/bin/python -m pytest -q tests/observability/test_samplers.py
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hetflow.accelerators import amd, nvidia
from hetflow.core.topology import Vendor
from hetflow.runtime.samplers import AmdSmiSampler, CpuSampler, NvmlSampler, open_sampler
from tests.accelerators.fakes import fake_amdsmi, fake_pynvml

GIB = 1 << 30
MIB = 1 << 20


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _busy_h100_box():
    box = fake_pynvml.h100_nvswitch_box()
    for i, gpu in enumerate(box.gpus):
        gpu.utilization_gpu = 10 * i
        gpu.memory_used = (i + 1) * GIB
        gpu.power_mw = 400_000 + 500 * i
        gpu.nvlink_tx_kib = [1000] * 18
        gpu.nvlink_rx_kib = [2000] * 18
    return box


# ---- NVML ------------------------------------------------------------------------------------


def test_nvml_sampler_reads_utilisation_memory_and_power_of_every_gpu() -> None:
    box = _busy_h100_box()
    sampler = NvmlSampler.open(fake_pynvml.install(box))
    assert sampler is not None
    samples = sampler.sample()

    assert [s.device for s in samples] == list(range(8))
    for i, s in enumerate(samples):
        assert s.vendor is Vendor.NVIDIA and s.name == "NVIDIA H100 80GB HBM3"
        assert s.utilisation == pytest.approx(i / 10)
        assert s.memory_used_bytes == (i + 1) * GIB
        assert s.memory_total_bytes == 81559 * MIB
        assert s.power_watts == pytest.approx(400 + 0.5 * i)
        assert s.link_fabric == "nvlink"
        assert s.link_tx_bytes_per_s is None  # one reading of a counter is not a rate yet
        # ... but the counters themselves are there from the first reading, in bytes
        assert s.link_tx_bytes == 18 * 1000 * 1024 and s.link_rx_bytes == 18 * 2000 * 1024
        assert s.counters() == {("nvlink", "tx"): 18 * 1000 * 1024, ("nvlink", "rx"): 18 * 2000 * 1024}
        assert s.pcie_tx_bytes is None  # the fake's driver has no PCIe counters here
    sampler.close()
    assert fake_pynvml.state.refcount == 0


@pytest.mark.parametrize("aggregate_scope", [True, False], ids=["scope-all-links", "per-link-fallback"])
def test_nvml_link_rate_is_the_counter_increase_over_time(aggregate_scope: bool) -> None:
    box = _busy_h100_box()
    for gpu in box.gpus:
        gpu.nvlink_aggregate_scope = aggregate_scope
    clock = Clock()
    sampler = NvmlSampler.open(fake_pynvml.install(box), clock=clock)
    sampler.sample()
    for gpu in box.gpus:  # 18 links: +500 KiB sent and +250 KiB received on each
        gpu.nvlink_tx_kib = [1500] * 18
        gpu.nvlink_rx_kib = [2250] * 18
    clock.now += 2.0
    second = sampler.sample()

    for s in second:
        assert s.link_tx_bytes_per_s == pytest.approx(18 * 500 * 1024 / 2.0)
        assert s.link_rx_bytes_per_s == pytest.approx(18 * 250 * 1024 / 2.0)
        assert (s.link_tx_bytes, s.link_rx_bytes) == (18 * 1500 * 1024, 18 * 2250 * 1024)


def test_nvml_counter_reset_gives_no_rate() -> None:
    box = _busy_h100_box()
    clock = Clock()
    sampler = NvmlSampler.open(fake_pynvml.install(box), clock=clock)
    sampler.sample()
    box.gpus[0].nvlink_tx_kib = [0] * 18  # the driver reset its counters
    clock.now += 1.0
    after = sampler.sample()[0]
    assert after.link_tx_bytes_per_s is None
    assert after.link_tx_bytes == 0  # the counter as the driver has it now


def test_nvml_pcie_counters_where_the_driver_has_them() -> None:
    box = fake_pynvml.pcie_pair_box()
    box.gpus[0].pcie_tx_bytes, box.gpus[0].pcie_rx_bytes = 5_000, 7_000
    sampler = NvmlSampler.open(fake_pynvml.install(box))
    first = sampler.sample()
    box.gpus[0].pcie_tx_bytes, box.gpus[0].pcie_rx_bytes = 9_000, 8_000
    second = sampler.sample()
    assert (first[0].pcie_tx_bytes, first[0].pcie_rx_bytes) == (5_000, 7_000)
    assert second[0].counters() == {("pcie", "tx"): 9_000, ("pcie", "rx"): 8_000}
    assert second[1].pcie_tx_bytes is None and second[1].counters() == {}  # NotSupported


def test_pcie_gpus_have_no_link_series_and_unsupported_power_is_unknown() -> None:
    box = fake_pynvml.pcie_pair_box()
    box.gpus[1].utilization_gpu, box.gpus[1].memory_used = 77, 3 * GIB
    sampler = NvmlSampler.open(fake_pynvml.install(box))
    first, second = sampler.sample(), sampler.sample()

    for s in first + second:
        assert s.link_fabric is None and s.link_tx_bytes_per_s is None
        assert s.link_tx_bytes is None and s.counters() == {}
        assert s.power_watts is None  # the fake answers NotSupported, as NVML may
    assert second[1].utilisation == pytest.approx(0.77)
    assert second[1].memory_used_bytes == 3 * GIB
    assert second[1].memory_total_bytes == 32607 * MIB


def test_nvml_sampler_numbers_devices_as_discovery_does() -> None:
    lib = fake_pynvml.install(fake_pynvml.v100_hybrid_mesh_box())
    discovered = [d.index for d in nvidia.discover(lib).devices]
    sampler = NvmlSampler.open(lib)
    assert [s.device for s in sampler.sample()] == discovered
    sampler.close()


def test_nvml_without_driver_is_no_sampler() -> None:
    assert NvmlSampler.open(fake_pynvml.install(fake_pynvml.no_driver_box())) is None
    assert NvmlSampler.open(fake_pynvml.install(fake_pynvml.empty_box())) is None


# ---- amdsmi ----------------------------------------------------------------------------------


def _busy_mi300x_box():
    box = fake_amdsmi.mi300x_xgmi_box()
    for i, p in enumerate(box.processors):
        p.gfx_activity = 20 + i
        p.vram_used = (i + 2) * GIB
        p.socket_power_w = 500 + i
        p.xgmi_read_kb = [10] * 7
        p.xgmi_write_kb = [20] * 7
    return box


def test_amdsmi_sampler_reads_activity_vram_power_and_xgmi_rates() -> None:
    box = _busy_mi300x_box()
    clock = Clock()
    sampler = AmdSmiSampler.open(fake_amdsmi.install(box), clock=clock)
    first = sampler.sample()
    for p in box.processors:  # 7 xGMI links: +100 KB read, +300 KB written on each
        p.xgmi_read_kb = [110] * 7
        p.xgmi_write_kb = [320] * 7
    clock.now += 4.0
    second = sampler.sample()

    assert [s.device for s in second] == list(range(8))
    for i, s in enumerate(second):
        assert s.vendor is Vendor.AMD and s.name == "AMD Instinct MI300X OAM"
        assert s.utilisation == pytest.approx((20 + i) / 100)
        assert s.memory_used_bytes == (i + 2) * GIB
        assert s.memory_total_bytes == fake_amdsmi.MI300X_VRAM
        assert s.power_watts == 500 + i
        assert s.link_fabric == "xgmi"
        assert s.link_tx_bytes_per_s == pytest.approx(7 * 300 * 1024 / 4.0)
        assert s.link_rx_bytes_per_s == pytest.approx(7 * 100 * 1024 / 4.0)
        assert s.counters() == {("xgmi", "tx"): 7 * 320 * 1024, ("xgmi", "rx"): 7 * 110 * 1024}
    assert first[0].link_rx_bytes_per_s is None
    assert first[0].link_rx_bytes == 7 * 10 * 1024  # the counter from the first reading on
    sampler.close()
    assert not fake_amdsmi.state.initialized


def test_amdsmi_na_values_are_unknown_not_zero() -> None:
    box = fake_amdsmi.pcie_pair_box()  # no link metrics, no power reading
    box.processors[0].gfx_activity = None  # amdsmi reports "N/A"
    sampler = AmdSmiSampler.open(fake_amdsmi.install(box))
    s0, s1 = sampler.sample()
    assert s0.utilisation is None and s1.utilisation == 0.0
    assert s0.power_watts is None and s0.link_fabric is None
    assert s0.memory_total_bytes == 24 * GIB


def test_amdsmi_sampler_numbers_partitions_by_hip_id_as_discovery_does() -> None:
    order = [15 - n for n in range(16)]  # HIP enumerates the partitions in reverse
    lib = fake_amdsmi.install(fake_amdsmi.mi300x_cpx_box(hip_ids=order))
    discovered = {d.index: d.pci_bus_id for d in amd.discover(lib).devices}
    box = fake_amdsmi.state.box
    for n, p in enumerate(box.processors):
        p.vram_used = n * MIB  # handle order n, so HIP id 15 - n
    sampler = AmdSmiSampler.open(lib)
    samples = {s.device: s for s in sampler.sample()}
    assert sorted(samples) == sorted(discovered) == list(range(16))
    for hip_id, s in samples.items():
        assert s.memory_used_bytes == (15 - hip_id) * MIB


# ---- CPU -------------------------------------------------------------------------------------


def _write_proc(tmp: Path, busy: tuple[int, ...], meminfo_kib: tuple[int, int]) -> tuple[Path, Path]:
    stat, meminfo = tmp / "stat", tmp / "meminfo"
    user, nice, system, idle, iowait, irq, softirq, steal = busy
    stat.write_text(f"cpu  {user} {nice} {system} {idle} {iowait} {irq} {softirq} {steal} 0 0\n"
                    f"cpu0 {user} {nice} {system} {idle} {iowait} {irq} {softirq} {steal} 0 0\n")
    total, available = meminfo_kib
    meminfo.write_text(f"MemTotal:       {total} kB\nMemFree:  1 kB\nMemAvailable:   {available} kB\n")
    return stat, meminfo


def test_cpu_utilisation_is_the_busy_share_of_jiffies_since_the_last_sample(tmp_path: Path) -> None:
    stat, meminfo = _write_proc(tmp_path, (100, 0, 50, 800, 50, 0, 0, 0), (16_000_000, 12_000_000))
    sampler = CpuSampler(stat, meminfo)
    # +60 user +15 system +5 irq busy; +100 idle +20 iowait not busy: 80 of 200 jiffies
    _write_proc(tmp_path, (160, 0, 65, 900, 70, 5, 0, 0), (16_000_000, 10_000_000))
    (s,) = sampler.sample()
    assert s.device == 0 and s.vendor is Vendor.CPU
    assert s.utilisation == pytest.approx(80 / 200)
    assert s.memory_total_bytes == 16_000_000 * 1024
    assert s.memory_used_bytes == 6_000_000 * 1024


def test_cpu_sampler_on_this_machine() -> None:
    total = next(int(l.split()[1]) * 1024 for l in open("/proc/meminfo") if l.startswith("MemTotal:"))
    sampler = CpuSampler()
    # Work for 0.2 s between the readings: /proc/stat counts in jiffies (1/100 s), and a
    # shorter gap can leave the counters unchanged, when utilisation is rightly unknown.
    import time

    deadline = time.monotonic() + 0.2
    while time.monotonic() < deadline:
        sum(i * i for i in range(10_000))
    (s,) = sampler.sample()
    assert s.utilisation is not None and 0.0 <= s.utilisation <= 1.0
    assert s.memory_total_bytes == total
    assert 0 < s.memory_used_bytes < total


def test_cpu_sampler_without_proc_files_reports_unknowns(tmp_path: Path) -> None:
    (s,) = CpuSampler(tmp_path / "none", tmp_path / "none2").sample()
    assert s.utilisation is None and s.memory_total_bytes is None


# ---- choosing ---------------------------------------------------------------------------------


def test_open_sampler_uses_the_library_of_the_nodes_vendor() -> None:
    nv = fake_pynvml.install(fake_pynvml.pcie_pair_box())
    am = fake_amdsmi.install(fake_amdsmi.pcie_pair_box())
    assert isinstance(open_sampler(Vendor.NVIDIA, nvidia_lib=nv, amd_lib=am), NvmlSampler)
    assert isinstance(open_sampler(Vendor.AMD, nvidia_lib=nv, amd_lib=am), AmdSmiSampler)
    assert isinstance(open_sampler(Vendor.CPU, nvidia_lib=nv, amd_lib=am), CpuSampler)


def test_open_sampler_falls_back_to_the_cpu_when_no_library_answers() -> None:
    nv = fake_pynvml.install(fake_pynvml.no_driver_box())
    am = fake_amdsmi.install(fake_amdsmi.init_failing_box())
    assert isinstance(open_sampler(None, nvidia_lib=nv, amd_lib=am), CpuSampler)
    assert isinstance(open_sampler(Vendor.AMD, nvidia_lib=nv, amd_lib=am), CpuSampler)
