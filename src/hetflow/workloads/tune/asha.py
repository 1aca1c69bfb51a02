"""ASHA that promotes no trial from its first rung without competition.

Ray Tune's ``ASHAScheduler`` judges a trial that reaches a rung against the trials that reached
that rung before it; the first one to arrive has nothing to be judged against and always goes
on. With few trials at a time that is where most of ASHA's wasted epochs go: on the digits
benchmark the first trials of a run were often promoted through every rung to the last epoch
(all 27 epochs of the budget then, for a trial at chance-level accuracy), because they arrived
first, not because they were good.

:class:`QuorumASHAScheduler` is Ray's ASHA with one change at the first rung: until
``quorum`` trials have reached it, a trial that arrives there is stopped (its result is still
recorded, and the searcher still learns from it). After that, the first rung - and every later
rung from the start - works as in Ray: a trial goes on only if its metric is in the best
``1 / reduction_factor`` of the results recorded at that rung. This is the ``bootstrap_count``
of Optuna's ``SuccessiveHalvingPruner``, applied to the first rung only: at the later rungs
stopping the first arrivals would stop good trials after many epochs of work. What it saves is
measured by ``benchmarks/tuning_replay.py`` (docs/tuning.md, "Benchmark").

And one change at every epoch: a result whose metric is NaN (a diverged trial: NaN weights
stay NaN, and a loss that overflowed is no basis to go on) stops the trial at once. Ray's ASHA
lets such a trial on to its last epoch, since NaN is below no cutoff.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from ray.tune.schedulers import ASHAScheduler, TrialScheduler


class _QuorumRungs:
    """The rungs of one ASHA bracket; the first needs ``quorum`` results before it promotes."""

    def __init__(self, grace_period: int, max_t: int, reduction_factor: float,
                 quorum: int) -> None:
        self.reduction_factor = reduction_factor
        self.quorum = quorum
        milestones = []
        milestone = float(grace_period)
        while milestone < max_t:
            milestones.append(milestone)
            milestone *= reduction_factor
        # highest rung first, so a result is filed under the highest rung it has reached
        self._rungs: list[tuple[float, dict[str, float]]] = [(m, {}) for m in reversed(milestones)]

    def cutoff(self, recorded: dict[str, float]) -> float | None:
        """The value a trial must reach to go on (Ray's rule: the (1 - 1/factor) quantile)."""
        if not recorded:
            return None
        return float(np.nanpercentile(list(recorded.values()),
                                      (1 - 1 / self.reduction_factor) * 100))

    def on_result(self, trial: Any, cur_iter: float, cur_rew: float | None) -> str:
        """File the result at the highest rung it reached for the first time; stop or go on.

        A NaN stops the trial at once, rung or not, and is not filed: the trial diverged
        (Ray's rule would let it on: NaN is below no cutoff).
        """
        if cur_rew is not None and math.isnan(cur_rew):
            return TrialScheduler.STOP
        first_milestone = self._rungs[-1][0] if self._rungs else None
        for milestone, recorded in self._rungs:
            if cur_iter < milestone or trial.trial_id in recorded:
                continue
            if cur_rew is None:
                return TrialScheduler.CONTINUE
            if milestone == first_milestone and len(recorded) < self.quorum:
                action = TrialScheduler.STOP  # too few results to call this one good yet
            else:
                cutoff = self.cutoff(recorded)
                action = (TrialScheduler.STOP if cutoff is not None and cur_rew < cutoff
                          else TrialScheduler.CONTINUE)
            recorded[trial.trial_id] = cur_rew
            return action
        return TrialScheduler.CONTINUE

    def debug_str(self) -> str:
        return "Bracket: " + " | ".join(f"Iter {m:.3f}: {self.cutoff(r)}" for m, r in self._rungs)


class QuorumASHAScheduler(ASHAScheduler):
    """Ray's ASHA (one bracket) whose first rung promotes nothing before ``quorum`` results,
    and which stops a trial as soon as its metric is NaN.

    ``quorum=0`` (or 1) behaves like ``ASHAScheduler(brackets=1)`` but for NaN. Everything
    else - metric and mode from ``TuneConfig``, stopping at ``max_t``, saving its state with
    the run - is Ray's.
    """

    def __init__(self, *, time_attr: str, max_t: int, grace_period: int,
                 reduction_factor: float, quorum: int, metric: str | None = None,
                 mode: str | None = None) -> None:
        if quorum < 0:
            raise ValueError(f"quorum must be >= 0, got {quorum}")
        super().__init__(time_attr=time_attr, metric=metric, mode=mode, max_t=max_t,
                         grace_period=grace_period, reduction_factor=reduction_factor,
                         brackets=1)
        self._brackets = [_QuorumRungs(grace_period, max_t, reduction_factor, quorum)]

    @property
    def milestones(self) -> list[float]:
        """The rungs, in epochs (or whatever ``time_attr`` counts), lowest first."""
        return [m for m, _ in reversed(self._brackets[0]._rungs)]


__all__ = ["QuorumASHAScheduler"]
