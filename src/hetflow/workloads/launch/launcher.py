"""``hetflow launch``: an unchanged torchrun script as ``nproc`` ranks on planned devices of Ray.

    from hetflow.workloads.launch import LaunchSpec, launch
    result = launch(LaunchSpec(script="examples/launch/ddp_snapshot.py", nproc=2, max_restarts=1))
    print(result.exit_code, result.restarts)

Steps:

1. **Check the target** before anything starts: the script exists (inside ``working_dir`` when
   one is given), or the module can be found; a bad one is one line and exit 2.
2. **Ray** (:func:`hetflow.runtime.session.connect`): join ``address`` (or ``RAY_ADDRESS``);
   else start an embedded local Ray for this run (the machine's cores, shared by the ranks -
   like ``torchrun --standalone``).
3. **Place** the ranks through the same path as ``hetflow train``
   (:func:`~hetflow.workloads.train.group.place_layout`): on hetflow-managed nodes the planner
   places the layout ``dp x pp x tp`` (tp ranks on the fastest links) and binds each rank to
   exactly its device; otherwise one Ray GPU per rank, or one CPU bundle per rank. A request
   the cluster can never hold exits 3 with the reason. Rank order is the planner's.
4. **Run an attempt**: one :class:`~hetflow.workloads.launch.rank.RankProcess` actor per rank
   starts the script as a child with the torchrun environment
   (:func:`~hetflow.workloads.launch.env.torchrun_env`: a new MASTER_PORT every attempt); each
   rank's output is printed with a ``[rank k]`` prefix and kept in ``<log_dir>/rank-<k>.log``.
5. **Failures, as torchrun's ``--max-restarts``**: when a rank exits non-zero or its actor dies
   (a lost node), every rank of the attempt is stopped (SIGTERM, SIGKILL after
   ``stop_grace_s``) and the whole group starts again, up to ``max_restarts`` times - on the
   same actors when all live, else on a new placement. The script resumes from its own
   checkpoint, as under torchrun.
6. **The end**: exit code 0 when every rank exited 0, else the first failing rank's code (128 +
   N for a rank killed by signal N); Ctrl-C (or SIGTERM) stops every rank and exits 130 (143).
   The actors and the placement group are always released.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from hetflow.core.errors import HetflowError, InputError
from hetflow.workloads.launch.env import torchrun_env
from hetflow.workloads.launch.spec import LaunchSpec

LOST_AFTER_S = 30.0  # a rank whose actor has not answered a poll for this long is lost
POLL_WAIT_S = 1.0


class LaunchInterrupted(HetflowError):
    """Ctrl-C or SIGTERM: every rank was stopped."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}; every rank was stopped")
        self.exit_code = 128 + signum


@dataclass
class RankFailure:
    rank: int
    code: int | None  # exit status (negative: killed by that signal); None: the actor was lost
    why: str

    @property
    def exit_code(self) -> int:
        if self.code is None:
            return 1
        return 128 - self.code if self.code < 0 else self.code


@dataclass
class LaunchResult:
    """How a launch ended."""

    exit_code: int  # 0, the failing rank's code, or 130/143 when interrupted
    restarts: int  # attempts restarted after a failure
    failures: list[str]  # why each failed attempt failed
    log_dir: Path
    placement: str  # how the last attempt was placed
    wall_s: float
    startup_s: float | None  # launch() called -> every rank of the first attempt started
    ranks: list[dict[str, Any]] = field(default_factory=list)  # last attempt: ip, pid, devices


@dataclass
class Target:
    """What each rank runs: ``argv`` (``python`` = the worker's interpreter), its directory."""

    argv: list[str]
    cwd: str | None  # None: the actor's own directory (the shipped working_dir, if any)
    working_dir: str | None


