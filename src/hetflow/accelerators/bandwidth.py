"""Estimated GB/s for a link between two devices, from the catalog rows of its two ends.

The placement planner ranks device groups by these numbers, so what matters most is their
order; the magnitudes are nominal peaks (GB/s per direction) from the catalog, whose link
figures follow ``tests/fixtures/topology/BANDWIDTH.md``. A bandwidth a tool reported is
kept as it is; only links with ``bandwidth_gbps is None`` get an estimate, and every estimate
carries a note that says how it was made ("catalog: ..." when every figure came from catalog
rows, "assumed: ..." when a default stood in for an unknown model or an unreported count).

=============  ==========================================================================
kind           estimate
=============  ==========================================================================
NVLINK         count x per-link GB/s of the NVLink generation (NVLink 2/3/4: 25, NVLink 5:
               50; unknown model: 25). Count not reported: 1 link.
NVSWITCH       min(count, links_per_device) x per-link (every pair gets the GPU's NVLink
               bandwidth through the switches). Count not reported: links_per_device.
XGMI           per-link (MI200: 50, MI300-series: 64, MI350-series: 76.5; unknown: 50) x
               count (default 1), discounted over the xGMI hops estimated from the KFD
               weight (15 per hop: 15 -> 1, 30 -> 2, 45 -> 3; no weight: 1 hop). See the
               fabric rule below for the discount.
SAME_PACKAGE   the catalog's ``same_package_gbps`` (MI250X GCD pair: 200, MI300X CPX
               partitions: 819.2). Without it (MIG instances cannot do peer-to-peer):
               the PCIe estimate at level PHB, a copy staged through the host.
PCIE           PCIe x16 GB/s of the slower end (gen3 15.75, gen4 31.5, gen5 63; unknown
               model: gen4) x level factor:  PIX 1.0 > PXB 0.9 > PHB 0.8 > NODE 0.7 >
               SYS 0.5; level not reported: 0.5 (as bad as SYS).
UNKNOWN        the PCIe SYS estimate: any two devices of a node can at least copy through
               host memory, and an unknown path must not rank above any known one.
=============  ==========================================================================

Fabric rule (NVLINK, NVSWITCH, XGMI): a GPU-to-GPU fabric never ranks at or below the PCIe
path of the same two devices (their PIX estimate, the best PCIe can do). With ``direct`` the
fabric figure above and ``floor`` that PCIe PIX estimate::

    estimate = floor + max(direct - floor, 1% of direct) / hops

so a one-hop link keeps its nominal figure whenever it beats PCIe (H100 NVSwitch 450, MI300X
xGMI 64 > PCIe5 63), each extra xGMI hop shares out only the advantage over PCIe (MI250X:
50, 40.75, 37.67 GB/s for weights 15, 30, 45 over PCIe4 31.5), and a fabric slower than the
host link (one NVLink 5 link, 50 < PCIe5 63) still ranks just above it. Dividing the whole
figure by the hop count would put a 3-hop MI250X pair (16.7) below PCIe PIX (31.5), the
opposite of the real order.

Resulting order for one generation, strictly: NVSwitch H100 450 > xGMI MI300X 64 > PCIe5 PIX
63 > PXB 56.7 > PHB 50.4 > NODE 44.1 > SYS 31.5.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from hetflow.accelerators.spec import AcceleratorSpec
from hetflow.core.topology import Link, LinkKind, PcieLevel

PCIE_LEVEL_FACTOR: dict[PcieLevel, float] = {
    PcieLevel.PIX: 1.0,
    PcieLevel.PXB: 0.9,
    PcieLevel.PHB: 0.8,
    PcieLevel.NODE: 0.7,
    PcieLevel.SYS: 0.5,
}
UNKNOWN_LEVEL_FACTOR = 0.5  # a level nobody reported ranks as badly as SYS
DEFAULT_PCIE_GBPS = 31.5  # PCIe 4.0 x16 when the model is unknown
DEFAULT_NVLINK_GBPS = 25.0  # NVLink 2/3/4 per link (BANDWIDTH.md): unknown models predate NVLink 5
DEFAULT_XGMI_GBPS = 50.0  # MI200-era xGMI per link, the slowest Instinct fabric
XGMI_WEIGHT_PER_HOP = 15  # KFD adds 15 per xGMI hop (API-NOTES.md)
FABRIC_MARGIN = 0.01  # a fabric slower than PCIe still ranks this share of itself above it

_FAMILY_PREFIX = {LinkKind.NVLINK: "nvlink", LinkKind.NVSWITCH: "nvlink", LinkKind.XGMI: "xgmi"}
_FAMILY_DEFAULT = {"nvlink": DEFAULT_NVLINK_GBPS, "xgmi": DEFAULT_XGMI_GBPS}
_FAMILY_LABEL = {"nvlink": "NVLink", "xgmi": "xGMI"}


def estimate_link(
    link: Link, spec_a: AcceleratorSpec | None, spec_b: AcceleratorSpec | None
) -> Link:
    """``link`` with ``bandwidth_gbps`` and ``bandwidth_note`` filled from the catalog.

    A link that already has a bandwidth (reported by a tool) is returned unchanged. A spec is
    None when that end's model is unknown; defaults then stand in and the note says so.
    """
    hint = link.bandwidth_note in DRIVER_MAXIMA
    if link.bandwidth_gbps is not None and not (hint and spec_a and spec_b):
        return link
    ends = _Ends(spec_a, spec_b)
    gbps, note = _ESTIMATORS[link.kind](link, ends)
    if hint:
        note += f"; the driver reports {link.bandwidth_gbps:g} GB/s max (not a line rate)"
    return dataclasses.replace(link, bandwidth_gbps=round(gbps, 3), bandwidth_note=note)


# Driver-reported min/max figures (KFD io_link properties, as amd-smi/amdsmi print them) are not
# line rates: one MI300X platform reports 50000 MB/s between GPUs whose xGMI runs at 64 GB/s
# (see tests/fixtures/topology/BANDWIDTH.md). When both ends' models are in the catalog the
# catalog estimate is used, so nodes described by different tools rank alike; the driver's
# figure stays in the note. Measured figures (rocm-bandwidth-test) and line rates (amd-smi xgmi)
# are kept as they are.
DRIVER_MAXIMA = frozenset({
    "reported by amd-smi (max)",
    "reported by amdsmi (max)",
    "reported by KFD io_link max_bandwidth",
})


def pcie_level_factor(level: PcieLevel | None) -> float:
    """The share of the x16 PCIe rate assumed for a path through ``level`` (None: unknown)."""
    if level is None:
        return UNKNOWN_LEVEL_FACTOR
    return PCIE_LEVEL_FACTOR.get(level, UNKNOWN_LEVEL_FACTOR)


def xgmi_hops(weight: int | None) -> int:
    """xGMI hops estimated from a KFD link weight: 15 per hop, at least 1 (None: 1)."""
    if weight is None:
        return 1
    return max(1, round(weight / XGMI_WEIGHT_PER_HOP))


@dataclasses.dataclass(frozen=True)
class _Figure:
    """A number with where it came from; ``assumed`` holds the reason when it is a default."""

    value: float
    label: str
    assumed: str | None = None


@dataclasses.dataclass(frozen=True)
class _Ends:
    """The catalog rows of a link's two ends (None: model unknown)."""

    a: AcceleratorSpec | None
    b: AcceleratorSpec | None

    @property
    def specs(self) -> tuple[AcceleratorSpec | None, AcceleratorSpec | None]:
        return (self.a, self.b)

    def pcie(self) -> _Figure:
        """PCIe x16 GB/s of the slower end; an unknown end counts as PCIe4."""
        figures = []
        for spec in self.specs:
            if spec is not None and spec.pcie_gbps is not None:
                figures.append(_Figure(spec.pcie_gbps, f"PCIe x16 {spec.pcie_gbps:g} GB/s"))
            else:
                who = spec.name if spec is not None else "model unknown"
                label = f"PCIe x16 {DEFAULT_PCIE_GBPS:g} GB/s"
                figures.append(_Figure(DEFAULT_PCIE_GBPS, label, f"{who}: PCIe4"))
        return min(figures, key=lambda f: f.value)

    def fabric_rows(self, kind: LinkKind) -> list[AcceleratorSpec]:
        """The ends whose catalog fabric is of ``kind``'s family (NVLink or xGMI)."""
        prefix = _FAMILY_PREFIX[kind]
        return [
            s for s in self.specs
            if s is not None
            and s.link_generation is not None
            and s.link_generation.lower().startswith(prefix)
            and s.link_gbps_per_link is not None
        ]

    def per_link(self, kind: LinkKind) -> _Figure:
        """Per-link GB/s of the fabric family, the slower end's; a default when none is known."""
        rows = self.fabric_rows(kind)
        if rows:
            row = min(rows, key=lambda s: s.link_gbps_per_link or 0.0)
            return _Figure(row.link_gbps_per_link or 0.0, f"{row.link_generation}")
        family = _FAMILY_PREFIX[kind]
        default = _FAMILY_DEFAULT[family]
        return _Figure(default, _FAMILY_LABEL[family], f"model unknown: {default:g} GB/s per link")

    def same_package(self) -> _Figure | None:
        values = [s.same_package_gbps if s is not None else None for s in self.specs]
        if any(v is None for v in values):
            return None
        names = sorted({s.name for s in self.specs if s is not None})
        value = min(v for v in values if v is not None)
        return _Figure(value, f"same package ({', '.join(names)})")


