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
"""

from __future__ import annotations

import math
import time

from hetflow.sim.llm_pools import PRIMARY, SETTINGS, evaluate, load_cluster, load_model


def _fmt(x: float, digits: int = 1) -> str:
    return "n/a" if math.isnan(x) else f"{x:.{digits}f}"


def main() -> None:
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
    import json

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
    print(f"RESULT sim_over_helix={p.sim_over_helix:.2f} setting={PRIMARY} engines={p.runnable_replicas} "
          f"helix_tokens_s={p.helix:.1f} {extra} wall_s={time.perf_counter() - t0:.2f}")


if __name__ == "__main__":
    main()
