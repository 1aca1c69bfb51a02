"""What a job asks for: a parallel layout (or a plain device count) and device constraints.

``ParallelLayout`` owns the degrees dp x pp x tp and the rank order; ``PlacementRequest`` adds
memory per device, device constraints, exclusive/shared use and pack/spread. Both are frozen
and validated on construction: a bad value raises :class:`~hetflow.core.errors.InputError`
saying what was wrong and how to write it.

Rank order (the contract every other layer relies on): data-parallel outermost, pipeline in the
middle, tensor-parallel innermost::

    rank = (dp_index * pp + pp_index) * tp + tp_index

so the ``tp`` ranks of one tensor-parallel group are consecutive, and one data-parallel
replica is ``pp * tp`` consecutive ranks. The mesh axes are named by :class:`MeshAxis` in
that order, as ``torch.distributed.device_mesh.init_device_mesh(..., mesh_dim_names=...)``
expects them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from hetflow.core.errors import InputError
from hetflow.core.topology import Vendor

WHATEVER_FITS = -1  # a degree of -1 is resolved by the planner to the largest value that fits


class MeshAxis(str, enum.Enum):
    """Names of the device-mesh axes, outermost first (the rank order above)."""

    DP = "dp"
    PP = "pp"
    TP = "tp"


class Strategy(str, enum.Enum):
    """How to spread a job over nodes when several choices are equally good for bandwidth.

    ``pack`` fills nodes that are already partly used and leaves whole free nodes free (less
    fragmentation); ``spread`` puts data-parallel replicas on different nodes, emptiest first
    (fault isolation, host memory and network per replica).
    """

    PACK = "pack"
    SPREAD = "spread"


@dataclass(frozen=True)
class ParallelLayout:
    """Degrees of data (dp), pipeline (pp) and tensor (tp) parallelism.

    Each degree is a positive integer; at most one may be ``-1`` (``WHATEVER_FITS``), which the
    planner replaces by the largest value for which enough usable devices exist
    (:meth:`resolve`).
    """

    dp: int = 1  # data-parallel replicas (outermost axis)
    pp: int = 1  # pipeline stages per replica
    tp: int = 1  # devices per tensor-parallel group (innermost axis, on the fastest links)

    def __post_init__(self) -> None:
        for axis in MeshAxis:
            value = getattr(self, axis.value)
            if isinstance(value, bool) or not isinstance(value, int):
                raise InputError(f"{axis.value} must be a whole number, got {value!r}")
            if value < 1 and value != WHATEVER_FITS:
                raise InputError(
                    f"{axis.value} must be >= 1, or -1 for 'whatever fits', got {value}"
                )
        if len(self.unresolved_axes) > 1:
            names = " and ".join(a.value for a in self.unresolved_axes)
            raise InputError(f"only one of dp, pp, tp may be -1 ('whatever fits'), got {names}")

    @property
    def unresolved_axes(self) -> tuple[MeshAxis, ...]:
        return tuple(a for a in MeshAxis if getattr(self, a.value) == WHATEVER_FITS)

    @property
    def is_resolved(self) -> bool:
        return WHATEVER_FITS not in (self.dp, self.pp, self.tp)  # cheap: asked on every plan

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(dp, pp, tp)``, in :class:`MeshAxis` order."""
        return (self.dp, self.pp, self.tp)

    @property
    def axis_names(self) -> tuple[str, str, str]:
        return tuple(a.value for a in MeshAxis)  # type: ignore[return-value]

    @property
    def world_size(self) -> int:
        """Number of ranks (= devices). Only defined once resolved."""
        assert self.is_resolved, f"resolve {self} before asking for its world size"
        return self.dp * self.pp * self.tp

    @property
    def num_tp_groups(self) -> int:
        assert self.is_resolved
        return self.dp * self.pp

    def fixed_product(self) -> int:
        """Product of the degrees that are not -1."""
        product = 1
        for value in self.shape:
            if value != WHATEVER_FITS:
                product *= value
        return product

    def resolve(self, num_devices: int) -> "ParallelLayout | None":
        """Fill the -1 degree with the largest value that fits in ``num_devices``.

        Returns ``self`` when already resolved, and ``None`` when not even a degree of 1 fits
        (the caller reports why devices are missing).
        """
        if self.is_resolved:
            return self
        (axis,) = self.unresolved_axes
        value = num_devices // self.fixed_product()
        if value < 1:
            return None
        return replace(self, **{axis.value: value})

    def rank(self, dp_index: int, pp_index: int, tp_index: int) -> int:
        assert 0 <= dp_index < self.dp and 0 <= pp_index < self.pp and 0 <= tp_index < self.tp
        return (dp_index * self.pp + pp_index) * self.tp + tp_index

    def coords(self, rank: int) -> tuple[int, int, int]:
        """``(dp_index, pp_index, tp_index)`` of a rank; inverse of :meth:`rank`."""
        assert 0 <= rank < self.world_size, f"rank {rank} outside world of {self.world_size}"
        group, tp_index = divmod(rank, self.tp)
        dp_index, pp_index = divmod(group, self.pp)
        return dp_index, pp_index, tp_index

    def tp_group_ranks(self, dp_index: int, pp_index: int) -> range:
        start = self.rank(dp_index, pp_index, 0)
        return range(start, start + self.tp)

    def describe(self) -> str:
        def show(v: int) -> str:
            return "?" if v == WHATEVER_FITS else str(v)

        return f"dp {show(self.dp)} x pp {show(self.pp)} x tp {show(self.tp)}"


