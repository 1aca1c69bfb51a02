"""The cluster controller: a named, detached, restartable Ray actor that owns the job queue.

    hetflow submit job.yaml            # starts it on first use (see hetflow.control.client)

``HetflowController`` (name ``hetflow-controller``, namespace ``hetflow``, detached,
``max_restarts=-1``, no CPU) keeps every job as a :class:`~hetflow.control.state.JobRecord` in
Ray's GCS key-value store and runs one loop, every ``tick_s`` and at once after a submit:

1. **watch** - read each attempt's report (its runner writes it; only the current token counts)
   and check that each runner is alive; an attempt that ended is closed (succeeded, failed ->
   retried from its checkpoint up to ``max_attempts``, preempted -> queued again, cancelled).
   A runner that vanished without a report lost its attempt: the job is queued again and
   resumes from its checkpoint.
2. **decide** - after an arrival or an ending when someone waits and devices are free, and at
   every round boundary of a preemptive policy: the live snapshot, the view, the policy
   (:class:`~hetflow.control.scheduler.LiveScheduler`: the simulator's round functions).
3. **apply** - stops first (the runner checkpoints the job and releases its placement group),
   then launches: the record (new token, devices, reason) is saved *before* the runner is
   created, so a controller that dies in between finds the runner by name when it restarts.

Restart: a new incarnation reloads every record. Runners are detached and own their placement
groups, so running jobs keep running; the loop's first watch adopts them (or closes the
attempts that ended meanwhile from their reports). A job is never started twice at once: the
runner's actor name is the job's, and a name Ray already has refuses a second runner.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import traceback
import warnings
from dataclasses import asdict, fields
from typing import Any

import ray

from hetflow.control.hosts import HostView, host_view
from hetflow.control.jobspec import JobSpec
from hetflow.control.runner import JobRunner, runner_name
from hetflow.control.scheduler import ControllerSettings, Launch, LiveScheduler, Plan
from hetflow.control.state import AttemptReport, Event, JobRecord, JobStore, RayKV, Status
from hetflow.core.errors import InputError
from hetflow.runtime.binding import live_snapshot
from hetflow.runtime.resources import NODE_LABEL, label_value

CONTROLLER_NAME = "hetflow-controller"
NAMESPACE = "hetflow"

log = logging.getLogger("hetflow.control")


def settings_from(saved: dict[str, Any] | None, given: dict[str, Any] | None) -> ControllerSettings:
    """Saved settings, overridden by the ones given at creation; unknown keys are an error."""
    known = {f.name for f in fields(ControllerSettings)}
    merged = {**(saved or {}), **(given or {})}
    bad = sorted(set(merged) - known)
    if bad:
        raise InputError(f"unknown controller settings {bad}; known: {sorted(known)}")
    return ControllerSettings(**merged)


def dashboard_url() -> str | None:
    """The cluster's Ray dashboard (its job API), ``http://host:port``; None when it runs none."""
    from ray._private import ray_constants
    from ray.experimental.internal_kv import _internal_kv_get

    try:
        api = _internal_kv_get(ray_constants.DASHBOARD_ADDRESS, namespace=ray_constants.KV_NAMESPACE_DASHBOARD)
    except Exception:  # noqa: BLE001 - no listing then; jobs run all the same
        return None
    return f"http://{api.decode()}" if api else None


