"""The controller's job states: every transition of the table walked, everything else refused,
and no status set in the controller but through the table."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from hetflow.control.state import TRANSITIONS, Event, HeldDevices, IllegalTransition, JobRecord, Slot, Status

CONTROLLER = Path(__file__).resolve().parents[2] / "src" / "hetflow" / "control" / "controller.py"


def _record(status: Status) -> JobRecord:
    held = HeldDevices("MI300X", [Slot("mi300x-0", 1)]) if status.holds_devices else None
    return JobRecord("job-1", 1, {"name": "job"}, 0.0, status=status, held=held)


@pytest.mark.parametrize("status, event", sorted(TRANSITIONS, key=lambda k: (k[0].value, k[1].value)))
def test_every_transition_of_the_table(status: Status, event: Event) -> None:
    record = _record(status)
    held_before = record.held
    target = record.move(event, 5.0, f"{event.value} now")
    assert record.status is target is TRANSITIONS[(status, event)]
    assert record.reason == f"{event.value} now" and record.history[-1] == [5.0, f"{event.value} now"]
    assert record.held is (held_before if target.holds_devices else None)  # one that lets go holds nothing
    assert (record.finished_at == 5.0) == target.finished


@pytest.mark.parametrize("status", list(Status))
@pytest.mark.parametrize("event", list(Event))
def test_what_the_table_does_not_allow_is_refused(status: Status, event: Event) -> None:
    if (status, event) in TRANSITIONS:
        return
    record = _record(status)
    with pytest.raises(IllegalTransition, match=f"'{event.value}' is not allowed while {status.value}"):
        record.move(event, 5.0, "no")
    assert record.status is status and record.history == []  # nothing changed


def test_the_table_covers_the_life_of_a_job() -> None:
    assert not any(status.finished for status, _ in TRANSITIONS)  # an ended job takes no event
    reachable, frontier = {Status.QUEUED}, [Status.QUEUED]
    while frontier:
        now = frontier.pop()
        for (status, _), target in TRANSITIONS.items():
            if status is now and target not in reachable:
                reachable.add(target)
                frontier.append(target)
    assert reachable == set(Status)  # every status is reached from a new job
    every_event = {event for _, event in TRANSITIONS}
    assert every_event == set(Event)
    # a preempted or failed attempt goes back to the queue from each state that holds devices
    assert {s for (s, e) in TRANSITIONS if e is Event.REQUEUE} == {s for s in Status if s.holds_devices}


def test_the_controller_sets_no_status_but_through_the_table() -> None:
    tree = ast.parse(CONTROLLER.read_text())
    assignments = [node.lineno for node in ast.walk(tree)
                   if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
                   for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
                   if isinstance(target, ast.Attribute) and target.attr == "status"]
    assert assignments == [], f"controller.py sets .status directly at lines {assignments}: use record.move"
    moves = [node for node in ast.walk(tree) if isinstance(node, ast.Call)
             and isinstance(node.func, ast.Attribute) and node.func.attr == "move"]
    assert len(moves) >= 4  # launch, running, preempt, requeue/end
