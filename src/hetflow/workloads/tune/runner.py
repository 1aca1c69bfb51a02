"""``run_tuning(config) -> TuningResult``: a whole tuning run on Ray Tune, resumable.

    from hetflow.workloads.tune.config import load_tuning_config
    from hetflow.workloads.tune.runner import run_tuning
    result = run_tuning(load_tuning_config("examples/tune_digits.yaml"))
    print(result.best_value, result.best_config_path)

What runs: ``config.budget.trials`` trials of :func:`~hetflow.workloads.tune.trial.run_trial`,
chosen by Optuna's TPE (``ray.tune.search.optuna.OptunaSearch``) or plain random search
(Tune's ``BasicVariantGenerator``), stopped early by ASHA on epochs
(:class:`~hetflow.workloads.tune.asha.QuorumASHAScheduler`: Ray's ``ASHAScheduler`` whose first
rung promotes nothing before ``search.first_rung_quorum`` results) or run to the end (FIFO),
within the time budget. Trial resources come from
:func:`~hetflow.workloads.tune.placement.place_trials` (hetflow's planner on GPU nodes).

On disk, under ``config.output_dir``::

    trials/              Ray Tune's experiment: one directory per trial (results and
                         checkpoints), the searcher's and the run's state (what resume reads)
    trials.json          every trial: sampled values, status, epochs, validation curve
    best/config.yaml     the training config that reproduces the best trial (hetflow train)
    best/checkpoint/     its weights at its best epoch (a hetflow checkpoint directory)
    best/result.json     which trial, which epoch, the metric
    curves.png           every trial's validation curve, the best highlighted

**Resume.** Ctrl-C (SIGINT) stops the run gracefully: Tune saves the experiment state, with
every finished trial and the last checkpoint of each unfinished one. ``run_tuning(config,
resume=True)`` (``hetflow tune CONFIG --resume``) continues it with ``Tuner.restore``:
finished trials are kept as they are, unfinished ones go on from their last checkpoint, and
the searcher continues from its saved state until the trial budget is used. The time budget
counts from the resume.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import signal
import threading
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import yaml

from hetflow.core.errors import HetflowError, InputError
from hetflow.workloads.tune.config import TuningConfig

EXPERIMENT_DIR = "trials"  # Tune's experiment directory inside the output directory


@dataclass
class TrialSummary:
    """One trial as it ended."""

    trial_id: str
    params: dict[str, Any]  # sampled values, "section.field" -> value
    status: str  # done (all epochs), stopped (early: scheduler or time budget), error, not run
    epochs: int  # epochs trained (reported)
    curve: list[dict[str, float]]  # per epoch: epoch, the metrics, reported_at
    best: float | None  # the best metric value over its epochs
    best_epoch: int | None
    error: str | None = None
    path: str = ""  # its Tune trial directory
    device: str = ""  # where it ran: node:device, ray-gpu:<ids> or cpu (last attempt)
    device_units: float = 0.0  # its share of the hetflow device resource (MiB)
    visible_devices: str = ""  # CUDA_VISIBLE_DEVICES inside the trial
    torch_device: str = ""  # the torch device it trained on (cuda:0, cpu, ...)

    def points(self, metric: str) -> list[tuple[int, float]]:
        return [(int(r["epoch"]), float(r[metric])) for r in self.curve if metric in r]


@dataclass
class TuningResult:
    """What a finished (or time-limited) tuning run found."""

    name: str
    metric: str
    mode: str
    output_dir: Path
    experiment_dir: Path
    trials: list[TrialSummary]
    best: TrialSummary | None
    best_config_path: Path | None
    best_checkpoint_path: Path | None
    plot_path: Path | None
    placement: str  # how trials were placed, one line
    started_at: float  # time.time() when this run (or resume) began fitting
    wall_s: float
    resumed: bool
    interrupted: bool = False  # stopped before its budget (Ctrl-C): resume continues it
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def best_value(self) -> float | None:
        return self.best.best if self.best else None

    @property
    def trial_epochs(self) -> int:
        """Epochs trained over all trials: the compute the run spent."""
        return sum(t.epochs for t in self.trials)

    @property
    def stopped_early(self) -> list[TrialSummary]:
        return [t for t in self.trials if t.status == "stopped"]


def run_tuning(config: TuningConfig, *, resume: bool = False, callbacks: Sequence[Any] = (),
               quiet: bool = False, data: Any | None = None,
               tracker: Any | None = None) -> TuningResult:
    """Run (or with ``resume`` continue) the tuning run of ``config`` to its budget.

    ``data``: an ObjectRef of the split's arrays already in Ray's object store (keys
    ``SPLIT_KEYS`` of :mod:`hetflow.workloads.train.data`; the split ``base.data`` describes):
    every trial maps them instead of loading the dataset itself.

    Joins ``base.resources.ray_address`` or starts a local Ray when none is connected (and
    stops it at the end). ``callbacks`` are extra Ray Tune callbacks; a resumed run gets back
    the callbacks it started with instead (Tune restores them with the run). ``quiet``: no
    table and no placement line. Raises InputError when the output directory already holds a
    run and ``resume`` is False, or holds none to resume.

    Tracking (``config.tracking.mlflow``, or ``tracker``: a run to log into, e.g. a workflow's
    stage): the tuning run is an MLflow run and each trial a run nested under it
    (:mod:`~hetflow.workloads.tune.mlflow_trials`); a resumed run continues the same runs.
    """
    from hetflow.runtime.session import ray_loopback_mode

    ray_loopback_mode(config.base.resources.ray_address)
    # Each checkpoint forces a snapshot of the run's state (what resume reads); that is the
    # intent here, so Tune's warning about frequent snapshots is noise.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    # Tune's newer console output prints its own heading even at verbose=0; hetflow shows its
    # own table (progress.LiveTable), so Tune is kept silent.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    import ray

    from hetflow.runtime.tracking import status_of

    experiment = config.output_dir / EXPERIMENT_DIR
    _check_output(experiment, resume)
    own = None
    if tracker is None and config.tracking.mlflow is not None:
        own = tracker = _start_tracker(config, resume)
    started_ray = False
    status = "FAILED"
    try:
        if not ray.is_initialized():
            ray.init(address=config.base.resources.ray_address, include_dashboard=False)
            started_ray = True
        result = _run(config, experiment, resume, list(callbacks), quiet, data, tracker)
        if tracker is not None:
            log_tuning_result(tracker, result)
        status = "KILLED" if result.interrupted else "FINISHED"  # an interrupted run resumes
        return result
    except BaseException as exc:
        status = status_of(exc)
        raise
    finally:
        if started_ray:
            ray.shutdown()
        if own is not None:
            own.finish(status)


TRACKING_FILE = "mlflow.json"  # in the output directory: the tuning run's MLflow run (resume)


def _start_tracker(config: TuningConfig, resume: bool) -> Any:
    """The tuning run's MLflow run: on resume the one the run started with (same URI)."""
    from hetflow.runtime.tracking import Tracker, resolve

    assert config.tracking.mlflow is not None
    saved = config.output_dir / TRACKING_FILE
    run_id = None
    if resume and saved.is_file():
        record = json.loads(saved.read_text())
        if record.get("uri") == resolve(config.tracking.mlflow, config.name).uri:
            run_id = record.get("run_id")
    tracker = Tracker.start(config.tracking.mlflow, config.name, kind="tune", run_id=run_id)
    if tracker.run_id is not None:
        config.output_dir.mkdir(parents=True, exist_ok=True)
        tmp = saved.with_name(saved.name + ".tmp")
        tmp.write_text(json.dumps({"uri": tracker.target.uri, "run_id": tracker.run_id}))
        os.replace(tmp, saved)
    return tracker


