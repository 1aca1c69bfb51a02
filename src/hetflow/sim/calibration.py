"""Reference results of the reference simulators, read for comparison (benchmark and tests).

- Gavel: ``data/traces/gavel-calibration/seed<s>/`` (FORMAT.md there): traces, the
  isolated throughputs, ``results.json`` and per-job ``jobs_<trace>_<policy>.csv``.
- FGD: ``data/traces/alibaba-gpu-2023/fgd-reference/`` (PROTOCOL.md there): the published
  per-seed allocation rows, the arrival orders and node ranks of seeds 42-51.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

from hetflow.sim.textio import existing, open_text, read_text

TRACE_FILES = {"single": "trace_single_r4.0_n1500_seed{s}.trace", "multi": "trace_multi_r2.0_n1000_seed{s}.trace"}


@dataclass(frozen=True)
class GavelCase:
    seed: int
    trace: str  # "single" or "multi"
    folder: Path

    @property
    def trace_path(self) -> Path:
        return self.folder / TRACE_FILES[self.trace].format(s=self.seed)

    @property
    def throughputs_path(self) -> Path:
        return self.folder / "throughputs_isolated.csv"

    def reference(self, policy: str) -> dict:
        """results.json's entry for this trace and policy (the completed run, not a FAILED one)."""
        entries = json.loads(read_text(existing(self.folder / "results.json")))
        name = self.trace_path.name
        ok = [e for e in entries if e["trace"] == name and e["policy"] == policy and e.get("status") == "ok"]
        if not ok:
            raise KeyError(f"{self.folder}/results.json has no completed {policy} run on {name}")
        return ok[-1]

    def reference_jct(self, policy: str) -> dict[int, float | None]:
        path = existing(self.folder / self.reference(policy)["per_job_csv"])
        with open_text(path) as f:
            return {int(r["job_id"]): (float(r["jct_s"]) if r["jct_s"] else None) for r in csv.DictReader(f)}


def gavel_cases(root: Path) -> list[GavelCase]:
    out = []
    for d in sorted(root.glob("seed*")):
        if (d / "results.json").is_file():
            seed = int(d.name[len("seed"):])
            out += [GavelCase(seed, t, d) for t in TRACE_FILES if (d / TRACE_FILES[t].format(s=seed)).is_file()]
    return out


def fgd_expected(root: Path, workload: str = "openb_pod_list_default",
                 metric: str = "allo") -> dict[tuple[str, int], dict[int, float]]:
    """``{(csv policy name, seed): {x: value}}`` from the published CSV: ``metric`` "allo"
    (allocation %) or "frag" (fragmentation amount, % of capacity)."""
    out: dict[tuple[str, int], dict[int, float]] = {}
    with open_text(existing(root / "expected_results" / f"analysis_{metric}_discrete.csv")) as f:
        for r in csv.DictReader(f):
            if r["workload"] != workload:
                continue
            out[(r["sc_policy"], int(r["seed"]))] = {
                int(k): float(v) for k, v in r.items() if k.isdigit() and v not in ("", None)}
    return out
