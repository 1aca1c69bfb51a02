"""Helix's own simulator on one layout: the child process of ``benchmarks/llm_helix.py --helix``.

    python benchmarks/helix_sim.py --helix DIR --setting llama70b/cluster24 --chains JSON --work DIR
    python benchmarks/helix_sim.py --helix DIR --setting llama70b/cluster24 --own --work DIR

``DIR`` is a checkout of ``Thesys-lab/Helix-ASPLOS25`` at 148b733 (Apache 2.0; not shipped with
hetflow). ``--chains``: hetflow's engines as JSON, a list of chains of ``[node index, layers]``
in the cluster file's node order (``hetflow.sim.llm_pools.plan_mixed_pipelines``). The layout is
written the way Helix's own layout writer writes its MILP solutions - a solution file (each
node's layer range) and a simulator cluster file (each used node's VRAM, NIC and KV-cache
capacity from Helix's ``ModelManager`` for its layer count; the links from the cluster file) -
with two differences a layout of separate chains needs: only nodes that hold layers are listed
(Helix's max-flow graph asks every listed node for its throughput at its layer count), and the
links are only those along each chain (source -> first stage -> ... -> last stage -> sink), so
each chain is one pipeline, as one vLLM engine is. ``--own``: Helix's shipped MILP layout for the
setting instead (its paper's figure, re-run). Then Helix's offline simulation runs unchanged
(``step3_simulation.simulate_maxflow_offline``: its max-flow scheduler, 60 s warm-up, 600 s
measured) and one JSON line is printed: ``{"decode_tokens_per_s": ..., "wall_s": ...}``.

Two things are supplied at run time, Helix's files untouched: ``gurobipy`` (Helix imports it
everywhere; loading a layout needs no solver) as a stub that fails on use, and a memory patch:
Helix's simulator keeps every event and log entry it ever made (read only by a duplicate-uid
assertion, and never), past 20 GB on a 600 s 70B run; the patch keeps the uids and the log-time
assertion and nothing else - the simulated behaviour is the same (Helix's own 70B/24-node layout
gives 252.08 tokens/s through it, its README's 252.1).
"""

from __future__ import annotations

import argparse
import configparser
import json
import os
import sys
import time
from pathlib import Path

MODELS = {"llama70b": "LLaMa70B", "llama30b": "LLaMa30B"}  # Helix's ModelName members
OFFSET = 2  # Helix's solution files number compute nodes from 2 (0, 1: source and sink)
ARTIFACT = {"cluster24": "artifact_evaluation/single_cluster", "cluster42": "artifact_evaluation/high_heterogeneity"}
OWN = {  # Helix's shipped MILP layouts, relative to the artifact folder
    "llama70b/cluster24": ("./layout_llama70b/ilp/ilp_sol.ini", "./layout_llama70b/ilp/simulator_cluster.ini"),
    "llama70b/cluster42": ("./layout_llama70b/ilp/ilp_sol.ini", "./layout_llama70b/ilp/simulator_cluster.ini"),
}
STUB = '''"""gurobipy stand-in (hetflow's benchmarks/helix_sim.py): imports succeed, any use fails."""
class _Missing:
    def __init__(self, *a, **k):
        raise RuntimeError("gurobipy is not installed: only layouts that need no solver can be loaded")
Model = Var = Constr = LinExpr = QuadExpr = Env = _Missing
class GRB:
    INTEGER, BINARY, CONTINUOUS, INFINITY, MAXIMIZE, MINIMIZE = "I", "B", "C", float("inf"), -1, 1
    class Param: pass
    class Attr: pass
    class Callback:
        MIP = MIPSOL = MIPNODE = MIP_OBJBST = MIP_OBJBND = RUNTIME = 0
    class Status:
        OPTIMAL, INFEASIBLE, TIME_LIMIT = 2, 3, 9
def quicksum(*a, **k):
    raise RuntimeError("gurobipy is not installed")
'''


def machine_counts(cluster_file: str) -> dict[str, int]:
    cp = configparser.ConfigParser()
    cp.read(cluster_file)
    out: dict[str, int] = {}
    for i in range(int(cp["NodeNames"]["total_compute_nodes"])):
        t = cp[f"ComputeNode-{i}"]["type"]
        out[t] = out.get(t, 0) + 1
    return out


