"""Resume: a job continued from its checkpoint takes exactly the steps an uninterrupted job takes
(same step, same batches, same optimizer state), also after resharding from dp 2 to dp 1."""

from __future__ import annotations

import pytest

from hetflow.workloads.train.checkpoint import list_checkpoints
from tests.workloads.conftest import Worlds


def test_resume_continues_at_the_exact_step(worlds: Worlds) -> None:
    straight, first, second = (worlds.outcomes[n] for n in ("straight", "first-half", "second-half"))
    for outcome in (straight, first, second):
        assert outcome.error is None, outcome.error
    assert (first.start_step, first.end_step) == (0, 4)
    assert (second.start_step, second.end_step) == (4, 8)
    # The continued run carries the first half's history and computes the second half anew.
    assert sorted(second.losses) == list(range(1, 9))
    for step in range(1, 5):
        assert second.losses[step] == first.losses[step]
    # Same weights, moments and batches as the straight run: identical losses (same process
    # count, same reduction order).
    for step in range(5, 9):
        assert second.losses[step] == pytest.approx(straight.losses[step], abs=1e-6)


def test_straight_run_checkpoints_every_interval(worlds: Worlds) -> None:
    steps = [c.step for c in list_checkpoints(worlds.configs["straight"].checkpoint_dir)]
    assert steps == [4, 8]


def test_resume_on_fewer_replicas_keeps_the_loss_curve(worlds: Worlds) -> None:
    """dp 2 (FSDP-sharded checkpoint) -> dp 1: DCP reshards; the global batch is unchanged."""
    straight, shrunk = worlds.outcomes["straight"], worlds.outcomes["dp1-rest"]
    assert shrunk.error is None, shrunk.error
    assert shrunk.start_step == 4
    for step in range(5, 9):
        assert shrunk.losses[step] == pytest.approx(straight.losses[step], abs=1e-4)
