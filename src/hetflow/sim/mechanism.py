"""The engine skeleton the reference protocols share: two loops and one set of JCT metrics.

Each reference simulator hetflow reproduces is its protocol's *rules* - state, job model,
checks, written to match that simulator's own code - driven by one of the loops here:

- :func:`run_rounds` drives :class:`RoundRules`: Gavel's protocol (``gavel.GavelSimulator``:
  a round ends when its last micro-task does, arrivals join at round starts) and Sia's
  (``sia.SiaSimulator``: fixed rounds, each job steps itself through the round). Per round:
  end the round in progress (progress, clock), admit what arrived, ask the policy, check its
  answer and start the next round - until every job has ended, the rules say nothing can
  progress any more, or a round limit is hit.
- :func:`run_arrivals` drives :class:`ArrivalRules`: FGD's protocol (``fgd.simulate_fgd``:
  pods arrive one by one and never leave; no clock). Per arrival: the policy's placement,
  checked and bound, one sample recorded.

The policies are the scheduling registry's (``hetflow.scheduling.policies.registry``), which the
live controller runs, through each protocol's adapter (``live_gavel``, ``live_sia``,
``live_fgd``; :class:`~hetflow.sim.live_base.ProtocolAdapter`), or the reference policies as
their papers' code has them (in ``gavel``, ``sia_reference`` and ``fgd``). hetflow's own
event simulator (``engine.Simulator``) is not a reference protocol and keeps its own loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np


class RoundRules(Protocol):
    """A round-based protocol's rules (what :func:`run_rounds` calls, in this order)."""

    def finished(self) -> bool:
        """Every job has ended (completed or dropped)."""

    def end_round(self) -> bool:
        """Finish the round in progress: the jobs' progress and the clock move to its end.
        False when nothing can progress any more (the loop stops; the rest is unfinished)."""

    def admit(self) -> None:
        """Take in the jobs that arrived by now."""

    def decide(self) -> Any | None:
        """The policy's answer for the next round; None when there is nothing to decide."""

    def start_round(self, decision: Any) -> None:
        """Check ``decision`` against the protocol's rules and start the next round with it."""


class ArrivalRules(Protocol):
    """An arrival-ordered protocol's rules (what :func:`run_arrivals` calls)."""

    def arrivals(self) -> Sequence[Any]:
        """What arrives, in order."""

    def decide(self, step: int, item: Any) -> Any | None:
        """The policy's placement of arrival ``step``; None when it places it nowhere."""

    def apply(self, step: int, item: Any, decision: Any | None) -> None:
        """Check and bind ``decision`` (or count the failure) and record the step's sample."""


@dataclass(frozen=True)
class LoopStats:
    """What a loop counted: rounds (or arrivals) run, the wall time, the time in decisions,
    and whether it stopped before every job ended (no progress possible, or the round limit)."""

    rounds: int
    wall_s: float
    decide_s: float
    stopped: bool


def run_rounds(rules: RoundRules, max_rounds: int | None = None) -> LoopStats:
    """Drive ``rules`` round by round (module docstring)."""
    start = time.perf_counter()
    rounds = 0
    decide_s = 0.0
    stopped = False
    while not rules.finished():
        if (max_rounds is not None and rounds >= max_rounds) or not rules.end_round():
            stopped = True
            break
        rules.admit()
        rounds += 1
        t0 = time.perf_counter()
        decision = rules.decide()
        decide_s += time.perf_counter() - t0
        if decision is not None:
            rules.start_round(decision)
    return LoopStats(rounds, time.perf_counter() - start, decide_s, stopped)


def run_arrivals(rules: ArrivalRules, progress: Callable[[int, int], None] | None = None,
                 every: int = 500) -> LoopStats:
    """Drive ``rules`` arrival by arrival (module docstring); ``progress(step, total)`` every
    ``every`` arrivals."""
    start = time.perf_counter()
    decide_s = 0.0
    items = rules.arrivals()
    for step, item in enumerate(items):
        t0 = time.perf_counter()
        decision = rules.decide(step, item)
        decide_s += time.perf_counter() - t0
        rules.apply(step, item, decision)
        if progress and step % every == 0:
            progress(step, len(items))
    return LoopStats(len(items), time.perf_counter() - start, decide_s, False)


def jct_summary(jcts: Iterable[float]) -> dict[str, float | int | None]:
    """Average, median and 95th-percentile job completion time (seconds) of the completed jobs,
    and how many completed - the figures every round protocol reports."""
    v = np.asarray(list(jcts), dtype=float)
    if not len(v):
        return {"avg_jct_s": None, "median_jct_s": None, "p95_jct_s": None, "completed": 0}
    return {"avg_jct_s": float(v.mean()), "median_jct_s": float(np.median(v)),
            "p95_jct_s": float(np.percentile(v, 95)), "completed": int(len(v))}


__all__ = ["ArrivalRules", "LoopStats", "RoundRules", "jct_summary", "run_arrivals", "run_rounds"]
