"""A Ray Tune callback that reports finished trials to the workflow's progress bar.

A module of its own because Tune pickles callbacks into the experiment's state (what resume
reads); the progress bar itself is not picklable and is dropped from that state.
"""

from __future__ import annotations

from typing import Any, Callable

from ray.tune import Callback


class TrialsDone(Callback):
    """Calls ``on_done(trials_finished)`` each time a trial completes or fails."""

    def __init__(self, on_done: Callable[[int], None] | None) -> None:
        self.on_done = on_done
        self.finished = 0

    def __getstate__(self) -> dict[str, Any]:
        return {"on_done": None, "finished": self.finished}

    def _tick(self) -> None:
        self.finished += 1
        if self.on_done is not None:
            self.on_done(self.finished)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._tick()

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._tick()


__all__ = ["TrialsDone"]