# ---------------------------------------------------------------------- per kind


def _estimate_pcie(link: Link, ends: _Ends) -> tuple[float, str]:
    level = link.pcie_level
    gbps, label, assumed = _pcie_at(level, ends, level.name if level else "level not reported")
    return gbps, _note(label, assumed)


def _pcie_at(
    level: PcieLevel | None, ends: _Ends, level_label: str
) -> tuple[float, str, str | None]:
    """PCIe estimate at ``level``: (GB/s, description, assumption or None)."""
    pcie = ends.pcie()
    factor = pcie_level_factor(level)
    return pcie.value * factor, f"{pcie.label} x {factor:g} ({level_label})", pcie.assumed


def _estimate_unknown(link: Link, ends: _Ends) -> tuple[float, str]:
    gbps, label, assumed = _pcie_at(PcieLevel.SYS, ends, "SYS")
    return gbps, _note(label, "link kind not reported: ranked as the slowest host path", assumed)


def _estimate_same_package(link: Link, ends: _Ends) -> tuple[float, str]:
    figure = ends.same_package()
    if figure is not None:
        return figure.value, _note(f"{figure.label} {figure.value:g} GB/s")
    gbps, label, assumed = _pcie_at(PcieLevel.PHB, ends, "PHB")
    reason = "no on-package figure in the catalog: copy staged through the host"
    return gbps, _note(label, reason, assumed)


