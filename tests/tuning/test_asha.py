"""QuorumASHAScheduler: Ray's ASHA, except that its first rung promotes nothing before a quorum.

The scheduler is driven directly with results (no Ray cluster): Tune hands it the trial (only
its id is read) and each result dict.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ray.tune.schedulers import ASHAScheduler, TrialScheduler

from hetflow.core.errors import InputError
from hetflow.workloads.tune.asha import QuorumASHAScheduler
from hetflow.workloads.tune.config import tuning_config_from_dict

STOP, GO = TrialScheduler.STOP, TrialScheduler.CONTINUE


@dataclass(frozen=True)
class TrialRecord:
    """What a scheduler reads of Tune's Trial: its id."""

    trial_id: str


def scheduler(quorum: int, *, max_t: int = 27, grace: int = 1, factor: float = 3,
              mode: str = "max") -> QuorumASHAScheduler:
    return QuorumASHAScheduler(time_attr="epoch", metric="acc", mode=mode, max_t=max_t,
                               grace_period=grace, reduction_factor=factor, quorum=quorum)


def feed(sched: ASHAScheduler, trial_id: str, epoch: int, value: float) -> str:
    trial = TrialRecord(trial_id)
    if trial_id not in sched._trial_info:  # Tune adds a trial before its first result
        sched.on_trial_add(None, trial)
    return sched.on_trial_result(None, trial, {"epoch": epoch, "acc": value})


def test_rungs_are_grace_times_powers_of_the_factor_below_max_t() -> None:
    assert scheduler(3).milestones == [1, 3, 9]
    assert scheduler(3, max_t=20, grace=2, factor=2).milestones == [2, 4, 8, 16]


def test_the_first_quorum_arrivals_at_the_first_rung_stop_even_when_best() -> None:
    sched = scheduler(3)
    # the first three stop whatever they scored: nothing yet to compare them with
    assert [feed(sched, t, 1, v) for t, v in (("a", 0.9), ("b", 0.2), ("c", 0.5))] == [STOP] * 3
    # then Ray's rule: go on only at or above the 2/3 quantile of the results at the rung
    assert feed(sched, "d", 1, 0.8) == GO  # quantile of 0.9, 0.2, 0.5 is 0.633
    assert feed(sched, "e", 1, 0.6) == STOP  # quantile of the four is 0.8
    # a trial is judged once per rung; between rungs it trains on
    assert feed(sched, "d", 2, 0.1) == GO


def test_later_rungs_let_their_first_arrival_go_on_as_ray_does() -> None:
    sched = scheduler(2)
    feed(sched, "a", 1, 0.3)
    feed(sched, "b", 1, 0.4)
    assert feed(sched, "c", 1, 0.5) == GO
    # rung 3 (and 9) has no quorum: stopping the first arrival there would throw away epochs
    assert feed(sched, "c", 3, 0.1) == GO
    assert feed(sched, "d", 1, 0.6) == GO
    assert feed(sched, "d", 3, 0.05) == STOP  # below c's 0.1 at rung 3
    assert feed(sched, "c", 27, 0.9) == STOP  # the last epoch ends every trial


def test_mode_min_stops_the_higher_values() -> None:
    sched = scheduler(1, mode="min")
    assert feed(sched, "a", 1, 0.5) == STOP  # the quorum of one
    assert feed(sched, "b", 1, 0.7) == STOP  # a higher loss than a's
    assert feed(sched, "c", 1, 0.2) == GO


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.floats(0, 1)), min_size=1, max_size=40),
       st.sampled_from([2, 3, 4]))
def test_quorum_zero_decides_exactly_like_rays_asha(results: list[tuple[int, float]],
                                                    factor: int) -> None:
    """Each trial reports epochs 1, 2, ... in the order drawn; both schedulers see the same."""
    ours = scheduler(0, max_t=16, factor=factor)
    rays = ASHAScheduler(time_attr="epoch", metric="acc", mode="max", max_t=16, grace_period=1,
                         reduction_factor=factor, brackets=1)
    epochs: dict[str, int] = {}
    stopped: set[str] = set()
    for index, value in results:
        trial = f"t{index}"
        if trial in stopped:
            continue
        epochs[trial] = epochs.get(trial, 0) + 1
        expected = feed(rays, trial, epochs[trial], value)
        assert feed(ours, trial, epochs[trial], value) == expected
        if expected == STOP:
            stopped.add(trial)


def test_the_config_takes_the_quorum_and_refuses_a_negative_one() -> None:
    data = {"base": {"model": {"kind": "mlp", "hidden": [32]}, "resources": {"devices": "cpu"}},
            "space": {"train": {"lr": {"loguniform": [1e-4, 0.1]}}}}
    assert tuning_config_from_dict(data).search.first_rung_quorum == 3
    assert tuning_config_from_dict(
        {**data, "search": {"first_rung_quorum": 0}}).search.first_rung_quorum == 0
    with pytest.raises(InputError) as info:
        tuning_config_from_dict({**data, "search": {"first_rung_quorum": -1}}, source="t.yaml")
    assert "search.first_rung_quorum" in str(info.value)
    assert "greater than or equal to 0" in str(info.value)
    with pytest.raises(ValueError):
        scheduler(-1)


@pytest.mark.parametrize("mode", ["min", "max"])
@pytest.mark.parametrize("quorum", [0, 3])
def test_a_trial_whose_metric_is_nan_stops_at_once(mode: str, quorum: int) -> None:
    """A diverged trial (its metric is NaN) is stopped at its next report, rung or not; Ray's
    ASHA lets it on, since NaN is never below a cutoff."""
    nan = float("nan")
    sched = scheduler(quorum, mode=mode)
    rays = ASHAScheduler(time_attr="epoch", metric="acc", mode=mode, max_t=27, grace_period=1,
                         reduction_factor=3, brackets=1)
    good, bad = (0.1, 0.9) if mode == "min" else (0.9, 0.1)
    for name, value in (("a", good), ("b", bad), ("c", good), ("d", bad)):
        feed(sched, name, 1, value)
        feed(rays, name, 1, value)
    assert feed(rays, "e", 1, nan) == GO  # what this scheduler changes
    assert feed(sched, "e", 1, nan) == STOP  # at a rung
    assert feed(sched, "f", 1, good) == GO
    assert feed(sched, "f", 2, nan) == STOP  # between rungs
    # a NaN is not recorded at the rung: later arrivals are judged as before
    assert feed(sched, "g", 1, good) == GO
