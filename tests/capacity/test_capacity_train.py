"""``hetflow capacity train``: the cheapest fleet on which a trace meets a JCT target.

The search is checked against every fleet of a grid with a JCT that falls as devices are
added (so skipping fleets smaller than a miss is exact): the cheapest meeting the target is the
one exhaustive search finds, and fewer fleets are simulated. The command runs as a user runs
it on a small synthetic trace with the real simulator and the controller's policy."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hetflow.capacity.train import (
    Evaluation,
    TrainFleetPlan,
    fleet_cost,
    mix_price_ranges,
    parse_prices,
    parse_time,
    plan_train,
)
from hetflow.core.errors import InputError, Unschedulable

SCRIPT = Path(sys.executable).with_name("hetflow")
HETFLOW = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "hetflow.cli.main"]

MODELS = ["A100-80GB", "H100-SXM", "MI300X"]
PRICES = {"A100-80GB": 2.5, "H100-SXM": 4.5, "MI300X": 3.5}
SPEED = {"A100-80GB": 1.0, "H100-SXM": 2.2, "MI300X": 2.0}  # work per device-hour


def analytic(work: float, jobs: int):
    """A queue-free stand-in for the simulator: avg JCT = work over the fleet's speed (plus a
    fixed hour); a fleet too small for the widest job leaves jobs unfinished."""
    calls = []

    def simulate(nodes: dict[str, int]) -> dict:
        calls.append(dict(nodes))
        speed = sum(8 * n * SPEED[m] for m, n in nodes.items())
        devices = sum(8 * n for n in nodes.values())
        if devices < 8:
            return {"avg_jct_s": None, "p95_jct_s": None, "unfinished": jobs, "rejected": 0}
        jct = 3600 * (1 + work / speed)
        return {"avg_jct_s": jct, "p95_jct_s": 1.5 * jct, "unfinished": 0, "rejected": 0}

    return simulate, calls


@pytest.mark.parametrize("work, target_h", [(200, 4), (200, 2.5), (500, 6), (80, 3), (300, 3.2)])
def test_the_search_finds_what_exhaustive_search_finds_with_fewer_simulations(work, target_h) -> None:
    simulate, calls = analytic(work, 10)
    plan = plan_train(MODELS, PRICES, simulate, target_h * 3600, node_size=8, max_nodes=4)
    every = []
    for counts in itertools.product(range(5), repeat=3):
        if any(counts):
            out = simulate(dict(zip(MODELS, counts)))
            if out["avg_jct_s"] is not None and out["avg_jct_s"] <= target_h * 3600:
                every.append(fleet_cost(counts, MODELS, 8, PRICES))
    assert plan.best is not None and plan.best.cost_per_hour == pytest.approx(min(every))
    assert plan.best.avg_jct_s <= target_h * 3600
    grid = 5 ** 3 - 1
    assert len(plan.evaluated) < grid and len(plan.evaluated) + plan.skipped <= grid
    homog = plan.best_homogeneous  # a single model may not reach the target at all
    assert homog is None or homog.cost_per_hour >= plan.best.cost_per_hour
    singles = [min((fleet_cost(c, MODELS, 8, PRICES) for c in itertools.product(range(5), repeat=3)
                    if sum(1 for n in c if n) == 1 and c[i] and
                    (simulate(dict(zip(MODELS, c)))["avg_jct_s"] or 1e18) <= target_h * 3600), default=None)
               for i in range(3)]
    assert [None if plan.homogeneous[m] is None else plan.homogeneous[m].cost_per_hour for m in MODELS] == singles
    front = plan.pareto()
    assert all(a.cost_per_hour < b.cost_per_hour and a.avg_jct_s > b.avg_jct_s for a, b in zip(front, front[1:]))


@pytest.mark.parametrize("work, target_h", [(900, 5), (400, 2.6), (1500, 7.5)])
def test_side_by_side_simulations_find_the_same_fleet(work, target_h) -> None:
    """Two forked workers read each batch cheapest first: the same answer as one process, on a
    grid big enough that the search takes several batches."""
    simulate, calls = analytic(work, 10)
    one = plan_train(MODELS, PRICES, simulate, target_h * 3600, node_size=8, max_nodes=7)
    two = plan_train(MODELS, PRICES, simulate, target_h * 3600, node_size=8, max_nodes=7, workers=2)
    every = [fleet_cost(c, MODELS, 8, PRICES) for c in itertools.product(range(8), repeat=3) if any(c)
             and simulate(dict(zip(MODELS, c)))["avg_jct_s"] <= target_h * 3600]
    assert one.best.cost_per_hour == pytest.approx(min(every)) == pytest.approx(two.best.cost_per_hour)
    assert {m: e and e.counts for m, e in one.homogeneous.items()} == {m: e and e.counts for m, e in two.homogeneous.items()}
    assert len(one.evaluated) < 8 ** 3 // 4  # far from every fleet of the grid


def test_where_a_mix_pays_is_read_off_the_fleets_costs_as_lines_in_one_price() -> None:
    """Two models of one device a node: A alone needs 2 nodes, B alone 3, one of each meets
    the target too. At A $3 and B $1 B alone is cheapest; a mix is cheapest with A between
    $1 and $2 (worked by hand: 1 + a < min(2a, 3)) and with B between $1.50 and $3."""
    def e(a: int, b: int, cost: float) -> Evaluation:
        return Evaluation({"A": a, "B": b}, cost, 3600.0, 3600.0, 0, True)

    plan = TrainFleetPlan(None, {}, evaluated=[e(2, 0, 6.0), e(0, 3, 3.0), e(1, 1, 4.0),
                                               Evaluation({"A": 1, "B": 0}, 3.0, None, None, 5, False)])
    ranges = mix_price_ranges(plan, ["A", "B"], 1, {"A": 3.0, "B": 1.0})
    assert ranges["A"] == [pytest.approx((1.0, 2.0))] and ranges["B"] == [pytest.approx((1.5, 3.0))]
    only = TrainFleetPlan(None, {}, evaluated=[e(2, 0, 6.0)])
    assert mix_price_ranges(only, ["A", "B"], 1, {"A": 3.0, "B": 1.0}) == {"A": [], "B": []}


@pytest.mark.parametrize("work, target_h", [(200, 4), (500, 6), (300, 3.2)])
def test_inside_a_mix_price_range_the_search_at_that_price_buys_a_mix(work, target_h) -> None:
    simulate, _ = analytic(work, 10)
    plan = plan_train(MODELS, PRICES, simulate, target_h * 3600, node_size=8, max_nodes=4)
    ranges = mix_price_ranges(plan, MODELS, 8, PRICES)
    tried = 0
    for model, spans in ranges.items():
        for lo, hi in spans:
            price = (lo + hi) / 2 if hi != float("inf") else lo * 1.5 + 0.5
            moved = {**PRICES, model: price}
            again = plan_train(MODELS, moved, simulate, target_h * 3600, node_size=8, max_nodes=4)
            assert sum(1 for n in again.best.counts.values() if n) > 1, (model, price, again.best)
            tried += 1
    assert tried > 0, ranges


def test_when_one_model_is_cheapest_find_mix_walks_on_to_the_cheapest_mix() -> None:
    """MI300X alone is cheapest here; ``find_mix`` finds the cheapest mix meeting the target
    (what an exhaustive search over mixes finds), and with it the prices at which mixing pays -
    where the search at that price then buys a mix."""
    simulate, _ = analytic(300, 10)
    target = 6 * 3600
    plan = plan_train(MODELS, PRICES, simulate, target, node_size=8, max_nodes=4, find_mix=True)
    assert sum(1 for n in plan.best.counts.values() if n) == 1
    best = tuple(plan.best.counts[m] for m in MODELS)
    mixes = [fleet_cost(c, MODELS, 8, PRICES) for c in itertools.product(range(5), repeat=3)
             if sum(1 for n in c if n) > 1 and simulate(dict(zip(MODELS, c)))["avg_jct_s"] <= target
             and not all(x >= y for x, y in zip(c, best))]  # one holding the best never pays
    assert plan.best_mix is not None and plan.best_mix.meets
    assert plan.best_mix.cost_per_hour == pytest.approx(min(mixes))
    assert plan.best_mix.cost_per_hour >= plan.best.cost_per_hour
    assert plan_train(MODELS, PRICES, simulate, target, node_size=8, max_nodes=4).best_mix is None
    ranges = mix_price_ranges(plan, MODELS, 8, PRICES)
    spans = [(m, lo, hi) for m, r in ranges.items() for lo, hi in r]
    assert spans, ranges
    for model, lo, hi in spans:
        price = (lo + hi) / 2 if hi != float("inf") else lo * 1.5 + 0.5
        again = plan_train(MODELS, {**PRICES, model: price}, simulate, target, node_size=8, max_nodes=4)
        assert sum(1 for n in again.best.counts.values() if n) > 1, (model, price, again.best)


def test_a_fleet_ruled_out_by_its_bound_is_not_simulated() -> None:
    simulate, calls = analytic(200, 10)
    plan = plan_train(MODELS, PRICES, simulate, 4 * 3600, max_nodes=4,
                      bound=lambda devices: 0 if sum(devices.values()) >= 16 else 1e9)
    assert plan.bounded > 0 and all(sum(c.values()) >= 2 for c in calls)  # no single-node fleet simulated
    assert plan.best.cost_per_hour == plan_train(MODELS, PRICES, simulate, 4 * 3600, max_nodes=4).best.cost_per_hour


def test_no_fleet_meets_an_impossible_target() -> None:
    simulate, _ = analytic(200, 10)
    with pytest.raises(Unschedulable, match="the best simulated: avg JCT"):
        plan_train(MODELS, PRICES, simulate, 0.5 * 3600, max_nodes=2)
    with pytest.raises(InputError, match="no price for MI300X"):
        plan_train(MODELS, {"A100-80GB": 1, "H100-SXM": 2}, simulate, 3600)
    with pytest.raises(InputError, match="avg or p95"):
        plan_train(MODELS, PRICES, simulate, 3600, metric="p50")


def test_prices_and_times_parse_or_say_why() -> None:
    assert parse_prices(["H100-SXM=4.5"], {"MI300X": 3}) == {"MI300X": 3.0, "H100-SXM": 4.5}
    for bad in ("H100", "H100=", "H100=-1", "=3"):
        with pytest.raises(InputError, match="MODEL=DOLLARS"):
            parse_prices([bad])
    assert parse_time("12h", "--t") == 43200 and parse_time("2d", "--t") == 172800 and parse_time("90", "--t") == 90
    with pytest.raises(InputError, match="positive time"):
        parse_time("soon", "--target-avg-jct")


def test_the_command_on_a_real_simulation(tmp_path) -> None:
    cmd = [*HETFLOW, "capacity", "train", "--trace", "synthetic:jobs=12,rate=6,seed=3",
           "--devices", "A100-80GB,MI300X", "--price", "A100-80GB=2.5", "--price", "mi300x=3.5",
           "--target-avg-jct", "30h", "--node-size", "4", "--max-nodes", "2", "--out", str(tmp_path), "--json",
           "--where-mix-pays"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["best"]["meets_target"] and plan["best"]["avg_jct_h"] <= 30
    assert plan["policy"] == "hetflow" and plan["jobs"] == 12
    assert json.loads((tmp_path / "plan.json").read_text())["best"] == plan["best"]
    assert (tmp_path / "pareto.png").stat().st_size > 1000
    cheaper = [e for e in plan["pareto"] if e["cost_per_hour"] < plan["best"]["cost_per_hour"]]
    assert all(e["avg_jct_h"] > 30 for e in cheaper)  # every cheaper fleet simulated missed the target
    assert set(plan["mix_price_ranges"]) == {"A100-80GB", "MI300X"}
    # one model alone is cheapest here: --where-mix-pays walked on to the cheapest mix
    assert len(plan["best"]["nodes"]) == 1 and len(plan["best_mix"]["nodes"]) == 2
    assert plan["best_mix"]["meets_target"] and plan["best_mix"]["cost_per_hour"] >= plan["best"]["cost_per_hour"]


@pytest.mark.parametrize("flags, code, words", [
    (["--devices", "A100-80GB,Z9000", "--price", "A100-80GB=1", "--target-avg-jct", "5h"], 2, "unknown accelerator"),
    (["--devices", "MI210", "--target-avg-jct", "5h"], 2, "no price for MI210"),  # none in the catalog
    (["--devices", "A100-80GB", "--price", "A100-80GB=1", "--target-avg-jct", "never"], 2, "positive time"),
    (["--devices", "A100-80GB", "--price", "A100-80GB=1", "--target-avg-jct", "1s", "--max-nodes", "1"], 3,
     "no fleet of up to 1 nodes"),
    # huge counts: refused at once, not walked (a grid of 10^8 fleets once ran until killed)
    (["--devices", "A100-80GB", "--price", "A100-80GB=1", "--target-avg-jct", "5h", "--max-nodes", "100000000"], 2,
     "past the 10,000 nodes"),
    (["--devices", "A100-80GB,MI300X,H100-SXM", "--price", "A100-80GB=1", "--price", "MI300X=1", "--price",
      "H100-SXM=1", "--target-avg-jct", "5h", "--max-nodes", "200"], 2, "lower --max-nodes to 124 or fewer"),
])
def test_bad_input_is_one_line(flags, code, words) -> None:
    out = subprocess.run([*HETFLOW, "capacity", "train", "--trace", "synthetic:jobs=4,rate=6,seed=1",
                          "--node-size", "4", *flags], capture_output=True, text=True, timeout=300)
    assert out.returncode == code, out.stderr
    assert words in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_serving_reserves_whole_nodes_and_leaves_the_rest_to_training() -> None:
    from hetflow.capacity.train import reserve_serving

    r = reserve_serving({"MI300X": 5, "A100-80GB": 8, "cpu-32c": 3},
                        {"MI300X": 3.5, "A100-80GB": 2.5, "cpu-32c": 0.8}, 4, lambda m: not m.startswith("cpu"))
    assert r.nodes == {"MI300X": 2, "A100-80GB": 2} and r.spare == {"MI300X": 3, "A100-80GB": 0}
    assert r.cost_per_hour == pytest.approx(2 * 4 * 3.5 + 2 * 4 * 2.5 + 3 * 0.8)  # CPU replicas: per replica


PROFILES = {"devices": {"A100-80GB": {"price_per_hour": 2.5}, "MI300X": {"price_per_hour": 3.5},
                        "cpu-32c": {"price_per_hour": 0.8}},
            "throughput": {"A100-80GB": {"short": 12.0, "long": 2.0}, "MI300X": {"short": 16.0, "long": 4.0},
                           "cpu-32c": {"short": 1.0, "long": 0.05}}}


def test_training_beside_a_serving_load_uses_the_serving_nodes_leftovers(tmp_path) -> None:
    import yaml

    (tmp_path / "profiles.yaml").write_text(yaml.safe_dump(PROFILES))
    (tmp_path / "workload.yaml").write_text(yaml.safe_dump({"buckets": {"short": 40, "long": 10}}))
    base = [*HETFLOW, "capacity", "train", "--trace", "synthetic:jobs=12,rate=6,seed=3",
            "--devices", "A100-80GB,MI300X", "--target-avg-jct", "30h", "--node-size", "4", "--max-nodes", "2"]
    priced = ["--price", "A100-80GB=2.5", "--price", "MI300X=3.5"]
    serve = ["--serve", str(tmp_path / "profiles.yaml"), "--workload", str(tmp_path / "workload.yaml")]
    out = subprocess.run([*base, *priced, *serve, "--json"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    serving = plan["serving"]
    # the serving plan's replicas, bought as whole nodes of 4; the devices left go to training
    for model, nodes in serving["nodes"].items():
        assert serving["spare_for_training"].get(model, 0) == nodes * 4 - serving["replicas"][model]
    assert plan["total_cost_per_hour"] == pytest.approx(serving["cost_per_hour"] + plan["best"]["cost_per_hour"])
    assert plan["best"]["meets_target"] and plan["best"]["avg_jct_h"] <= 30
    # the shared fleet costs no more than the two bought apart (the training plan run alone)
    alone = subprocess.run([*base, *priced, "--json"], capture_output=True, text=True, timeout=600)
    assert alone.returncode == 0, alone.stderr
    apart = serving["cost_per_hour"] + json.loads(alone.stdout)["best"]["cost_per_hour"]
    assert plan["apart_cost_per_hour"] == pytest.approx(apart)
    assert plan["total_cost_per_hour"] <= apart
    # one fleet, one price per model; --workload alone is refused
    wrong = subprocess.run([*base, "--price", "A100-80GB=2.5", "--price", "MI300X=9", *serve],
                           capture_output=True, text=True, timeout=300)
    assert wrong.returncode == 2 and "one price per model" in wrong.stderr
    assert len(wrong.stderr.strip().splitlines()) == 1
    lone = subprocess.run([*base, *priced, "--workload", str(tmp_path / "workload.yaml")],
                          capture_output=True, text=True, timeout=300)
    assert lone.returncode == 2 and "go with --serve" in lone.stderr


def _sim_jcts(trace_spec: str, fleet: list[tuple[int, str]], config=None):
    from hetflow.scheduling.policies.capacity import ClusterModel
    from hetflow.scheduling.policies.registry import make_policy
    from hetflow.scheduling.throughput import default_model
    from hetflow.sim.cluster import synthetic_cluster
    from hetflow.sim.engine import SimConfig, Simulator
    from hetflow.sim.metrics import summarise
    from hetflow.sim.traces import load_trace

    tp = default_model(None)
    trace = load_trace(trace_spec, tp, ("A100-80GB", "MI300X"))
    model = ClusterModel.from_snapshot(synthetic_cluster(fleet))
    result = Simulator(model, trace.jobs, make_policy("hetflow"), tp, config or SimConfig()).run()
    return trace, result, summarise(result, 0.0)


@pytest.mark.parametrize("seed, fleet", [(1, [(1, "8x A100-80GB")]), (2, [(1, "8x A100-80GB"), (1, "4x MI300X")]),
                                         (3, [(2, "8x MI300X")]), (4, [(1, "8x A100-80GB"), (2, "4x MI300X")])])
def test_the_trace_bound_never_exceeds_the_simulated_jct(seed, fleet) -> None:
    """fleet_lower_bound is a lower bound of what the simulator gives (avg and P95), on real
    simulations of synthetic traces, loaded and idle fleets alike."""
    from hetflow.capacity.train import fleet_lower_bound, job_times
    from hetflow.scheduling.throughput import default_model

    trace, _, summary = _sim_jcts(f"synthetic:jobs=40,rate=6,seed={seed}", fleet)
    assert summary["unfinished"] == 0 and summary["rejected"] == 0
    times = job_times(trace.jobs, ["A100-80GB", "MI300X"], 4, 2, default_model(None))
    devices: dict[str, int] = {}
    for n, text in fleet:
        size, model = text.split("x ")
        devices[model] = devices.get(model, 0) + n * int(size)
    for metric, key in (("avg", "avg_jct_s"), ("p95", "p95_jct_s")):
        low = fleet_lower_bound(times, devices, metric)
        assert 0 < low <= summary[key] * (1 + 1e-9), (metric, low, summary[key])
    assert fleet_lower_bound(times, {"A100-80GB": 1}) == float("inf")  # an 8-GPU gang fits nowhere


@pytest.mark.parametrize("metric", ["avg", "p95"])
def test_a_simulation_stops_early_only_when_the_target_is_missed(metric) -> None:
    """SimConfig.stop_past ends a run once the target is sure to be missed; the full run then
    misses it too, and a run that meets the target is not cut short."""
    from hetflow.sim.engine import SimConfig

    key = metric + "_jct_s"
    spec, fleet = "synthetic:jobs=60,rate=8,seed=5", [(1, "8x A100-80GB")]
    _, full, summary = _sim_jcts(spec, fleet)
    assert summary["unfinished"] == 0 and summary["rejected"] == 0
    jct = summary[key]
    _, cut, _ = _sim_jcts(spec, fleet, SimConfig(stop_past=(metric, 0.5 * jct)))
    assert cut.stopped_past_s is not None and cut.stopped_past_s < full.end_s  # stopped before the end
    _, whole, again = _sim_jcts(spec, fleet, SimConfig(stop_past=(metric, 1.01 * jct)))
    assert whole.stopped_past_s is None and again[key] == pytest.approx(jct)
    with pytest.raises(InputError, match="whole trace"):
        SimConfig(stop_past=(metric, 3600.0), window=(0, 10))


def test_catalog_prices_are_the_default_and_cite_their_source(tmp_path) -> None:
    from hetflow.accelerators.prices import default_prices

    listed = default_prices()
    cmd = [*HETFLOW, "capacity", "train", "--trace", "synthetic:jobs=6,rate=6,seed=3", "--devices", "A100-80GB,MI300X",
           "--price", "MI300X=3.5", "--target-avg-jct", "60h", "--node-size", "4", "--max-nodes", "2", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["prices"] == {"A100-80GB": listed["A100-80GB"].cloud_usd_per_hour, "MI300X": 3.5}
    assert plan["price_sources"]["MI300X"] == "given" and plan["price_sources"]["A100-80GB"].startswith("catalog: ")
    assert plan["best"]["power_kw"] > 0  # both models have a cited TDP


def test_every_shipped_price_names_its_source() -> None:
    import yaml
    from hetflow.accelerators.prices import default_prices, parse_prices_doc

    listed = default_prices()
    assert {"H100-SXM", "MI300X", "A100-80GB", "L40S"} <= {m for m, p in listed.items() if p.cloud_usd_per_hour}
    for info in listed.values():
        assert info.cloud_usd_per_hour is None or info.cloud_source  # a price always names its source
        assert info.tdp_w is None or info.tdp_source
    doc = {"schema": "hetflow.prices/v1", "prices": {"T4": {"cloud_usd_per_hour": 0.5}}}
    with pytest.raises(InputError, match="without cloud_source"):
        parse_prices_doc(doc)
    with pytest.raises(InputError, match="not a catalog model"):
        parse_prices_doc({"schema": "hetflow.prices/v1", "prices": {"Z9000": {}}})
    with pytest.raises(InputError, match="unknown key"):
        parse_prices_doc(yaml.safe_load("schema: hetflow.prices/v1\nprices: {T4: {price: 1}}"))


@pytest.mark.parametrize("a100_speed, h100_price", [(1.0, 4.5), (0.5, 9.0)])
def test_the_walk_on_to_a_mix_leaves_out_mixes_holding_the_best_and_those_dearer_than_a_swap(
        monkeypatch, a100_speed, h100_price) -> None:
    """A mix holding the whole best fleet costs at least as much at any prices, so it is never
    where mixing pays: the walk on skips them. It starts from a price to beat: one node of the
    best's model fewer and the fewest nodes of another model making up for it (bisection);
    beyond those bisections it simulates only mixes cheaper than the cheapest such swap, and it
    finds what an exhaustive search over the mixes not holding the best finds. (In the second
    case a slow A100 makes the best fleet and one A100 node cheaper than any swap.)"""
    monkeypatch.setitem(SPEED, "A100-80GB", a100_speed)
    prices = {**PRICES, "H100-SXM": h100_price}
    simulate, calls = analytic(300, 10)
    target = 6 * 3600
    plan = plan_train(MODELS, prices, simulate, target, node_size=8, max_nodes=4, find_mix=True)
    best = tuple(plan.best.counts[m] for m in MODELS)
    (lone,) = [i for i, n in enumerate(best) if n]
    assert best[lone] > 1  # so there is a swap

    def meets(c) -> bool:
        out = simulate(dict(zip(MODELS, c)))
        return out["avg_jct_s"] is not None and out["avg_jct_s"] <= target

    ran = [tuple(c[m] for m in MODELS) for c in calls]
    holds = [c for c in ran if all(x >= y for x, y in zip(c, best)) and c != best]
    assert not holds
    swaps = []
    for j in range(3):
        if j != lone:
            fleets = [tuple(best[lone] - 1 if x == lone else k if x == j else 0 for x in range(3)) for k in range(1, 5)]
            swaps += [c for c in fleets if meets(c)][:1]
    seed = min(fleet_cost(c, MODELS, 8, prices) for c in swaps)
    swap_lines = {tuple(best[lone] - 1 if x == lone else k if x == j else 0 for x in range(3))
                  for j in range(3) if j != lone for k in range(1, 5)}
    others = [c for c in ran if sum(1 for n in c if n) > 1 and c not in swap_lines]
    assert all(fleet_cost(c, MODELS, 8, prices) < seed for c in others)
    exhaustive = min(fleet_cost(c, MODELS, 8, prices) for c in itertools.product(range(5), repeat=3)
                     if sum(1 for n in c if n) > 1 and not all(x >= y for x, y in zip(c, best)) and meets(c))
    assert plan.best_mix is not None and plan.best_mix.cost_per_hour == pytest.approx(exhaustive)
