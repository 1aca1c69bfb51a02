"""Durable state of the cluster controller: job records, attempt reports, its own settings.

Everything lives in a key-value store, one key per fact, each put atomic:

- ``control/job/<id>``      a :class:`JobRecord` (JSON, ``hetflow.job/v1``) - written by the
  controller only;
- ``control/attempt/<id>``  the current attempt's :class:`AttemptReport` - written by that
  attempt's runner only (the token says which attempt wrote it);
- ``control/log/<id>``      the tail of a finished attempt's log;
- ``control/attempt-log/<id>`` the last attempt's own log end (token, byte offsets, text), so
  that ``hetflow logs -f`` shows an attempt's last lines after its runner is gone;
- ``control/seq``           the last job number handed out; ``control/config`` the settings.

No index key: listing the ``control/job/`` prefix is the index, so there is no second write
that could be lost between a record and its index entry.

Stores: :class:`RayKV` (Ray's GCS key-value store, namespace ``hetflow``; survives the
controller and every worker, lives as long as the Ray cluster's GCS) and :class:`DirectoryKV`
(a file per key on the head node, written to a temporary file, fsynced and renamed; for tests
without Ray, and as the documented alternative for a GCS without fault tolerance).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from hetflow.core.errors import InputError
from hetflow.core.units import format_cpus
from hetflow.runtime.kv import DirectoryKV, KeyValue
from hetflow.runtime.kv import RayKV as _RayKV

SCHEMA = "hetflow.job/v1"
KV_NAMESPACE = "hetflow"
JOB_PREFIX = "control/job/"
ATTEMPT_PREFIX = "control/attempt/"
LOG_PREFIX = "control/log/"
ATTEMPT_LOG_PREFIX = "control/attempt-log/"
SEQ_KEY = "control/seq"
CONFIG_KEY = "control/config"
HISTORY_LIMIT = 50  # events kept per job


class Status(str, Enum):
    QUEUED = "QUEUED"  # waiting for the policy to place it (new, preempted or retried)
    PLACING = "PLACING"  # a runner was started; it is reserving the devices
    RUNNING = "RUNNING"
    PREEMPTING = "PREEMPTING"  # asked to checkpoint and stop; still holds its devices
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def holds_devices(self) -> bool:
        return self in (Status.PLACING, Status.RUNNING, Status.PREEMPTING)

    @property
    def finished(self) -> bool:
        return self in (Status.SUCCEEDED, Status.FAILED, Status.CANCELLED)


class Event(str, Enum):
    """What happens to a job; :data:`TRANSITIONS` says which status each one leads to."""

    LAUNCH = "launch"  # the policy placed it: its runner was started
    RUNNING = "running"  # its runner committed the devices and started the work
    PREEMPT = "preempt"  # the policy asks it to checkpoint and stop
    REQUEUE = "requeue"  # back in the queue: preempted, not committed, retried after a failure or a lost runner
    SUCCEED = "succeed"
    FAIL = "fail"  # failed for good: a fatal error or its last attempt
    CANCEL = "cancel"  # cancelled by its user (while queued, or its runner stopped it)


_HOLDING = (Status.PLACING, Status.RUNNING, Status.PREEMPTING)
TRANSITIONS: dict[tuple[Status, Event], Status] = {
    (Status.QUEUED, Event.LAUNCH): Status.PLACING,
    (Status.QUEUED, Event.CANCEL): Status.CANCELLED,
    (Status.PLACING, Event.RUNNING): Status.RUNNING,
    (Status.PLACING, Event.PREEMPT): Status.PREEMPTING,
    (Status.RUNNING, Event.PREEMPT): Status.PREEMPTING,
    **{(held, Event.REQUEUE): Status.QUEUED for held in _HOLDING},
    **{(held, Event.SUCCEED): Status.SUCCEEDED for held in _HOLDING},
    **{(held, Event.FAIL): Status.FAILED for held in _HOLDING},
    **{(held, Event.CANCEL): Status.CANCELLED for held in _HOLDING},
}
"""Every status change the controller makes: (status, event) -> the next status. A finished
job takes no event; anything not here is a bug in the controller (:class:`IllegalTransition`)."""


class IllegalTransition(RuntimeError):
    """The controller tried a status change :data:`TRANSITIONS` does not allow."""


@dataclass
class Slot:
    """One device of an assignment, by name (node indices change when nodes come and go)."""

    node: str
    device: int


@dataclass
class HeldDevices:
    """Where an attempt runs: the policy's assignment in names, and how it was chosen.

    A CPU job holds no slots: ``host`` is its node, ``cpu_milli`` and ``memory_mib`` what it
    reserved there (device type ``CPU``)."""

    device_type: str
    slots: list[Slot]
    milli: int = 1000
    host: str | None = None
    cpu_milli: int = 0
    memory_mib: int = 0

    @property
    def nodes(self) -> list[str]:
        """Nodes it runs on, the first one first (where the runner goes)."""
        names = [s.node for s in self.slots] + ([self.host] if self.host else [])
        return list(dict.fromkeys(names))

    def text(self) -> str:
        if not self.slots:
            memory = f", {self.memory_mib / 1024:.1f} GiB" if self.memory_mib else ""
            return f"{format_cpus(self.cpu_milli / 1000)}{memory} on {self.host}"
        per_node: dict[str, list[str]] = {}
        for s in self.slots:
            per_node.setdefault(s.node, []).append(str(s.device))
        where = " + ".join(f"{n} [{' '.join(d)}]" for n, d in per_node.items())
        return f"{len(self.slots)}x {self.device_type} on {where}"


@dataclass
class JobRecord:
    """Everything the controller knows about one job; written atomically as one key.

    ``token`` is the fencing token: it grows by one for each attempt the controller launches,
    and only reports carrying the current token are believed. ``done_base`` is the work (in the
    spec's units) finished by attempts that ended; ``seg_start`` the wall time the current
    attempt was launched.
    """

    job_id: str
    seq: int  # submission order (ties in arrival time are broken by it)
    spec: dict[str, Any]  # the resolved JobSpec, as JSON
    submitted_at: float
    status: Status = Status.QUEUED
    token: int = 0
    failures: int = 0  # attempts that failed (not preemptions)
    preemptions: int = 0
    held: HeldDevices | None = None
    seg_start: float = 0.0
    done_base: float = 0.0
    needs_restore: bool = False
    service_s: dict[str, float] = field(default_factory=dict)  # seconds run per device type
    attained_s: float = 0.0  # device-seconds run so far
    first_started_at: float | None = None
    finished_at: float | None = None
    reason: str = "submitted"  # what is happening to it now, and why
    history: list[list[Any]] = field(default_factory=list)  # [wall time, event]
    cancel_requested: bool = False
    progress_step: int | None = None  # newest step a training attempt reported
    message: str = ""  # the outcome's detail (error text, checkpoint)
    submission: str = ""  # the client's id for this submit: a retried call finds the same job
    runs: list[dict[str, Any]] = field(default_factory=list)  # per attempt: token, devices, times, outcome
    size: int | None = None  # devices of the latest attempt (an elastic job's current size)
    resizes: int = 0  # attempts started at another size than the one before (elastic jobs)

    def move(self, event: Event, when: float, reason: str) -> Status:
        """The status change of ``event`` (by :data:`TRANSITIONS`), with its reason noted; a
        job that leaves the devices holds none afterwards, a finished one gets its end time."""
        target = TRANSITIONS.get((self.status, event))
        if target is None:
            raise IllegalTransition(f"job {self.job_id}: {event.value!r} is not allowed while "
                                    f"{self.status.value}")
        self.status = target
        if not target.holds_devices:
            self.held = None
        if target.finished:
            self.finished_at = when
        self.reason = reason
        self.note(when, reason)
        return target

    def note(self, when: float, event: str) -> None:
        self.history.append([when, event])
        del self.history[:-HISTORY_LIMIT]

    @property
    def name(self) -> str:
        return str(self.spec.get("name", self.job_id))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        return {"schema": SCHEMA, **data}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "JobRecord":
        if data.get("schema") != SCHEMA:
            raise InputError(f"job record has schema {data.get('schema')!r}; this hetflow reads {SCHEMA}")
        data = {k: v for k, v in data.items() if k != "schema"}
        held = data.pop("held", None)
        record = cls(**{**data, "status": Status(data["status"])})
        if held is not None:
            record.held = HeldDevices(held["device_type"], [Slot(**s) for s in held["slots"]],
                                      held.get("milli", 1000), held.get("host"),
                                      held.get("cpu_milli", 0), held.get("memory_mib", 0))
        return record


@dataclass
class AttemptReport:
    """What one attempt's runner says about itself (``phase``: placing, running, done).

    ``outcome`` once done: succeeded, failed, preempted, cancelled or unplaced (the reservation
    did not commit; nothing ran). ``fatal``: retrying would repeat the failure (an error in the
    job's own code). ``start_step``/``end_step`` for training attempts.
    """

    job_id: str
    token: int
    phase: str
    outcome: str | None = None
    message: str = ""
    fatal: bool = False
    start_step: int | None = None
    end_step: int | None = None
    progress: float | None = None  # a training attempt's end in reference steps (train.step_gain)
    step: int | None = None  # progress while running
    at: float = 0.0


class RayKV(_RayKV):
    """Ray's GCS key-value store, namespace ``hetflow`` (the process must be connected)."""

    def __init__(self, namespace: str = KV_NAMESPACE) -> None:
        super().__init__(namespace)


class JobStore:
    """Typed access to the controller's keys (see the module docstring)."""

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv

    # -- job records (controller) -------------------------------------------------------------

    def save(self, record: JobRecord) -> None:
        self.kv.put(JOB_PREFIX + record.job_id, json.dumps(record.to_dict()).encode())

    def load(self, job_id: str) -> JobRecord | None:
        raw = self.kv.get(JOB_PREFIX + job_id)
        return None if raw is None else JobRecord.from_dict(json.loads(raw))

    def all(self) -> list[JobRecord]:
        """Every job, in submission order."""
        records = []
        for key in self.kv.keys(JOB_PREFIX):
            raw = self.kv.get(key)
            if raw is not None:
                records.append(JobRecord.from_dict(json.loads(raw)))
        return sorted(records, key=lambda r: r.seq)

    def next_seq(self) -> int:
        raw = self.kv.get(SEQ_KEY)
        seq = (int(raw) if raw else 0) + 1
        self.kv.put(SEQ_KEY, str(seq).encode())
        return seq

    # -- attempt reports (runners) ------------------------------------------------------------

    def report(self, report: AttemptReport) -> None:
        self.kv.put(ATTEMPT_PREFIX + report.job_id, json.dumps(asdict(report)).encode())

    def attempt(self, job_id: str) -> AttemptReport | None:
        raw = self.kv.get(ATTEMPT_PREFIX + job_id)
        return None if raw is None else AttemptReport(**json.loads(raw))

    def save_log_tail(self, job_id: str, text: str) -> None:
        self.kv.put(LOG_PREFIX + job_id, text.encode())

    def log_tail(self, job_id: str) -> str | None:
        raw = self.kv.get(LOG_PREFIX + job_id)
        return None if raw is None else raw.decode(errors="replace")

    def save_attempt_log(self, job_id: str, token: int, start: int, text: str) -> None:
        """The end of attempt ``token``'s log: ``text`` begins at byte ``start`` of the log file."""
        self.kv.put(ATTEMPT_LOG_PREFIX + job_id, json.dumps({"token": token, "start": start, "text": text}).encode())

    def attempt_log(self, job_id: str) -> dict[str, Any] | None:
        raw = self.kv.get(ATTEMPT_LOG_PREFIX + job_id)
        return None if raw is None else json.loads(raw)

    # -- settings -----------------------------------------------------------------------------

    def config(self) -> dict[str, Any] | None:
        raw = self.kv.get(CONFIG_KEY)
        return None if raw is None else json.loads(raw)

    def save_config(self, config: dict[str, Any]) -> None:
        self.kv.put(CONFIG_KEY, json.dumps(config).encode())


__all__ = ["TRANSITIONS", "AttemptReport", "DirectoryKV", "Event", "HeldDevices", "IllegalTransition", "JobRecord",
           "JobStore", "KeyValue", "RayKV", "Slot", "Status"]
