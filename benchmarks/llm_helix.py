"""hetflow's LLM pools against Helix's placement, on Helix's own settings (issue 30, item 3).

    .venv/bin/python benchmarks/llm_helix.py          # a second or two, no network, no Ray

Helix (ASPLOS'25, ``Thesys-lab/Helix-ASPLOS25`` at 148b733) places layers of LLaMA-1 30B and
LLaMA-2 70B over 24- and 42-node clusters of A100-40GB / L4 / T4 (and V100, 2xL4, 2xT4, 4xT4)
nodes; its simulator gives each placement's offline decode throughput. Per setting this prints:

- Helix's throughput (its placement + max-flow routing; its artifact's printed result);
- engines inside one node (the whole model on one node, tensor parallel inside it): how many
  fit and their throughput;
- hetflow's pools as they are (``hetflow.sim.llm_pools``): engines over nodes of one type (a
  pool's ``nodes``: vLLM's multi-node mode, one pipeline stage a node), memory-respecting,
  routed by measured capacity - their replicas and estimated capacity; ``sim_over_helix`` is
  that over Helix's; Helix's own "separate pipelines" baseline (the same shape, its nodes filled
  past its memory limit), by its simulator, over Helix's (``pipelines_over_helix``); the same
  pools under equal weights, which the capacity rule avoids;
- pipelines over nodes of *several* types with an uneven layer split
  (``plan_mixed_pipelines``: what vLLM's pipeline parallelism over chosen nodes could run, not
  placed by hetflow yet), their estimated capacity over Helix's (``mixed_over_helix``).

The last line: ``RESULT sim_over_helix=<x> setting=<primary> ...`` (primary: LLaMA-2 70B on the
24-node cluster, Helix's headline single-cluster setting).

``--helix DIR`` (a checkout of Helix's repository at that commit: ``git clone
https://github.com/Thesys-lab/Helix-ASPLOS25 DIR && git -C DIR checkout 148b733``) also runs
Helix's own simulator on hetflow's engines - the runnable mixed pipelines ``sim_over_helix``
counts, each chain one pipeline - instead of hetflow's estimate (``benchmarks/helix_sim.py``,
one process per simulation, 12-19 minutes each two at a time on this machine's 2 cores):
``helix_sim_over_helix`` is that over Helix's figure for its own placement, by the same
simulator; ``--helix-own`` re-runs Helix's shipped layout of the primary setting too, for its
denominator.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hetflow.sim.llm_pools import PRIMARY, SETTINGS, evaluate, load_cluster, load_model


def _fmt(x: float, digits: int = 1) -> str:
    return "n/a" if math.isnan(x) else f"{x:.{digits}f}"


def helix_simulated(helix: str, own: bool, workers: int) -> dict[str, dict[str, float]]:
    """Per setting: Helix's simulator's tokens/s for hetflow's engines (``hetflow``) and, with
    ``own``, for Helix's shipped layout (``helix``; else its README's figure)."""
    from hetflow.sim.llm_pools import plan_mixed_pipelines

    runner = Path(__file__).with_name("helix_sim.py")
    jobs = []
    for setting in SETTINGS:
        model_name, cluster = setting.split("/")
        engines = plan_mixed_pipelines(load_model(model_name), load_cluster(cluster), uniform=True)
        chains = [[[n, k] for n, k in zip(e.nodes, e.stages)] for e in engines]
        jobs.append((setting, "hetflow", ["--chains", json.dumps(chains)]))
        if own and setting == PRIMARY:
            jobs.append((setting, "helix", ["--own"]))
    def run(job: tuple[str, str, list[str]]) -> tuple[str, str, float]:
        setting, side, flags = job
        folder = work / f"{setting.replace('/', '_')}_{side}"
        out = subprocess.run([sys.executable, str(runner), "--helix", helix, "--setting", setting,
                              "--work", str(folder), *flags], capture_output=True, text=True)
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
        if out.returncode != 0 or not lines:
            raise SystemExit(f"Helix's simulator failed on {setting} ({side}): {out.stderr.strip()[-800:]}")
        got = json.loads(lines[-1])
        print(f"  {setting} {side}: {got['decode_tokens_per_s']:.2f} tokens/s by Helix's simulator "
              f"({got['wall_s']:.0f} s)", flush=True)
        return setting, side, got["decode_tokens_per_s"]

    results: dict[str, dict[str, float]] = {s: {} for s in SETTINGS}
    with tempfile.TemporaryDirectory(prefix="hetflow-helix-") as tmp, ThreadPoolExecutor(workers) as pool:
        work = Path(tmp)  # the layouts and the gurobipy stand-in: gone also when a run fails
        for setting, side, value in pool.map(run, jobs):
            results[setting][side] = value
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--helix", metavar="DIR", help="a checkout of Helix's repository at 148b733: "
                        "its simulator on hetflow's engines too (minutes)")
    parser.add_argument("--helix-own", action="store_true", help="with --helix: re-run Helix's own layout of the primary setting")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="Helix simulations side by side")
    args = parser.parse_args()
    if args.helix and not (Path(args.helix) / "artifact_evaluation").is_dir():
        parser.exit(2, f"llm_helix.py: error: {args.helix} is no checkout of Helix-ASPLOS25 "
                       "(no artifact_evaluation folder)\n")
    t0 = time.perf_counter()
    print(f"{'setting':<20} {'helix':>7} {'engines':>7} {'pools':>7} {'ratio':>6} {'separate':>8} "
          f"{'sep/helix':>9} {'pp repl':>7} {'pp est':>7} {'sep est':>7} {'equal-w':>7} {'mix repl':>8} "
          f"{'mix est':>7} {'mix/helix':>9}")
    results = {}
    for setting in SETTINGS:
        r = evaluate(setting)
        results[setting] = r
        print(f"{setting:<20} {r.helix:7.1f} {r.node_engines:7d} {r.node_throughput:7.1f} "
              f"{r.sim_over_helix:6.2f} {r.separate:8.1f} {r.pipelines_over_helix:9.2f} "
              f"{r.pipeline_replicas:7d} {r.pipeline_estimate:7.1f} {_fmt(r.separate_estimate):>7} "
              f"{_fmt(r.equal_weights):>7} {r.mixed_replicas:8d} {r.mixed_estimate:7.1f} "
              f"{r.mixed_over_helix:9.2f}")
    print("why no engine: most layers one node holds (Helix's max_num_layers) against the model's")
    for setting in SETTINGS:
        model_name, cluster = setting.split("/")
        model = load_model(model_name)
        types = sorted(set(load_cluster(cluster)))
        held = ", ".join(f"{t} {model.devices[t].max_num_layers}" for t in types)
        print(f"  {setting}: {model.layers} layers; {held}")
    from hetflow.sim.llm_pools import plan_mixed_pipelines, pool_entries

    model, nodes = load_model(PRIMARY.split("/")[0]), load_cluster(PRIMARY.split("/")[1])
    print(f"the pools of {PRIMARY} (engines over mixed nodes, as a serving config's pools):")
    for entry in pool_entries(model, plan_mixed_pipelines(model, nodes, uniform=True), nodes):
        print("  - " + json.dumps(entry))
    p = results[PRIMARY]
    extra = " ".join(f"sim_over_helix_{s.replace('/', '_')}={results[s].sim_over_helix:.2f}"
                     for s in SETTINGS)
    extra += " " + " ".join(f"one_type_over_helix_{s.replace('/', '_')}={results[s].one_type_over_helix:.2f}"
                            for s in SETTINGS)
    extra += " " + " ".join(f"pipelines_over_helix_{s.replace('/', '_')}={results[s].pipelines_over_helix:.2f}"
                     for s in SETTINGS)
    extra += " " + " ".join(f"mixed_over_helix_{s.replace('/', '_')}={results[s].mixed_over_helix:.2f}"
                            for s in SETTINGS)
    if args.helix:
        print("Helix's simulator on hetflow's engines (each chain one pipeline), against Helix's placement:")
        simulated = helix_simulated(args.helix, args.helix_own, args.workers)
        for setting in SETTINGS:
            r = simulated[setting]
            r.setdefault("helix", results[setting].helix)
            print(f"  {setting:<20} hetflow {r['hetflow']:7.1f}  Helix {r['helix']:7.1f}  "
                  f"ratio {r['hetflow'] / r['helix']:.2f}  (hetflow's estimate {results[setting].sim_over_helix:.2f})")
        extra += f" helix_sim_over_helix={simulated[PRIMARY]['hetflow'] / simulated[PRIMARY]['helix']:.2f} "
        extra += " ".join(f"helix_sim_over_helix_{s.replace('/', '_')}={simulated[s]['hetflow'] / simulated[s]['helix']:.2f}"
                          for s in SETTINGS)
    print(f"RESULT sim_over_helix={p.sim_over_helix:.2f} setting={PRIMARY} engines={p.runnable_replicas} "
          f"helix_tokens_s={p.helix:.1f} {extra} wall_s={time.perf_counter() - t0:.2f}")


if __name__ == "__main__":
    main()
