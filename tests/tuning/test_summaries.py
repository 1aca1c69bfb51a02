"""Trial summaries from Tune's results: the curve read back from the trial's files, completed by
Tune's in-memory last result (no Ray cluster: real ``ray.tune.Result`` objects)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from ray.tune import Result

from hetflow.workloads.tune.config import load_tuning_config
from hetflow.workloads.tune.runner import _summaries

EXAMPLE = Path(__file__).parents[2] / "examples" / "tune_digits.yaml"


def report(epoch: int, accuracy: float) -> dict:
    return {"epoch": epoch, "val_accuracy": accuracy, "val_loss": 1.0 / epoch,
            "train_loss": 1.0 / epoch, "started_at": 100.0, "reported_at": 100.0 + epoch,
            "trial_id": "t1"}


def summary(tmp_path: Path, written: list[dict], last: dict | None, epochs: int = 3):
    config = load_tuning_config(EXAMPLE)
    config = config.model_copy(update={"budget": config.budget.model_copy(update={"epochs": epochs})})
    frame = pd.DataFrame(written) if written else None
    result = Result(metrics=last, checkpoint=None, error=None, path=str(tmp_path / "trial_t1"),
                    metrics_dataframe=frame)
    (one,) = _summaries(config, [result])
    return one


def test_last_epoch_known_only_in_memory_still_counts(tmp_path: Path) -> None:
    # Interrupted after the driver got epoch 3 but before the logger wrote it to the files.
    one = summary(tmp_path, [report(1, 0.5), report(2, 0.7)], last=report(3, 0.9))
    assert one.status == "done" and one.epochs == 3
    assert [r["epoch"] for r in one.curve] == [1, 2, 3]
    assert (one.best, one.best_epoch) == (0.9, 3)


def test_files_and_memory_agreeing_count_each_epoch_once(tmp_path: Path) -> None:
    one = summary(tmp_path, [report(1, 0.5), report(2, 0.7)], last=report(2, 0.7))
    assert one.status == "stopped" and one.epochs == 2
    assert [r["epoch"] for r in one.curve] == [1, 2]


def test_an_epoch_trained_again_after_resume_keeps_its_last_report(tmp_path: Path) -> None:
    again = {**report(2, 0.75), "reported_at": 500.0}
    one = summary(tmp_path, [report(1, 0.5), report(2, 0.7), again], last=again)
    assert [r["val_accuracy"] for r in one.curve] == [0.5, 0.75]


def test_a_trial_with_no_result_is_not_run(tmp_path: Path) -> None:
    one = summary(tmp_path, [], last={})
    assert one.status == "not run" and one.epochs == 0 and one.best is None


def test_tunes_warning_about_trials_that_never_reported_is_dropped_and_others_kept() -> None:
    """A trial whose first report ended the run has its result in Tune's memory but no result
    file yet; Tune warns about it (in this format), and the summary counts that result from
    memory (``test_last_epoch_known_only_in_memory_still_counts``)."""
    import logging

    from hetflow.workloads.tune.runner import _TrialsWithoutResults

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("ray.tune.analysis.experiment_analysis", logging.WARNING,
                                 __file__, 1, message, None, None)

    def missing(trial: str) -> str:
        return (f"- {trial}: FileNotFoundError('Could not fetch metrics for {trial}: both "
                f"result.json and progress.csv were not found at /tmp/x/{trial}')")

    keep = _TrialsWithoutResults().filter
    assert not keep(record("Failed to fetch metrics for 2 trial(s):\n"
                           + missing("run_trial_a") + "\n" + missing("run_trial_b")))
    assert keep(record("Failed to fetch metrics for 2 trial(s):\n" + missing("run_trial_a")
                       + "\n- run_trial_b: ParserError('Error tokenizing data')"))
    assert keep(record("Some other warning"))