def log_tuning_start(tracker: Any, config: TuningConfig, how: str) -> None:
    """The tuning run's parameters (search, budget, trial, space, the base job; flattened)
    and where trials are placed."""
    tracker.log_params(config.model_dump(mode="json", exclude={"tracking", "output"}))
    tracker.set_tags({"hetflow.placement": how})


def log_tuning_result(tracker: Any, result: TuningResult) -> None:
    """The end of a tuning run: the best value, trial counts, compute spent; the outputs as
    artifacts (``trials.json``, ``best/`` with its config and checkpoint, ``curves.png``)."""
    best = result.best
    tracker.log_metrics({f"best_{result.metric}": best.best if best else None,
                         "trials": len(result.trials), "stopped_early": len(result.stopped_early),
                         "trial_epochs": result.trial_epochs, "wall_s": result.wall_s})
    if best is not None:
        tracker.set_tags({"hetflow.best_trial": best.trial_id, "hetflow.best_epoch": best.best_epoch,
                          **{f"hetflow.best.{k}": v for k, v in best.params.items()}})
    tracker.log_dict([{"trial_id": t.trial_id, "device": t.device, "device_units": t.device_units,
                       "visible_devices": t.visible_devices, "status": t.status}
                      for t in result.trials], "placement.json")
    out = result.output_dir
    tracker.log_artifacts(out / "trials.json")
    if (out / "best").is_dir():
        tracker.log_artifacts(out / "best", "best")
    if result.plot_path is not None:
        tracker.log_artifacts(result.plot_path)