def _estimate_nvlink(link: Link, ends: _Ends) -> tuple[float, str]:
    per = ends.per_link(link.kind)
    assumptions = [per.assumed]
    if link.count is not None:
        count = link.count
    else:
        count = 1
        assumptions.append("count not reported: 1 link")
    label = f"{per.label} {count} x {per.value:g} GB/s"
    return _fabric(label, count * per.value, 1, ends, assumptions)


def _estimate_nvswitch(link: Link, ends: _Ends) -> tuple[float, str]:
    per = ends.per_link(link.kind)
    assumptions = [per.assumed]
    known_links = [s.links_per_device for s in ends.fabric_rows(link.kind) if s.links_per_device]
    per_device = min(known_links) if known_links else None
    if link.count is not None and per_device is not None:
        count = min(link.count, per_device)
    elif link.count is not None:
        count = link.count
    elif per_device is not None:
        count = per_device
    else:
        count = 1
        assumptions.append("count and model unknown: 1 link")
    label = f"{per.label} {count} x {per.value:g} GB/s"
    return _fabric(label, count * per.value, 1, ends, assumptions)


def _estimate_xgmi(link: Link, ends: _Ends) -> tuple[float, str]:
    per = ends.per_link(link.kind)
    count = link.count if link.count is not None else 1
    hops = xgmi_hops(link.weight)
    label = f"{per.label} {count} x {per.value:g} GB/s, {hops} hop{'s' if hops > 1 else ''}"
    assumptions = [per.assumed]
    if link.weight is not None:
        label += f" (weight {link.weight})"
    else:
        assumptions.append("weight not reported: 1 hop")
    return _fabric(label, count * per.value, hops, ends, assumptions)


def _fabric(
    label: str, direct: float, hops: int, ends: _Ends, assumptions: list[str | None]
) -> tuple[float, str]:
    """Apply the fabric rule (module docstring): stay strictly above the pair's PCIe PIX."""
    floor = ends.pcie()
    estimate = floor.value + max(direct - floor.value, FABRIC_MARGIN * direct) / hops
    if estimate != direct:
        label += (
            f"; over PCIe x16 {floor.value:g}: {floor.value:g} + "
            f"max({direct:g} - {floor.value:g}, {FABRIC_MARGIN:.0%}) / {hops} = {estimate:.2f}"
        )
        assumptions = assumptions + [floor.assumed]
    return estimate, _note(label, *assumptions)


def _note(label: str, *assumptions: str | None) -> str:
    reasons = [a for a in assumptions if a]
    if reasons:
        return f"assumed: {label} ({'; '.join(reasons)})"
    return f"catalog: {label}"


_ESTIMATORS: dict[LinkKind, Callable[[Link, _Ends], tuple[float, str]]] = {
    LinkKind.SAME_PACKAGE: _estimate_same_package,
    LinkKind.NVLINK: _estimate_nvlink,
    LinkKind.NVSWITCH: _estimate_nvswitch,
    LinkKind.XGMI: _estimate_xgmi,
    LinkKind.PCIE: _estimate_pcie,
    LinkKind.UNKNOWN: _estimate_unknown,
}
