"""Each tuning trial as an MLflow run nested under the tuning run: Ray Tune's own
``MLflowLoggerCallback``, made safe for hetflow.

Ray's callback already does what a trial's run needs, on Tune's driver: one run per trial, the
trial's sampled values as parameters (Ray's ``a/b`` keys), every numeric result as a metric at
the trial's ``training_iteration`` (its epoch), the run ended FINISHED or FAILED. hetflow adds
three things: the runs nest under the tuning run (``mlflow.parentRunId`` among its tags), the
device each trial ran on becomes tags (``hetflow.device``, ``hetflow.host``,
``hetflow.visible_devices``), and a failing store is warned once instead of failing Tune's
control loop (Ray's callback lets every MLflow error through).
"""

from __future__ import annotations

from typing import Any

from ray.air.integrations.mlflow import MLflowLoggerCallback


class TrialRuns(MLflowLoggerCallback):
    """``MLflowLoggerCallback`` whose trial runs nest under ``parent_run_id``."""

    def __init__(self, tracking_uri: str, experiment_name: str, parent_run_id: str) -> None:
        super().__init__(tracking_uri=tracking_uri, experiment_name=experiment_name,
                         tags={"mlflow.parentRunId": parent_run_id, "hetflow.kind": "trial"},
                         save_artifact=False)
        self._warned = False
        self._placed: set[str] = set()

    def _guard(self, call: Any, *args: Any) -> None:
        try:
            call(*args)
        except Exception as exc:  # noqa: BLE001 - logging must never stop the tuning run
            if not self._warned:
                self._warned = True
                text = " ".join(str(exc).split())[:300]
                import sys

                print(f"hetflow: warning: MLflow logging of a trial failed ({type(exc).__name__}: "
                      f"{text}); tuning goes on, further MLflow errors are not shown",
                      file=sys.stderr, flush=True)

    def setup(self, *args: Any, **kwargs: Any) -> None:
        self._guard(lambda: super(TrialRuns, self).setup(*args, **kwargs))
        if not hasattr(self, "_trial_runs"):
            self._trial_runs = {}

    def log_trial_start(self, trial: Any) -> None:
        self._guard(super().log_trial_start, trial)

    def log_trial_result(self, iteration: int, trial: Any, result: dict) -> None:
        if trial not in self._trial_runs:
            return  # its run could not be created (warned)
        self._guard(super().log_trial_result, iteration, trial, result)
        if trial.trial_id not in self._placed and "device" in result:
            self._placed.add(trial.trial_id)
            tags = {"hetflow.device": result.get("device"), "hetflow.host": result.get("host"),
                    "hetflow.visible_devices": result.get("visible_devices")}
            client = self.mlflow_util._get_client()
            run_id = self._trial_runs[trial]
            for key, value in tags.items():
                if value not in (None, ""):
                    self._guard(client.set_tag, run_id, key, str(value))

    def log_trial_end(self, trial: Any, failed: bool = False) -> None:
        if trial in self._trial_runs:
            self._guard(super().log_trial_end, trial, failed)


__all__ = ["TrialRuns"]
