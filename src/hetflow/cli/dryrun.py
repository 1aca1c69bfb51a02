"""``--dry-run`` output shared by train, launch, submit and run: what would be placed and started.

Text: one ``key: value`` line each, under a first line saying nothing was started; ``--json``:
``{"dry_run": true, ...}`` with the same facts as data. The facts come from
:mod:`hetflow.runtime.preview` (which starts nothing) and the verbs' own parsed inputs.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def show(lines: list[tuple[str, str]], data: dict[str, Any], as_json: bool) -> int:
    if as_json:
        json.dump({"dry_run": True, **data}, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        print("dry run: nothing was started")
        width = max(len(k) for k, _ in lines)
        for key, value in lines:
            print(f"  {key + ':':<{width + 1}} {value}")
    return 0


def train_plan(config: Any, cluster: Any, job_id: str) -> tuple[list[tuple[str, str]], dict[str, Any]]:
    """A training job's lines and data: its layout, the ranks' placement, what would start."""
    from hetflow.runtime.preview import preview_ranks
    from hetflow.workloads.models.spec import spec_label

    layout = config.layout
    ranks = preview_ranks(layout.parallel, config.resources, cluster, job_id)
    backend = "gloo" if ranks.devices == "cpu" else "nccl (RCCL on ROCm)"
    every = f"every {config.checkpoint.interval} steps" if config.checkpoint.interval else "at the end"
    lines = [
        ("ray", cluster.describe()),
        ("job", f"{config.name}: {spec_label(config.model)} on {config.dataset}, {config.train.steps} steps "
                f"x batch {config.train.batch_size}"),
        ("layout", f"dp {layout.dp} x pp {layout.pp} x tp {layout.tp} = {layout.parallel.world_size} ranks "
                   f"({layout.data_parallel})"),
        ("placement", ranks.how + (f": {' '.join(ranks.where)}" if ranks.where else "")),
        ("would start", f"{ranks.ranks} rank actor(s), one process each, {ranks.cpus_per_rank:g} CPU each, "
                        f"torch.distributed over {backend}"),
        ("checkpoints", f"{config.checkpoint_dir} {every}"
                        + ("; resumes from the newest there" if config.checkpoint.resume else "")),
    ]
    data = {"ray": cluster.to_dict(), "job": config.name, "model": spec_label(config.model),
            "dataset": config.dataset, "steps": config.train.steps,
            "layout": {"dp": layout.dp, "pp": layout.pp, "tp": layout.tp,
                       "world_size": layout.parallel.world_size, "data_parallel": layout.data_parallel},
            "placement": ranks.to_dict(), "backend": backend.split()[0],
            "checkpoint_dir": str(config.checkpoint_dir)}
    return lines, data
