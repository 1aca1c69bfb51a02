"""The cheapest mix of devices for a serving load (``hetflow capacity serve``).

Melange's formulation (Griggs et al., "Mélange: Cost Efficient Large Language Model Serving by
Exploiting GPU Heterogeneity", 2024), extended to any device the profiles name (AMD, NVIDIA,
CPU replicas): the load is a set of request-size buckets, each with its rate (requests/s);
each device model has a profiled throughput per bucket - the most requests/s one device (or
replica) of it sustains for that bucket while meeting the latency SLO (0 or absent: it cannot
meet the SLO on that bucket) - and a price per hour. A mixed-integer program chooses how many
devices of each model to buy and which share of each bucket's rate each model takes:

    minimise   sum_g price_g * n_g
    subject to sum_g x[b, g] = 1                              for every bucket b
               sum_b rate_b * x[b, g] / tput[b, g] <= n_g      for every device model g
               n_g integer >= 0,  0 <= x[b, g] <= 1,  x[b, g] = 0 where tput[b, g] = 0

solved with SciPy's MILP (HiGHS). ``slice_factor`` > 0 follows Melange's own program: every
bucket's rate is cut into that many equal slices and each slice goes whole to one model
(x[b, g] in multiples of 1/slice_factor); 0 lets shares be any fraction (a lower bound on cost).
The best single-model fleet is given beside the mix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hetflow.core.errors import InputError, Unschedulable


@dataclass(frozen=True)
class Bucket:
    """A request-size class and its rate."""

    name: str
    rate: float  # requests per second


@dataclass
class ServeFleet:
    counts: dict[str, int]  # device model -> devices (replicas) to buy
    cost_per_hour: float
    shares: dict[str, dict[str, float]]  # bucket -> device model -> share of its rate
    load: dict[str, float]  # device model -> busy fraction of the devices bought (0..1)
    homogeneous: dict[str, tuple[int, float] | None] = field(default_factory=dict)
    # device model -> (count, $/h) of a fleet of that model alone; None: it cannot serve every bucket
    carried: dict[str, float] = field(default_factory=dict)  # device model -> planned requests/s

    def weights(self) -> dict[str, int]:
        """Routing weights for the pools of one endpoint (1..100, per replica): each model's
        planned requests/s per device, relative to the busiest. hetflow serve's front door
        splits a model's traffic over its pools by these (weighted least-outstanding); it
        does not route by request size, so the plan's per-bucket split holds on average only."""
        per = {d: self.carried.get(d, 0.0) / n for d, n in self.counts.items() if n}
        top = max(per.values(), default=0.0)
        return {d: max(1, round(100 * v / top)) if top > 0 else 1 for d, v in per.items()}

    @property
    def best_homogeneous(self) -> tuple[str, int, float] | None:
        options = [(cost, name, n) for name, v in self.homogeneous.items() if v is not None
                   for n, cost in [v]]
        if not options:
            return None
        cost, name, n = min(options)
        return name, n, cost

    def to_dict(self) -> dict[str, Any]:
        best = self.best_homogeneous
        return {
            "counts": {k: v for k, v in self.counts.items() if v},
            "cost_per_hour": round(self.cost_per_hour, 6),
            "shares": self.shares,
            "load": {k: round(v, 4) for k, v in self.load.items() if self.counts.get(k)},
            "weights": self.weights(),
            "homogeneous": {k: (None if v is None else {"count": v[0], "cost_per_hour": round(v[1], 6)})
                            for k, v in self.homogeneous.items()},
            "best_homogeneous": (None if best is None else
                                 {"device": best[0], "count": best[1], "cost_per_hour": round(best[2], 6)}),
            "mixed_over_homogeneous": (round(self.cost_per_hour / best[2], 4)
                                       if best and best[2] > 0 else None),
        }


