"""Record this host's device utilisation while a workflow runs, for the report.

A daemon thread reads the host's sampler (NVML, amdsmi, else the CPU from /proc; see
:func:`hetflow.runtime.samplers.open_sampler`) every ``interval_s`` and keeps, per reading, the
seconds since the run started, the stage running then and each device's busy fraction and
memory used. Multi-node clusters have a metrics agent per node (docs/observability.md); the
report shows the driver's host.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class UtilisationRecorder:
    interval_s: float = 0.5
    samples: list[dict[str, Any]] = field(default_factory=list)
    stage: str = "start"
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> "UtilisationRecorder":
        from hetflow.runtime.samplers import open_sampler

        self._sampler = open_sampler()
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="hetflow-utilisation", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                readings = self._sampler.sample()
            except Exception:  # a sampler that fails mid-run must not fail the workflow
                continue
            t = time.monotonic() - self._t0
            for r in readings:
                self.samples.append({
                    "t_s": round(t, 3), "stage": self.stage,
                    "device": f"{r.vendor.value}:{r.device}",
                    "utilisation": r.utilisation, "memory_used_bytes": r.memory_used_bytes,
                })

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._sampler.close()