def _check_output(experiment: Path, resume: bool) -> None:
    from ray.tune import Tuner

    if resume and not Tuner.can_restore(experiment):
        raise InputError(f"nothing to resume in {experiment}: no tuning run was saved there "
                         "(run without --resume to start one, or point output.dir at the run)")
    if not resume and experiment.exists():
        raise InputError(f"{experiment.parent} already holds a tuning run; add --resume to "
                         "continue it, or set output.dir to a new directory (or remove it)")


def _run(config: TuningConfig, experiment: Path, resume: bool, callbacks: list[Any],
         quiet: bool, data: Any | None = None, tracker: Any | None = None) -> TuningResult:
    from ray import tune

    from hetflow.workloads.tune.placement import place_trials
    from hetflow.workloads.tune.progress import LiveTable
    from hetflow.workloads.tune.trial import TrialSetup, run_trial

    search, budget = config.search, config.budget
    space = config.search_space
    placement = place_trials(config, key=str(experiment))
    if config.trainable is not None:
        from hetflow.workloads.tune.user_trial import UserTrialSetup, run_user_trial

        user = UserTrialSetup(trainable=config.trainable, fixed=dict(config.config), space=space,
                              epochs=budget.epochs, threads=config.trial.threads,
                              device=config.base.resources.devices.kind)
        trial_fn: Any = tune.with_parameters(run_user_trial, setup=user)
    else:
        setup = TrialSetup(base=config.base.model_dump(mode="json"), space=space,
                           epochs=budget.epochs, threads=config.trial.threads)
        # with_parameters keeps an ObjectRef as it is (no second copy in the store).
        trial_fn = tune.with_parameters(run_trial, setup=setup, data=data)
    trainable = tune.with_resources(trial_fn, resources=placement.resources)
    table = LiveTable(space, search.metric, search.mode, budget.epochs, budget.trials,
                      live=config.output.live)
    run_callbacks = [*placement.callbacks, *([] if quiet else [table]), *callbacks]
    if tracker is not None:
        log_tuning_start(tracker, config, placement.how)
        if tracker.run_id is not None:  # one nested run per trial (Ray Tune's MLflow callback)
            from hetflow.workloads.tune.mlflow_trials import TrialRuns

            run_callbacks.append(TrialRuns(tracker.target.uri, tracker.target.experiment,
                                           tracker.run_id))
    if not quiet:
        print(f"placement: {placement.how}", flush=True)
    started_at = time.time()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module="optuna")  # ExperimentalWarning chatter
        if resume:
            tuner = tune.Tuner.restore(str(experiment), trainable, resume_unfinished=True,
                                       resume_errored=True, param_space=space.to_tune())
        else:
            tuner = tune.Tuner(
                trainable, param_space=space.to_tune(),
                tune_config=build_tune_config(config, placement.max_concurrent),
                run_config=tune.RunConfig(
                    name=EXPERIMENT_DIR, storage_path=str(experiment.parent),
                    # Two best checkpoints of each trial, and its latest. Tune snapshots the
                    # run's state each time a trial has checkpointed num_to_keep times, so
                    # that the state never names a deleted checkpoint.
                    checkpoint_config=tune.CheckpointConfig(
                        num_to_keep=2, checkpoint_score_attribute=search.metric,
                        checkpoint_score_order=search.mode),
                    failure_config=tune.FailureConfig(max_failures=0),
                    callbacks=run_callbacks, verbose=0,
                    stop=_target_stopper(search.metric, search.mode, budget.target)),
            )
        grid, interrupted = _fit(tuner)
    wall_s = time.time() - started_at
    result = _write_outputs(config, experiment, grid, placement.how, started_at, wall_s, resume)
    result.interrupted = interrupted
    return result


