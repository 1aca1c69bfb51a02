"""What ``hetflow launch`` runs: one frozen, validated ``LaunchSpec`` (CLI flags or a job file).

    LaunchSpec(script="train.py", args=("--epochs", "3"), nproc=2)
    LaunchSpec(module="pkg.train", nproc=8, tp=4, device="gpu", vendor="amd")

The same object is built from ``hetflow launch`` flags and from a controller job file's
``launch:`` section (``kind: launch``), so both refuse the same mistakes with the same words.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from hetflow.core.request import ParallelLayout
from hetflow.runtime.tracking import TrackingConfig
from hetflow.core.topology import AcceleratorVendor

ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


class LaunchSpec(BaseModel):
    """An unchanged torchrun-style script (or module) run as ``nproc`` ranks on planned devices."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    script: str | None = None
    """Path of the script (as for ``torchrun SCRIPT``); with ``working_dir``, a path inside it."""
    module: str | None = None
    """Module to run instead of a script (as ``torchrun -m MODULE``)."""
    args: tuple[str, ...] = ()
    """The script's own arguments, passed unchanged."""
    nproc: int = Field(1, gt=0)
    """Ranks (processes) in all, one device each (one CPU bundle each on CPU)."""
    tp: int = Field(1, gt=0)
    """Layout hint: ranks per tensor-parallel group (consecutive ranks, on the fastest links)."""
    pp: int = Field(1, gt=0)
    """Layout hint: pipeline stages (groups of tp ranks, neighbours next fastest)."""
    device: Literal["auto", "cpu", "gpu"] = "auto"
    """``auto``: GPUs when the cluster has them, else CPU; ``cpu``; ``gpu`` (fails without)."""
    vendor: AcceleratorVendor | None = None
    """Only GPUs of this vendor (hetflow-managed nodes)."""
    model: str | None = None
    """Only GPUs of this catalog model, e.g. ``H100`` or ``MI300X`` (hetflow-managed nodes)."""
    memory: str | None = None
    """Device memory each rank needs, e.g. ``40GiB`` (the planner picks devices that have it)."""
    cpus_per_rank: float | None = Field(None, gt=0)
    """CPUs Ray reserves for each rank. Default: 1 on a cluster; on the embedded local Ray,
    the machine's cores shared by the ranks (at most 1 each)."""
    max_restarts: int = Field(0, ge=0)
    """As torchrun's ``--max-restarts``: after a rank fails, stop every rank and start the
    whole group again, up to this many times."""
    visible_devices: Literal["node", "own"] = "node"
    """``node``: each rank sees the job's devices on its node in local-rank order, so
    ``cuda:LOCAL_RANK`` (``torch.cuda.set_device(LOCAL_RANK)``, as torchrun scripts do) is
    exactly its planned device and no other job's device is visible. ``own``: each rank sees
    only its own device (as ``cuda:0``)."""
    working_dir: str | None = None
    """A local directory shipped to every rank's node (Ray's runtime_env ``working_dir``);
    the ranks run inside it."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment variables for every rank (set last: they win)."""
    address: str | None = None
    """Ray cluster to join (``host:port``, ``auto``, ``ray://...``); default ``RAY_ADDRESS``,
    else an embedded local Ray started for this run."""
    stop_grace_s: float = Field(5.0, ge=0)
    """After SIGTERM, how long a rank may take to exit before it is killed."""
    placement_timeout_s: float = Field(120.0, gt=0)
    """How long to wait for Ray to commit the ranks' placement before giving up."""
    run_id: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    """``TORCHELASTIC_RUN_ID`` and the name of the run's log directory (default: generated)."""
    log_dir: str | None = None
    """Where each rank's output is kept (``rank-<k>.log``); default ``results/launch/<run_id>``."""
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    """MLflow tracking (``--mlflow URI``): the launch is one MLflow run - its settings, where
    each rank ran, the exit status, the rank logs - and the ranks get ``MLFLOW_RUN_ID`` and
    ``MLFLOW_TRACKING_URI``, so a script that logs to MLflow itself logs into that run."""

    @model_validator(mode="after")
    def _check(self) -> "LaunchSpec":
        if (self.script is None) == (self.module is None):
            raise ValueError("give exactly one of a script (SCRIPT) or a module (-m MODULE)")
        if self.nproc % (self.tp * self.pp):
            raise ValueError(f"--tp {self.tp} x --pp {self.pp} = {self.tp * self.pp} does not "
                             f"divide --nproc {self.nproc}; choose --nproc a multiple of tp x pp")
        import re

        for key in self.env:
            if not re.match(ENV_NAME, key):
                raise ValueError(f"environment variable name {key!r} is not valid; write K=V "
                                 "with K made of letters, digits and _")
        return self

    @property
    def layout(self) -> ParallelLayout:
        return ParallelLayout(dp=self.nproc // (self.tp * self.pp), pp=self.pp, tp=self.tp)

    def devices(self) -> dict[str, Any]:
        """Each rank's devices as a training config's ``resources.devices`` takes them."""
        return {k: v for k, v in (("kind", self.device), ("model", self.model), ("vendor", self.vendor),
                                  ("memory", self.memory)) if v is not None}

    @property
    def target(self) -> str:
        """What runs, as a user would write it: ``train.py`` or ``-m pkg.train``."""
        return self.script if self.script is not None else f"-m {self.module}"


__all__ = ["LaunchSpec"]