def plan_serve(buckets: list[Bucket], throughput: dict[str, dict[str, float]],
               prices: dict[str, float], slice_factor: int = 0) -> ServeFleet:
    """The cheapest fleet for ``buckets`` (see the module docstring). ``throughput``: device
    model -> bucket name -> requests/s one device sustains at the SLO; ``prices``: device model
    -> price per hour. Raises InputError for malformed input and Unschedulable when some
    bucket no device can serve."""
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp

    devices = sorted(throughput)
    if not devices:
        raise InputError("no device profiles: give each device model's requests/s per bucket")
    missing = [d for d in devices if d not in prices]
    if missing:
        raise InputError(f"no price for {', '.join(missing)}: add price_per_hour for each device "
                         "model (or leave the model out)")
    for d in devices:
        if not (prices[d] > 0 and math.isfinite(prices[d])):
            raise InputError(f"price of {d} must be a positive number of dollars per hour, not {prices[d]}")
    if slice_factor < 0:
        raise InputError("slice_factor must be >= 0 (0: shares may be any fraction)")
    active = [b for b in buckets if b.rate > 0]
    for b in buckets:
        if not (b.rate >= 0 and math.isfinite(b.rate)):
            raise InputError(f"bucket {b.name}: rate must be >= 0 requests/s, not {b.rate}")
    served = {b.name: [d for d in devices if throughput[d].get(b.name, 0) > 0] for b in active}
    unserved = [name for name, ds in served.items() if not ds]
    if unserved:
        raise Unschedulable(f"no device meets the SLO on bucket(s) {', '.join(unserved)}: profile "
                            "another device model for them, relax the SLO, or drop those requests")
    if not active:
        return ServeFleet(dict.fromkeys(devices, 0), 0.0, {}, dict.fromkeys(devices, 0.0),
                          dict.fromkeys(devices, (0, 0.0)))

    G, B = len(devices), len(active)
    nvar = G + B * G  # n_g, then x[b, g] (or slices taken, with a slice factor)

    def xi(b: int, g: int) -> int:
        return G + b * G + g

    cost = np.zeros(nvar)
    cost[:G] = [prices[d] for d in devices]
    upper = np.zeros(nvar)
    integrality = np.zeros(nvar)
    integrality[:G] = 1
    k = float(slice_factor) if slice_factor else 1.0
    for gi, d in enumerate(devices):
        need = sum(b.rate / throughput[d][b.name] for b in active if throughput[d].get(b.name, 0) > 0)
        upper[gi] = math.ceil(need) + 1  # never more than all of the load on this model alone
        for bi, b in enumerate(active):
            if throughput[d].get(b.name, 0) > 0:
                upper[xi(bi, gi)] = k
                if slice_factor:
                    integrality[xi(bi, gi)] = 1
    rows, lo, hi = [], [], []
    for bi in range(B):  # every bucket's rate goes somewhere: sum_g x = 1 (slices: = k)
        row = np.zeros(nvar)
        for gi in range(G):
            row[xi(bi, gi)] = 1.0
        rows.append(row), lo.append(k), hi.append(k)
    for gi, d in enumerate(devices):  # the devices bought carry what they are given
        row = np.zeros(nvar)
        row[gi] = -1.0
        for bi, b in enumerate(active):
            t = throughput[d].get(b.name, 0)
            if t > 0:
                row[xi(bi, gi)] = b.rate / t / k
        rows.append(row), lo.append(-np.inf), hi.append(0.0)
    result = milp(cost, constraints=LinearConstraint(np.array(rows), lo, hi),
                  integrality=integrality, bounds=Bounds(np.zeros(nvar), upper),
                  options={"time_limit": 60})
    if result.x is None:
        raise Unschedulable(f"no fleet found ({result.message})")
    x = result.x
    counts = {d: int(round(x[gi])) for gi, d in enumerate(devices)}
    shares = {b.name: {d: round(float(x[xi(bi, gi)]) / k, 6) for gi, d in enumerate(devices)
                       if x[xi(bi, gi)] > 1e-9} for bi, b in enumerate(active)}
    load = {}
    for gi, d in enumerate(devices):
        used = sum(b.rate * x[xi(bi, gi)] / k / throughput[d][b.name]
                   for bi, b in enumerate(active) if throughput[d].get(b.name, 0) > 0)
        load[d] = float(used / counts[d]) if counts[d] else 0.0
    fleet = ServeFleet(counts, float(sum(prices[d] * n for d, n in counts.items())), shares, load)
    fleet.carried = {d: float(sum(b.rate * x[xi(bi, gi)] / k for bi, b in enumerate(active)))
                     for gi, d in enumerate(devices)}
    for d in devices:
        if all(throughput[d].get(b.name, 0) > 0 for b in active):
            n = math.ceil(sum(b.rate / throughput[d][b.name] for b in active) - 1e-9)
            fleet.homogeneous[d] = (n, n * prices[d])
        else:
            fleet.homogeneous[d] = None
    return fleet


def read_profiles(doc: Any, source: str) -> tuple[dict[str, dict[str, float]], dict[str, float], str]:
    """A profiles document -> (throughput, prices, slo text). Shape::

        slo: "TPOT <= 120 ms"                 # what the throughputs were measured under (text)
        devices: {A10G: {price_per_hour: 1.01}, MI300X: {price_per_hour: 4.9}, ...}
        throughput: {A10G: {short: 4.0, long: 0.5}, ...}   # requests/s per device, per bucket
    """
    if not isinstance(doc, dict):
        raise InputError(f"{source}: expected a mapping with devices: and throughput:")
    devices, tput = doc.get("devices"), doc.get("throughput")
    if not isinstance(devices, dict) or not isinstance(tput, dict) or not tput:
        raise InputError(f"{source}: needs devices: {{MODEL: {{price_per_hour: N}}}} and "
                         "throughput: {MODEL: {BUCKET: requests/s}}")
    prices: dict[str, float] = {}
    for name, spec in devices.items():
        price = spec.get("price_per_hour") if isinstance(spec, dict) else None
        if not isinstance(price, (int, float)) or isinstance(price, bool):
            raise InputError(f"{source}: devices.{name}.price_per_hour must be a number (dollars per hour)")
        prices[str(name)] = float(price)
    throughput: dict[str, dict[str, float]] = {}
    for name, row in tput.items():
        if str(name) not in prices:
            raise InputError(f"{source}: throughput names {name}, which devices: does not "
                             f"(known: {', '.join(sorted(prices))})")
        if not isinstance(row, dict):
            raise InputError(f"{source}: throughput.{name} must map bucket names to requests/s")
        for bucket, value in row.items():
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise InputError(f"{source}: throughput.{name}.{bucket} must be requests/s >= 0, not {value!r}")
        throughput[str(name)] = {str(b): float(v) for b, v in row.items()}
    return throughput, {d: prices[d] for d in throughput}, str(doc.get("slo", ""))


