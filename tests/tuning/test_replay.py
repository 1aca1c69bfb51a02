"""benchmarks/tuning_replay.py drives the tuner's own searcher and scheduler, in Tune's order.

The replays here use scripted curves (a trial's accuracy is a fixed function of its learning
rate and epoch) instead of training, so a whole 32-trial run takes a fraction of a second;
the last test checks the trained curves the benchmark uses instead.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from typing import Any

from ray.tune.schedulers import ASHAScheduler, TrialScheduler

from hetflow.workloads.tune.asha import QuorumASHAScheduler
from hetflow.workloads.tune.trial import TrialSetup

REPO = Path(__file__).resolve().parents[2]
STOP, GO = TrialScheduler.STOP, TrialScheduler.CONTINUE


def _load_replay_module() -> Any:
    spec = importlib.util.spec_from_file_location(
        "tuning_replay", REPO / "benchmarks" / "tuning_replay.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["tuning_replay"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


replay_module = _load_replay_module()


class ScriptedCurve:
    """Accuracy rises towards a ceiling set by the learning rate (best near 3e-3)."""

    steps_per_epoch = 10

    def __init__(self, config: Any) -> None:
        self.ceiling = 0.95 - 0.25 * abs(math.log10(config.train.lr) + 2.5)

    def metrics(self, epoch: int) -> dict[str, float]:
        accuracy = self.ceiling * (1 - 0.6 ** epoch)
        return {"val_accuracy": accuracy, "val_loss": 1 - accuracy}


class TrialRecord:
    """What a scheduler reads of Tune's Trial: its id."""

    def __init__(self, trial_id: str) -> None:
        self.trial_id = trial_id


def run(strategy: str, quorum: int | None, target: float, tmp_path: Path, seed: int = 0) -> Any:
    search = {} if quorum is None else {"first_rung_quorum": quorum}
    config = replay_module.tuning_config(strategy, seed, target, search)
    return replay_module.replay(config, ScriptedCurve, target, tmp_path, strategy, seed)


def rung_one_arrivals(outcome: Any) -> list[Any]:
    return [r for r in outcome.reports if r.epoch == 1]


def test_the_asha_strategy_gets_the_tuners_quorum_scheduler(tmp_path: Path) -> None:
    config = replay_module.tuning_config("asha+tpe", 0, 0.98)
    _, scheduler = replay_module.tune_components(config, tmp_path)
    assert isinstance(scheduler, QuorumASHAScheduler)
    search = config.search
    assert (search.grace_epochs, search.reduction_factor) == (1, 4)  # the example's
    assert config.budget.epochs == 64
    assert scheduler.milestones == [1, 4, 16]  # grace x factor^k below 64 epochs


def test_the_per_trial_budget_can_be_overridden_for_both_strategies(tmp_path: Path) -> None:
    """``--epochs``: ASHA's max_t, and how far random search trains each trial."""
    asha = replay_module.tuning_config("asha+tpe", 0, 2.0, epochs=16)
    _, scheduler = replay_module.tune_components(asha, tmp_path / "asha")
    assert asha.budget.epochs == 16 and scheduler.milestones == [1, 4]
    random = replay_module.tuning_config("random", 0, 2.0, epochs=5)
    outcome = replay_module.replay(random, ScriptedCurve, 2.0, tmp_path / "random", "random", 0)
    assert outcome.compute == 32 * 5  # every trial trained its 5 epochs, no more


def test_with_a_quorum_the_first_three_arrivals_at_rung_one_stop(tmp_path: Path) -> None:
    outcome = run("asha+tpe", 3, 2.0, tmp_path)  # an unreachable target: the whole budget
    assert not outcome.reached
    assert outcome.trials == 32
    arrivals = rung_one_arrivals(outcome)
    assert len(arrivals) == 32
    # stopped whatever they scored (Ray's ASHA would let the first one go on)
    assert [r.decision for r in arrivals[:3]] == [STOP] * 3
    assert len({r.trial for r in arrivals[:3]}) == 3
    assert GO in [r.decision for r in arrivals[3:]]
    # FIFO's runs are never stopped early, ASHA's mostly are
    assert sum(r.decision == STOP for r in outcome.reports) >= 20


def test_with_quorum_zero_the_replay_stops_the_trials_rays_asha_stops(tmp_path: Path) -> None:
    outcome = run("asha+tpe", 0, 2.0, tmp_path)
    assert rung_one_arrivals(outcome)[0].decision == GO  # nothing to compare it with
    config = replay_module.tuning_config("asha+tpe", 0, 2.0)  # the example's rungs
    search = config.search
    rays = ASHAScheduler(time_attr="training_iteration", metric="val_accuracy", mode="max",
                         max_t=config.budget.epochs, grace_period=search.grace_epochs,
                         reduction_factor=search.reduction_factor, brackets=1)
    seen: set[int] = set()
    for report in outcome.reports:
        trial = TrialRecord(f"trial-{report.trial}")
        if report.trial not in seen:
            rays.on_trial_add(None, trial)
            seen.add(report.trial)
        decision = rays.on_trial_result(None, trial, {"training_iteration": report.epoch,
                                                      "val_accuracy": report.value})
        assert decision == report.decision, report
    assert sum(r.decision == STOP for r in outcome.reports) >= 20