def write_layout(work: Path, model: str, cluster_file: str, chains: list[list[list[int]]],
                 counts: dict[str, int]) -> tuple[str, str]:
    """The solution and simulator cluster files of ``chains`` (module docstring)."""
    from simulator.event_simulator.utils import MB, mbps
    from simulator.initial_layout.load_existing_layout import LoadExistingLayout
    from simulator.model_manager.model_manager import ModelManager, ModelName

    ranges: dict[int, tuple[int, int]] = {}
    for chain in chains:
        start = 0
        for node, layers in chain:
            if node in ranges:
                raise SystemExit(f"helix_sim: node {node} is in two chains")
            ranges[node] = (start, start + layers)
            start += layers
    solution = work / "ilp_sol.ini"
    solution.write_text("[Settings]\n" f"offset={OFFSET}\n\n[Solution]\n" + "".join(
        f"compute_node_{OFFSET + n}={list(range(s, e))}\n" for n, (s, e) in sorted(ranges.items())))
    manager = ModelManager(model_name=getattr(ModelName, MODELS[model]), machine_num_dict=counts)
    layout = LoadExistingLayout(model_manager=manager)
    layout.from_ini(cluster_file_name=cluster_file, machine_profile_name="./config/machine_profiles.ini")
    layout.load_solution(solution_file_name=str(solution))
    nodes = layout.nodes

    def name(x) -> str:
        return x if x in ("source", "sink") else f"compute_node_{OFFSET + x}"

    links = {}
    for chain in chains:
        order = [n for n, _ in chain]
        for a, b in [("source", order[0]), *zip(order, order[1:]), (order[-1], "sink")]:
            link = layout.links.get((a, b)) or layout.links.get((b, a))
            if link is None:
                raise SystemExit(f"helix_sim: the cluster file has no link {name(a)} - {name(b)}")
            links[(a, b)] = link
    used = sorted(ranges)
    types = [t for t in layout.machine_profiles if t not in ("SourceNode", "SinkNode")]
    lines = ["# Simulator cluster file: hetflow's chains (benchmarks/helix_sim.py)\n",
             "[Coordinator]", f"inbound_nic_speed={layout.machine_profiles['SinkNode'].inbound_nic_speed / mbps} * mbps",
             f"outbound_nic_speed={layout.machine_profiles['SourceNode'].outbound_nic_speed / mbps} * mbps\n",
             "[MachineTypes]", f"types={types}\n", "[ComputeNodes]", f"names={[name(i) for i in used]}\n"]
    for i in used:
        m, k = nodes[i].machine_type, ranges[i][1] - ranges[i][0]
        lines += [f"[{name(i)}]", f"vram_size={m.vram_size / MB} * MB",
                  f"inbound_nic_speed={m.inbound_nic_speed / mbps} * mbps",
                  f"outbound_nic_speed={m.outbound_nic_speed / mbps} * mbps",
                  f"disk_speed={m.disk_speed / mbps} * mbps", f'machine_type="{m.type_name}"',
                  f"kv_cache_capacity={manager.get_kv_cache_capacity(machine_type=m.type_name, num_on_node_layers=k)}",
                  "activation_backup_capacity="
                  f"{manager.get_activation_backup_capacity(machine_type=m.type_name, num_on_node_layers=k)}\n"]
    lines += ["[Links]", f"names={[f'link_{name(a)}_{name(b)}' for a, b in links]}\n"]
    for (a, b), link in links.items():
        lines += [f"[link_{name(a)}_{name(b)}]", f"in={name(a)}", f"out={name(b)}",
                  f"latency={link.latency * 1000} * MilliSec", f"bandwidth={link.bandwidth / mbps} * mbps\n"]
    cluster = work / "simulator_cluster.ini"
    cluster.write_text("\n".join(lines))
    return str(solution), str(cluster)


def lean_memory() -> None:
    """Helix's simulator without its unread event and log history (module docstring)."""
    from simulator.event_simulator import cluster_simulator, logger

    class UidsOnly(dict):
        def __setitem__(self, key, value):
            super().__setitem__(key, None)

    class Nothing(list):
        def append(self, item):
            pass

    def add_log(self, log_time, entity_name, activity, description, is_empty=False):
        assert log_time >= self.last_log_time, "Found a log item with wrong time ordering!"

    init = cluster_simulator.ClusterSimulator.__init__

    def lean_init(self, *a, **k):
        init(self, *a, **k)
        self.previous_events_list, self.previous_events_dict = Nothing(), UidsOnly()

    logger.Logger.add_log = add_log
    cluster_simulator.ClusterSimulator.__init__ = lean_init


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--helix", required=True, help="a checkout of Thesys-lab/Helix-ASPLOS25 at 148b733")
    parser.add_argument("--setting", required=True, help="MODEL/CLUSTER, e.g. llama70b/cluster24")
    parser.add_argument("--chains", help="hetflow's engines: JSON list of chains of [node, layers]")
    parser.add_argument("--own", action="store_true", help="Helix's shipped MILP layout instead")
    parser.add_argument("--work", required=True, help="a folder for the layout files")
    args = parser.parse_args()
    model, cluster_name = args.setting.split("/")
    work = Path(args.work).resolve()
    (work / "gurobipy").mkdir(parents=True, exist_ok=True)
    (work / "gurobipy" / "__init__.py").write_text(STUB)
    helix = Path(args.helix).resolve()
    art = helix / ARTIFACT[cluster_name]
    if not (art / "step3_simulation.py").exists():
        raise SystemExit(f"helix_sim: {art / 'step3_simulation.py'} not found: --helix must be a checkout of "
                         "Thesys-lab/Helix-ASPLOS25 at 148b733")
    sys.path[:0] = [str(art), str(helix), str(work)]
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.chdir(art)  # Helix's scripts open config/... relative to their folder
    lean_memory()
    import step3_simulation
    from simulator.event_simulator.cluster_simulator import ModelName

    cluster_file = f"./config/{cluster_name}.ini"
    counts = machine_counts(cluster_file)
    if args.own:
        if args.setting not in OWN:
            raise SystemExit(f"helix_sim: no single shipped layout for {args.setting}")
        solution, simulator_cluster = OWN[args.setting]
    else:
        solution, simulator_cluster = write_layout(work, model, cluster_file, json.loads(args.chains), counts)
    started = time.time()
    tokens_s = step3_simulation.simulate_maxflow_offline(
        model_name=getattr(ModelName, MODELS[model]),
        solution_file_name=solution, complete_cluster_file_name=cluster_file,
        simulator_cluster_file_name=simulator_cluster, machine_num_dict=counts)
    print(json.dumps({"decode_tokens_per_s": round(tokens_s, 2), "wall_s": round(time.time() - started, 1)}),
          flush=True)


if __name__ == "__main__":
    main()
