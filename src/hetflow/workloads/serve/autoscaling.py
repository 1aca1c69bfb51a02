"""The ``autoscaling`` section of a served model or of an LLM pool (``engine: vllm``):
Ray Serve's ``autoscaling_config`` fields, which both scalers read (hetflow's own replicas are
scaled by Ray Serve; an LLM pool's engines by the front door, :mod:`hetflow.workloads.serve.scaling`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_REPLICAS = 100_000
"""The most replicas one model (or LLM pool) may ask for. Past the numeric bounds of the
serving config (timeouts: a day; a batch: 65,536 rows; queues: 1,000,000) the config is refused
in one line: larger values overflow HAProxy's or Serve's own limits, or wait forever."""


class AutoscalingConfig(BaseModel):
    """Autoscaling of one model's replicas by ongoing requests per replica: Ray Serve's for
    hetflow's own replicas, hetflow's front door's for an ``engine: vllm`` pool (an engine's
    ongoing requests: those it runs plus those waiting in its queue, from its own metrics)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    min_replicas: int = Field(1, ge=1, le=MAX_REPLICAS)
    """Fewest replicas kept running (at least one, so the gateway can tell 'down' from idle)."""
    max_replicas: int = Field(4, ge=1, le=MAX_REPLICAS)
    """Most replicas; on hetflow nodes this many are planned (by memory) up front."""
    initial_replicas: int | None = Field(None, ge=1)
    """Replicas at start (default: ``min_replicas``)."""
    target_ongoing_requests: float = Field(16.0, gt=0)
    """Ongoing requests per replica the autoscaler aims at. With batching, about one or two
    batches' worth of requests."""
    upscale_delay_s: float = Field(3.0, ge=0)
    """How long the load must stay above target before replicas are added."""
    downscale_delay_s: float = Field(30.0, ge=0)
    """How long the load must stay below target before replicas are removed."""

    @model_validator(mode="after")
    def _bounds(self) -> "AutoscalingConfig":
        initial = self.initial_replicas or self.min_replicas
        if not self.min_replicas <= initial <= self.max_replicas:
            raise ValueError(f"need min_replicas <= initial_replicas <= max_replicas, got "
                             f"{self.min_replicas}, {initial}, {self.max_replicas}")
        return self

    def to_serve(self) -> dict[str, Any]:
        """The ``autoscaling_config`` dict Ray Serve takes."""
        return {
            "min_replicas": self.min_replicas,
            "initial_replicas": self.initial_replicas or self.min_replicas,
            "max_replicas": self.max_replicas,
            "target_ongoing_requests": self.target_ongoing_requests,
            "upscale_delay_s": self.upscale_delay_s,
            "downscale_delay_s": self.downscale_delay_s,
        }