def test_random_search_runs_every_trial_to_the_end_until_the_target(tmp_path: Path) -> None:
    outcome = run("random", None, 0.90, tmp_path)
    epochs_per_trial = replay_module.tuning_config("random", 0, 0.90).budget.epochs
    assert outcome.reached
    last = outcome.reports[-1]
    assert last.decision == "TARGET" and last.target_value >= 0.90
    assert all(r.target_value < 0.90 for r in outcome.reports[:-1])
    assert outcome.compute == len(outcome.reports)
    epochs = {}
    for report in outcome.reports:
        assert report.decision in (GO, "TARGET")  # FIFO stops nothing
        epochs[report.trial] = report.epoch
    running = _running_at_end(outcome, epochs_per_trial)
    finished = [t for t in epochs if t != last.trial and t not in running]
    assert finished and all(epochs[t] == epochs_per_trial for t in finished)
    # two trials at a time: while one trains, the other does too
    assert len(running) == 2


def _running_at_end(outcome: Any, epochs_per_trial: int) -> set[int]:
    """Trials that had reported an epoch but not their last when the run ended."""
    last_epoch: dict[int, int] = {}
    for report in outcome.reports:
        last_epoch[report.trial] = report.epoch
    return {t for t, e in last_epoch.items() if e < epochs_per_trial}


def test_a_trained_curve_does_not_depend_on_what_else_was_trained(tmp_path: Path) -> None:
    """What makes sharing curves exact: the same config gives the same curve, interleaved
    with other trainings or not."""
    config = replay_module.tuning_config("random", 0, 0.98)
    setup = TrialSetup(base=config.base.model_dump(mode="json"), space=config.search_space,
                       epochs=3, threads=1)

    def trial(lr: float) -> Any:
        return setup.trial_config({"train": {"lr": lr, "batch_size": 256, "weight_decay": 0.0},
                                   "model": {"hidden": "[32]"}})

    shared = replay_module.TrainedCurves()
    first = shared(trial(0.01))
    first.metrics(1)
    shared(trial(0.1)).metrics(2)  # another trial trains in between
    assert shared(trial(0.01)) is first
    interleaved = [first.metrics(e)["val_accuracy"] for e in (1, 2, 3)]
    alone = replay_module.TrainedCurves()(trial(0.01))
    assert [alone.metrics(e)["val_accuracy"] for e in (3, 2, 1)][::-1] == interleaved
    assert first.epochs_trained == 3
    assert interleaved[2] > 0.5  # it did learn: far above chance (0.1) after 3 epochs


def test_a_lower_accuracy_costs_what_a_run_stopped_there_costs(tmp_path: Path) -> None:
    """``--also-at``: the cost at a lower threshold, read from a run that went on to a higher
    target, is the cost of a run that stopped at that threshold (where a run stops does not
    change what it did before)."""
    for strategy in ("random", "asha+tpe"):
        high = run(strategy, None, 0.90, tmp_path / strategy / "high")
        low = run(strategy, None, 0.85, tmp_path / strategy / "low")
        assert high.reached and low.reached
        assert high.compute_at(0.85) == (low.compute, True)
        assert high.compute_at(0.90) == (high.compute, True)
        assert high.compute > low.compute  # the higher target did cost more here
        assert high.compute_at(0.99) == (high.compute, False)  # beyond the run: all it ran


def test_more_concurrent_trials_mean_more_virtual_workers(tmp_path: Path) -> None:
    config = replay_module.tuning_config("random", 0, 2.0, concurrent=4)
    assert config.budget.concurrent == 4
    outcome = replay_module.replay(config, ScriptedCurve, 2.0, tmp_path, "random", 0)
    first_epochs = [r.trial for r in outcome.reports[:4]]
    assert sorted(first_epochs) == [0, 1, 2, 3]  # four trials report before any second epoch
    assert outcome.compute == 32 * config.budget.epochs


def test_another_space_replaces_the_examples_and_bad_ones_are_refused(tmp_path: Path) -> None:
    import pytest

    from hetflow.core.errors import InputError

    path = tmp_path / "space.yaml"
    path.write_text("space:\n  train:\n    lr: {loguniform: [1.0e-4, 1.0e-1]}\n")
    space = replay_module.read_space(path)
    config = replay_module.tuning_config("random", 0, 2.0, space=space, source=path)
    assert config.search_space.describe({"train": {"lr": 0.01}}) == "lr=0.01"
    outcome = replay_module.replay(config, ScriptedCurve, 2.0, tmp_path, "random", 0)
    assert len(outcome.trial_values) == 32
    assert all(v.startswith("lr=") and "batch_size" not in v for v in outcome.trial_values)

    (tmp_path / "none.yaml").write_text("search: {}\n")
    with pytest.raises(InputError, match="no 'space' section"):
        replay_module.read_space(tmp_path / "none.yaml")
    bad = {"train": {"lrr": {"uniform": [0, 1]}}}
    with pytest.raises(InputError, match=r"space\.yaml.*space\.train\.lrr.*did you mean 'lr'"):
        replay_module.tuning_config("random", 0, 2.0, space=bad, source=path)


def test_the_oracle_is_the_fastest_of_random_searchs_configurations(tmp_path: Path) -> None:
    config = replay_module.tuning_config("random", 0, 0.85)
    best = replay_module.oracle(config, ScriptedCurve, 0.85, tmp_path / "oracle")
    # the same 32 configurations, every one trained to the end by an unreachable target
    full = run("random", None, 2.0, tmp_path / "full")
    first_hit: dict[int, int] = {}
    for report in full.reports:
        if report.target_value >= 0.85:
            first_hit.setdefault(report.trial, report.epoch)
    assert first_hit, "no scripted configuration reaches 0.85: the test needs one"
    fastest = min(first_hit, key=lambda t: (first_hit[t], t))
    assert best.configurations == 32
    assert best.epochs == first_hit[fastest]
    assert best.values == full.trial_values[fastest]
    nothing = replay_module.oracle(config, ScriptedCurve, 0.999, tmp_path / "none")
    assert nothing.epochs is None and nothing.values == ""