class HetflowController:
    """The actor (see the module docstring). Public methods are what the client calls."""

    def __init__(self, settings: dict[str, Any] | None = None) -> None:
        self.store = JobStore(RayKV())
        # A restart re-runs this constructor with the creation arguments; the saved settings
        # (changed by configure() since) win then. A fresh controller takes what it was given.
        with warnings.catch_warnings():  # Ray's property reads a deprecated field of its own
            warnings.simplefilter("ignore", DeprecationWarning)
            restarted = bool(ray.get_runtime_context().was_current_actor_reconstructed)
        saved = self.store.config()
        self.settings = settings_from(saved, None if restarted and saved else settings)
        self.restarted = restarted
        self.store.save_config(asdict(self.settings))
        self.dashboard_url = dashboard_url()  # where runners list their attempts as Ray jobs (or None)
        self.scheduler = LiveScheduler(self.settings)
        self.lock = threading.RLock()
        self.records: dict[str, JobRecord] = {r.job_id: r for r in self.store.all()}
        self.started_at = time.time()
        self.dirty = True  # decide at once: the queue may have waited through a restart
        self.next_round: float | None = None
        self.decisions = 0
        self._wake = threading.Event()
        self._loop_error = ""
        threading.Thread(target=self._loop, name="hetflow-controller", daemon=True).start()

    # -- client calls -------------------------------------------------------------------------------

    def info(self) -> dict[str, Any]:
        return {"settings": asdict(self.settings), "started_at": self.started_at, "restarted": self.restarted,
                "decisions": self.decisions, "jobs": len(self.records), "loop_error": self._loop_error}

    def configure(self, settings: dict[str, Any]) -> dict[str, Any]:
        """Change settings (policy, round_s, ...) from now on; kept across restarts."""
        with self.lock:
            self.settings = settings_from(asdict(self.settings), settings)
            self.store.save_config(asdict(self.settings))
            self.scheduler = LiveScheduler(self.settings)
            self.next_round = None
            self.dirty = True
        self._wake.set()
        return asdict(self.settings)

    def submit(self, spec: dict[str, Any], submission: str = "") -> dict[str, Any]:
        """Queue a job; returns its record at once. Unschedulable when it can never fit."""
        job = JobSpec.model_validate(spec)
        with self.lock:
            for r in self.records.values():
                if submission and r.submission == submission:
                    return self._public(r)  # a retried call: the job was already queued
        self.scheduler.admit(job, self._view().snapshot)
        with self.lock:
            seq = self.store.next_seq()
            now = time.time()
            record = JobRecord(f"{job.name}-{seq}", seq, spec, now, submission=submission,
                               reason="queued: waiting for the policy's next decision")
            record.note(now, "submitted")
            self.store.save(record)
            self.records[record.job_id] = record
            self.dirty = True
        self._wake.set()
        return self._public(record)

    def status(self, job_id: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            if job_id is None:
                return [self._public(r) for r in sorted(self.records.values(), key=lambda r: r.seq)]
            return [self._public(self._get(job_id))]

    def cancel(self, job_id: str) -> dict[str, Any]:
        with self.lock:
            record = self._get(job_id)
            now = time.time()
            if record.status.finished:
                raise InputError(f"job {job_id} already ended ({record.status.value}); nothing to cancel")
            if record.status is Status.QUEUED:
                self._end(record, Event.CANCEL, now, "cancelled while queued")
            else:
                record.cancel_requested = True
                record.reason = "cancelling: its runner is stopping it"
                record.note(now, "cancel requested")
                self.store.save(record)
                handle = self._runner(job_id)
                if handle is not None:
                    handle.stop.remote(cancel=True)
            self.dirty = True
        self._wake.set()
        return self._public(record)

    def logs(self, job_id: str, nbytes: int = 64 * 1024, lines: int | None = None) -> str:
        return self.logs_at(job_id, nbytes, lines)["text"]

    def logs_at(self, job_id: str, nbytes: int = 64 * 1024, lines: int | None = None) -> dict[str, Any]:
        """The job's output (as :meth:`logs`) and where it ends - ``token`` and ``offset`` for
        :meth:`follow` to go on from exactly there (``hetflow logs -f`` prints this first: no line
        written between the two calls is lost or printed twice)."""
        with self.lock:
            record = self._get(job_id)
            token, live = record.token, record.status.holds_devices
        text = self.store.log_tail(job_id) or ""
        offset: int | None = None
        if live:
            handle = self._runner(job_id)
            if handle is not None:
                try:
                    more, offset = ray.get(handle.log_tail_at.remote(nbytes), timeout=10)
                    text += more
                except Exception:  # noqa: BLE001 - the runner may be ending right now
                    pass
        if offset is None:  # nothing runs (or it is ending): the attempt's saved end, when saved
            _, offset = self._saved_rest(job_id, token, -1)
        text = text[-nbytes:]
        if lines is not None:  # the last N lines (`--tail N`, as kubectl and `ray job logs`)
            text = "".join(text.splitlines(keepends=True)[-lines:]) if lines > 0 else ""
        return {"text": text, "token": token, "offset": offset}

    def follow(self, job_id: str, token: int | None = None, offset: int | None = None) -> dict[str, Any]:
        """The job's log from byte ``offset`` of attempt ``token`` on (``hetflow logs -f`` calls
        this in a loop, passing back the token and offset it got). ``offset`` None: from the
        attempt's start; -1: from its end now. When the followed attempt has ended, the rest of
        it comes from its saved end, then the next attempt from its start."""
        with self.lock:
            record = self._get(job_id)
            current, live = record.token, record.status.holds_devices
            status, finished = record.status.value, record.status.finished
        text = ""
        if token is not None and token != current:  # the followed attempt was followed by another
            text, _ = self._saved_rest(job_id, token, offset)
            token, offset = current, None
        if not live:  # nothing runs now: what the (current) attempt saved when it ended
            more, offset = self._saved_rest(job_id, current, offset)
            return {"token": current, "offset": offset, "text": text + more, "status": status,
                    "finished": finished}
        handle = self._runner(job_id) if live else None
        if handle is not None:
            try:
                more, offset = ray.get(handle.log_since.remote(offset), timeout=10)
                text += more
            except Exception:  # noqa: BLE001 - the runner may be ending right now; the next call sees
                pass
        return {"token": current, "offset": offset, "text": text, "status": status, "finished": finished}

    def _saved_rest(self, job_id: str, token: int, offset: int | None) -> tuple[str, int | None]:
        """What attempt ``token`` logged from ``offset`` to its end (saved by its runner)."""
        saved = self.store.attempt_log(job_id)
        if saved is None or saved["token"] != token:
            return "", offset
        data = saved["text"].encode()
        end = saved["start"] + len(data)
        if offset == -1:
            return "", end
        start = saved["start"] if offset is None else offset
        return data[max(0, start - saved["start"]):].decode(errors="replace"), end

    def tick(self) -> None:
        """One round of the loop (the thread calls it; tests may too)."""
        with self.lock:
            now = time.time()
            self._watch(now)
            active = [r for r in self.records.values() if not r.status.finished]
            if not active:
                self.next_round, self.dirty = None, False
                return
            boundary = False
            if self.scheduler.policy.preemptive:
                if self.next_round is not None and now >= self.next_round:
                    boundary = True
                if self.next_round is None or boundary:
                    self.next_round = (math.floor(now / self.settings.round_s + 1e-9) + 1) * self.settings.round_s
            if not (self.dirty or boundary):
                return
            self.dirty = False
            view = self._view()
            plan = self.scheduler.decide(active, view.snapshot, now, boundary, force=True,
                                         cpu_holds=view.cpu_holds)
            self.decisions += plan.decided
            self._apply(plan, now, view)

    # -- the loop -------------------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            self._wake.wait(timeout=self.settings.tick_s)
            self._wake.clear()
            try:
                self.tick()
                self._loop_error = ""
            except Exception:  # noqa: BLE001 - the loop must outlive one bad tick; status shows it
                self._loop_error = traceback.format_exc(limit=5)
                log.exception("controller tick failed")

    def _view(self) -> HostView:
        """The cluster now: hetflow nodes with their devices, every Ray node's CPUs, the CPUs
        placement groups hold (:mod:`hetflow.control.hosts`)."""
        from ray.util import placement_group_table

        return host_view(live_snapshot(self.settings.inter_node_gbps), ray.nodes(), placement_group_table())

    def _watch(self, now: float) -> None:
        for record in list(self.records.values()):
            if not record.status.holds_devices:
                continue
            report = self.store.attempt(record.job_id)
            if report is not None and report.token == record.token:
                changed = False
                if report.step is not None and report.step != record.progress_step:
                    record.progress_step, changed = report.step, True
                if report.phase == "running" and record.status is Status.PLACING:
                    record.move(Event.RUNNING, now,
                                f"running on {record.held.text() if record.held else '?'}")
                    changed = True
                if report.phase == "done":
                    self._close(record, report, now)
                    continue
                if changed:
                    self.store.save(record)
            if self._runner(record.job_id) is None:
                self._lost(record, now)

    def _runner(self, job_id: str) -> Any | None:
        try:
            return ray.get_actor(runner_name(job_id), namespace=NAMESPACE)
        except ValueError:
            return None

    def _close(self, record: JobRecord, report: AttemptReport, now: float) -> None:
        """An attempt ended with a report: account its time, then the job's new state."""
        spec = JobSpec.model_validate(record.spec)
        self._account(record, now)
        handle = self._runner(record.job_id)
        if handle is not None:
            ray.kill(handle, no_restart=True)  # it reported; its name must be free for the next
        outcome, message = report.outcome, report.message
        record.message = message
        self._end_run(record, now, str(outcome), report)
        if report.end_step is not None:
            record.progress_step = report.end_step
        if outcome == "succeeded":
            record.done_base = spec.total_work
            self._end(record, Event.SUCCEED, now, f"succeeded: {message}")
        elif outcome == "cancelled" or record.cancel_requested:
            self._end(record, Event.CANCEL, now, f"cancelled: {message}")
        elif outcome == "preempted":
            record.preemptions += 1
            if report.end_step is not None and spec.work.seconds is None:
                record.done_base = spec.done_steps(report.end_step, report.progress)
            self._requeue(record, now, f"queued again after preemption: {message}")
        elif outcome == "unplaced":
            self._requeue(record, now, f"queued again: its devices were not committed ({message})",
                          restore=record.needs_restore)
        else:
            record.failures += 1
            if report.fatal or record.failures >= spec.max_attempts:
                self._end(record, Event.FAIL, now, f"failed: {message}")
            else:
                self._requeue(record, now, f"queued again after a failure ({record.failures} of "
                                           f"{spec.max_attempts} attempts): {message}")
        self.dirty = True

    def _lost(self, record: JobRecord, now: float) -> None:
        """The runner is gone without a final report (its node or process died)."""
        self._account(record, now)
        spec = JobSpec.model_validate(record.spec)
        record.failures += 1
        why = f"its runner (attempt {record.token}) died without reporting"
        self._end_run(record, now, "lost", None)
        if record.cancel_requested:
            self._end(record, Event.CANCEL, now, f"cancelled ({why})")
        elif record.failures >= spec.max_attempts:
            self._end(record, Event.FAIL, now, f"failed: {why}, {record.failures} times")
        else:
            self._requeue(record, now, f"queued again: {why}; it resumes from its checkpoint")
        self.dirty = True

    @staticmethod
    def _end_run(record: JobRecord, now: float, outcome: str, report: AttemptReport | None) -> None:
        if record.runs and record.runs[-1]["token"] == record.token:
            run = record.runs[-1]
            run.update(ended_at=now, outcome=outcome)
            if report is not None:
                run.update(start_step=report.start_step, end_step=report.end_step)

    def _account(self, record: JobRecord, now: float) -> None:
        held = record.held
        if held is None:
            return
        span = max(0.0, now - record.seg_start)
        record.attained_s += len(held.slots) * held.milli / 1000 * span
        record.service_s[held.device_type] = record.service_s.get(held.device_type, 0.0) + span
        spec = JobSpec.model_validate(record.spec)
        if spec.work.seconds is not None:  # seconds of work: the time it ran, after its restore
            restore = self.settings.restore_s if record.needs_restore else 0.0
            # (an elastic job at another size does its curve's share of a second's work per second)
            speed = self.scheduler.relative_speed(spec, len(held.slots), held.device_type)
            record.done_base = min(spec.total_work, record.done_base + max(0.0, span - restore) * speed)

    def _requeue(self, record: JobRecord, now: float, reason: str, restore: bool = True) -> None:
        record.move(Event.REQUEUE, now, reason)
        record.needs_restore = restore
        self.store.save(record)

    def _end(self, record: JobRecord, event: Event, now: float, reason: str) -> None:
        record.move(event, now, reason)
        self.store.save(record)

    def _apply(self, plan: Plan, now: float, view: HostView) -> None:
        for stop in plan.stops:
            record = self.records[stop.job_id]
            handle = self._runner(stop.job_id)
            record.move(Event.PREEMPT, now, stop.reason)
            self.store.save(record)
            if handle is not None:
                handle.stop.remote()
        for launch in plan.launches:
            self._launch(self.records[launch.job_id], launch, now, view)
        for job_id, reason in plan.reasons.items():
            record = self.records[job_id]
            if record.reason != reason:
                record.reason = reason
                self.store.save(record)

    def _launch(self, record: JobRecord, launch: Launch, now: float, view: HostView) -> None:
        old = self._runner(record.job_id)
        if old is not None:  # an earlier attempt's runner is still there: never two at once
            ray.kill(old, no_restart=True)
            record.reason = "waiting: the previous attempt's runner is still shutting down"
            self.store.save(record)
            self.dirty = True
            return
        record.token += 1
        record.move(Event.LAUNCH, now, launch.reason)
        record.held = launch.held
        size = len(launch.held.slots)
        if record.size is not None and size != record.size:
            record.resizes += 1  # an elastic job restarts at another size (through its checkpoint)
        record.size = size
        record.seg_start = now
        if record.first_started_at is None:
            record.first_started_at = now
        record.runs.append({"token": record.token, "device_type": launch.held.device_type,
                            "devices": [[s.node, s.device] for s in launch.held.slots],
                            "where": launch.held.text(), "size": size,
                            "started_at": now, "ended_at": None, "outcome": None})
        self.store.save(record)  # before the runner exists: a restart then knows its token
        node = launch.held.nodes[0]
        host = None
        if launch.placement is None:  # a CPU job: pinned by Ray's node id (plain Ray nodes have no hetflow label)
            host = {"node": node, "selector": view.selector(node)}
            selector = host["selector"]
        else:
            selector = {NODE_LABEL: label_value(node)}
        try:
            ray.remote(JobRunner).options(
                name=runner_name(record.job_id), namespace=NAMESPACE, lifetime="detached",
                num_cpus=0, max_restarts=0, max_concurrency=8, label_selector=selector,
            ).remote(record.job_id, record.token, record.spec, launch.placement, view.snapshot,
                     {**asdict(self.settings), "dashboard_url": self.dashboard_url}, now,
                     record.needs_restore, host)
        except ValueError as exc:  # the name was taken in between: try again next decision
            self._requeue(record, now, f"queued again: could not start its runner ({exc})",
                          restore=record.needs_restore)
            self.dirty = True

    # -- helpers ----------------------------------------------------------------------------------

    def _get(self, job_id: str) -> JobRecord:
        record = self.records.get(job_id)
        if record is None:
            known = ", ".join(list(self.records)[-5:]) or "none yet"
            raise InputError(f"no job {job_id!r} (recent jobs: {known}); `hetflow status` lists them")
        return record

    def _public(self, record: JobRecord) -> dict[str, Any]:
        data = record.to_dict()
        data["devices"] = record.held.text() if record.held else None
        data["name"] = record.name
        sizes = self.scheduler.sizes_of(record)
        data["sizes"] = list(sizes) if len(sizes) > 1 else None  # an elastic job's allowed device counts
        return data


__all__ = ["CONTROLLER_NAME", "NAMESPACE", "HetflowController", "settings_from"]
