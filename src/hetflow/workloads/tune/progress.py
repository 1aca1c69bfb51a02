"""Progress of a tuning run: a live table of the trials, and a plot of their validation curves.

:class:`LiveTable` is a Ray Tune callback. On a terminal it redraws one table (rich ``Live``)
as results arrive: each trial's status, sampled values, epochs done, last and best metric, and
whether the scheduler stopped it early. Elsewhere (a log file, CI) it prints one line per
finished trial instead. At the end it prints the final table, best trial first.

:func:`plot_curves` draws every trial's validation metric per epoch (matplotlib's Agg
backend: no display needed), the best trial highlighted.

Tune pickles its callbacks with the run (so that ``Tuner.restore`` has them); the console and
the live display are made in ``setup`` and left out of the pickle.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from ray.tune import Callback, Stopper
from ray.tune.experiment import Trial

from hetflow.workloads.tune.space import SearchSpace

REFRESH_S = 0.25  # the live table is redrawn at most this often


class LiveTable(Callback):
    """The trials of a run as a table, kept current while Tune runs them."""

    def __init__(self, space: SearchSpace, metric: str, mode: str, epochs: int,
                 total_trials: int, live: bool = True, stream: Any = None) -> None:
        self.space = space
        self.metric = metric
        self.mode = mode
        self.epochs = epochs
        self.total_trials = total_trials
        self.live = live
        self.stream = stream
        self._best: dict[str, float] = {}
        self._console: Any = None
        self._live: Any = None
        self._trials: list[Trial] = []
        self._drawn_at = 0.0
        self._finished = 0

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_console=None, _live=None, _trials=[], stream=None)
        return state

    # --- Tune hooks --------------------------------------------------------------------------

    def setup(self, **info: Any) -> None:
        from rich.console import Console
        from rich.live import Live

        self._console = Console(file=self.stream or sys.stdout)
        if self.live and self._console.is_terminal:
            self._live = Live(self.table(), console=self._console, refresh_per_second=4,
                              transient=True)
            self._live.start()

    def on_step_end(self, iteration: int, trials: list[Trial], **info: Any) -> None:
        self._trials = trials
        now = time.monotonic()
        if self._live is not None and now - self._drawn_at >= REFRESH_S:
            self._live.update(self.table())
            self._drawn_at = now

    def on_trial_result(self, iteration: int, trials: list[Trial], trial: Trial,
                        result: dict[str, Any], **info: Any) -> None:
        value = result.get(self.metric)
        if value is not None:
            best = self._best.get(trial.trial_id)
            if best is None or self._better(value, best):
                self._best[trial.trial_id] = float(value)

    def on_trial_complete(self, iteration: int, trials: list[Trial], trial: Trial,
                          **info: Any) -> None:
        self._trials = trials
        self._finished += 1
        if self._live is None and self._console is not None:
            self._console.print(self.line(trial), highlight=False, soft_wrap=True)

    def on_trial_error(self, iteration: int, trials: list[Trial], trial: Trial,
                       **info: Any) -> None:
        self.on_trial_complete(iteration, trials, trial)

    def on_experiment_end(self, trials: list[Trial], **info: Any) -> None:
        self._trials = trials
        if self._live is not None:
            self._live.stop()
            self._live = None
        if self._console is not None:
            self._console.print(self.table(final=True))

    # --- rendering ---------------------------------------------------------------------------

    def _better(self, a: float, b: float) -> bool:
        return a > b if self.mode == "max" else a < b

    def status(self, trial: Trial) -> str:
        epochs = int((trial.last_result or {}).get("epoch", 0))
        if trial.status == Trial.TERMINATED and epochs < self.epochs:
            return f"stopped at {epochs}"
        return {Trial.TERMINATED: "done", Trial.ERROR: "error"}.get(trial.status,
                                                                     trial.status.lower())

    def _params(self, trial: Trial) -> str:
        try:
            return self.space.describe(trial.config)
        except KeyError:
            return "-"

    def line(self, trial: Trial) -> str:
        """One finished trial, for logs: ``trial 3/24 1a2b3c4d done  10/10 epochs ...``."""
        last = trial.last_result or {}
        value = last.get(self.metric)
        best = self._best.get(trial.trial_id)
        shown = f"{self.metric} {value:.4f} (best {best:.4f})" if value is not None else "-"
        return (f"trial {self._finished}/{self.total_trials} {trial.trial_id} "
                f"{self.status(trial)}  {int(last.get('epoch', 0))}/{self.epochs} epochs  "
                f"{shown}  {self._params(trial)}")

    def table(self, final: bool = False) -> Any:
        from rich.table import Table

        trials = list(self._trials)
        if final:
            sign = -1 if self.mode == "max" else 1
            trials.sort(key=lambda t: (t.trial_id not in self._best,
                                       sign * self._best.get(t.trial_id, 0.0)))
        done = sum(t.status in (Trial.TERMINATED, Trial.ERROR) for t in trials)
        title = f"trials: {done} finished, {len(trials) - done} live, budget {self.total_trials}"
        table = Table(title=title, title_justify="left")
        for column in ("trial", "status"):
            table.add_column(column)
        for column in ("epochs", self.metric, "best"):
            table.add_column(column, justify="right")
        names = self.space.names
        for name in names:  # one column per searched field, named by the field alone
            table.add_column(name.split(".", 1)[1], justify="right")
        for trial in trials:
            last = trial.last_result or {}
            value = last.get(self.metric)
            best = self._best.get(trial.trial_id)
            try:
                params = self.space.flat(trial.config)
            except KeyError:
                params = {}
            table.add_row(trial.trial_id, self.status(trial),
                          f"{int(last.get('epoch', 0))}/{self.epochs}",
                          "-" if value is None else f"{value:.4f}",
                          "-" if best is None else f"{best:.4f}",
                          *(_cell(params.get(name)) for name in names))
        return table


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    return json.dumps(value) if isinstance(value, (list, tuple)) else str(value)


class TargetReached(Stopper):
    """Ends the whole run once any trial reports ``metric`` at (or beyond) ``target``."""

    def __init__(self, metric: str, mode: str, target: float) -> None:
        self.metric = metric
        self.mode = mode
        self.target = target
        self.reached = False

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        value = result.get(self.metric)
        if value is not None and (value >= self.target if self.mode == "max"
                                  else value <= self.target):
            self.reached = True
        return False  # the trial itself is not stopped; stop_all ends them all

    def stop_all(self) -> bool:
        return self.reached


def plot_curves(curves: dict[str, Sequence[tuple[int, float]]], metric: str, path: str | Path,
                best: str | None = None, title: str = "") -> Path:
    """Draw each trial's ``metric`` per epoch into a PNG; ``best`` (a key) is highlighted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    try:
        for name, points in curves.items():
            if not points or name == best:
                continue
            epochs, values = zip(*points)
            ax.plot(epochs, values, color="tab:gray", alpha=0.55, linewidth=1.0,
                    marker="o", markersize=2.5)
            ax.plot(epochs[-1:], values[-1:], color="tab:gray", marker="x", markersize=5)
        if best is not None and curves.get(best):
            epochs, values = zip(*curves[best])
            ax.plot(epochs, values, color="tab:red", linewidth=2.2, marker="o", markersize=3.5,
                    label=f"best: {best}")
            ax.legend(loc="lower right" if "accuracy" in metric else "upper right")
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("epoch")
        ax.set_ylabel(metric.replace("_", " "))
        ax.set_title(title or f"{len(curves)} trials (x: last epoch of a trial)")
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
    finally:
        plt.close(fig)
    return path


__all__ = ["LiveTable", "TargetReached", "plot_curves"]
