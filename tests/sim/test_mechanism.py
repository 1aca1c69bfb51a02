"""The engine skeleton the reference protocols share (hetflow.sim.mechanism): the two loops'
order and stops, the JCT metrics, and the protocols driven through them."""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import pytest

from hetflow.sim.mechanism import jct_summary, run_arrivals, run_rounds

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "sia"


class Rounds:
    """Toy rules: a job per arrival time, each needing ``work`` rounds on one slot."""

    def __init__(self, arrivals: list[int], work: int, slots: int, stall_after: int | None = None) -> None:
        self.arrivals, self.work, self.slots = arrivals, work, slots
        self.now, self.active, self.left, self.done = 0, [], {}, {}
        self.running: list[int] = []
        self.calls: list[str] = []
        self.stall_after = stall_after

    def finished(self) -> bool:
        return len(self.done) == len(self.arrivals)

    def end_round(self) -> bool:
        self.calls.append("end")
        if self.stall_after is not None and self.now >= self.stall_after:
            return False
        for j in self.running:
            self.left[j] -= 1
            if self.left[j] == 0:
                self.done[j] = self.now + 1
        self.running = []
        self.now += 1
        return True

    def admit(self) -> None:
        self.calls.append("admit")
        for j, t in enumerate(self.arrivals):
            if t <= self.now and j not in self.left:
                self.left[j] = self.work

    def decide(self):
        self.calls.append("decide")
        waiting = [j for j in self.left if j not in self.done]
        return waiting[: self.slots] if waiting else None

    def start_round(self, decision) -> None:
        self.calls.append("start")
        self.running = list(decision)


def test_rounds_run_in_order_until_every_job_ends() -> None:
    rules = Rounds([0, 0, 3], work=2, slots=1)
    stats = run_rounds(rules)
    # one slot: job 0 runs rounds 2-3, job 1 rounds 4-5, job 2 (arrived at 3) rounds 6-7
    assert rules.done == {0: 3, 1: 5, 2: 7} and not stats.stopped
    assert rules.calls[:4] == ["end", "admit", "decide", "start"]
    assert stats.rounds == rules.now == 7


def test_rounds_skip_the_start_when_there_is_nothing_to_decide() -> None:
    rules = Rounds([4], work=1, slots=1)  # rounds 1-4: nothing arrived yet
    run_rounds(rules)
    assert rules.calls.count("decide") == 5 and rules.calls.count("start") == 1
    assert rules.done == {0: 5}


def test_rounds_stop_where_nothing_can_progress_or_at_the_limit() -> None:
    stalled = Rounds([0, 0], work=5, slots=1, stall_after=3)
    stats = run_rounds(stalled)
    assert stats.stopped and stats.rounds == 3 and stalled.done == {}
    limited = Rounds([0, 0], work=5, slots=1)
    stats = run_rounds(limited, max_rounds=4)
    assert stats.stopped and stats.rounds == 4 and len(limited.calls) == 4 * 4


class Arrivals:
    def __init__(self, items: list[int], capacity: int) -> None:
        self.items, self.free, self.log = items, capacity, []

    def arrivals(self):
        return self.items

    def decide(self, step: int, item: int):
        return step if item <= self.free else None

    def apply(self, step: int, item: int, decision) -> None:
        if decision is not None:
            self.free -= item
        self.log.append((step, item, decision))


def test_arrivals_are_placed_in_order_and_progress_is_reported() -> None:
    rules = Arrivals([3, 4, 2, 1], capacity=6)
    seen = []
    stats = run_arrivals(rules, progress=lambda step, total: seen.append((step, total)), every=2)
    assert rules.log == [(0, 3, 0), (1, 4, None), (2, 2, 2), (3, 1, 3)]
    assert seen == [(0, 4), (2, 4)] and stats.rounds == 4 and not stats.stopped


def test_jct_summary() -> None:
    values = [10.0, 20.0, 30.0, 40.0, 100.0]
    got = jct_summary(values)
    # the 95th percentile by linear interpolation between the closest ranks: rank 0.95 * 4 = 3.8
    assert got == {"avg_jct_s": statistics.mean(values), "median_jct_s": 30.0,
                   "p95_jct_s": pytest.approx(40.0 + 0.8 * 60.0), "completed": 5}
    assert jct_summary([]) == {"avg_jct_s": None, "median_jct_s": None, "p95_jct_s": None, "completed": 0}


def test_sias_protocol_stops_at_its_round_limit_and_reports_the_rest_unfinished() -> None:
    from hetflow.sim.live_sia import live_sia_policy
    from hetflow.sim.sia import SiaProfiles, SiaSimulator, load_workload

    specs = load_workload(FIX / "workloads" / "philly-workload-1-bert-deepspeech2.csv")
    run = SiaSimulator(specs, SiaProfiles(FIX / "profiles"), live_sia_policy("fifo"), round_s=60,
                       max_rounds=5).run()
    assert run.rounds == 5 and run.unfinished and len(run.jcts) + len(run.unfinished) == len(specs)


def test_every_protocol_the_command_offers_has_its_entry() -> None:
    from hetflow.cli import simulate
    from hetflow.cli.simulate_protocols import PROTOCOLS

    parser = argparse.ArgumentParser(prog="hetflow")
    simulate.register(parser.add_subparsers())
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["simulate"]
    choices = next(a.choices for a in sub._actions if a.dest == "protocol")
    assert set(choices) - {"hetflow"} == set(PROTOCOLS)