def resolve_target(spec: LaunchSpec, cwd: Path | None = None) -> Target:
    """Check the script or module and turn it into argv (InputError when it cannot run)."""
    cwd = (cwd or Path.cwd()).absolute()
    wd = None
    if spec.working_dir is not None:
        wd = Path(spec.working_dir).expanduser()
        wd = (wd if wd.is_absolute() else cwd / wd).resolve()
        if not wd.is_dir():
            raise InputError(f"--working-dir {spec.working_dir}: no such directory")
    if spec.script is not None:
        script = Path(spec.script).expanduser()
        if wd is not None:
            inside = [p for p in ((script if script.is_absolute() else cwd / script), wd / script)
                      if p.is_file() and p.resolve().is_relative_to(wd)]
            if not inside:
                raise InputError(f"no such script {spec.script} in --working-dir {wd} (with "
                                 "--working-dir, SCRIPT is a file inside that directory)")
            rel = inside[0].resolve().relative_to(wd)
            return Target(["python", "-u", str(rel), *spec.args], None, str(wd))
        path = script if script.is_absolute() else cwd / script
        if not path.is_file():
            raise InputError(f"no such script {spec.script}" + (
                " (a directory: name the .py file in it)" if path.is_dir() else ""))
        return Target(["python", "-u", str(path), *spec.args], str(cwd), None)
    assert spec.module is not None
    search = [str(wd or cwd)]
    found = False
    sys.path[:0] = search
    try:
        found = importlib.util.find_spec(spec.module) is not None
    except (ImportError, ValueError):
        found = False
    finally:
        del sys.path[:len(search)]
    if not found:
        raise InputError(f"no module named {spec.module} (looked in {search[0]} and sys.path); "
                         "check the name, or ship its directory with --working-dir")
    return Target(["python", "-u", "-m", spec.module, *spec.args],
                  None if wd is not None else str(cwd), str(wd) if wd else None)


