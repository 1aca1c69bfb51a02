"""One attempt of one job: reserve its devices, run it, report, give the devices back.

The controller starts one :class:`JobRunner` per attempt as a named, detached Ray actor
(``hetflow-job-<id>`` in namespace ``hetflow``) on the job's first node. Ray refuses a second
actor of the same name, so two attempts of one job can never run at once; the controller kills
the previous runner before it launches the next.

The runner, not the controller, creates the job's placement group: the group then lives
exactly as long as the runner (Ray removes a group when its creator dies), and a controller
restart leaves running jobs alone. Its steps, each reported to the key-value store as an
:class:`~hetflow.control.state.AttemptReport` carrying the attempt's token:

1. ``placing``: :func:`~hetflow.runtime.binding.reserve` the policy's devices (the planner's
   binding: bundle per device, visibility variables per rank) - or, for a CPU job,
   :func:`~hetflow.runtime.binding.reserve_cpus` its CPUs on its node (one bundle per rank,
   pinned by the node's ``ray.io/node-id``; no device visible);
2. ``running``: run the job - ``train``: one rank actor per device on its bundle (the training
   actor group), with ``HETFLOW_STOP_FILE`` in their environment; ``launch``: ``hetflow
   launch``'s launcher on the reserved bundles (one process per rank, the torchrun environment,
   its ``max_restarts``; rank output to the log with ``[rank k]``); ``python``/``tune``: one
   process on this node, seeing this node's devices of the job, stdout and stderr to the log;
3. ``done`` with an outcome: succeeded, failed (``fatal`` when the job's own code raised),
   preempted (stopped on request after a checkpoint), cancelled, or unplaced (the devices were
   not committed in time; nothing ran).

Stopping (preemption or cancel): the stop file is created; training ranks checkpoint at the
current step and return; a process - and every rank of a launch job - gets SIGTERM (it should
checkpoint and exit) and SIGKILL after ``stop_grace_s``.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from hetflow.control.attempt_job import STOPPED, submission_id, write_outcome
from hetflow.control.jobspec import JobSpec
from hetflow.control.state import AttemptReport, JobStore, RayKV
from hetflow.core.placement import Placement
from hetflow.core.topology import ClusterSnapshot
from hetflow.core.units import format_cpus

RUNNER_PREFIX = "hetflow-job-"
LOG_TAIL_BYTES = 64 * 1024

# Calls ``module:function`` with sys.argv set as for a script (the job's own arguments).
_ENTRY = ("import importlib, sys\n"
          "target = sys.argv[1]\n"
          "sys.argv = [target] + sys.argv[2:]\n"
          "mod, fn = target.split(':')\n"
          "result = getattr(importlib.import_module(mod), fn)()\n"
          "sys.exit(result if isinstance(result, int) else 0)\n")


def runner_name(job_id: str) -> str:
    return RUNNER_PREFIX + job_id


def _die_with_parent() -> None:
    """In the child: own process group (so a stop reaches its children) and, on Linux, die
    when the runner dies (a killed runner must not leave its job running unseen)."""
    os.setsid()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class JobRunner:
    """One attempt (see the module docstring). Methods return at once; the work runs in a thread."""

    def __init__(self, job_id: str, token: int, spec: dict[str, Any], placement: Placement | None,
                 snapshot: ClusterSnapshot, settings: dict[str, Any], launched_at: float,
                 restarted: bool, host: dict[str, Any] | None = None) -> None:
        """``placement``: the devices of a device job; None for a CPU job, whose ``host`` is
        ``{"node": name, "selector": {label: value}}`` (its CPUs and memory are the spec's)."""
        assert (placement is None) != (host is None), "a job has devices or a host, not both"
        self.host = host
        self.job_id = job_id
        self.token = token
        self.spec = JobSpec.model_validate(spec)
        if placement is not None and self.spec.devices.elastic:
            # an elastic job runs at the size the policy gave it: dp = n / (tp x pp), or nproc n
            self.spec = self.spec.at_size(placement.world_size)
        self.placement = placement
        self.snapshot = snapshot
        self.settings = settings
        self.launched_at = launched_at
        self.restarted = restarted
        self.store = JobStore(RayKV())
        run_dir = Path(settings["log_dir"]) / job_id
        run_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = run_dir / "job.log"
        self.stop_file = run_dir / f"stop-{token}"
        self.stop_file.unlink(missing_ok=True)
        self.outcome_file = run_dir / f"outcome-{token}.json"  # the attempt's end, for its Ray job
        self.cancel_file = run_dir / f"cancel-{token}"  # `ray job stop` on that Ray job asks to cancel
        self.outcome_file.unlink(missing_ok=True)
        self.cancel_file.unlink(missing_ok=True)
        self.log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.ray_job: str | None = None  # the attempt's Ray job (submission id), once submitted
        self._ray_job_tried = threading.Event()  # set when its submission returned (or none is made)
        self._stop = threading.Event()
        self._cancel = threading.Event()
        self._proc: subprocess.Popen | None = None
        self._group: Any = None
        self._log_lock = threading.Lock()
        self._report = AttemptReport(job_id, token, "placing", at=time.time())
        self.store.report(self._report)
        threading.Thread(target=self._main, name=f"job-{job_id}", daemon=True).start()

    # -- called by the controller ----------------------------------------------------------------

    def ping(self) -> tuple[str, int]:
        return self.job_id, self.token

    def stop(self, cancel: bool = False) -> None:
        """Checkpoint and stop (``cancel``: and do not come back). Idempotent."""
        if cancel:
            self._cancel.set()
        if self._stop.is_set():
            return
        self._stop.set()
        self.stop_file.touch()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        threading.Timer(float(self.settings["stop_grace_s"]), self._kill).start()

    def log_since(self, offset: int | None, limit: int = 1 << 20) -> tuple[str, int]:
        """This attempt's log from byte ``offset`` (None: where the attempt began; -1: its end now), at most
        ``limit`` bytes, and the offset to ask for next (``hetflow logs -f``)."""
        if offset == -1:  # from the end now
            try:
                return "", self.log_path.stat().st_size
            except FileNotFoundError:
                return "", self.log_start
        start = self.log_start if offset is None else max(offset, self.log_start)
        try:
            with open(self.log_path, "rb") as f:
                f.seek(start)
                data = f.read(limit)
        except FileNotFoundError:
            return "", start
        cut = data.rfind(b"\n") + 1 if len(data) == limit else len(data)  # whole lines while more comes
        return data[:cut].decode(errors="replace"), start + cut

    def log_tail(self, nbytes: int = LOG_TAIL_BYTES) -> str:
        return self.log_tail_at(nbytes)[0]

    def log_tail_at(self, nbytes: int = LOG_TAIL_BYTES) -> tuple[str, int]:
        """The log's last ``nbytes`` and the byte offset where they end (one read: what
        :meth:`log_since` from that offset returns follows on exactly)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - nbytes))
                data = f.read()
                return data.decode(errors="replace"), f.tell()
        except FileNotFoundError:
            return "", self.log_start

    def record(self, reports: list[dict[str, Any]]) -> None:
        """Training rank 0's reports (read from the group's progress log, :meth:`_run_training`)."""
        from hetflow.workloads.train.loop import loss_records

        records = loss_records(reports)
        self._log("".join(f"step {r['step']} loss {r['loss']:.6f}\n" for r in records))
        if records:
            self._set(step=int(records[-1]["step"]))

    # -- the attempt -----------------------------------------------------------------------------

    def _main(self) -> None:
        from hetflow.core.errors import Unschedulable

        self._log(f"=== {self.job_id} attempt {self.token}: {self._where()} "
                  f"({time.strftime('%Y-%m-%d %H:%M:%S')}) ===\n")
        if self.settings.get("ray_jobs", True) and self.settings.get("dashboard_url"):
            # beside the work: a slow dashboard never delays it
            threading.Thread(target=self._submit_ray_job, name=f"rayjob-{self.job_id}", daemon=True).start()
        else:
            self._ray_job_tried.set()
        try:
            bound = self._reserve()
        except Unschedulable as exc:
            self._finish("unplaced", str(exc))
            return
        except Exception as exc:  # noqa: BLE001 - any failure to reserve is reported, not raised
            self._finish("unplaced", f"{type(exc).__name__}: {exc}")
            return
        try:
            self._set(phase="running")
            if self.spec.kind == "train":
                outcome, message, fatal = self._run_training(bound)
            elif self.spec.kind == "launch":
                outcome, message, fatal = self._run_launch(bound)
            else:
                outcome, message, fatal = self._run_process()
        except Exception as exc:  # noqa: BLE001
            outcome, message, fatal = "failed", f"runner error: {type(exc).__name__}: {exc}", False
        finally:
            bound.release()
        if outcome != "succeeded" and self._cancel.is_set():
            outcome = "cancelled"
        elif outcome != "succeeded" and self._stop.is_set():
            outcome = "preempted"
        self._finish(outcome, message, fatal)

    def _submit_ray_job(self) -> None:
        """The attempt's Ray job (:mod:`hetflow.control.attempt_job`), on this node, through the
        dashboard the controller found (its job API). Best effort: the attempt runs all the same."""
        import ray

        try:
            from ray.job_submission import JobSubmissionClient

            import hetflow

            node_id = ray.get_runtime_context().get_node_id()
            src = str(Path(hetflow.__file__).resolve().parents[1])
            entry = [sys.executable, "-u", "-m", "hetflow.control.attempt_job", "--log", str(self.log_path),
                     "--offset", str(self.log_start), "--outcome", str(self.outcome_file),
                     "--cancel", str(self.cancel_file), "--runner-pid", str(os.getpid())]
            sid = submission_id(self.job_id, self.token)
            JobSubmissionClient(self.settings["dashboard_url"]).submit_job(
                entrypoint=shlex.join(entry), submission_id=sid, entrypoint_num_cpus=0,
                entrypoint_label_selector={"ray.io/node-id": node_id},
                runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(
                    [src, *([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])])}},
                metadata={"hetflow_job": self.job_id, "attempt": str(self.token), "kind": self.spec.kind,
                          "where": self._where()})
            self.ray_job = sid
        except Exception as exc:  # noqa: BLE001 - a listing must never stop the job
            if "already exists" in str(exc):  # this attempt's Ray job was submitted before: one per attempt
                self.ray_job = submission_id(self.job_id, self.token)
            else:
                self._log(f"(not shown in `ray job list`: {type(exc).__name__}: "
                          f"{str(exc).splitlines()[0][:200]})\n")
        finally:
            self._ray_job_tried.set()
        if self.ray_job is not None and self._watch_cancel():
            import json

            if json.loads(self.outcome_file.read_text())["outcome"] in STOPPED:
                self._stop_ray_job()  # a preempted or cancelled attempt's Ray job ends STOPPED

    def _watch_cancel(self) -> bool:
        """`ray job stop` on the attempt's Ray job: cancel the hetflow job (as `hetflow cancel`).
        Runs in the submitting thread until the attempt ends; False when it was stopped that way."""
        while not self.outcome_file.exists():
            if self.cancel_file.exists():
                self._log("=== `ray job stop` on this attempt's Ray job: cancelling the job ===\n")
                self.stop(cancel=True)
                return False
            time.sleep(0.5)
        return True

    def _stop_ray_job(self) -> None:
        """Stop the attempt's Ray job (it then shows STOPPED: the attempt did not finish)."""
        try:
            from ray.job_submission import JobSubmissionClient

            JobSubmissionClient(self.settings["dashboard_url"]).stop_job(self.ray_job)
        except Exception:  # noqa: BLE001 - it ends by itself anyway (with the outcome's exit code)
            pass

    def _where(self) -> str:
        if self.placement is None:
            assert self.host is not None
            memory = f", {self.spec.memory_bytes / 2**30:.1f} GiB" if self.spec.memory_bytes else ""
            return f"{format_cpus(self.spec.job_cpus)}{memory} on {self.host['node']}"
        return ", ".join(str(d) for d in self.placement.devices)

    def _reserve(self) -> Any:
        from hetflow.runtime.binding import reserve, reserve_cpus

        timeout_s = float(self.settings["placement_timeout_s"])
        if self.placement is None:
            assert self.host is not None
            return reserve_cpus(self.job_id, self.host["selector"], ranks=self.spec.num_ranks,
                                cpus=self.spec.job_cpus, memory_bytes=self.spec.memory_bytes,
                                timeout_s=timeout_s)
        return reserve(self.placement, self.snapshot, cpus_per_rank=self.spec.cpus_per_device,
                       timeout_s=timeout_s)

    def _visibility(self) -> dict[str, str]:
        from hetflow.core.topology import Vendor
        from hetflow.runtime.resources import visibility_env

        if self.placement is None:
            return visibility_env(Vendor.CPU, [])
        node = self.placement.devices[0].node
        devices = list(self.placement.devices_on(node))
        return visibility_env(self.snapshot.node(node).device(devices[0]).vendor, devices)

    def _run_process(self) -> tuple[str, str, bool]:
        spec = self.spec
        env = {**os.environ, **self._visibility(), **self._job_env()}
        if spec.kind == "python":
            assert spec.python is not None
            py = spec.python
            env.update(py.env)
            if py.script:
                cmd = [sys.executable, "-u", py.script, *py.args]
                shown = cmd
            else:
                cmd = [sys.executable, "-u", "-c", _ENTRY, str(py.entrypoint), *py.args]
                shown = ["python", "-c", "<call>", str(py.entrypoint), *py.args]
            cwd = py.workdir
        else:
            cmd = [sys.executable, "-u", "-m", "hetflow.cli.main", "tune", str(spec.tune),
                   "--address", "auto", "--quiet"] + (["--resume"] if self.restarted else [])
            shown = cmd
            cwd = str(Path(str(spec.tune)).parent)
        self._log(f"$ {shlex.join(shown)}\n")
        with open(self.log_path, "ab", buffering=0) as log:
            self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                          preexec_fn=_die_with_parent)
            if self._stop.is_set():  # a stop that arrived while the process was starting
                os.killpg(self._proc.pid, signal.SIGTERM)
            code = self._proc.wait()
        if code == 0 and not self._stop.is_set():
            return "succeeded", "exit code 0", False
        return "failed", f"exit code {code}", False

    def _job_env(self) -> dict[str, str]:
        return {
            "HETFLOW_JOB_ID": self.job_id,
            "HETFLOW_ATTEMPT": str(self.token),
            "HETFLOW_DEVICES": ",".join(str(d) for d in self.placement.devices) if self.placement else "",
            "HETFLOW_NODE": self.host["node"] if self.host else self.placement.devices[0].node,  # type: ignore[union-attr]
            "HETFLOW_LAUNCHED_AT": repr(self.launched_at),
            "HETFLOW_RESTARTED": "1" if self.restarted else "0",
            "HETFLOW_STOP_FILE": str(self.stop_file),
        }

    def _run_training(self, bound: Any) -> tuple[str, str, bool]:
        from hetflow.workloads.train.api import ProgressLog
        from hetflow.workloads.train.group import Placed, RankGroup, TrainingCodeError, WorkerFailure
        from hetflow.workloads.train.loop import STOP_FILE_ENV, train_func

        config = self.spec.train_config()
        options = []
        ranks = self.placement.world_size if self.placement is not None else self.spec.num_ranks
        for rank in range(ranks):
            opts = bound.actor_options(rank)
            opts["runtime_env"]["env_vars"][STOP_FILE_ENV] = str(self.stop_file)
            options.append(opts)
        # rank 0's reports, through the cluster's store, into this job's log and step
        progress, read = ProgressLog(f"{self.job_id}-{self.token}"), [0]

        def drain() -> None:
            new = progress.since(read[0])
            read[0] += len(new)
            if new:
                self.record(new)

        how = self.placement.explain() if self.placement is not None else f"the controller reserved {self._where()}"
        # the devices reserved here: the group neither places nor releases them
        placed = Placed(options, lambda: None, how,
                        devices="cpu" if self.placement is None else "hetflow")
        group = RankGroup(config.layout.parallel, config.resources, self.job_id, self.token,
                          placed=placed)
        self._group = group
        try:
            group.start()
            ranks = group.run(train_func, {"config": config, "data": None},
                              {"checkpoint_dir": str(config.checkpoint_dir)}, progress, tick=drain,
                              poll_s=0.5)
        except TrainingCodeError as exc:
            return "failed", str(exc), True
        except WorkerFailure as exc:
            return "failed", str(exc), False
        finally:
            group.shutdown()
            self._group = None
            try:
                drain()  # what the last ranks reported before they ended
            finally:
                progress.close()
        rank0 = ranks[0]
        self._set(start_step=rank0.start_step, end_step=rank0.end_step, step=rank0.end_step,
                  progress=rank0.progress)
        self._log(f"attempt {self.token}: steps {rank0.start_step} -> {rank0.end_step}, "
                  f"checkpoint {rank0.checkpoint}\n")
        if rank0.stopped:
            return "preempted", f"checkpointed at step {rank0.end_step} in {rank0.checkpoint}", False
        return "succeeded", f"{rank0.end_step} steps; final checkpoint {rank0.checkpoint}", False

    def _run_launch(self, bound: Any) -> tuple[str, str, bool]:
        """``hetflow launch``'s launcher on the devices (or CPUs) reserved here."""
        from hetflow.workloads.launch.launcher import Launcher
        from hetflow.workloads.launch.spec import LaunchSpec
        from hetflow.workloads.train.group import Placed

        job = self.spec.launch
        assert job is not None
        spec = LaunchSpec(script=job.script, module=job.module, args=job.args, nproc=job.nproc,
                          tp=job.tp, pp=job.pp, max_restarts=job.max_restarts,
                          env={**self._job_env(), **job.env}, run_id=self.job_id,
                          log_dir=str(self.log_path.parent / "ranks"),
                          stop_grace_s=float(self.settings["stop_grace_s"]))
        how = self.placement.explain() if self.placement is not None else f"the controller reserved {self._where()}"
        placed = Placed([bound.actor_options(rank) for rank in range(job.nproc)], lambda: None,
                        how, devices="cpu" if self.placement is None else "hetflow")
        writer = _LogWriter(self._log)
        result = Launcher(spec, out=writer, err=writer, placed=placed, cwd=Path(job.workdir or "."),
                          stop=self._stop).run()
        if result.exit_code == 0 and not self._stop.is_set():
            restarts = f" after {result.restarts} restart(s)" if result.restarts else ""
            return "succeeded", f"all {job.nproc} ranks exited 0{restarts}", False
        return "failed", f"exit code {result.exit_code}" + (
            f" ({result.failures[-1]})" if result.failures else ""), False

    def _kill(self) -> None:
        """The stop grace ran out: end the job the hard way."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        group = self._group
        if group is not None:
            group.shutdown()

    # -- reporting --------------------------------------------------------------------------------

    def _log(self, text: str) -> None:
        with self._log_lock, open(self.log_path, "a") as f:
            f.write(text)

    def _set(self, **fields: Any) -> None:
        for k, v in fields.items():
            setattr(self._report, k, v)
        self._report.at = time.time()
        self.store.report(self._report)

    def _finish(self, outcome: str, message: str, fatal: bool = False) -> None:
        self._log(f"=== attempt {self.token}: {outcome}: {message} ===\n")
        earlier = self.store.log_tail(self.job_id) or ""
        tail = (earlier + self.log_tail())[-LOG_TAIL_BYTES:]
        self.store.save_log_tail(self.job_id, tail)
        end = self.log_path.stat().st_size
        start = max(self.log_start, end - LOG_TAIL_BYTES)
        own, _ = self.log_since(start, limit=end - start + 1)
        self.store.save_attempt_log(self.job_id, self.token, start, own)
        self.stop_file.unlink(missing_ok=True)
        write_outcome(self.outcome_file, outcome, message)  # its Ray job ends with it (_submit_ray_job)
        # A short attempt can end before its Ray job is submitted (a slow dashboard): the runner
        # is ended once the phase says done, so wait (bounded) for the submission to return.
        self._ray_job_tried.wait(timeout=30)
        self._set(phase="done", outcome=outcome, message=message, fatal=fatal)


class _LogWriter:
    """A text stream into the job's log (the launcher's rank output and its own lines)."""

    def __init__(self, log: Any) -> None:
        self._log = log

    def write(self, text: str) -> int:
        self._log(text)
        return len(text)

    def flush(self) -> None:
        pass


__all__ = ["JobRunner", "RUNNER_PREFIX", "runner_name"]