def is_melange(doc: Any) -> bool:
    return isinstance(doc, dict) and "gpu_info" in doc


def read_melange(doc: Any, source: str) -> tuple[dict[str, dict[str, float]], dict[str, float],
                                                 list[Bucket], int]:
    """Melange's own solver input (its ``melange/config/*.json``: ``gpu_info: {GPU: {cost,
    tputs[input bucket][output bucket]}}``, ``workload_distribution`` (fractions, same shape),
    ``total_request_rate``, ``slice_factor``) -> (throughput, prices, buckets, slice factor).
    Buckets are named ``in<i>-out<j>`` by their indices."""
    try:
        gpus = doc["gpu_info"]
        dist = doc["workload_distribution"]
        rate = float(doc["total_request_rate"])
        shape = (len(dist), len(dist[0]))
        throughput, prices = {}, {}
        for name, info in gpus.items():
            prices[str(name)] = float(info["cost"])
            tputs = info["tputs"]
            if (len(tputs), len(tputs[0])) != shape or any(len(r) != shape[1] for r in tputs):
                raise ValueError(f"gpu_info.{name}.tputs is not {shape[0]} x {shape[1]} like the distribution")
            throughput[str(name)] = {f"in{i}-out{j}": float(tputs[i][j])
                                     for i in range(shape[0]) for j in range(shape[1])}
        buckets = [Bucket(f"in{i}-out{j}", rate * float(dist[i][j]))
                   for i in range(shape[0]) for j in range(shape[1])]
        slice_factor = int(doc.get("slice_factor", 1))
    except (KeyError, TypeError, IndexError, ValueError) as exc:
        raise InputError(f"{source}: not a Melange config ({exc}); expected gpu_info, "
                         "workload_distribution, total_request_rate") from None
    if abs(sum(b.rate for b in buckets) - rate) > 1e-6 * max(1.0, rate):
        raise InputError(f"{source}: workload_distribution sums to "
                         f"{sum(b.rate for b in buckets) / rate if rate else 0:g}, not 1")
    return throughput, prices, buckets, slice_factor


def read_workload(doc: Any, source: str, known: set[str]) -> list[Bucket]:
    """A workload document -> buckets: ``buckets: {NAME: requests/s}``, or ``rate: R`` with
    ``mix: {NAME: fraction}`` (fractions of R, summing to 1)."""
    if not isinstance(doc, dict):
        raise InputError(f"{source}: expected buckets: {{NAME: requests/s}} or rate: with mix:")
    if "buckets" in doc:
        rates = doc["buckets"]
        if not isinstance(rates, dict) or not rates:
            raise InputError(f"{source}: buckets must map bucket names to requests/s")
    elif "rate" in doc and "mix" in doc:
        rate, mix = doc["rate"], doc["mix"]
        if not isinstance(rate, (int, float)) or rate < 0 or not isinstance(mix, dict) or not mix:
            raise InputError(f"{source}: rate must be requests/s >= 0 and mix a mapping of fractions")
        if any(not isinstance(v, (int, float)) or v < 0 for v in mix.values()):
            raise InputError(f"{source}: mix fractions must be numbers >= 0")
        total = sum(mix.values())
        if abs(total - 1) > 1e-6:
            raise InputError(f"{source}: mix fractions sum to {total:g}, not 1")
        rates = {b: rate * f for b, f in mix.items()}
    else:
        raise InputError(f"{source}: give buckets: {{NAME: requests/s}} or rate: with mix:")
    unknown = sorted(str(b) for b in rates if str(b) not in known)
    if unknown:
        raise InputError(f"{source}: bucket(s) {', '.join(unknown)} are in no device's profile "
                         f"(profiled buckets: {', '.join(sorted(known))})")
    out = []
    for b, r in rates.items():
        if not isinstance(r, (int, float)) or isinstance(r, bool) or r < 0:
            raise InputError(f"{source}: bucket {b}: rate must be requests/s >= 0, not {r!r}")
        out.append(Bucket(str(b), float(r)))
    return out


__all__ = ["Bucket", "ServeFleet", "is_melange", "plan_serve", "read_melange", "read_profiles",
           "read_workload"]