@dataclass(frozen=True)
class PlacementRequest:
    """One job's request for devices.

    Give exactly one of ``count`` or ``layout``. A plain ``count`` of n means n devices that
    communicate with each other (one gang, like a tensor-parallel group): it is planned as
    ``ParallelLayout(dp=1, pp=1, tp=n)`` so the n devices land on the fastest links available.
    For independent replicas ask for ``ParallelLayout(dp=n)`` instead.

    Within one job every rank gets its own device; ``exclusive=False`` lets the job share
    devices *with other jobs* by memory (small inference replicas).
    """

    job_id: str
    count: int | None = None  # n devices forming one gang; or give ``layout``
    layout: ParallelLayout | None = None
    memory_bytes: int | None = None  # needed per device; required when sharing
    memory_note: str | None = None  # where memory_bytes came from ("given", an estimate formula)
    vendor: Vendor | None = None  # only devices of this vendor
    model: str | None = None  # only models starting with these words: "H100" = "H100-SXM", "H100-PCIe"
    arch: str | None = None  # only this architecture (case-insensitive), e.g. "gfx942"
    min_memory_bytes: int | None = None  # only devices with at least this much memory in total
    exclusive: bool = True  # False: share devices with other jobs by free memory
    strategy: Strategy = Strategy.PACK
    mixed_models: bool = False  # True: a tensor-parallel group may mix device models (one vendor always)

    def __post_init__(self) -> None:
        if not isinstance(self.job_id, str) or not self.job_id:
            raise InputError("a request needs a non-empty job id")
        if (self.count is None) == (self.layout is None):
            raise InputError(
                f"job {self.job_id!r}: give either a device count or a layout (dp x pp x tp), "
                "not both and not neither"
            )
        if self.count is not None:
            if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
                raise InputError(f"job {self.job_id!r}: device count must be >= 1, got {self.count!r}")
        for name in ("memory_bytes", "min_memory_bytes"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise InputError(f"job {self.job_id!r}: {name} must be a byte count >= 0, got {value!r}")
        if not self.exclusive and not self.memory_bytes:
            raise InputError(
                f"job {self.job_id!r}: sharing devices needs the memory per device "
                "(give --mem, e.g. --mem 20GiB, or estimate it from the parameter count)"
            )
        if self.vendor is not None and not isinstance(self.vendor, Vendor):
            raise InputError(f"job {self.job_id!r}: vendor must be one of {[v.value for v in Vendor]}")
        if not isinstance(self.strategy, Strategy):
            raise InputError(f"job {self.job_id!r}: strategy must be one of {[s.value for s in Strategy]}")

    @classmethod
    def parse(cls, job_id: str, *, count: int | None = None, layout: ParallelLayout | None = None,
              memory: str | int | None = None, memory_note: str | None = None,
              vendor: str | Vendor | None = None, model: str | None = None, arch: str | None = None,
              min_memory: str | int | None = None, share: bool = False,
              strategy: str | Strategy = Strategy.PACK, mixed_models: bool = False) -> "PlacementRequest":
        """The request from values as users write them - the one path every other request shape
        (a job file's ``devices``, a training config's ``resources`` + ``layout``, a serving or
        tuning entry, ``hetflow plan``'s flags, ``hetflow.placement``'s keywords) goes through:
        sizes by :func:`~hetflow.core.units.parse_bytes` (``"40GiB"``), vendors by
        :func:`parse_vendor`, strategies by name; InputError saying what was wrong otherwise.
        Model names are matched when planning, by the catalog's one rule
        (:func:`hetflow.accelerators.catalog.model_matcher`)."""
        from hetflow.core.units import parse_bytes

        def size(value: str | int | None) -> int | None:
            return parse_bytes(value) if isinstance(value, str) else value

        if not isinstance(strategy, Strategy):
            try:
                strategy = Strategy(strategy)
            except ValueError:
                raise InputError(f"strategy must be one of {[s.value for s in Strategy]}, got {strategy!r}") from None
        return cls(job_id, count=count, layout=layout, memory_bytes=size(memory), memory_note=memory_note,
                   vendor=vendor if isinstance(vendor, Vendor) else parse_vendor(vendor), model=model or None,
                   arch=arch or None, min_memory_bytes=size(min_memory), exclusive=not share,
                   strategy=strategy, mixed_models=mixed_models)

    @property
    def parallel_layout(self) -> ParallelLayout:
        """The layout to plan: ``layout``, or one gang of ``count`` devices."""
        if self.layout is not None:
            return self.layout
        assert self.count is not None
        return ParallelLayout(dp=1, pp=1, tp=self.count)

    def describe(self) -> str:
        """One line: what is asked, e.g. ``16 devices (dp 2 x pp 2 x tp 4), >= 40.0 GiB each``."""
        from hetflow.core.units import format_bytes

        layout = self.parallel_layout
        if self.count is not None:
            what = f"{self.count} device{'s' if self.count != 1 else ''}"
        elif layout.is_resolved:
            what = f"{layout.world_size} devices ({layout.describe()})"
        else:
            what = f"devices for {layout.describe()}"
        parts = [what]
        if self.memory_bytes:
            free = " free" if not self.exclusive else ""
            parts.append(f">= {format_bytes(self.memory_bytes)}{free} each")
        for label, value in (("vendor", self.vendor.value if self.vendor else None),
                             ("model", self.model), ("arch", self.arch)):
            if value:
                parts.append(f"{label} {value}")
        if self.min_memory_bytes:
            parts.append(f"device memory >= {format_bytes(self.min_memory_bytes)}")
        parts.append("exclusive" if self.exclusive else "shared by memory")
        return ", ".join(parts)


def parse_vendor(text: str | None) -> Vendor | None:
    """``"AMD"`` -> ``Vendor.AMD``; an unknown name is an InputError listing the known ones."""
    if text is None:
        return None
    try:
        return Vendor(text.strip().lower())
    except ValueError:
        raise InputError(
            f"unknown vendor {text!r}; expected one of {', '.join(v.value for v in Vendor)}"
        ) from None


__all__ = [
    "MeshAxis", "ParallelLayout", "PlacementRequest", "Strategy", "WHATEVER_FITS", "parse_vendor",
]