class Launcher:
    """One ``hetflow launch`` run; :meth:`run` blocks until it ends."""

    def __init__(self, spec: LaunchSpec, out: IO[str] | None = None, err: IO[str] | None = None,
                 quiet: bool = False, placed: Any | None = None, cwd: Path | None = None,
                 stop: threading.Event | None = None) -> None:
        """``placed``: a placement reserved by the caller (a
        :class:`~hetflow.workloads.train.group.Placed`, e.g. the cluster controller's; it is not
        released here and a lost rank is not placed again: the attempt fails). ``cwd``: the
        directory the script path is taken from (default: this process's). ``stop``: when set,
        every rank is stopped (SIGTERM, then SIGKILL after ``stop_grace_s``) and the run ends
        with 143, as on SIGTERM."""
        self.spec = spec
        self._given = placed
        self._cwd = cwd
        self._stop_event = stop
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.quiet = quiet
        self.run_id = spec.run_id or time.strftime("launch-%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:4]
        self.log_dir = Path(spec.log_dir or f"results/launch/{self.run_id}").absolute()
        self._logs: list[IO[str]] = []
        self._placed: Any = None
        self._actors: list[Any] = []
        self._where: list[dict[str, Any]] = []
        self._embedded_cores: int | None = None
        self._signalled: int | None = None
        self._tracker: Any = None  # the launch's MLflow run (spec.tracking), or None
        self._placements: list[dict[str, Any]] = []

    # -- public ----------------------------------------------------------------------------------

    def run(self) -> LaunchResult:
        t0 = time.time()
        target = resolve_target(self.spec, self._cwd)
        if self.spec.tracking.mlflow is not None:  # before Ray: a bad URI is exit 2 at once
            from hetflow.runtime.tracking import Tracker

            self._tracker = Tracker.start(self.spec.tracking.mlflow, self.run_id, kind="launch")
            self._tracker.log_params({"hetflow": self._params(target)})
        result: LaunchResult | None = None
        try:
            result = self._run_on_ray(target, t0)
            return result
        finally:
            if self._tracker is not None:
                self._track_end(result)

    def _run_on_ray(self, target: Target, t0: float) -> LaunchResult:
        from hetflow.runtime.session import connect  # join or start Ray (its rules)

        session = connect(self.spec.address, self.spec.nproc,
                          {"working_dir": target.working_dir} if target.working_dir else None)
        self._embedded_cores = session.embedded_cores
        previous = self._install_signal_handlers()
        try:
            return self._run(target, t0)
        except KeyboardInterrupt:
            self._stop_all()
            self._say("interrupted: every rank was stopped")
            return self._interrupted(signal.SIGINT, t0)
        except LaunchInterrupted as exc:
            self._stop_all()
            self._say(str(exc))
            return self._interrupted(self._signalled or signal.SIGTERM, t0)
        finally:
            self._restore_signal_handlers(previous)
            self._shutdown_group()
            for log in self._logs:
                log.close()
            session.close()

    # -- tracking --------------------------------------------------------------------------------

    def _params(self, target: Target) -> dict[str, Any]:
        """The launch's settings as MLflow parameters (``hetflow.*``: apart from the script's)."""
        spec = self.spec
        return {"target": spec.target, "args": list(spec.args), "nproc": spec.nproc, "tp": spec.tp,
                "pp": spec.pp, "device": spec.device, "vendor": spec.vendor, "model": spec.model,
                "memory": spec.memory, "cpus_per_rank": spec.cpus_per_rank,
                "max_restarts": spec.max_restarts, "visible_devices": spec.visible_devices,
                "working_dir": target.working_dir, "run_id": self.run_id,
                "env": sorted(spec.env) or None}

    def _track_attempt(self, attempt: int, ranks: list[dict[str, Any]]) -> None:
        if self._tracker is None:
            return
        how = self._placed.how if self._placed is not None else ""
        self._placements.append({"attempt": attempt, "how": how, "ranks": ranks})
        self._tracker.set_tags({"hetflow.placement": how, "hetflow.attempt": attempt})
        self._tracker.log_dict({"attempts": self._placements}, "placement.json")

    def _track_end(self, result: LaunchResult | None) -> None:
        """Exit status, restarts and times as metrics; the rank logs as artifacts (``logs/``);
        the run FINISHED (exit 0), KILLED (interrupted) or FAILED."""
        tracker = self._tracker
        if result is None:
            tracker.finish("FAILED")
            return
        tracker.log_metrics({"hetflow.exit_code": result.exit_code,
                             "hetflow.restarts": result.restarts, "hetflow.wall_s": result.wall_s,
                             "hetflow.startup_s": result.startup_s})
        tracker.set_tags({"hetflow.exit_code": result.exit_code,
                          **({"hetflow.failure": result.failures[-1]} if result.failures else {})})
        if result.log_dir.is_dir():
            tracker.log_artifacts(result.log_dir, "logs")
        interrupted = result.exit_code in (128 + signal.SIGINT, 128 + signal.SIGTERM) and not result.failures
        tracker.finish("FINISHED" if result.exit_code == 0 else "KILLED" if interrupted else "FAILED")

    # -- Ray and placement -----------------------------------------------------------------------

    def _resources(self) -> Any:
        from hetflow.workloads.train.config import ResourcesConfig

        spec = self.spec
        from hetflow.runtime.session import Session

        cpus = Session(False, self._embedded_cores).cpus_per_rank(spec.nproc, spec.cpus_per_rank)
        return ResourcesConfig(devices=spec.devices(), cpus_per_rank=cpus,
                               placement_timeout_s=spec.placement_timeout_s)

    def _start_group(self, target: Target, attempt: int) -> None:
        import ray

        from hetflow.workloads.launch.rank import RankProcess
        from hetflow.workloads.train.group import place_layout

        if self._given is not None:
            if attempt and self._placed is None:
                raise HetflowError("a rank of the reserved placement was lost; its devices are gone")
            self._placed = self._given
        else:
            self._placed = place_layout(self.spec.layout, self._resources(), f"{self.run_id}-{attempt}")
        remote = ray.remote(max_restarts=0, max_concurrency=4)(RankProcess)
        self._actors = []
        for options in self._placed.options:  # the job's working_dir (ray.init) is inherited
            self._actors.append(remote.options(**options).remote())
        try:
            self._where = ray.get([a.where.remote() for a in self._actors],
                                  timeout=self.spec.placement_timeout_s)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError,
                ray.exceptions.RuntimeEnvSetupError) as exc:
            raise HetflowError(f"the ranks' actors did not start: {str(exc).strip().splitlines()[-1]}") from None

    def _shutdown_group(self) -> None:
        import ray

        for actor in self._actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # already gone
                pass
        self._actors, self._where = [], []
        if self._placed is not None and self._placed is not self._given:
            self._placed.release()
        self._placed = None

    # -- attempts --------------------------------------------------------------------------------

    def _run(self, target: Target, t0: float) -> LaunchResult:
        import ray

        spec = self.spec
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._logs = [open(self.log_dir / f"rank-{k}.log", "a", encoding="utf-8")
                      for k in range(spec.nproc)]
        self._start_group(target, 0)
        self._say(f"{spec.nproc} ranks of {spec.target}, run {self.run_id}; placement: "
                  f"{self._placed.how.splitlines()[0]}")
        self._say(f"logs: {self.log_dir}")
        failures: list[str] = []
        startup_s = None
        attempt = 0
        while True:
            ranks = self._start_attempt(target, attempt)
            self._track_attempt(attempt, ranks)
            if startup_s is None:
                startup_s = time.time() - t0
            failure = self._watch(attempt)
            if failure is None:
                self._say(f"all {spec.nproc} ranks exited 0" +
                          (f" after {attempt} restart(s)" if attempt else "") +
                          f" ({time.time() - t0:.1f}s)")
                return LaunchResult(0, attempt, failures, self.log_dir, self._placed.how,
                                    time.time() - t0, startup_s, ranks)
            failures.append(failure.why)
            if attempt >= spec.max_restarts:
                self._say(f"{failure.why}; {'no restarts allowed' if not spec.max_restarts else f'gave up after {attempt} restart(s)'}"
                          f" (--max-restarts {spec.max_restarts}); output of rank {failure.rank}: "
                          f"{self.log_dir / f'rank-{failure.rank}.log'}")
                return LaunchResult(failure.exit_code, attempt, failures, self.log_dir,
                                    self._placed.how, time.time() - t0, startup_s, ranks)
            attempt += 1
            self._say(f"{failure.why}; restarting every rank (restart {attempt} of {spec.max_restarts})")
            if failure.code is None or not self._all_alive(ray):
                self._shutdown_group()
                self._start_group(target, attempt)

    def _all_alive(self, ray: Any) -> bool:
        try:
            ray.get([a.child_pid.remote() for a in self._actors], timeout=10)
            return True
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return False

    def _start_attempt(self, target: Target, attempt: int) -> list[dict[str, Any]]:
        import ray

        from hetflow.runtime.resources import visibility_env
        from hetflow.core.topology import Vendor

        port = (self._where[0]["port"] if attempt == 0 and len(self._where) else
                ray.get(self._actors[0].free_port.remote()))
        # the launch's MLflow run for a script that logs itself (the user's --env wins)
        user_env = {**(self._tracker.env() if self._tracker is not None else {}), **self.spec.env}
        if "OMP_NUM_THREADS" in os.environ and "OMP_NUM_THREADS" not in user_env:
            user_env["OMP_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"]
        envs = torchrun_env([w["node_id"] for w in self._where], self._where[0]["ip"], port,
                            run_id=self.run_id, restart_count=attempt,
                            max_restarts=self.spec.max_restarts, user_env=user_env,
                            omp_threads=int(self._resources().cpus_per_rank))
        if self._placed.devices == "cpu":
            envs = [{**visibility_env(Vendor.CPU, []), **env} for env in envs]
        else:
            envs = [{**vis, **env} for vis, env in zip(self._visibility(), envs)]
        for k, log in enumerate(self._logs):
            log.write(f"--- hetflow launch: attempt {attempt} (TORCHELASTIC_RESTART_COUNT={attempt}) ---\n")
            log.flush()
        pids = ray.get([a.start.remote(attempt, target.argv, env, target.cwd)
                        for a, env in zip(self._actors, envs)])
        return [{"rank": k, "ip": w["ip"], "node_id": w["node_id"], "pid": pid,
                 "local_rank": int(envs[k]["LOCAL_RANK"]),
                 "visible_devices": envs[k].get("CUDA_VISIBLE_DEVICES")}
                for k, (w, pid) in enumerate(zip(self._where, pids))]

    def _visibility(self) -> list[dict[str, str]]:
        """Each rank's device variables: its own device, or (``visible_devices: node``) the
        job's devices on its node in local-rank order, so that ``cuda:LOCAL_RANK`` is its own."""
        own = [w.get("visible", {}) for w in self._where]
        if self.spec.visible_devices == "own":
            return own
        out = []
        for k, where in enumerate(self._where):
            peers = [j for j, w in enumerate(self._where) if w["node_id"] == where["node_id"]]
            out.append({var: ",".join(own[j].get(var, "") for j in peers)
                        for var in own[k] if all(own[j].get(var) for j in peers)} or own[k])
        return out

    def _watch(self, attempt: int) -> RankFailure | None:
        """Stream every rank's output until all have exited; stop them all at the first failure."""
        import ray

        n = len(self._actors)
        offsets = [0] * n
        answered = [time.monotonic()] * n
        codes: list[int | None] = [None] * n
        lost: set[int] = set()
        failure: RankFailure | None = None
        stop_deadline: float | None = None
        pending = {self._actors[k].poll.remote(attempt, 0, POLL_WAIT_S): k for k in range(n)}
        while pending:
            self._check_signal()
            done, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
            now = time.monotonic()
            for ref in done:
                k = pending.pop(ref)
                answered[k] = now
                try:
                    lines, code = ray.get(ref)
                except ray.exceptions.RayActorError:
                    lost.add(k)
                    failure = failure or RankFailure(k, None, f"rank {k}'s process was lost "
                                                              "(its actor died: node lost or killed)")
                    continue
                self._emit(k, lines)
                offsets[k] += len(lines)
                if code is None:
                    pending[self._actors[k].poll.remote(attempt, offsets[k], POLL_WAIT_S)] = k
                    continue
                codes[k] = code
                if code != 0 and failure is None:
                    failure = RankFailure(k, code, f"rank {k} {_describe_exit(code)} (attempt {attempt})")
            for ref, k in list(pending.items()):
                if now - answered[k] > LOST_AFTER_S:
                    pending.pop(ref)
                    lost.add(k)
                    failure = failure or RankFailure(k, None, f"rank {k} did not answer for "
                                                              f"{LOST_AFTER_S:g}s (node unreachable)")
            if failure is not None and stop_deadline is None:
                stop_deadline = now + self.spec.stop_grace_s + 10
                for k, actor in enumerate(self._actors):
                    if codes[k] is None and k not in lost:
                        actor.stop.remote(self.spec.stop_grace_s)
            if stop_deadline is not None and now > stop_deadline:
                for k in pending.values():
                    self._emit(k, ["(hetflow launch: no more output: the rank did not stop in time)"])
                break
        return failure

    # -- output, signals -------------------------------------------------------------------------

    def _emit(self, rank: int, lines: list[str]) -> None:
        if not lines:
            return
        log = self._logs[rank]
        log.write("".join(f"{line}\n" for line in lines))
        log.flush()
        self.out.write("".join(f"[rank {rank}] {line}\n" for line in lines))
        self.out.flush()

    def _say(self, text: str) -> None:
        if not self.quiet:
            self.err.write(f"hetflow launch: {text}\n")
            self.err.flush()

    def _stop_all(self) -> None:
        import ray

        if not self._actors:
            return
        refs = [a.stop.remote(self.spec.stop_grace_s) for a in self._actors]
        try:
            ray.wait(refs, num_returns=len(refs), timeout=self.spec.stop_grace_s + 5)
        except Exception:  # the actors are killed next in any case
            pass

    def _interrupted(self, signum: int, t0: float) -> LaunchResult:
        return LaunchResult(128 + signum, 0, [], self.log_dir,
                            self._placed.how if self._placed else "", time.time() - t0, None)

    def _install_signal_handlers(self) -> Any:
        if threading.current_thread() is not threading.main_thread():
            return None

        def on_term(signum: int, frame: Any) -> None:
            self._signalled = signum

        return signal.signal(signal.SIGTERM, on_term)

    def _restore_signal_handlers(self, previous: Any) -> None:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)

    def _check_signal(self) -> None:
        if self._signalled is None and self._stop_event is not None and self._stop_event.is_set():
            self._signalled = signal.SIGTERM
        if self._signalled is not None:
            raise LaunchInterrupted(self._signalled)


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def launch(spec: LaunchSpec, **kwargs: Any) -> LaunchResult:
    """Run ``spec`` to its end (see the module docstring); kwargs go to :class:`Launcher`."""
    return Launcher(spec, **kwargs).run()


__all__ = ["LaunchInterrupted", "LaunchResult", "Launcher", "RankFailure", "Target", "launch",
           "resolve_target"]
