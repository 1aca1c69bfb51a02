"""How a failed Serve start is reported: Ray's dead-actor error carries the actor's class and
Ray's cause on lines after its first; the one-line message keeps them (CI once saw only
"The actor died unexpectedly before finishing this task." and nothing to act on)."""

from __future__ import annotations

import ray
from ray.core.generated.common_pb2 import ActorDiedErrorContext

from hetflow.workloads.serve.deploy import _reason


def test_a_dead_serve_actor_is_named_with_rays_cause() -> None:
    cause = ("The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR "
             "Worker exit detail: Worker unexpectedly exits")
    error = ray.exceptions.ActorDiedError(ActorDiedErrorContext(
        class_name="ProxyActor", actor_id=b"\x01" * 16, pid=7, node_ip_address="127.0.0.1",
        error_message=cause))
    assert not error.actor_init_failed  # a system failure: deploy starts Serve once more
    line = _reason(error)
    assert "\n" not in line
    assert line == f"its ProxyActor actor died: {cause}"


def test_other_errors_keep_their_first_line() -> None:
    assert _reason(TimeoutError()) == "TimeoutError"
    assert _reason(ray.exceptions.GetTimeoutError("Get timed out: some object(s) not ready.\nmore")) == \
        "Get timed out: some object(s) not ready."