class _StagingRace(logging.Filter):
    """Drop Tune's report of one benign race: a snapshot of the run's state is uploaded from
    Tune's staging directory while the next snapshot renames a temporary file there
    (FileNotFoundError on ``.<uuid>-tmp-...``). The next snapshot, and the final one, which
    waits for its upload, succeed; resume reads those."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not (isinstance(error, FileNotFoundError) and "-tmp-" in str(error)
                    and record.getMessage().startswith("Saving experiment state"))


class _TrialsWithoutResults(logging.Filter):
    """Drop Tune's end-of-run warning about trials with no result files when that is all it
    reports: Tune has such a trial's result in memory, but the run ended (at the target, with
    that trial's first report or just after it) before its loggers wrote the file. The summary
    takes that last result from memory (:func:`_summaries`). Any other failure to read results
    still warns."""

    def filter(self, record: logging.LogRecord) -> bool:
        lines = record.getMessage().splitlines()
        if not lines or not lines[0].startswith("Failed to fetch metrics for"):
            return True
        return not all("FileNotFoundError" in line and "were not found at" in line
                       for line in lines[1:])


def _fit(tuner: Any) -> tuple[Any, bool]:
    """``tuner.fit()``, and whether a stop signal (Ctrl-C) ended it before its budget.

    Tune swaps in its own SIGINT handler for the run and never removes it, except on the
    first stop signal, when it puts the previous handler back. So the handler that is left
    tells an interrupted run from a finished one (Tune's result reports the interrupted trials
    as terminated). The previous handler is restored either way.
    """
    race, unreported = _StagingRace(), _TrialsWithoutResults()
    state_logger = logging.getLogger("ray.tune.execution.experiment_state")
    analysis_logger = logging.getLogger("ray.tune.analysis.experiment_analysis")
    state_logger.addFilter(race)
    analysis_logger.addFilter(unreported)
    try:
        if threading.current_thread() is not threading.main_thread():
            return tuner.fit(), False  # Tune catches no signal off the main thread
        previous = signal.getsignal(signal.SIGINT)
        try:
            grid = tuner.fit()
            return grid, signal.getsignal(signal.SIGINT) is previous
        finally:
            signal.signal(signal.SIGINT, previous)
    finally:
        state_logger.removeFilter(race)
        analysis_logger.removeFilter(unreported)


def _target_stopper(metric: str, mode: str, target: float | None) -> Any:
    if target is None:
        return None
    from hetflow.workloads.tune.progress import TargetReached

    return TargetReached(metric, mode, target)


def trial_dirname(trial: Any) -> str:
    """Trial directories named by trial id only (Tune's default spells out the config)."""
    return f"trial_{trial.trial_id}"


def build_tune_config(config: TuningConfig, max_concurrent: int | None) -> Any:
    """Tune's ``TuneConfig`` for ``config``: the searcher (random: Tune's
    ``BasicVariantGenerator``; tpe: ``OptunaSearch``), the scheduler (FIFO or
    :class:`~hetflow.workloads.tune.asha.QuorumASHAScheduler`), metric, mode and trial count.
    ``benchmarks/tuning_replay.py`` drives the same objects."""
    from ray import tune
    from ray.tune.schedulers import FIFOScheduler
    from ray.tune.search.basic_variant import BasicVariantGenerator

    from hetflow.workloads.tune.asha import QuorumASHAScheduler

    search, budget = config.search, config.budget
    if search.algorithm == "tpe":
        import optuna
        from ray.tune.search.optuna import OptunaSearch

        sampler = optuna.samplers.TPESampler(seed=search.seed,
                                             n_startup_trials=search.startup_trials)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        searcher: Any = OptunaSearch(sampler=sampler)
    else:
        # a SearchGenerator ignores TuneConfig.max_concurrent_trials: it takes its own limit
        searcher = BasicVariantGenerator(random_state=search.seed,
                                         max_concurrent=max_concurrent or 0)
    if search.scheduler == "asha":
        scheduler: Any = QuorumASHAScheduler(
            time_attr="training_iteration", max_t=budget.epochs,
            grace_period=search.grace_epochs, reduction_factor=search.reduction_factor,
            quorum=search.first_rung_quorum)
    else:
        scheduler = FIFOScheduler()
    return tune.TuneConfig(metric=search.metric, mode=search.mode, search_alg=searcher,
                           scheduler=scheduler, num_samples=budget.trials,
                           max_concurrent_trials=max_concurrent if search.algorithm == "tpe"
                           else None, time_budget_s=budget.time_s,
                           reuse_actors=config.trial.reuse_actors,
                           trial_dirname_creator=trial_dirname)


# --- outputs ---------------------------------------------------------------------------------


def _summaries(config: TuningConfig, grid: Any) -> list[TrialSummary]:
    metric, mode, epochs = config.search.metric, config.search.mode, config.budget.epochs
    space = config.search_space
    out = []
    for result in grid:
        frame = result.metrics_dataframe
        rows = [] if frame is None or frame.empty else frame.to_dict("records")
        if config.trainable is not None:  # a trainable's epochs are its reports, counted
            for row in rows:
                row["epoch"] = row.get("training_iteration")
        # A trial interrupted between reporting an epoch and Tune registering its checkpoint
        # trains that epoch again after resume: keep the last report of each epoch.
        by_epoch = {int(r["epoch"]): r for r in rows if not _missing(r.get("epoch"))}
        # The curve is read back from the trial's result files, which Tune's logger callbacks
        # write after the driver has the result: a run interrupted in between (Ctrl-C right
        # after a trial's last epoch) has that epoch in memory only. Tune's last result counts.
        last = dict(result.metrics or {})
        if config.trainable is not None:
            last["epoch"] = last.get("training_iteration")
        if not _missing(last.get("epoch")) and int(last["epoch"]) not in by_epoch:
            by_epoch[int(last["epoch"])] = last
        rows = [by_epoch[e] for e in sorted(by_epoch)]
        curve = [{k: _plain(r[k]) for k in ("epoch", metric, "val_loss", "train_loss",
                                            "started_at", "reported_at", "resumed_from")
                  if k in r and not _missing(r[k])} for r in rows]
        curve.sort(key=lambda r: r["epoch"])
        values = [(r[metric], int(r["epoch"])) for r in curve if not _missing(r.get(metric))]
        best = (max if mode == "max" else min)(values, default=None)
        trial_id = (result.metrics or {}).get("trial_id") or Path(result.path).name
        if result.error is not None:
            status = "error"
        elif not curve:
            status = "not run"
        else:
            status = "done" if curve[-1]["epoch"] >= epochs else "stopped"
        try:
            params = space.flat(result.config)
        except KeyError:
            params = {}
        out.append(TrialSummary(
            trial_id=str(trial_id), params=params, status=status,
            epochs=int(curve[-1]["epoch"]) if curve else 0, curve=curve,
            best=best[0] if best else None, best_epoch=best[1] if best else None,
            error=_first_line(result.error), path=str(result.path),
            **_placement_fields(rows[-1] if rows else {})))
    return sorted(out, key=lambda t: (t.curve[0]["reported_at"] if t.curve and
                                      "reported_at" in t.curve[0] else math.inf, t.trial_id))


def _placement_fields(row: dict[str, Any]) -> dict[str, Any]:
    visible = row.get("visible_devices", "")
    return {"device": str(row.get("device", "")),
            "device_units": float(_plain(row.get("device_units", 0.0)) or 0.0),
            "visible_devices": "" if _missing(visible) else str(visible),
            "torch_device": "" if _missing(row.get("torch_device", "")) else str(row.get("torch_device"))}


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _first_line(error: BaseException | None) -> str | None:
    if error is None:
        return None
    text = str(error).strip().splitlines()
    return text[-1] if text else type(error).__name__


def _best_checkpoint(grid: Any, best: TrialSummary, metric: str, mode: str) -> Any:
    for result in grid:
        if str(result.path) != best.path:
            continue
        kept = result.best_checkpoints or []
        for checkpoint, metrics in kept:
            if int(metrics.get("epoch", -1)) == best.best_epoch:
                return checkpoint
        # an interrupted trial's last result can arrive without its checkpoint registered
        return result.get_best_checkpoint(metric, mode) if kept else None
    return None


def _write_outputs(config: TuningConfig, experiment: Path, grid: Any, how: str,
                   started_at: float, wall_s: float, resumed: bool) -> TuningResult:
    from hetflow.workloads.tune.progress import plot_curves

    metric, mode = config.search.metric, config.search.mode
    out = config.output_dir
    trials = _summaries(config, grid)
    scored = [t for t in trials if t.best is not None]
    best = None
    if scored:
        sign = 1 if mode == "max" else -1
        best = max(scored, key=lambda t: (sign * t.best, -(t.best_epoch or 0)))
    (out / "trials.json").write_text(json.dumps([asdict(t) for t in trials], indent=1))
    config_path = checkpoint_path = plot_path = None
    best_dir = out / "best"
    if best is not None:
        best_dir.mkdir(parents=True, exist_ok=True)
        checkpoint = _best_checkpoint(grid, best, metric, mode)
        if checkpoint is not None:
            checkpoint_path = best_dir / "checkpoint"
            shutil.rmtree(checkpoint_path, ignore_errors=True)
            shutil.copytree(checkpoint.path, checkpoint_path)
        config_path = _write_best_config(config, best, best_dir / "config.yaml")
        (best_dir / "result.json").write_text(json.dumps({
            "trial_id": best.trial_id, "metric": metric, "value": best.best,
            "epoch": best.best_epoch, "params": best.params,
            "checkpoint": str(checkpoint_path) if checkpoint_path else None,
            "config": str(config_path)}, indent=1))
    if config.output.plot and scored:
        plot_path = plot_curves(
            {t.trial_id: t.points(metric) for t in trials}, metric, out / "curves.png",
            best=best.trial_id if best else None,
            title=(f"{config.name}: {len(trials)} trials, {config.search.algorithm} + "
                   f"{config.search.scheduler} (x: a trial's last epoch)"))
    if best is None and trials and all(t.status == "error" for t in trials):
        raise HetflowError(f"{config.name}: every trial failed; the first error: "
                           f"{trials[0].error} (trial directories under {experiment})")
    return TuningResult(
        name=config.name, metric=metric, mode=mode, output_dir=out, experiment_dir=experiment,
        trials=trials, best=best, best_config_path=config_path,
        best_checkpoint_path=checkpoint_path, plot_path=plot_path, placement=how,
        started_at=started_at, wall_s=wall_s, resumed=resumed)


def _write_best_config(config: TuningConfig, best: TrialSummary, path: Path) -> Path:
    """The base config with the best trial's values, training exactly its epochs (with a
    trainable: its dict with the best values)."""
    from hetflow.workloads.train.data import StepOrder, load_split

    if config.trainable is not None:
        values = {**config.config, **{k.split(".", 1)[1]: v for k, v in best.params.items()},
                  "epochs": best.best_epoch or 1}
        path.write_text(
            f"# The best trial of tuning run {config.name!r}: trial {best.trial_id}, "
            f"{config.search.metric} {best.best:.4f} after {best.best_epoch} epoch(s).\n"
            f"# Its trainable and the dict it was called with (epochs: up to its best one).\n"
            + yaml.safe_dump({"trainable": config.trainable, "config": values}, sort_keys=False))
        return path

    sections: dict[str, dict[str, Any]] = {}
    for name, value in best.params.items():
        section, key = name.split(".", 1)
        sections.setdefault(section, {})[key] = value
    train_config = config.base.with_overrides(**sections)
    dataset = load_split(train_config)
    per_epoch = StepOrder(len(dataset.train), train_config.train.batch_size,
                          train_config.data.seed).steps_per_epoch
    train_config = train_config.with_overrides(
        train={"steps": per_epoch * (best.best_epoch or 1)},
        checkpoint={"dir": None}, name=f"{config.name}-best")  # type: ignore[arg-type]
    header = (f"# The best trial of tuning run {config.name!r}: trial {best.trial_id}, "
              f"{config.search.metric} {best.best:.4f} after {best.best_epoch} epoch(s).\n"
              f"# `hetflow train {path.name}` trains it again; its weights are in checkpoint/.\n")
    quiet = None if train_config.tracking.enabled else {"tracking"}  # no empty section
    path.write_text(header + yaml.safe_dump(train_config.model_dump(mode="json", exclude=quiet),
                                            sort_keys=False))
    return path


__all__ = ["EXPERIMENT_DIR", "TrialSummary", "TuningResult", "run_tuning"]
